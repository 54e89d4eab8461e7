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
//! - this module's keeper process, the command's ptrace tracer, sees the stop, writes each original
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
//!
//! The tracer is a process of its own ([`Keeper`]), forked from fdr-profiled before the
//! command runs, holding only what repairs need: the table of stopped threads and the links of
//! the throw and catch probes. Whatever happens to fdr-profiled (Ctrl-C, `--duration`, a
//! crash, SIGKILL), frames it hooked go on being repaired until the command exits; the keeper
//! ignores the terminal's signals and exits with the command.
use super::ptrace::{
    kernel_has_syscall_trampoline, resume_all, seize, seize_all, seize_all_from, stop_all,
};
use super::release::{listen_for_release, Reports, LET_GO, RELEASE_POLL, RELEASE_SIGNAL};
use super::repairer::Repairer;
use crate::kernel::bpf::repair::RepairMaps;
use crate::session::summary::RepairsByThread;
use anyhow::{bail, Context as _, Result};
use std::fs::File;
use std::io::{BufRead as _, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, RawFd};
use std::time::Instant;

pub use super::release::RELEASE_WAIT;
pub use super::stops::{attach, PointCache, UnwindStops};

/// What the keeper traces.
pub enum Tracee {
    /// A command fdr-profiled launched, still parked before its exec: traced from its first
    /// instruction until it exits, whatever happens to fdr-profiled meanwhile.
    Launched(u32),
    /// A running process (`--pid`, or one of `--attach`), every thread seized where it is:
    /// let go when fdr-profiled asks ([`Keeper::release`]) or dies, after the original return
    /// address is put back into every live frame still hooked (read from the kernel by
    /// `release`, with the `repair_release` task iterator), so that no exception ever finds a
    /// hooked frame without a tracer.
    Running(u32),
    /// A process fdr-profiled holds stopped since its exec, before its first instruction
    /// (`repair::hold`): the keeper seizes it once fdr-profiled lets it go, keeps it stopped
    /// until its probes are in place ([`Keeper::go`]), then traces it as [`Tracee::Running`].
    Held(u32, RawFd),
}

/// How long a keeper waits for fdr-profiled to let a held process go before it gives up.
/// (It spins meanwhile, at a real-time priority: short.)
const HANDOVER_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

impl Tracee {
    fn pid(&self) -> u32 {
        match self {
            Tracee::Launched(pid) | Tracee::Running(pid) | Tracee::Held(pid, _) => *pid,
        }
    }
}

/// The process that traces the command (or the running process) and repairs its stack.
pub struct Keeper {
    pid: libc::pid_t,
    /// Whether it traces a running process, which it lets go when asked.
    running: bool,
    /// Its reports: a line once it traces the command, `let-go WHY` if it lets the process
    /// go by itself (see [`KeeperReport::let_go`]), its [`RepairsByThread`] (JSON, one line)
    /// when the command exits or is let go.
    reports: std::io::BufReader<std::fs::File>,
    /// Why it let the process go by itself, once read.
    let_go: Option<String>,
    /// [`Tracee::Held`]: the pipe the keeper waits on, its process stopped, until
    /// [`Keeper::go`] (or fdr-profiled's end) closes it.
    go: Option<File>,
}

/// What a keeper reports at its end.
#[derive(Debug)]
pub struct KeeperReport {
    /// What its repairs did, by thread.
    pub repairs: RepairsByThread,
    /// Why it let the process go by itself, if it did: the process exec'd a program that
    /// raised its privileges, which a root tracer must never hold (the kernel would keep the
    /// raised privileges under it). It was let go before the new program's first instruction,
    /// once fdr-profiled had removed its probes of it (or [`RELEASE_WAIT`] passed).
    pub let_go: Option<String>,
}

