//! Holding each new process of a repaired executable from its exec until its keeper has it.
//!
//! Under repair every probe of a process is its own (see [`super::processes`]), placed once
//! its keeper traces it; named at its entry point, a process would run its first
//! milliseconds, and a short one its whole life, untraced. So the `process_exec` program
//! reports each exec of a watched executable at once (a ring buffer that wakes this thread),
//! and this thread seizes the process (`PTRACE_SEIZE`, `PTRACE_INTERRUPT`) while the kernel's
//! dynamic loader is still mapping its libraries: measured here, 60 of 60 execs of a C++
//! fixture were stopped inside `ld.so`, also with three busy loops on the two CPUs. A ptrace
//! stop is not seen by the process's parent (a shell does not report a stopped job).
//!
//! The daemon's loop takes the held processes ([`ExecHold::held`]) and traces each: it forks
//! its keeper, which writes the pid into this thread's handover pipe once it is ready to
//! seize it, and then tries to seize it without a pause, at a real-time priority; this thread
//! (real-time one step higher, so that it runs even on one CPU) lets the process go as soon as
//! it reads that, and the keeper keeps it stopped until its probes are in place. The process
//! runs between the two for microseconds, still inside the loader: measured with three busy
//! loops on the two CPUs, 64 of 64 launches of a C++ fixture were recorded whole. (The
//! daemon's loop asks this thread to let go too, but only once the keeper has reported: asked
//! as soon as the keeper was forked, it let 4 of 48 such launches run to their entry point
//! while their keepers got ready, and in CI one to its end, never traced.) Where
//! real-time scheduling is refused, both take the highest ordinary priority, and the
//! accounting still holds: whether a process reached its entry point before its keeper
//! stopped it is read from `process_start`'s map (`ExecHold::entered`), and such a process is
//! counted as traced late. If fdr-profiled dies, the kernel detaches this thread's tracees and
//! the process runs on untraced; a process not taken within [`HOLD_LIMIT`] is let go too (it
//! is then traced from where its entry point names it).
use crate::kernel::bpf::{ExecReports, Tracer};
use crate::traced::mappings::FileId;
use anyhow::{Context as _, Result};
use std::collections::HashMap;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a process is held for the daemon's loop to trace it.
pub const HOLD_LIMIT: Duration = Duration::from_secs(2);

/// The thread that holds new processes, and what it shares with the daemon's loop.
pub struct ExecHold {
    shared: Arc<Shared>,
    commands: mpsc::Sender<Command>,
    /// Wakes the thread for a command (an eventfd).
    wake: Arc<OwnedFd>,
    /// Where a keeper ready to seize a held process writes its pid (4 bytes): the thread lets
    /// it go at once, without a round through the daemon's loop.
    handover: OwnedFd,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    /// The executables watched, by tag.
    watched: Mutex<HashMap<u32, FileId>>,
    /// Processes held and not taken yet: `(tag, pid, whether it had run its entry point
    /// when it was stopped)`.
    held: Mutex<Vec<(u32, u32, bool)>>,
    /// Processes this thread traces now (from just before it seizes one until it lets it go).
    holding: Mutex<std::collections::HashSet<u32>>,
    /// Processes held so far, and let go unclaimed after [`HOLD_LIMIT`].
    counts: Mutex<(u64, u64)>,
    /// The processes that ran the watched binary's entry point since their exec.
    entered: Mutex<Option<aya::maps::HashMap<aya::maps::MapData, u32, u8>>>,
}

impl Shared {
    /// Forgets process `pid`: not held, not to be taken any more (it ended, or was let go
    /// unclaimed).
    fn forget(&self, pid: u32) {
        self.held.lock().unwrap().retain(|(_, p, _)| *p != pid);
        self.holding.lock().unwrap().remove(&pid);
    }
}

enum Command {
    /// Let this process go, then answer.
    LetGo(u32, mpsc::Sender<()>),
}

/// A process this thread traces: since when, and the signal to give it back on release.
struct Holding {
    since: Instant,
    threads: Vec<(u32, i32)>,
}

/// The one holder of this fdr-profiled (the tracer has one `process_exec` ring): started at
/// the first call, then watching `executable` (named with `tag`) too.
pub fn shared(tracer: &mut Tracer, executable: &Path, tag: u32) -> Result<Arc<ExecHold>> {
    static SHARED: Mutex<Option<Arc<ExecHold>>> = Mutex::new(None);
    let id = crate::traced::mappings::file_id(executable).context("the executable is gone")?;
    let ring = tracer.watch_execs(executable, tag)?;
    let mut shared = SHARED.lock().unwrap();
    if let Some(reports) = ring {
        *shared = Some(Arc::new(ExecHold::start(reports)?));
    }
    let hold = shared
        .clone()
        .context("the ring of execs was taken before, by a tracer gone since")?;
    hold.watch(tag, id);
    Ok(hold)
}

