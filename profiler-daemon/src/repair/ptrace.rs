//! The ptrace system calls the keeper makes, each behind a small function: seizing threads,
//! waiting for stops, reading and writing registers and stack words, and passing a stopped
//! thread through the kernel's return trampoline.
use crate::arch::Registers;
use anyhow::{Context as _, Result};

pub(super) fn seize(pid: u32) -> Result<()> {
    // Threads, forked processes (see `Repairer::children`) and `exec` (a forked child that
    // runs another program is let go).
    // TRACESYSGOOD: the stops of a pass through the return trampoline (see
    // `Repairer::drop_dead_instances`) are told from signals.
    seize_with(pid, REPAIR_OPTIONS)
}

/// What the keeper is told of its tracees: see [`seize`].
const REPAIR_OPTIONS: libc::c_int = libc::PTRACE_O_TRACECLONE
    | libc::PTRACE_O_TRACEFORK
    | libc::PTRACE_O_TRACEEXEC
    | libc::PTRACE_O_TRACESYSGOOD;

/// `PTRACE_SEIZE` of thread `pid` with `options`.
pub(crate) fn seize_with(pid: u32, options: libc::c_int) -> Result<()> {
    // SAFETY: plain system call.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            pid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            options as usize as *mut libc::c_void,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).context("PTRACE_SEIZE");
    }
    Ok(())
}

/// Seizes every thread of the running process `pid`, new ones included (a thread created
/// meanwhile by one not seized yet shows up in the next listing; after that, the clone option
/// traces them); returns their ids. Fails when one cannot be traced: another tracer (a
/// debugger) has it.
pub(crate) fn seize_all(pid: u32) -> Result<Vec<u32>> {
    seize_all_with(pid, REPAIR_OPTIONS)
}

/// [`seize_all`] with `options` (`PTRACE_O_TRACECLONE` at least, for the threads created
/// meanwhile).
pub(crate) fn seize_all_with(pid: u32, options: libc::c_int) -> Result<Vec<u32>> {
    let mut seized: Vec<u32> = Vec::new();
    loop {
        let listed = crate::traced::process::threads(pid)
            .with_context(|| format!("listing the threads of process {pid}"))?;
        let new: Vec<u32> = listed.into_iter().filter(|t| !seized.contains(t)).collect();
        if new.is_empty() {
            return Ok(seized);
        }
        // SAFETY: getpid has no preconditions.
        let us = unsafe { libc::getpid() } as u32;
        for tid in new {
            match seize_with(tid, options) {
                Ok(()) => seized.push(tid),
                // It exited meanwhile.
                Err(_) if !std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists() => {}
                // Created meanwhile by a thread seized already: traced from its creation.
                Err(_) if crate::traced::process::tracer_of(tid) == Some(us) => seized.push(tid),
                Err(err) => {
                    let tracer = crate::traced::process::tracer_of(tid).unwrap_or(0);
                    return Err(if tracer != 0 {
                        anyhow::anyhow!(
                            "thread {tid} is already traced by process {tracer} (a debugger?)"
                        )
                    } else {
                        err.context(format!("thread {tid}"))
                    });
                }
            }
        }
    }
}

/// The new process a `PTRACE_EVENT_FORK` stop of `tid` announces.
pub(crate) fn event_message(tid: u32) -> Option<u32> {
    ptrace_get::<libc::c_ulong>(libc::PTRACE_GETEVENTMSG, tid).and_then(|m| u32::try_from(m).ok())
}

/// What a ptrace `request` that fills a `T` (`PTRACE_GETEVENTMSG`) gives of
/// the stopped thread `tid`. `T` must be plain data, valid when all zero.
pub(crate) fn ptrace_get<T: Copy>(request: libc::c_uint, tid: u32) -> Option<T> {
    let mut out = std::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: plain system call writing at most a `T` into `out`.
    let r = unsafe {
        libc::ptrace(
            request,
            tid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            out.as_mut_ptr().cast::<libc::c_void>(),
        )
    };
    // SAFETY: `out` was zeroed, and every `T` used here is valid so.
    (r == 0).then(|| unsafe { out.assume_init() })
}

