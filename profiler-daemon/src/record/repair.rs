//! `--exits repair`: return probes on every function of a launched C++ (or Rust) program,
//! made safe for exceptions by repairing the stack at each throw.
//!
//! A return probe replaces the frame's return address with the kernel's trampoline; an
//! exception unwinding through such a frame finds no frame there and the runtime calls
//! `std::terminate`. So, as uftrace does inside the process, fdr-profiled puts the original
//! addresses back when a throw starts and hooks the frames still alive again once it is
//! caught, from outside the process:
//!
//! - at the unwinder's raise functions (`plan::catches::THROW_FUNCTIONS`) the `unwind_stop`
//!   program copies the thread's pending return-probe instances from the kernel (slot and
//!   original address of each) and stops the thread with a signal
//!   (`profiler_common::RepairState`);
//! - this module's thread, the command's ptrace tracer, sees the stop, writes each original
//!   address into the slots still holding the trampoline (`process_vm_writev`: BPF may not
//!   write user memory under lockdown), and resumes the thread with the signal suppressed;
//! - at the catch (`__cxa_begin_catch`, Rust's panic cleanup) the program stops the thread
//!   again; the tracer puts the trampoline back into the restored slots of the frames that are
//!   still alive (above the stack pointer), so that their returns are observed. The frames
//!   the exception left are closed at the catch by the session (`session::thread`).
//!
//! Every other stop is passed on as it came: signals meant for the program are delivered
//! unchanged, group stops (SIGSTOP, Ctrl-Z) are kept with `PTRACE_LISTEN`, new threads are
//! traced from their creation (`PTRACE_O_TRACECLONE`) and resumed. Children the program forks
//! are not traced (and not probed).
use crate::kernel::bpf::{PodRepairState, Scope, Tracer};
use crate::session::summary::RepairsByThread;
use crate::traced::launch::ChildExit;
use anyhow::{bail, Context as _, Result};
use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::repair_state;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

/// The signal that stops a thread for its repair: its default action is to be ignored, so a
/// stop signal still pending when fdr-profiled dies does the program no harm (unless it
/// catches SIGURG: rare outside Go, whose programs XRay does not instrument).
pub const STOP_SIGNAL: i32 = libc::SIGURG;

/// Probes the unwinder's throw functions and the catch functions of `image` (the launched
/// command's objects, before it runs) for `pid`. Errors when the image has no unwinder: then
/// nothing can throw and `--exits return` does the same at no cost.
pub fn attach(tracer: &mut Tracer, image: &[PathBuf], scope: Scope) -> Result<()> {
    let mut throws = 0;
    for object in image {
        for point in crate::plan::catches::throw_points(object) {
            tracer
                .attach_unwind_stop(
                    object,
                    point.file_offset,
                    profiler_common::event_kind::THROW,
                    scope,
                )
                .with_context(|| format!("probing {} in {}", point.name, object.display()))?;
            throws += 1;
        }
        for point in crate::plan::catches::catch_points(object) {
            tracer
                .attach_unwind_stop(
                    object,
                    point.file_offset,
                    profiler_common::event_kind::CATCH,
                    scope,
                )
                .with_context(|| format!("probing {} in {}", point.name, object.display()))?;
        }
    }
    if throws == 0 {
        bail!("--exits repair: no unwinder (_Unwind_RaiseException) in the command's image: nothing can throw, use --exits return");
    }
    Ok(())
}

/// Starts the thread that traces the launched command `pid` (still parked before its exec)
/// and repairs its stack; returns once it is the command's tracer. The thread ends when the
/// command exits, with how it ended and what the repairs did in each thread.
pub fn start(
    pid: u32,
    repairs: BpfHashMap<MapData, u32, PodRepairState>,
) -> Result<std::thread::JoinHandle<Result<(ChildExit, RepairsByThread)>>> {
    let (seized_tx, seized_rx) = std::sync::mpsc::channel::<Result<()>>();
    let handle = std::thread::Builder::new()
        .name("repair".into())
        .spawn(move || {
            // ptrace requests must come from the thread that seized the tracee.
            let seized = seize(pid);
            let ok = seized.is_ok();
            let _ = seized_tx.send(seized);
            if !ok {
                bail!("not the command's tracer");
            }
            Repairer::new(pid, repairs).serve()
        })
        .context("starting the repair thread")?;
    seized_rx
        .recv()
        .context("the repair thread died")?
        .context("--exits repair: cannot trace the command")?;
    Ok(handle)
}