impl ExecHold {
    /// Starts the thread on `process_exec`'s ring.
    pub fn start(reports: ExecReports) -> Result<ExecHold> {
        // SAFETY: plain system call.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("eventfd");
        }
        // SAFETY: a fresh descriptor, owned from here on.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let mut ends = [0; 2];
        // SAFETY: valid pointer to two ints.
        if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(std::io::Error::last_os_error()).context("pipe");
        }
        // SAFETY: fresh descriptors, owned from here on.
        let (handover_read, handover) =
            unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
        let shared = Arc::new(Shared::default());
        let ExecReports { execs, entered } = reports;
        *shared.entered.lock().unwrap() = Some(entered);
        let (commands, receiver) = mpsc::channel();
        let thread = {
            let shared = shared.clone();
            let wake = wake.clone();
            std::thread::Builder::new()
                .name("fdr-exec-hold".into())
                .spawn(move || hold_loop(execs, &shared, &wake, &handover_read, &receiver))
                .context("starting the exec holder's thread")?
        };
        Ok(ExecHold {
            shared,
            commands,
            wake,
            handover,
            thread: Some(thread),
        })
    }

    /// Holds the processes that exec `executable` from now on, named with `tag`.
    pub fn watch(&self, tag: u32, executable: FileId) {
        self.shared.watched.lock().unwrap().insert(tag, executable);
    }

    /// Holds no more processes for `tag` (its tracing ended), and lets go those held for it
    /// and not taken.
    pub fn unwatch(&self, tag: u32) {
        self.shared.watched.lock().unwrap().remove(&tag);
        for (pid, _) in self.held(tag) {
            self.let_go(pid);
        }
    }

    /// The processes held since the last call that exec'd the executable watched with
    /// `tag`, oldest first, each with whether it had run the executable's entry point before
    /// it could be stopped (a busy host ran it first: its first calls will not be recorded).
    pub fn held(&self, tag: u32) -> Vec<(u32, bool)> {
        let mut held = self.shared.held.lock().unwrap();
        let mine = held
            .iter()
            .filter(|(t, ..)| *t == tag)
            .map(|&(_, pid, late)| (pid, late))
            .collect();
        held.retain(|(t, ..)| *t != tag);
        mine
    }

    /// Whether process `pid` has run the watched executable's entry point since its exec: a
    /// process held, then let go for its keeper, may have run that far before the keeper
    /// stopped it (a busy host): its first calls are then not recorded.
    pub fn entered(&self, pid: u32) -> bool {
        self.shared
            .entered
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|map| map.get(&pid, 0).is_ok())
    }

    /// Whether this thread traces process `pid` now (held, or being stopped).
    pub fn holds(&self, pid: u32) -> bool {
        self.shared.holding.lock().unwrap().contains(&pid)
    }

    /// Processes held so far, and those let go because nothing took them in time.
    pub fn counts(&self) -> (u64, u64) {
        *self.shared.counts.lock().unwrap()
    }

    /// Where a keeper writes the pid of the held process it is ready to seize (4 bytes).
    pub fn handover_fd(&self) -> std::os::fd::RawFd {
        self.handover.as_raw_fd()
    }

    /// Lets process `pid` go (it runs on until its keeper seizes it); returns once it is.
    pub fn let_go(&self, pid: u32) {
        let (answer, answered) = mpsc::channel();
        if self.commands.send(Command::LetGo(pid, answer)).is_ok() {
            self.wake();
            let _ = answered.recv_timeout(Duration::from_secs(1));
        }
    }

    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