/// Whether `tid` is the first thread of its process (`Tgid` equal to its id).
pub(super) fn is_process_leader(tid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .and_then(|t| t.trim().parse::<u32>().ok())
        })
        == Some(tid)
}

/// What waiting for the tracees gave.
pub(super) enum Wait {
    /// A stop or end of one (its id, the wait status).
    Stop(u32, i32),
    /// Nothing yet: a signal (a release request, the poll timer) interrupted the wait.
    Interrupted,
    /// No tracee is left (`ECHILD`).
    NoTracee,
}

/// The next stop or end of any tracee.
pub(super) fn wait_any() -> Result<Wait> {
    let mut status = 0;
    // SAFETY: valid pointer to an int.
    let tid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
    if tid < 0 {
        let err = std::io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::EINTR) => Ok(Wait::Interrupted),
            Some(libc::ECHILD) => Ok(Wait::NoTracee),
            _ => Err(err).context("waiting for the traced process"),
        };
    }
    Ok(Wait::Stop(tid as u32, status))
}

/// A ptrace request on a stopped tracee; a tracee that died meanwhile is no error.
pub(crate) fn request(request: libc::c_uint, tid: u32, data: i32) {
    // SAFETY: plain system call; `data` is a signal number or 0.
    unsafe {
        libc::ptrace(
            request,
            tid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            data as usize as *mut libc::c_void,
        );
    }
}

/// `__NR_uretprobe` (x86-64): the system call the return trampoline makes.
pub(super) const NR_URETPROBE: u64 = 335;

/// Whether the return trampoline of process `pid` is the kernel's system-call one (`push`
/// three registers, `uretprobe` system call: Linux 6.11+ on x86-64) and not a breakpoint
/// (older kernels, and processes with shadow stacks): only the first can be stopped in before
/// it returns anywhere.
pub(super) fn syscall_trampoline(pid: u32) -> bool {
    let shadow_stack = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("x86_Thread_features:") && l.contains("shstk"))
        })
        .unwrap_or(true);
    kernel_has_syscall_trampoline() && !shadow_stack
}

/// Whether this kernel gives 64-bit processes the system-call return trampoline: the
/// `uretprobe` system call exists exactly where it does. Read once (`/proc/kallsyms` takes tens
/// of milliseconds), by fdr-profiled before it forks a keeper, so that no thread waits for it.
pub(super) fn kernel_has_syscall_trampoline() -> bool {
    static KERNEL_HAS_IT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KERNEL_HAS_IT.get_or_init(|| {
        std::fs::read_to_string("/proc/kallsyms")
            .is_ok_and(|syms| syms.lines().any(|l| l.ends_with(" __x64_sys_uretprobe")))
    })
}

/// Runs the stopped thread `tid`, whose registers point at the return `trampoline`, up to the
/// end of its `uretprobe` system call (stopped at its entry, then at its exit). Whether it
/// got there, and a signal for the program that came meanwhile (0: none).
pub(super) fn pass_through_trampoline(tid: u32, trampoline: u64) -> (bool, i32) {
    let mut deliver = 0;
    let mut entered = false;
    for _ in 0..16 {
        request(libc::PTRACE_SYSCALL, tid, 0);
        let mut status = 0;
        // SAFETY: valid pointer to an int; `tid` is a thread we trace.
        let r = unsafe { libc::waitpid(tid as libc::pid_t, &mut status, libc::__WALL) };
        if r < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return (false, deliver);
        }
        if !libc::WIFSTOPPED(status) {
            return (false, deliver);
        }
        let signal = libc::WSTOPSIG(status);
        if signal == (libc::SIGTRAP | 0x80) && status >> 16 == 0 {
            let Some(regs) = Registers::of(tid) else {
                return (false, deliver);
            };
            if !entered {
                if regs.syscall() != NR_URETPROBE
                    || regs.pc() < trampoline
                    || regs.pc() > trampoline + 64
                {
                    // Not the trampoline's system call: it is not made (the registers are
                    // put back at its exit).
                    let mut skip = regs;
                    skip.cancel_syscall();
                    skip.set(tid);
                    return (false, deliver);
                }
                entered = true;
                continue;
            }
            return (true, deliver);
        }
        if status >> 16 == 0 && deliver == 0 && signal != libc::SIGTRAP {
            // A signal for the program, suppressed now, delivered when it resumes.
            deliver = signal;
        }
    }
    (false, deliver)
}

