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
use crate::kernel::bpf::{Attachment, PodRepairState, Scope, Tracer};
use crate::plan::catches::CatchPoint;
use crate::session::summary::RepairsByThread;
use crate::traced::mappings::FileId;
use anyhow::{bail, Context as _, Result};
use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::{event_kind, repair_state};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead as _, Read as _, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, RawFd};
use std::path::PathBuf;
use std::time::Instant;

/// The throw and catch stops of one process: the probes placed (to remove them again), and
/// what the [`Keeper`] needs to hold them and to place the same stops in the processes the
/// traced one forks.
pub struct UnwindStops {
    /// The links' descriptors: the keeper keeps them open for as long as it traces.
    links: Vec<RawFd>,
    /// The `unwind_stop` program as `uprobe_multi` links run it, and the `repair_release`
    /// task iterator program.
    program: RawFd,
    release_program: RawFd,
    /// Each object's points, with the object open: the keeper places a child's stops through
    /// `/proc/self/fd/N`, on the very files probed here, whatever happens to their paths.
    objects: Vec<StopPoints>,
}

/// The throw and catch points (`event_kind::THROW`, `CATCH`) of the objects looked at so far,
/// by file (device and inode): finding them reads an ELF symbol table each, 100 ms and more for
/// a C++ runtime, which a process that starts must not wait for each time.
#[derive(Default)]
pub struct PointCache(HashMap<FileId, std::rc::Rc<Vec<(CatchPoint, u8)>>>);

impl PointCache {
    /// The throw and catch points of `object` (none if it cannot be read).
    pub fn points(&mut self, object: &std::path::Path) -> std::rc::Rc<Vec<(CatchPoint, u8)>> {
        let read = || {
            std::rc::Rc::new(
                crate::plan::catches::throw_points(object)
                    .into_iter()
                    .map(|p| (p, event_kind::THROW))
                    .chain(
                        crate::plan::catches::catch_points(object)
                            .into_iter()
                            .map(|p| (p, event_kind::CATCH)),
                    )
                    .collect(),
            )
        };
        match crate::traced::mappings::file_id(object) {
            Some(id) => self.0.entry(id).or_insert_with(read).clone(),
            None => read(),
        }
    }
}

/// The throw and catch points of one object.
struct StopPoints {
    file: File,
    offsets: Vec<u64>,
    cookies: Vec<u64>,
}

/// Probes the unwinder's throw functions and the catch functions of `image` (the traced
/// process's objects) for `scope`; returns them (to remove them again) and what the
/// [`Keeper`] needs of them.
/// Errors when the image has no unwinder (then nothing can throw and `--exits return` does
/// the same at no cost), or when the probes are not `uprobe_multi` links; nothing placed here
/// stays in place then.
pub fn attach(
    tracer: &mut Tracer,
    image: &[PathBuf],
    scope: Scope,
    cache: &mut PointCache,
) -> Result<(Attachment, UnwindStops)> {
    let can_throw = image.iter().any(|o| {
        cache
            .points(o)
            .iter()
            .any(|(_, kind)| *kind == event_kind::THROW)
    });
    if !can_throw {
        bail!("--exits repair: no unwinder (_Unwind_RaiseException) in the image: nothing can throw, use --exits return");
    }
    // Only what is placed here goes to the keeper.
    drop(tracer.take_attachment());
    let placed = place_unwind_stops(tracer, image, scope, cache);
    let attachment = tracer.take_attachment();
    let stops = placed.and_then(|objects| {
        let links = tracer.link_fds(&attachment).context(
            "--exits repair needs uprobe_multi links (Linux 6.6 or later): a perf-event probe cannot be handed to the repair keeper",
        )?;
        Ok(UnwindStops {
            links,
            program: tracer.unwind_stop_program_fd()?,
            release_program: tracer.release_program_fd()?,
            objects,
        })
    });
    match stops {
        Ok(stops) => Ok((attachment, stops)),
        Err(err) => {
            tracer.detach(attachment);
            Err(err)
        }
    }
}