impl Keeper {
    /// Forks the keeper of `tracee` (a command still parked before its exec, or a running
    /// process); returns once it is its tracer. `stops` are the throw and catch probes placed
    /// for it (see [`attach`]): with the repairs table they are all the keeper keeps open, so
    /// that fdr-profiled's end removes every other probe. The child of a fork runs only the
    /// forking thread: call it where no other thread can hold a lock the keeper takes (none
    /// exists but the probe closer of `repair::processes`, which only closes descriptors).
    ///
    /// For a [`Tracee::Held`] process, `let_go` is called once the keeper has reported
    /// (seized it, or why not): it must make fdr-profiled's holder let the process go if the
    /// keeper's handover did not (it failed).
    pub fn start(
        tracee: Tracee,
        maps: RepairMaps,
        stops: &UnwindStops,
        let_go: impl FnOnce(),
    ) -> Result<Keeper> {
        // The repair passes threads through x86-64's uretprobe trampoline (a system call).
        if let Err(err) = crate::arch::repair_applies("the stack repair (--exits repair)") {
            let_go();
            return Err(err);
        }
        let (read_end, write_end) = pipe()?;
        let (go_read, go_write) = match tracee {
            Tracee::Held(..) => {
                let (r, w) = pipe()?;
                (Some(r), Some(w))
            }
            _ => (None, None),
        };
        let mut keep: Vec<RawFd> = stops.links.clone();
        keep.extend(maps.fds);
        keep.extend([write_end.as_raw_fd(), stops.program, stops.release_program]);
        keep.extend(go_read.as_ref().map(|r| r.as_raw_fd()));
        if let Tracee::Held(_, handover) = tracee {
            keep.push(handover);
        }
        keep.extend(stops.objects.iter().map(|o| o.file.as_raw_fd()));
        let running = matches!(tracee, Tracee::Running(..) | Tracee::Held(..));
        // Known before the fork, the keeper inherits them.
        kernel_has_syscall_trampoline();
        super::resumption::resumption_ns();
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: no other thread exists (see above), so the child may run any code.
        match unsafe { libc::fork() } {
            -1 => Err(std::io::Error::last_os_error()).context("--exits repair: fork"),
            0 => {
                drop(go_write);
                let code = keeper_main(tracee, parent, maps, stops, write_end, go_read, &keep);
                // SAFETY: the keeper ends here, without running the parent's destructors.
                unsafe { libc::_exit(code) }
            }
            pid => {
                drop(write_end);
                drop(go_read);
                drop(maps);
                let held = matches!(tracee, Tracee::Held(..));
                let mut keeper = Keeper {
                    pid,
                    running,
                    reports: std::io::BufReader::new(read_end),
                    let_go: None,
                    go: go_write,
                };
                let mut line = String::new();
                let _ = keeper.reports.read_line(&mut line);
                if held {
                    // `ready`, then `tracing` or why it failed. The holder lets the process go
                    // when the keeper, trying to seize it already, writes to its handover
                    // pipe; asked here only once the keeper has reported (in case that write
                    // failed, or the keeper did), so that the process never runs free while
                    // the keeper gets ready (on a busy host, long enough to run its loader
                    // and reach its entry point, or its whole short life).
                    if line == "ready\n" {
                        line.clear();
                        let _ = keeper.reports.read_line(&mut line);
                    }
                    let_go();
                }
                match line.trim_end() {
                    "tracing" => Ok(keeper),
                    why => {
                        keeper.reap();
                        bail!(
                            "--exits repair: cannot trace the {}: {}",
                            if running { "process" } else { "command" },
                            if why.is_empty() {
                                "the keeper died"
                            } else {
                                why
                            }
                        )
                    }
                }
            }
        }
    }

    /// Lets a [`Tracee::Held`] process run, its probes in place (nothing for the others).
    pub fn go(&mut self) {
        // Closing the pipe is the word.
        drop(self.go.take());
    }

    /// The keeper's pid.
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Asks the keeper of a running process to let it go (see [`Tracee::Running`]); call it
    /// once fdr-profiled's own probes are removed, then [`Keeper::finish`]. The keeper looks
    /// for the request at least every [`RELEASE_POLL`], so the signal is sent until it
    /// answers. Returns false when it has not answered within [`RELEASE_WAIT`] (a thread it
    /// must stop first is in an uninterruptible wait): it goes on by itself, and its report
    /// is not waited for.
    pub fn release(&mut self) -> bool {
        if !self.running {
            return true;
        }
        let fd = self.reports.get_ref().as_raw_fd();
        let deadline = Instant::now() + RELEASE_WAIT;
        while Instant::now() < deadline {
            // SAFETY: plain system calls; the keeper is our child, not yet reaped.
            unsafe { libc::kill(self.pid, RELEASE_SIGNAL) };
            let mut poll = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let ready =
                unsafe { libc::poll(&mut poll, 1, RELEASE_POLL.as_millis() as libc::c_int) };
            if ready != 0 {
                return true;
            }
        }
        false
    }

    /// Whether the keeper is ending: its report is readable (it writes nothing else after its
    /// first line) or its end of the pipe is closed. [`Keeper::finish`] then returns at once.
    pub fn has_ended(&self) -> bool {
        let mut poll = libc::pollfd {
            fd: self.reports.get_ref().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut poll, 1, 0) != 0 }
    }

    /// Why the keeper is letting its process go by itself, if it is (see
    /// [`KeeperReport::let_go`]): it says so first, and waits for fdr-profiled to remove its
    /// probes of the process and ask for the release ([`Keeper::release`]). Does not wait.
    pub fn let_go(&mut self) -> Option<&str> {
        if self.let_go.is_none() && self.has_ended() {
            let starts = self
                .reports
                .fill_buf()
                .is_ok_and(|buf| buf.starts_with(LET_GO.as_bytes()));
            let mut line = String::new();
            if starts && self.reports.read_line(&mut line).is_ok() {
                self.let_go = Some(line[LET_GO.len()..].trim_end().to_owned());
            }
        }
        self.let_go.as_deref()
    }

    /// Waits for the keeper's report (the command exited, or the process was let go) and
    /// returns it (blocking: run it on its own thread). A keeper whose command left forked
    /// processes behind goes on repairing them until they exit; it is not waited for.
    pub fn finish(mut self) -> Result<KeeperReport> {
        let mut report = String::new();
        let read = loop {
            report.clear();
            match self.reports.read_line(&mut report) {
                Ok(_) if report.starts_with(LET_GO) => {
                    self.let_go = Some(report[LET_GO.len()..].trim_end().to_owned());
                }
                other => break other,
            }
        };
        self.reap_if_gone();
        read.context("reading the keeper's report")?;
        let repairs = serde_json::from_str(report.trim()).with_context(|| {
            format!(
                "the repair keeper ended without its report ({:?})",
                report.trim()
            )
        })?;
        Ok(KeeperReport {
            repairs,
            let_go: self.let_go.take(),
        })
    }

    fn reap(&mut self) {
        let mut status = 0;
        // SAFETY: valid pointer to an int; the keeper is our child.
        while unsafe { libc::waitpid(self.pid, &mut status, 0) } < 0
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {}
    }

    /// Reaps the keeper if it ends within a moment of its report (it still serves forked
    /// processes otherwise: the system reaps it once fdr-profiled is gone).
    fn reap_if_gone(&mut self) {
        let mut poll = libc::pollfd {
            fd: self.reports.get_ref().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the end of the pipe (POLLHUP) comes as the keeper exits.
        if unsafe { libc::poll(&mut poll, 1, 1000) } > 0 && poll.revents & libc::POLLHUP != 0 {
            self.reap();
        }
    }
}