/// The stack pointer at the throw or catch probe that stopped `tid`, as its program saw it
/// (see `RepairState::sp`); the registers' only when the program could not say.
pub(super) fn probe_stack_pointer(tid: u32, state: &profiler_common::RepairState) -> Option<u64> {
    match state.sp {
        0 => stack_pointer(tid),
        sp => Some(sp),
    }
}

/// The stopped thread's stack pointer.
pub(super) fn stack_pointer(tid: u32) -> Option<u64> {
    Registers::of(tid).map(|regs| regs.sp())
}

pub(super) fn read_word(tid: u32, at: u64) -> Option<u64> {
    let mut word = 0u64;
    let local = libc::iovec {
        iov_base: (&raw mut word).cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: at as *mut libc::c_void,
        iov_len: 8,
    };
    // SAFETY: plain system call; `local` is 8 writable bytes of ours.
    let n = unsafe { libc::process_vm_readv(tid as libc::pid_t, &local, 1, &remote, 1, 0) };
    (n == 8).then_some(word)
}

pub(super) fn write_word(tid: u32, at: u64, value: u64) -> bool {
    let local = libc::iovec {
        iov_base: (&raw const value).cast_mut().cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: at as *mut libc::c_void,
        iov_len: 8,
    };
    // SAFETY: plain system call; `local` is 8 readable bytes of ours.
    let n = unsafe { libc::process_vm_writev(tid as libc::pid_t, &local, 1, &remote, 1, 0) };
    n == 8
}

/// Seizes every thread of process `pid` as [`seize_all`] does, once process `holder` (the
/// fdr-profiled that held it since its exec, see `repair::hold`) has let it go: tries to seize
/// its first thread (its only one, just after its exec) again and again while a thread of
/// `holder` still traces it, for at most `wait`. It tells the holder it is ready by writing
/// `pid` to `handover`. The process runs its loader from the moment it is let go: this thread
/// tries every 20 µs meanwhile, at a real-time priority.
pub(crate) fn seize_all_from(
    pid: u32,
    holder: u32,
    handover: std::os::fd::RawFd,
    wait: std::time::Duration,
) -> Result<Vec<u32>> {
    let deadline = std::time::Instant::now() + wait;
    // On a CPU of its own while it waits: real-time, below the holder (which must still run
    // to let the process go, on a single CPU too), above every ordinary task, the process
    // included. Where that is refused, the highest ordinary priority.
    let realtime = set_realtime(HANDOVER_PRIORITY);
    if !realtime {
        // SAFETY: plain system call on this process.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -20) };
    }
    // Ready: the holder lets the process go when it reads this (fdr-profiled asks it too
    // once this keeper has reported, in case this write failed).
    // SAFETY: writes 4 bytes from a valid u32 to the holder's pipe.
    unsafe { libc::write(handover, (&pid as *const u32).cast(), 4) };
    let mut tries = 0u32;
    let seized = loop {
        match seize(pid) {
            Ok(()) => {
                // Stopped at once (`stop_all` waits for the stop).
                request(libc::PTRACE_INTERRUPT, pid, 0);
                break Ok(());
            }
            Err(err) => {
                tries += 1;
                // Real-time, it wakes at once when this ends (no timer slack), on a CPU of its
                // own; sleeping between tries leaves the CPUs to everyone else.
                std::thread::sleep(std::time::Duration::from_micros(20));
                // Looked at now and then only (a look costs tens of microseconds).
                if tries.is_multiple_of(64) {
                    let held = crate::traced::process::tracer_of(pid).is_some_and(|tracer| {
                        tracer != 0
                            && std::path::Path::new(&format!("/proc/{holder}/task/{tracer}"))
                                .exists()
                    });
                    if !held || std::time::Instant::now() >= deadline {
                        // Let go between the last try and this look: one more try.
                        break seize(pid)
                            .map(|()| request(libc::PTRACE_INTERRUPT, pid, 0))
                            .map_err(|_| err);
                    }
                }
            }
        }
    };
    if realtime {
        set_realtime(0);
    }
    // SAFETY: plain system call on this process.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 0) };
    seized?;
    // Its other threads, if any (it was seized first, so it is listed as ours).
    seize_all(pid)
}