/// Places the `unwind_stop` probes; returns each object's points.
fn place_unwind_stops(
    tracer: &mut Tracer,
    image: &[PathBuf],
    scope: Scope,
    cache: &mut PointCache,
) -> Result<Vec<StopPoints>> {
    let mut objects = Vec::new();
    for object in image {
        let points = cache.points(object);
        if points.is_empty() {
            continue;
        }
        let file = File::open(object).with_context(|| format!("opening {}", object.display()))?;
        let mut stops = StopPoints {
            file,
            offsets: Vec::new(),
            cookies: Vec::new(),
        };
        for (point, kind) in points.iter() {
            let cookie = tracer
                .attach_unwind_stop(object, point.file_offset, *kind, scope)
                .with_context(|| format!("probing {} in {}", point.name, object.display()))?;
            stops.offsets.push(point.file_offset);
            stops.cookies.push(cookie);
        }
        objects.push(stops);
    }
    Ok(objects)
}

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
}

impl Tracee {
    fn pid(&self) -> u32 {
        match self {
            Tracee::Launched(pid) | Tracee::Running(pid) => *pid,
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
    pub fn start(
        tracee: Tracee,
        (repairs, repairs_fd): (BpfHashMap<MapData, u32, PodRepairState>, RawFd),
        stops: &UnwindStops,
    ) -> Result<Keeper> {
        let mut ends = [0; 2];
        // SAFETY: valid pointer to two ints.
        if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error()).context("--exits repair: pipe");
        }
        // SAFETY: fresh descriptors from pipe2, owned from here on.
        let (read_end, write_end) =
            unsafe { (File::from_raw_fd(ends[0]), File::from_raw_fd(ends[1])) };
        let mut keep: Vec<RawFd> = stops.links.clone();
        keep.extend([
            repairs_fd,
            write_end.as_raw_fd(),
            stops.program,
            stops.release_program,
        ]);
        keep.extend(stops.objects.iter().map(|o| o.file.as_raw_fd()));
        let running = matches!(tracee, Tracee::Running(..));
        // Known before the fork, the keeper inherits it.
        kernel_has_syscall_trampoline();
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        // SAFETY: no other thread exists (see above), so the child may run any code.
        match unsafe { libc::fork() } {
            -1 => Err(std::io::Error::last_os_error()).context("--exits repair: fork"),
            0 => {
                let code = keeper_main(tracee, parent, repairs, stops, write_end, &keep);
                // SAFETY: the keeper ends here, without running the parent's destructors.
                unsafe { libc::_exit(code) }
            }
            pid => {
                drop(write_end);
                drop(repairs);
                let mut keeper = Keeper {
                    pid,
                    running,
                    reports: std::io::BufReader::new(read_end),
                    let_go: None,
                };
                let mut line = String::new();
                let _ = keeper.reports.read_line(&mut line);
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
    repairs: BpfHashMap<MapData, u32, PodRepairState>,
    stops: &UnwindStops,
    mut reports: File,
    keep: &[RawFd],
) -> i32 {
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
        libc::prctl(libc::PR_SET_NAME, c"fdr-repair".as_ptr());
    }
    close_all_but(keep);
    let running = matches!(tracee, Tracee::Running(..));
    if running {
        listen_for_release(parent);
    }
    let command = tracee.pid();
    let seized = match &tracee {
        Tracee::Launched(pid) => seize(*pid).map(|()| vec![*pid]),
        Tracee::Running(pid) => seize_all(*pid),
    };
    let line = match &seized {
        Ok(_) => "tracing\n".to_owned(),
        Err(err) => format!("{err:#}\n"),
    };
    let _ = reports.write_all(line.as_bytes());
    let Ok(threads) = seized else {
        return 1;
    };
    let mut reports = Reports(reports);
    match Repairer::new(command, threads, repairs, stops).serve(running, &mut reports) {
        Ok(()) => 0,
        Err(err) => {
            errln!("fdr-profiled: repair keeper: {err:#}");
            1
        }
    }
}

/// The first word of the line by which a keeper says it lets its process go by itself.
const LET_GO: &str = "let-go ";

/// What the keeper tells fdr-profiled, one line each (fdr-profiled may be gone: then nobody
/// reads it, which is fine).
struct Reports(File);

impl Reports {
    /// The process is let go by the keeper itself, and why (before it is).
    fn let_go(&mut self, why: &str) {
        let line = format!("{LET_GO}{}\n", crate::console::one_line(why));
        let _ = self.0.write_all(line.as_bytes());
    }

    /// What the repairs did: the keeper's last word.
    fn repairs(&mut self, stats: &RepairsByThread) {
        let line = serde_json::to_string(stats).unwrap_or_default() + "\n";
        let _ = self.0.write_all(line.as_bytes());
    }
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

fn seize(pid: u32) -> Result<()> {
    // Threads, forked processes (see `Repairer::children`) and `exec` (a forked child that
    // runs another program is let go).
    // TRACESYSGOOD: the stops of a pass through the return trampoline (see
    // `Repairer::drop_dead_instances`) are told from signals.
    let options = libc::PTRACE_O_TRACECLONE
        | libc::PTRACE_O_TRACEFORK
        | libc::PTRACE_O_TRACEEXEC
        | libc::PTRACE_O_TRACESYSGOOD;
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
fn seize_all(pid: u32) -> Result<Vec<u32>> {
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
            match seize(tid) {
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

/// How the keeper of a running process is asked to let it go, and how often at least it
/// looks for the request.
const RELEASE_SIGNAL: libc::c_int = libc::SIGUSR2;
const RELEASE_POLL: std::time::Duration = std::time::Duration::from_millis(100);
/// How long fdr-profiled waits for the keeper to have let the process go.
pub const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Set by [`RELEASE_SIGNAL`]'s handler.
static RELEASE_ASKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A pidfd of fdr-profiled, readable once all of it is gone (see [`release_due`]); -1 when
/// there is none.
static PARENT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

extern "C" fn on_release_signal(_: libc::c_int) {
    RELEASE_ASKED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether the keeper of a running process must let it go now: fdr-profiled asked (having
/// removed its probes first), or fdr-profiled is gone, every thread of it. Not as soon as the
/// thread that forked the keeper is gone (a parent-death signal would come then): while another
/// thread of fdr-profiled lives, its probes are still in place and go on hooking frames, which
/// a keeper that had let go would leave for an exception to find.
fn release_due() -> bool {
    if RELEASE_ASKED.load(std::sync::atomic::Ordering::SeqCst) {
        return true;
    }
    let fd = PARENT.load(std::sync::atomic::Ordering::SeqCst);
    if fd < 0 {
        return false;
    }
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait; a pidfd is readable once its process has exited.
    unsafe { libc::poll(&mut poll, 1, 0) > 0 }
}

/// The keeper of a running process lets it go when fdr-profiled asks ([`RELEASE_SIGNAL`]) or
/// is gone (see [`release_due`]). A wait for the tracee's next stop is interrupted by the
/// request, and by a timer every [`RELEASE_POLL`] (a request that came just before a wait
/// began, and fdr-profiled's end, are seen then).
fn listen_for_release(parent: libc::pid_t) {
    // SAFETY: installing async-signal-safe handlers (an atomic store, nothing) and a timer.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_release_signal as extern "C" fn(libc::c_int) as usize;
        // No SA_RESTART: the wait returns EINTR.
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(RELEASE_SIGNAL, &action, std::ptr::null_mut());
        let mut tick: libc::sigaction = std::mem::zeroed();
        tick.sa_sigaction = on_tick as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut tick.sa_mask);
        libc::sigaction(libc::SIGALRM, &tick, std::ptr::null_mut());
        let every = libc::timeval {
            tv_sec: 0,
            tv_usec: RELEASE_POLL.as_micros() as libc::suseconds_t,
        };
        let timer = libc::itimerval {
            it_interval: every,
            it_value: every,
        };
        libc::setitimer(libc::ITIMER_REAL, &timer, std::ptr::null_mut());
        let pidfd = libc::syscall(libc::SYS_pidfd_open, parent, 0);
        if pidfd >= 0 && libc::getppid() == parent {
            PARENT.store(pidfd as i32, std::sync::atomic::Ordering::SeqCst);
        } else {
            // fdr-profiled is gone already: nobody will ask.
            on_release_signal(RELEASE_SIGNAL);
        }
    }
}

extern "C" fn on_tick(_: libc::c_int) {}

/// The tracer's state.
struct Repairer<'a> {
    pid: u32,
    /// Every thread it traces (seized, or traced from its creation), until its exit.
    threads: std::collections::BTreeSet<u32>,
    /// The processes the traced one forked (and theirs, and so on), with the throw and catch
    /// stops placed for each: a child has the frames it inherited hooked, and the kernel
    /// hooks its own calls too (a return probe hooks a frame wherever its breakpoint fires,
    /// whatever process it is filtered to), so it is repaired as its parent is.
    children: HashMap<u32, Vec<crate::kernel::uprobe_multi::MultiLink>>,
    /// Whether the traced process has exited (its forked processes may live on).
    exited: bool,
    stops: &'a UnwindStops,
    repairs: BpfHashMap<MapData, u32, PodRepairState>,
    /// The kernel's return-probe trampoline in the command (its `[uprobes]` mapping, at the
    /// same address in a forked child), once known.
    trampoline: Option<u64>,
    /// By thread: the slots restored at its last throws, with the address written.
    restored: HashMap<u32, Vec<(u64, u64)>>,
    /// What the repairs did, by thread.
    stats: RepairsByThread,
}

/// `PTRACE_EVENT_*` (uapi values).
const EVENT_FORK: i32 = 1;
const EVENT_EXEC: i32 = 4;
const EVENT_STOP: i32 = 128;

impl<'a> Repairer<'a> {
    fn new(
        pid: u32,
        threads: Vec<u32>,
        repairs: BpfHashMap<MapData, u32, PodRepairState>,
        stops: &'a UnwindStops,
    ) -> Repairer<'a> {
        Repairer {
            pid,
            threads: threads.into_iter().collect(),
            children: HashMap::new(),
            exited: false,
            stops,
            repairs,
            trampoline: None,
            restored: HashMap::new(),
            stats: RepairsByThread::new(),
        }
    }

    /// Serves every stop of every thread of the command (and of the processes it forks) until
    /// they have all exited, or, for a running process (`running`), until it is asked to let
    /// it go (`release`: see [`Tracee::Running`]). `report` gets what the repairs did once:
    /// when the command exits (a launched command: fdr-profiled waits for it, not for the
    /// processes it left), or when the process is let go or gone.
    fn serve(mut self, running: bool, reports: &mut Reports) -> Result<()> {
        let mut reported = false;
        loop {
            if running && release_due() {
                self.release()?;
                if !reported {
                    reports.repairs(&self.stats);
                }
                return Ok(());
            }
            if self.exited && self.threads.is_empty() {
                if !reported {
                    reports.repairs(&self.stats);
                }
                return Ok(());
            }
            let (tid, status) = match wait_any()? {
                Wait::Stop(tid, status) => (tid, status),
                Wait::Interrupted => continue,
                Wait::NoTracee => {
                    self.exited = true;
                    self.threads.clear();
                    continue;
                }
            };
            if self.exited(tid, status) {
                if tid == self.pid {
                    self.exited = true;
                    // How it ended is fdr-profiled's to read (the command's parent, or the
                    // pidfd of --pid).
                    if !running && !reported {
                        reports.repairs(&self.stats);
                        reported = true;
                    }
                }
                continue;
            }
            if !libc::WIFSTOPPED(status) {
                continue;
            }
            if self.threads.insert(tid) && is_process_leader(tid) && tid != self.pid {
                // A forked child's first stop, before its parent's fork event was seen.
                self.follow(tid, None);
            }
            let signal = libc::WSTOPSIG(status);
            match status >> 16 {
                0 => {
                    self.signal_stop(tid, signal, true);
                }
                EVENT_STOP => {
                    if matches!(
                        signal,
                        libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
                    ) {
                        // A group stop: stay stopped until SIGCONT, as without a tracer.
                        request(libc::PTRACE_LISTEN, tid, 0);
                    } else {
                        // A new thread's or process's first stop (SIGTRAP), or an interrupt.
                        request(libc::PTRACE_CONT, tid, 0);
                    }
                }
                EVENT_FORK => {
                    if let Some(child) = event_message(tid) {
                        self.follow(child, Some(tid));
                    }
                    request(libc::PTRACE_CONT, tid, 0);
                }
                EVENT_EXEC if tid == self.pid => {
                    // A program that raised the process's privileges must not run under a
                    // root tracer: let go before its first instruction.
                    if let Some(why) = crate::traced::process::exec_raised_privileges(tid) {
                        return self.let_go_at_exec(&why, running, reports);
                    }
                    request(libc::PTRACE_CONT, tid, 0);
                }
                EVENT_EXEC => {
                    // A forked child now runs another program: its frames went with its old
                    // image. Its stops go first, so that none stops it once untraced.
                    self.children.remove(&tid);
                    self.threads.remove(&tid);
                    self.restored.remove(&tid);
                    request(libc::PTRACE_DETACH, tid, 0);
                }
                _ => request(libc::PTRACE_CONT, tid, 0),
            }
        }
    }

    /// The traced process, stopped at its exec event, now runs a program that raised its
    /// privileges (`why`: which, and how): under a root tracer the kernel keeps them, so the
    /// keeper lets it go before its first instruction. fdr-profiled is told first: for a
    /// running process it removes its probes of the process and asks for the release, which
    /// is waited for (at most [`RELEASE_WAIT`]); then the keeper's own throw and catch stops go
    /// (none can stop the new program), its repair states are dropped, and it is detached from
    /// its exec stop. Nothing is written into the new program: no frame of it was hooked yet.
    /// The processes it forked are let go as at a release; then the keeper reports and ends.
    fn let_go_at_exec(&mut self, why: &str, running: bool, reports: &mut Reports) -> Result<()> {
        let pid = self.pid;
        reports.let_go(&format!(
            "process {pid} exec'd {why}: its tracer let it go before its first instruction"
        ));
        if running {
            let deadline = Instant::now() + RELEASE_WAIT;
            while !release_due() && Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        // The children's trampoline is the one they inherited (the new image has none yet).
        let _ = self.trampoline_of(self.children.keys().next().copied());
        for &fd in &self.stops.links {
            // SAFETY: the keeper's own copies of the links; nothing uses them after this.
            unsafe { libc::close(fd) };
        }
        let _ = self.repairs.remove(&pid);
        self.threads.remove(&pid);
        self.restored.remove(&pid);
        self.exited = true;
        request(libc::PTRACE_DETACH, pid, 0);
        // Its forked processes, and its old threads' ends still to be collected.
        if !self.threads.is_empty() {
            self.release()?;
        }
        reports.repairs(&self.stats);
        Ok(())
    }

    /// Follows the process `child` that a traced thread (`parent`, when known) forked: places
    /// its throw and catch stops (once), before it runs.
    fn follow(&mut self, child: u32, parent: Option<u32>) {
        if let Some(parent) = parent {
            self.stats.entry(parent).or_default().forks_followed += 1;
        }
        if child == self.pid || self.children.contains_key(&child) {
            return;
        }
        let Some(pid) = std::num::NonZeroU32::new(child) else {
            return;
        };
        let mut links = Vec::new();
        for object in &self.stops.objects {
            let path = PathBuf::from(format!("/proc/self/fd/{}", object.file.as_raw_fd()));
            // SAFETY: the program's descriptor stays open for the keeper's life (kept).
            let program = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.stops.program) };
            match crate::kernel::uprobe_multi::attach(
                program,
                &path,
                &object.offsets,
                &object.cookies,
                Some(pid),
                false,
            ) {
                Ok(link) => links.push(link),
                Err(err) => errln!(
                    "fdr-profiled: repair keeper: warning: process {child} (forked): its throws cannot be repaired ({err}); one through a hooked frame ends it"
                ),
            }
        }
        self.children.insert(child, links);
    }

    /// Whether `status` says `tid` is gone; forgets it then.
    fn exited(&mut self, tid: u32, status: i32) -> bool {
        let gone = libc::WIFEXITED(status) || libc::WIFSIGNALED(status);
        if gone {
            self.restored.remove(&tid);
            self.threads.remove(&tid);
            self.children.remove(&tid);
        }
        gone
    }

    /// Lets a running process, and the processes it forked, go: stops every thread
    /// (`PTRACE_INTERRUPT`; a repair due meanwhile is made, a signal meant for the program is
    /// kept for the detach), has the `repair_release` iterator copy each thread's pending
    /// return-probe instances from the kernel, puts the original return address back into
    /// every live slot that still holds the trampoline, and detaches every thread. The frames
    /// so released return straight to their callers; the kernel drops their instances as it
    /// drops those a `longjmp` left.
    fn release(&mut self) -> Result<()> {
        // Signal to deliver at the detach, by stopped thread.
        let mut stopped: HashMap<u32, i32> = HashMap::new();
        for &tid in &self.threads {
            request(libc::PTRACE_INTERRUPT, tid, 0);
        }
        while self.threads.iter().any(|t| !stopped.contains_key(t)) {
            let (tid, status) = match wait_any()? {
                Wait::Stop(tid, status) => (tid, status),
                Wait::Interrupted => continue,
                Wait::NoTracee => {
                    self.threads.clear();
                    break;
                }
            };
            if self.exited(tid, status) {
                stopped.remove(&tid);
                continue;
            }
            if !libc::WIFSTOPPED(status) {
                continue;
            }
            if self.threads.insert(tid) {
                // Created meanwhile: its first stop is this one.
                stopped.insert(tid, 0);
                continue;
            }
            let signal = libc::WSTOPSIG(status);
            let deliver = match status >> 16 {
                0 => {
                    if self.signal_stop(tid, signal, false) {
                        // Ours: repaired, and resumed; stop it again.
                        request(libc::PTRACE_INTERRUPT, tid, 0);
                        continue;
                    }
                    signal
                }
                // An interrupt, a group stop, a clone, a fork: stopped all the same (a
                // child forked meanwhile is stopped at its first stop and traced).
                _ => 0,
            };
            // A second stop of one already stopped cannot come: it is not resumed.
            stopped.insert(tid, deliver);
        }
        // Every thread is stopped: their instances cannot change until the detach.
        let processes: Vec<u32> = std::iter::once(self.pid)
            .filter(|_| !self.exited)
            .chain(self.children.keys().copied())
            .collect();
        for pid in processes {
            let Some(nz) = std::num::NonZeroU32::new(pid) else {
                continue;
            };
            // SAFETY: the program's descriptor stays open for the keeper's life (kept).
            let program =
                unsafe { std::os::fd::BorrowedFd::borrow_raw(self.stops.release_program) };
            let mut sink = Vec::new();
            crate::kernel::task_iter::for_process(program, nz)
                .and_then(|mut iterator| iterator.read_to_end(&mut sink))
                .with_context(|| {
                    format!("running the repair_release task iterator over process {pid}")
                })?;
        }
        let trampoline = self.trampoline();
        for &tid in stopped.keys() {
            let state = self.repairs.get(&tid, 0).ok().map(|s| s.0);
            let _ = self.repairs.remove(&tid);
            if let (Some(state), Some(trampoline), Some(sp)) =
                (state, trampoline, stack_pointer(tid))
            {
                if state.state == repair_state::RELEASE {
                    let stats = self.stats.entry(tid).or_default();
                    let frames = (state.frames as usize).min(state.slots.len());
                    let mut done: Vec<u64> = Vec::new();
                    for i in 0..frames {
                        let (slot, orig) = (state.slots[i], state.origs[i]);
                        // Dead (at or below the stack pointer), or a tail call's shared slot.
                        if slot <= sp || done.contains(&slot) {
                            continue;
                        }
                        done.push(slot);
                        match read_word(tid, slot) {
                            Some(word) if word == trampoline => {
                                if write_word(tid, slot, orig) {
                                    stats.frames_released += 1;
                                } else {
                                    stats.slots_left_alone += 1;
                                }
                            }
                            // Restored at a throw not caught yet, or overwritten.
                            _ => {}
                        }
                    }
                }
            }
        }
        // The children's stops go before they are untraced: none may stop them afterwards.
        self.children.clear();
        for (&tid, &deliver) in &stopped {
            request(libc::PTRACE_DETACH, tid, deliver);
        }
        Ok(())
    }

    /// A signal about to be delivered to `tid`: ours (a repair is due: made, and the thread
    /// resumed; returns true) or the program's (returns false; passed on when `pass_on`, else
    /// left for the caller to deliver).
    fn signal_stop(&mut self, tid: u32, signal: i32, pass_on: bool) -> bool {
        let state = self.repairs.get(&tid, 0).ok().map(|s| s.0);
        // The stop the program sent (`profiler_common::STOP_SIGNALS`) names its signal: any
        // other, even the same number arriving meanwhile, is the program's.
        let ours = state.is_some_and(|s| {
            (s.state == repair_state::THROWN || s.state == repair_state::CATCHING)
                && s.signal == signal as u32
        });
        let stats = self.stats.entry(tid).or_default();
        if !ours {
            stats.signals_passed_on += 1;
            if pass_on {
                request(libc::PTRACE_CONT, tid, signal);
            }
            return false;
        }
        let started = Instant::now();
        // A signal for the program that came while the thread passed through the trampoline.
        let mut deliver = 0;
        if let Some(state) = state {
            if state.state == repair_state::THROWN {
                self.throw(tid, &state);
                let mut done = state;
                done.state = repair_state::RESTORED;
                let _ = self.repairs.insert(tid, PodRepairState(done), 0);
            } else {
                self.catch(tid, &state);
                deliver = self.drop_dead_instances(tid, &state);
                let _ = self.repairs.remove(&tid);
            }
        }
        let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let stats = self.stats.entry(tid).or_default();
        stats.repair_ns_total += took;
        stats.repair_ns_max = stats.repair_ns_max.max(took);
        request(libc::PTRACE_CONT, tid, deliver);
        true
    }

    /// At a catch: when the kernel holds as many return-probe instances for the thread as it
    /// allows (64) and some are of frames the exception left (their slot at or below the
    /// catch's stack pointer), it hooks no new frame until a traced caller of those returns,
    /// and in a thread whose outer frames were entered before tracing none ever does (it
    /// cleans up only when a hooked frame returns, or at an entry below its limit). So the
    /// thread, stopped at its catch, is made to pass once through the return trampoline with
    /// its stack pointer just above the outermost dead frame's slot: the kernel drops every
    /// instance below that point, as when a frame returns past frames a `longjmp` left (it runs
    /// the return handler of that outermost one, which the return program is told to keep
    /// silent: `repair_state::CLEANUP`). The thread is stopped at the trampoline's system call
    /// (`PTRACE_SYSCALL`), then its registers and the three stack words the trampoline pushed
    /// are put back, and it resumes at its catch: the program sees nothing of it. Returns a
    /// signal for the program that came meanwhile (to deliver when it resumes), else 0.
    fn drop_dead_instances(&mut self, tid: u32, state: &profiler_common::RepairState) -> i32 {
        let frames = (state.frames as usize).min(state.slots.len());
        if frames < profiler_common::MAX_RETURN_PROBE_DEPTH as usize {
            // Below its limit the kernel drops them itself at the thread's next entry.
            return 0;
        }
        let catch_sp = state.sp;
        let Some(&outermost) = state.slots[..frames]
            .iter()
            .filter(|&&slot| slot != 0 && slot <= catch_sp)
            .max()
        else {
            return 0;
        };
        let dead = state.slots[..frames]
            .iter()
            .filter(|&&slot| slot != 0 && slot <= catch_sp)
            .count() as u64;
        let (Some(trampoline), true) = (self.trampoline(), syscall_trampoline(self.pid)) else {
            return 0;
        };
        let Some(saved) = ptrace_get::<libc::user_regs_struct>(libc::PTRACE_GETREGS, tid) else {
            return 0;
        };
        // The trampoline pushes three words below the stack pointer it starts with.
        let sp = outermost + 8;
        let words: Vec<Option<u64>> = (1..=3).map(|i| read_word(tid, sp - 8 * i)).collect();
        if words.iter().any(Option::is_none) {
            return 0;
        }
        let mut cleanup = *state;
        cleanup.state = repair_state::CLEANUP;
        cleanup.sp = outermost;
        if self
            .repairs
            .insert(tid, PodRepairState(cleanup), 0)
            .is_err()
        {
            return 0;
        }
        let mut regs = saved;
        regs.rip = trampoline;
        regs.rsp = sp;
        // Not in a system call: nothing is restarted when the registers are put back.
        regs.orig_rax = u64::MAX;
        let mut deliver = 0;
        let passed = set_regs(tid, &regs) && {
            let (passed, signal) = pass_through_trampoline(tid, trampoline);
            deliver = signal;
            passed
        };
        // Whatever happened, the thread goes on from its catch as it was.
        let restored = set_regs(tid, &saved);
        for (i, word) in words.into_iter().enumerate() {
            if let Some(word) = word {
                write_word(tid, sp - 8 * (i as u64 + 1), word);
            }
        }
        if passed && restored {
            let stats = self.stats.entry(tid).or_default();
            stats.trampoline_passes += 1;
            stats.instances_dropped += dead;
        }
        deliver
    }

    /// At a throw: the original return address back into every live slot that holds the
    /// trampoline, newest frame first (a slot shared by a tail call is written once).
    fn throw(&mut self, tid: u32, state: &profiler_common::RepairState) {
        let (sp, trampoline) = (probe_stack_pointer(tid, state), self.trampoline());
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
    fn catch(&mut self, tid: u32, state: &profiler_common::RepairState) {
        let restored = self.restored.remove(&tid).unwrap_or_default();
        let (sp, trampoline) = (probe_stack_pointer(tid, state), self.trampoline());
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
        self.trampoline_of(Some(self.pid))
    }

    /// [`Repairer::trampoline`], read from process `pid`'s mappings if not known yet (a
    /// forked child has it where its parent had it).
    fn trampoline_of(&mut self, pid: Option<u32>) -> Option<u64> {
        if self.trampoline.is_none() {
            let maps = std::fs::read_to_string(format!("/proc/{}/maps", pid?)).ok()?;
            self.trampoline = maps
                .lines()
                .find(|l| l.trim_end().ends_with("[uprobes]"))
                .and_then(|l| u64::from_str_radix(l.split('-').next()?, 16).ok());
        }
        self.trampoline
    }
}

/// The new process a `PTRACE_EVENT_FORK` stop of `tid` announces.
fn event_message(tid: u32) -> Option<u32> {
    ptrace_get::<libc::c_ulong>(libc::PTRACE_GETEVENTMSG, tid).and_then(|m| u32::try_from(m).ok())
}

/// What a ptrace `request` that fills a `T` (`PTRACE_GETREGS`, `PTRACE_GETEVENTMSG`) gives of
/// the stopped thread `tid`. `T` must be plain data, valid when all zero.
fn ptrace_get<T: Copy>(request: libc::c_uint, tid: u32) -> Option<T> {
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
fn is_process_leader(tid: u32) -> bool {
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
enum Wait {
    /// A stop or end of one (its id, the wait status).
    Stop(u32, i32),
    /// Nothing yet: a signal (a release request, the poll timer) interrupted the wait.
    Interrupted,
    /// No tracee is left (`ECHILD`).
    NoTracee,
}

/// The next stop or end of any tracee.
fn wait_any() -> Result<Wait> {
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

/// `__NR_uretprobe` (x86-64): the system call the return trampoline makes.
const NR_URETPROBE: u64 = 335;

/// Whether the return trampoline of process `pid` is the kernel's system-call one (`push`
/// three registers, `uretprobe` system call: Linux 6.11+ on x86-64) and not a breakpoint
/// (older kernels, and processes with shadow stacks): only the first can be stopped in before
/// it returns anywhere.
fn syscall_trampoline(pid: u32) -> bool {
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
fn kernel_has_syscall_trampoline() -> bool {
    static KERNEL_HAS_IT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *KERNEL_HAS_IT.get_or_init(|| {
        std::fs::read_to_string("/proc/kallsyms")
            .is_ok_and(|syms| syms.lines().any(|l| l.ends_with(" __x64_sys_uretprobe")))
    })
}

/// Runs the stopped thread `tid`, whose registers point at the return `trampoline`, up to the
/// end of its `uretprobe` system call (stopped at its entry, then at its exit). Whether it
/// got there, and a signal for the program that came meanwhile (0: none).
fn pass_through_trampoline(tid: u32, trampoline: u64) -> (bool, i32) {
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
            let Some(regs) = ptrace_get::<libc::user_regs_struct>(libc::PTRACE_GETREGS, tid) else {
                return (false, deliver);
            };
            if !entered {
                if regs.orig_rax != NR_URETPROBE
                    || regs.rip < trampoline
                    || regs.rip > trampoline + 64
                {
                    // Not the trampoline's system call: it is not made (the registers are
                    // put back at its exit).
                    let mut skip = regs;
                    skip.orig_rax = u64::MAX;
                    set_regs(tid, &skip);
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

/// Sets the stopped thread's registers; whether it could.
fn set_regs(tid: u32, regs: &libc::user_regs_struct) -> bool {
    // SAFETY: plain system call reading a `user_regs_struct` of ours.
    unsafe {
        libc::ptrace(
            libc::PTRACE_SETREGS,
            tid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            (regs as *const libc::user_regs_struct)
                .cast_mut()
                .cast::<libc::c_void>(),
        ) == 0
    }
}

/// The stack pointer at the throw or catch probe that stopped `tid`, as its program saw it
/// (see `RepairState::sp`); the registers' only when the program could not say.
fn probe_stack_pointer(tid: u32, state: &profiler_common::RepairState) -> Option<u64> {
    match state.sp {
        0 => stack_pointer(tid),
        sp => Some(sp),
    }
}

/// The stopped thread's stack pointer.
fn stack_pointer(tid: u32) -> Option<u64> {
    ptrace_get::<libc::user_regs_struct>(libc::PTRACE_GETREGS, tid).map(|regs| regs.rsp)
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