/// The keeper's life, in the forked child: its own session, deaf to the terminal's signals,
/// nothing open but what it needs; traces `tracee` and serves its stops (and those of the
/// processes it forks) until it exits or is let go, and reports what the repairs did to
/// fdr-profiled if it is still there.
fn keeper_main(
    tracee: Tracee,
    parent: libc::pid_t,
    maps: RepairMaps,
    stops: &UnwindStops,
    mut reports: File,
    go: Option<File>,
    keep: &[RawFd],
) -> i32 {
    become_keeper(c"fdr-repair", keep);
    let running = matches!(tracee, Tracee::Running(..) | Tracee::Held(..));
    if running {
        listen_for_release(parent);
    }
    let command = tracee.pid();
    let seized = match &tracee {
        Tracee::Launched(pid) => seize(*pid).map(|()| vec![*pid]),
        Tracee::Running(pid) => seize_all(*pid),
        Tracee::Held(pid, handover) => {
            let _ = reports.write_all(b"ready\n");
            seize_all_from(*pid, parent as u32, *handover, HANDOVER_WAIT)
        }
    };
    // A held process stays stopped until its probes are in place.
    let stopped = match (&seized, &go) {
        (Ok(threads), Some(_)) => stop_all(threads),
        _ => Vec::new(),
    };
    let line = match &seized {
        Ok(_) => "tracing\n".to_owned(),
        Err(err) => format!("{err:#}\n"),
    };
    let _ = reports.write_all(line.as_bytes());
    let Ok(threads) = seized else {
        return 1;
    };
    if let Some(mut go) = go {
        // Closed by `Keeper::go`, or by fdr-profiled's end.
        let mut byte = [0u8; 1];
        while let Err(err) = std::io::Read::read(&mut go, &mut byte) {
            if err.kind() != std::io::ErrorKind::Interrupted {
                break;
            }
        }
        resume_all(&stopped);
    }
    let mut reports = Reports(reports);
    match Repairer::new(command, threads, maps, stops).serve(running, &mut reports) {
        Ok(()) => 0,
        Err(err) => {
            errln!("fdr-profiled: repair keeper: {err:#}");
            1
        }
    }
}

/// Makes the forked child a keeper named `name`: a session of its own, deaf to the
/// terminal's signals (fdr-profiled's Ctrl-C must not end it), nothing open but `keep` (and
/// standard error).
pub(crate) fn become_keeper(name: &std::ffi::CStr, keep: &[RawFd]) {
    // SAFETY: plain system calls on our own process.
    unsafe {
        libc::setsid();
        for signal in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGPIPE,
            libc::SIGTSTP,
            libc::SIGTTIN,
            libc::SIGTTOU,
        ] {
            libc::signal(signal, libc::SIG_IGN);
        }
        libc::prctl(libc::PR_SET_NAME, name.as_ptr());
    }
    close_all_but(keep);
}

/// A pipe, both ends closed on exec.
pub(crate) fn pipe() -> Result<(File, File)> {
    let mut ends = [0; 2];
    // SAFETY: valid pointer to two ints.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe");
    }
    // SAFETY: fresh descriptors from pipe2, owned from here on.
    Ok(unsafe { (File::from_raw_fd(ends[0]), File::from_raw_fd(ends[1])) })
}

/// Closes every descriptor but standard error and `keep`; standard input and output become
/// /dev/null (the keeper must not hold the command's pipes or fdr-profiled's files open).
fn close_all_but(keep: &[RawFd]) {
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in open {
        if fd > 2 && !keep.contains(&fd) {
            // SAFETY: closing a descriptor of our own; nothing else uses it in this process.
            unsafe { libc::close(fd) };
        }
    }
    // SAFETY: plain system calls on descriptors we own.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            if null > 2 {
                libc::close(null);
            }
        }
    }
}