impl Drop for ExecHold {
    /// Stops the thread; it lets every process it holds go.
    fn drop(&mut self) {
        let (commands, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.commands, commands));
        self.wake();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn hold_loop(
    mut ring: aya::maps::RingBuf<aya::maps::MapData>,
    shared: &Shared,
    wake: &OwnedFd,
    handover: &OwnedFd,
    commands: &mpsc::Receiver<Command>,
) {
    // The process runs its loader until this thread has stopped it: on a busy host the
    // scheduler must run this thread first when an exec wakes it. It works microseconds per
    // exec of a watched binary.
    // Real-time above the keepers that wait for it to let a process go (see
    // `ptrace::seize_all_from`); else the highest ordinary priority.
    if !super::ptrace::set_realtime(super::ptrace::HANDOVER_PRIORITY + 1) {
        // SAFETY: plain system call on this thread.
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, -20);
        }
    }
    let mut holding: HashMap<u32, Holding> = HashMap::new();
    loop {
        let mut fds = [
            libc::pollfd {
                fd: ring.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: handover.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: three valid pollfds.
        unsafe { libc::poll(fds.as_mut_ptr(), 3, 100) };
        if fds[2].revents != 0 {
            // Keepers ready: their processes go first, before anything else.
            let mut pids = [0u32; 64];
            // SAFETY: reads into a valid buffer of 256 bytes from our nonblocking pipe.
            let n = unsafe { libc::read(handover.as_raw_fd(), pids.as_mut_ptr().cast(), 256) };
            for &pid in &pids[..(n.max(0) as usize / 4)] {
                if let Some(held) = holding.remove(&pid) {
                    release(&held);
                }
                shared.holding.lock().unwrap().remove(&pid);
            }
        }
        if fds[1].revents != 0 {
            let mut count = 0u64;
            // SAFETY: reads 8 bytes into a valid u64 from our eventfd.
            unsafe { libc::read(wake.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
        }
        while let Some(item) = ring.next() {
            let Ok(bytes) = <[u8; 8]>::try_from(&item[..]) else {
                continue;
            };
            let report = u64::from_ne_bytes(bytes);
            let (tag, pid) = ((report >> 32) as u32, report as u32);
            if holding.contains_key(&pid) {
                continue;
            }
            let watched = shared.watched.lock().unwrap().get(&tag).copied();
            // The program compared inode numbers only: the device is checked here.
            if watched.is_none() || crate::traced::mappings::executable_id(pid) != watched {
                continue;
            }
            shared.holding.lock().unwrap().insert(pid);
            let Some(threads) = hold(pid) else {
                shared.holding.lock().unwrap().remove(&pid);
                continue;
            };
            {
                // Stopped now: had it run the entry point already?
                let late = shared
                    .entered
                    .lock()
                    .unwrap()
                    .as_ref()
                    .is_some_and(|map| map.get(&pid, 0).is_ok());
                holding.insert(
                    pid,
                    Holding {
                        since: Instant::now(),
                        threads,
                    },
                );
                shared.held.lock().unwrap().push((tag, pid, late));
                shared.counts.lock().unwrap().0 += 1;
            }
        }
        loop {
            match commands.try_recv() {
                Ok(Command::LetGo(pid, answer)) => {
                    if let Some(held) = holding.remove(&pid) {
                        release(&held);
                    }
                    shared.holding.lock().unwrap().remove(&pid);
                    let _ = answer.send(());
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    for held in holding.values() {
                        release(held);
                    }
                    return;
                }
            }
        }
        // A held process killed meanwhile is a zombie only this thread can reap: its parent
        // learns of its end once its tracer has waited for it.
        holding.retain(|&pid, _| {
            if reap(pid) {
                shared.forget(pid);
                false
            } else {
                true
            }
        });
        let expired: Vec<u32> = holding
            .iter()
            .filter(|(_, h)| h.since.elapsed() > HOLD_LIMIT)
            .map(|(pid, _)| *pid)
            .collect();
        for pid in expired {
            if let Some(held) = holding.remove(&pid) {
                release(&held);
                shared.forget(pid);
                shared.counts.lock().unwrap().1 += 1;
            }
        }
    }
}

/// Seizes process `pid` (one thread, just after its exec) and stops it; `None` when it
/// cannot be (gone, or another tracer has it).
fn hold(pid: u32) -> Option<Vec<(u32, i32)>> {
    // No options: the keeper sets its own when it seizes the process.
    // SAFETY: plain system call.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            pid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    if r != 0 {
        return None;
    }
    // Just after its exec a process has one thread, whose id is the process's.
    Some(super::ptrace::stop_all(&[pid]))
}

/// Lets a held process go, each thread with the signal it had when it was stopped. One that
/// was killed meanwhile cannot be detached: it is reaped (see [`reap`]).
fn release(held: &Holding) {
    for &(tid, signal) in &held.threads {
        // SAFETY: plain system call on a tracee of this thread.
        let detached = unsafe {
            libc::ptrace(
                libc::PTRACE_DETACH,
                tid as libc::pid_t,
                std::ptr::null_mut::<libc::c_void>(),
                signal as usize as *mut libc::c_void,
            )
        } == 0;
        if !detached && !reap(tid) {
            detach_running(tid, signal);
        }
    }
}

/// Detaches a tracee of this thread that is not in a stop (`PTRACE_DETACH` needs one): stops
/// it first, waiting for the stop for at most 100 ms. Left traced by this thread only if it
/// does not stop within that (then it is let go at this thread's end, by the kernel).
fn detach_running(tid: u32, signal: i32) {
    super::ptrace::request(libc::PTRACE_INTERRUPT, tid, 0);
    let deadline = Instant::now() + Duration::from_millis(100);
    while Instant::now() < deadline {
        match super::ptrace::try_wait(tid) {
            Ok(Some(status)) => {
                if libc::WIFSTOPPED(status) {
                    // A signal's delivery stop hands that signal on; the interrupt's, the one
                    // kept.
                    let deliver = match super::ptrace::signal_of_stop(status) {
                        0 => signal,
                        stop => stop,
                    };
                    super::ptrace::request(libc::PTRACE_DETACH, tid, deliver);
                }
                return;
            }
            Ok(None) => std::thread::sleep(Duration::from_micros(200)),
            Err(_) => return,
        }
    }
}

/// Whether held process `pid` has ended, reaped now: a traced process that exits stays a
/// zombie, unseen by its parent, until its tracer waits for it (the kernel then tells the
/// parent). Does not wait.
fn reap(pid: u32) -> bool {
    match super::ptrace::try_wait(pid) {
        Ok(Some(status)) => libc::WIFEXITED(status) || libc::WIFSIGNALED(status),
        Ok(None) => false,
        // Not ours any more (reaped, detached): gone as far as this thread is concerned.
        Err(err) => err.raw_os_error() == Some(libc::ECHILD),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead as _, BufReader};
    use std::process::{Command, Stdio};

    /// A process of someone else's (a shell's child, as a held process is its parent's),
    /// stopped by [`hold`]; the shell's stdout, which says the pid, then the child's end.
    fn held_child_of_a_shell() -> (
        std::process::Child,
        BufReader<std::process::ChildStdout>,
        u32,
    ) {
        let mut shell = Command::new("sh")
            .args(["-c", "sleep 100 & echo $!; wait $!; echo \"ended $?\""])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(shell.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let pid: u32 = line.trim().parse().unwrap();
        // Its exec done (the shell's `sleep` runs), as when `process_exec` reports it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::read_link(format!("/proc/{pid}/exe"))
            .is_ok_and(|exe| !exe.to_string_lossy().contains("sleep"))
        {
            assert!(Instant::now() < deadline, "sleep did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(hold(pid).is_some(), "held (run the tests as root)");
        assert_eq!(tracer(pid), Some(gettid()));
        (shell, out, pid)
    }

    fn tracer(pid: u32) -> Option<u32> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .and_then(|t| t.trim().parse().ok())
    }

    fn gettid() -> u32 {
        // SAFETY: plain system call.
        unsafe { libc::gettid() as u32 }
    }

    fn last_line(
        shell: &mut std::process::Child,
        out: &mut BufReader<std::process::ChildStdout>,
    ) -> String {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        shell.wait().unwrap();
        line.trim().to_owned()
    }

    #[test]
    fn a_held_process_killed_is_reaped_and_its_parent_learns_of_its_end() {
        let (mut shell, mut out, pid) = held_child_of_a_shell();
        // SAFETY: plain system call.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !reap(pid) {
            assert!(Instant::now() < deadline, "never reaped");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Unreaped, the shell would wait for ever: a traced zombie is its tracer's first.
        assert_eq!(last_line(&mut shell, &mut out), "ended 137");
    }

    #[test]
    fn a_held_process_let_go_runs_on_untraced() {
        let (mut shell, mut out, pid) = held_child_of_a_shell();
        assert!(!reap(pid), "alive, held");
        let threads = hold_threads(pid);
        release(&Holding {
            since: Instant::now(),
            threads,
        });
        assert_eq!(tracer(pid), Some(0));
        // Stopped no more: it ends as any process does.
        // SAFETY: plain system call.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        assert_eq!(last_line(&mut shell, &mut out), "ended 143");
    }

    /// What `hold` returned for a process of one thread stopped by an interrupt.
    fn hold_threads(pid: u32) -> Vec<(u32, i32)> {
        vec![(pid, 0)]
    }

    #[test]
    fn a_held_process_running_again_is_still_let_go() {
        // A tracee not in a stop cannot be detached as it is: `release` stops it first.
        let (mut shell, mut out, pid) = held_child_of_a_shell();
        super::super::ptrace::request(libc::PTRACE_CONT, pid, 0);
        release(&Holding {
            since: Instant::now(),
            threads: hold_threads(pid),
        });
        assert_eq!(tracer(pid), Some(0));
        // SAFETY: plain system call.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        assert_eq!(last_line(&mut shell, &mut out), "ended 143");
    }
}