/// The real-time priority of a keeper waiting to seize a held process; the holder runs at
/// the next one up (see `repair::hold`).
pub(super) const HANDOVER_PRIORITY: i32 = 1;

/// Makes the calling thread `SCHED_FIFO` at `priority` (0: back to `SCHED_OTHER`); whether it
/// could.
pub(super) fn set_realtime(priority: i32) -> bool {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    let policy = if priority == 0 {
        libc::SCHED_OTHER
    } else {
        libc::SCHED_FIFO
    };
    // SAFETY: valid pointer to a sched_param; 0 is the calling thread.
    unsafe { libc::sched_setscheduler(0, policy, &param) == 0 }
}

/// Stops every seized thread (`PTRACE_INTERRUPT`) and waits until each is stopped; returns,
/// per thread still there, the signal to deliver when it is resumed (a signal that reached it
/// first: its stop is then that signal's delivery stop), 0 for none.
pub(crate) fn stop_all(threads: &[u32]) -> Vec<(u32, i32)> {
    let mut stopped = Vec::new();
    for &tid in threads {
        request(libc::PTRACE_INTERRUPT, tid, 0);
        loop {
            let mut status = 0;
            // SAFETY: valid pointer to an int; `tid` is a thread we trace.
            let r = unsafe { libc::waitpid(tid as libc::pid_t, &mut status, libc::__WALL) };
            if r < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                break;
            }
            if libc::WIFSTOPPED(status) {
                stopped.push((tid, signal_of_stop(status)));
            }
            break;
        }
    }
    stopped
}

/// The signal a thread in the stop `status` (from `waitpid`) is to be resumed with: a stop of
/// ptrace's own (an interrupt, an event) delivers nothing (0); any other is a signal's
/// delivery stop, and the signal is the program's.
pub(crate) fn signal_of_stop(status: i32) -> i32 {
    let signal = libc::WSTOPSIG(status);
    let event = status >> 16 != 0 || signal == (libc::SIGTRAP | 0x80);
    if event {
        0
    } else {
        signal
    }
}

/// `waitpid` on tracee `tid` without waiting: its new state (`Some(status)`), `None` while it
/// has none; an error when it is no tracee (or child) of this thread's any more.
pub(super) fn try_wait(tid: u32) -> std::io::Result<Option<i32>> {
    let mut status = 0;
    // SAFETY: valid pointer to an int.
    let r = unsafe {
        libc::waitpid(
            tid as libc::pid_t,
            &mut status,
            libc::WNOHANG | libc::__WALL,
        )
    };
    match r {
        r if r < 0 => Err(std::io::Error::last_os_error()),
        0 => Ok(None),
        _ => Ok(Some(status)),
    }
}

/// Resumes the threads [`stop_all`] stopped, each with its signal.
pub(crate) fn resume_all(stopped: &[(u32, i32)]) {
    for &(tid, signal) in stopped {
        request(libc::PTRACE_CONT, tid, signal);
    }
}