fn seize(pid: u32) -> Result<()> {
    let options = libc::PTRACE_O_TRACECLONE;
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

/// The tracer's state.
struct Repairer {
    pid: u32,
    repairs: BpfHashMap<MapData, u32, PodRepairState>,
    /// The kernel's return-probe trampoline in the command (its `[uprobes]` mapping), once
    /// known; after an `exec` it is looked up again.
    trampoline: Option<u64>,
    /// By thread: the slots restored at its last throws, with the address written.
    restored: HashMap<u32, Vec<(u64, u64)>>,
    /// What the repairs did, by thread.
    stats: RepairsByThread,
}

/// `PTRACE_EVENT_CLONE` and `PTRACE_EVENT_STOP` (uapi values).
const EVENT_CLONE: i32 = 3;
const EVENT_STOP: i32 = 128;

impl Repairer {
    fn new(pid: u32, repairs: BpfHashMap<MapData, u32, PodRepairState>) -> Repairer {
        Repairer {
            pid,
            repairs,
            trampoline: None,
            restored: HashMap::new(),
            stats: RepairsByThread::new(),
        }
    }

    /// Serves every stop of every thread of the command until its main thread's exit is
    /// reported (after all the others').
    fn serve(mut self) -> Result<(ChildExit, RepairsByThread)> {
        loop {
            let mut status = 0;
            // SAFETY: valid pointer to an int.
            let tid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
            if tid < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err).context("waiting for the launched command");
            }
            let tid = tid as u32;
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                self.restored.remove(&tid);
                if tid == self.pid {
                    let exit = if libc::WIFEXITED(status) {
                        ChildExit::Code(libc::WEXITSTATUS(status))
                    } else {
                        ChildExit::Signal(libc::WTERMSIG(status))
                    };
                    return Ok((exit, self.stats));
                }
                continue;
            }
            if !libc::WIFSTOPPED(status) {
                continue;
            }
            let signal = libc::WSTOPSIG(status);
            match status >> 16 {
                0 => self.signal_stop(tid, signal),
                EVENT_STOP => {
                    if matches!(
                        signal,
                        libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
                    ) {
                        // A group stop: stay stopped until SIGCONT, as without a tracer.
                        request(libc::PTRACE_LISTEN, tid, 0);
                    } else {
                        // A new thread's first stop, or an interrupt.
                        request(libc::PTRACE_CONT, tid, 0);
                    }
                }
                EVENT_CLONE => request(libc::PTRACE_CONT, tid, 0),
                _ => request(libc::PTRACE_CONT, tid, 0),
            }
        }
    }

    /// A signal about to be delivered to `tid`: ours (a repair is due) or the program's.
    fn signal_stop(&mut self, tid: u32, signal: i32) {
        let state = self.repairs.get(&tid, 0).ok().map(|s| s.0);
        let ours = (signal == STOP_SIGNAL || signal == libc::SIGSTOP)
            && state.is_some_and(|s| {
                s.state == repair_state::THROWN || s.state == repair_state::CATCHING
            });
        let stats = self.stats.entry(tid).or_default();
        if !ours {
            stats.signals_passed_on += 1;
            request(libc::PTRACE_CONT, tid, signal);
            return;
        }
        let started = Instant::now();
        if let Some(state) = state {
            if state.state == repair_state::THROWN {
                self.throw(tid, &state);
                let mut done = state;
                done.state = repair_state::RESTORED;
                let _ = self.repairs.insert(tid, PodRepairState(done), 0);
            } else {
                self.catch(tid);
                let _ = self.repairs.remove(&tid);
            }
        }
        let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let stats = self.stats.entry(tid).or_default();
        stats.repair_ns_total += took;
        stats.repair_ns_max = stats.repair_ns_max.max(took);
        request(libc::PTRACE_CONT, tid, 0);
    }

    /// At a throw: the original return address back into every live slot that holds the
    /// trampoline, newest frame first (a slot shared by a tail call is written once).
    fn throw(&mut self, tid: u32, state: &profiler_common::RepairState) {
        let (sp, trampoline) = (stack_pointer(tid), self.trampoline());
        let stats = self.stats.entry(tid).or_default();
        stats.throws += 1;
        let (Some(sp), Some(trampoline)) = (sp, trampoline) else {
            return;
        };
        let restored = self.restored.entry(tid).or_default();
        // Frames restored at an earlier throw that were never caught, and are gone now.
        restored.retain(|&(slot, _)| slot > sp);
        let frames = (state.frames as usize).min(state.slots.len());
        for i in 0..frames {
            let (slot, orig) = (state.slots[i], state.origs[i]);
            if slot <= sp || restored.iter().any(|&(s, _)| s == slot) {
                continue;
            }
            match read_word(tid, slot) {
                Some(word) if word == trampoline => {
                    if write_word(tid, slot, orig) {
                        restored.push((slot, orig));
                        stats.frames_restored += 1;
                    } else {
                        stats.slots_left_alone += 1;
                    }
                }
                _ => stats.slots_left_alone += 1,
            }
        }
    }

    /// At a catch: the trampoline back into the restored slots of the frames still alive.
    fn catch(&mut self, tid: u32) {
        let restored = self.restored.remove(&tid).unwrap_or_default();
        let (sp, trampoline) = (stack_pointer(tid), self.trampoline());
        let stats = self.stats.entry(tid).or_default();
        stats.catches += 1;
        let (Some(sp), Some(trampoline)) = (sp, trampoline) else {
            return;
        };
        for (slot, orig) in restored {
            if slot <= sp {
                // Unwound: the kernel drops its instance as dead.
                continue;
            }
            match read_word(tid, slot) {
                Some(word) if word == orig => {
                    if write_word(tid, slot, trampoline) {
                        stats.frames_hooked_again += 1;
                    }
                }
                _ => stats.slots_left_alone += 1,
            }
        }
    }

    /// The start of the command's `[uprobes]` mapping: the return-probe trampoline.
    fn trampoline(&mut self) -> Option<u64> {
        if self.trampoline.is_none() {
            let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).ok()?;
            self.trampoline = maps
                .lines()
                .find(|l| l.trim_end().ends_with("[uprobes]"))
                .and_then(|l| u64::from_str_radix(l.split('-').next()?, 16).ok());
        }
        self.trampoline
    }
}

/// A ptrace request on a stopped tracee; a tracee that died meanwhile is no error.
fn request(request: libc::c_uint, tid: u32, data: i32) {
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

/// The stopped thread's stack pointer.
fn stack_pointer(tid: u32) -> Option<u64> {
    // SAFETY: user_regs_struct is plain data; PTRACE_GETREGS fills it.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    // SAFETY: plain system call writing into `regs`.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_GETREGS,
            tid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            (&raw mut regs).cast::<libc::c_void>(),
        )
    };
    (r == 0).then_some(regs.rsp)
}

fn read_word(tid: u32, at: u64) -> Option<u64> {
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

fn write_word(tid: u32, at: u64, value: u64) -> bool {
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
