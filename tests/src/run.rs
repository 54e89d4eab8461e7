//! Running the daemon and the fixtures as child processes: output collected
//! by background threads (and echoed, prefixed, to the test's stderr, which
//! libtest shows for failing tests), waiting for marker lines, signals,
//! timeouts. Children still running when their handle is dropped (a test
//! panicked) are killed, so no tracer outlives its test.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::tools::fdr_profiled;

/// The line fdr-profiled prints on stderr once its probes are in place.
pub const ATTACHED_PREFIX: &str = "fdr-profiled: attached";

/// Start of the line the daemon prints once every first probe is in place and armed: what
/// the program does from then on is recorded.
pub const RECORDING_PREFIX: &str = "fdr-profiled: recording";
/// The line the fixtures print on stderr before polling `--wait-file`.
pub const WAITING_PREFIX: &str = "fixture: waiting for";

#[derive(Default)]
struct Collected {
    stdout: String,
    stderr: String,
    stdout_eof: bool,
    stderr_eof: bool,
}

/// What a finished child left behind.
#[derive(Debug, Clone)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// A child process whose stdout and stderr are collected.
pub struct Running {
    label: String,
    child: Child,
    shared: Arc<(Mutex<Collected>, Condvar)>,
    readers: Vec<JoinHandle<()>>,
}

impl Running {
    /// Spawns `cmd` with stdin from /dev/null and stdout/stderr collected.
    /// `label` prefixes the echoed lines.
    pub fn spawn(label: &str, cmd: &mut Command) -> Running {
        Self::spawn_with_stdin(label, cmd, Stdio::null())
    }

    /// [`Running::spawn`] with a pipe on stdin: feed it with
    /// [`Running::send_line`].
    pub fn spawn_piped(label: &str, cmd: &mut Command) -> Running {
        Self::spawn_with_stdin(label, cmd, Stdio::piped())
    }

    /// Writes `line` and a newline to the child's stdin (see
    /// [`Running::spawn_piped`]). Panics if that fails.
    pub fn send_line(&mut self, line: &str) {
        use std::io::Write as _;
        let stdin = self
            .child
            .stdin
            .as_mut()
            .unwrap_or_else(|| panic!("{}: stdin is not a pipe", self.label));
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("{}: write {line:?} to stdin: {e}", self.label));
    }

    fn spawn_with_stdin(label: &str, cmd: &mut Command, stdin: Stdio) -> Running {
        cmd.stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child =
            spawn_when_not_busy(cmd).unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let shared = Arc::new((Mutex::new(Collected::default()), Condvar::new()));
        let out = child.stdout.take().expect("piped stdout");
        let err = child.stderr.take().expect("piped stderr");
        let readers = vec![
            reader(format!("{label} stdout"), out, shared.clone(), false),
            reader(format!("{label} stderr"), err, shared.clone(), true),
        ];
        Running {
            label: label.to_string(),
            child,
            shared,
            readers,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// stdout and stderr collected so far.
    pub fn output_so_far(&self) -> (String, String) {
        let c = self.shared.0.lock().unwrap();
        (c.stdout.clone(), c.stderr.clone())
    }

    /// Waits until a stderr line starts with `prefix`. Panics (after killing
    /// the child) on timeout or if stderr closes first.
    pub fn wait_for_stderr_line(&mut self, prefix: &str, timeout: Duration) {
        let what = format!("starting with {prefix:?}");
        self.wait_for_stderr_match(&what, timeout, |l| l.starts_with(prefix));
    }

    /// Waits until a complete stderr line satisfies `matches` and returns the
    /// first such line. Panics (after killing the child) on timeout or if
    /// stderr closes first, naming `what` it waited for.
    pub fn wait_for_stderr_match(
        &mut self,
        what: &str,
        timeout: Duration,
        matches: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        let (lock, cvar) = &*self.shared;
        let mut c = lock.lock().unwrap();
        loop {
            if let Some(l) = c.stderr.lines().find(|l| matches(l)) {
                return l.to_string();
            }
            let now = Instant::now();
            if c.stderr_eof || now >= deadline {
                let why = if c.stderr_eof {
                    "its stderr closed"
                } else {
                    "timeout"
                };
                let (o, e) = (c.stdout.clone(), c.stderr.clone());
                drop(c);
                self.kill();
                let status = self.child.wait().ok();
                panic!(
                    "{}: no stderr line {what} after {timeout:?} ({why}; status {status:?})\n--- stdout:\n{o}\n--- stderr:\n{e}",
                    self.label
                );
            }
            c = cvar.wait_timeout(c, deadline - now).unwrap().0;
        }
    }

    /// Sends `sig` to the child.
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(
            rc,
            0,
            "kill({}, {sig}): {}",
            self.child.id(),
            std::io::Error::last_os_error()
        );
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Waits for the child to exit and its output to close. Panics (after
    /// SIGKILL) if it does not exit within `timeout`.
    pub fn finish(mut self, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    self.kill();
                    let status = self.child.wait().ok();
                    let (o, e) = self.output_so_far();
                    panic!(
                        "{}: still running after {timeout:?}, killed ({status:?})\n--- stdout:\n{o}\n--- stderr:\n{e}",
                        self.label
                    );
                }
                Err(e) => panic!("{}: wait: {e}", self.label),
            }
        };
        // The pipes close when every process holding them is gone; give
        // stragglers (grandchildren) a bounded time.
        let (lock, cvar) = &*self.shared;
        let mut c = lock.lock().unwrap();
        let eof_deadline = Instant::now() + Duration::from_secs(10);
        while !(c.stdout_eof && c.stderr_eof) {
            let now = Instant::now();
            if now >= eof_deadline {
                panic!(
                    "{}: exited ({status}) but its stdout/stderr stayed open\n--- stderr:\n{}",
                    self.label, c.stderr
                );
            }
            c = cvar.wait_timeout(c, eof_deadline - now).unwrap().0;
        }
        let finished = Finished {
            status,
            stdout: std::mem::take(&mut c.stdout),
            stderr: std::mem::take(&mut c.stderr),
        };
        drop(c);
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        finished
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn reader(
    label: String,
    pipe: impl Read + Send + 'static,
    shared: Arc<(Mutex<Collected>, Condvar)>,
    is_stderr: bool,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(pipe);
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = r.read_until(b'\n', &mut line).unwrap_or(0);
            let (lock, cvar) = &*shared;
            let mut c = lock.lock().unwrap();
            if n == 0 {
                if is_stderr {
                    c.stderr_eof = true;
                } else {
                    c.stdout_eof = true;
                }
                cvar.notify_all();
                return;
            }
            let text = String::from_utf8_lossy(&line);
            eprint!("[{label}] {text}");
            if !text.ends_with('\n') {
                eprintln!();
            }
            if is_stderr {
                c.stderr.push_str(&text);
            } else {
                c.stdout.push_str(&text);
            }
            cvar.notify_all();
        }
    })
}

/// `cmd.spawn()`, tried again for up to a second while the program is busy (ETXTBSY): a
/// fixture copied moments ago can still be open for writing in a child that another test
/// thread forked before the file was closed; that child execs (and drops the descriptor)
/// within milliseconds.
pub fn spawn_when_not_busy(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    let mut attempts = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempts < 100 => {
                attempts += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// Starts `fdr-profiled --attach BIN --out OUT [extra...]` (does not wait
/// for recording to start: call [`wait_attached`]).
pub fn start_attach(bin: &Path, out: &Path, extra: &[&str]) -> Running {
    let mut cmd = Command::new(fdr_profiled());
    cmd.arg("--attach")
        .arg(bin)
        .arg("--out")
        .arg(out)
        .args(extra);
    Running::spawn("fdr-profiled", &mut cmd)
}

/// Starts `fdr-profiled --pid PID --out OUT EXTRA...` (it stops by itself when PID exits).
pub fn start_pid(pid: u32, out: &Path, extra: &[&str]) -> Running {
    let mut cmd = Command::new(fdr_profiled());
    cmd.arg("--pid")
        .arg(pid.to_string())
        .arg("--out")
        .arg(out)
        .args(extra);
    Running::spawn("fdr-profiled", &mut cmd)
}

/// Waits up to 60 s for the daemon's `fdr-profiled: recording` line.
pub fn wait_attached(tracer: &mut Running) {
    tracer.wait_for_stderr_line(RECORDING_PREFIX, Duration::from_secs(60));
}

/// SIGINT to the tracer, then waits (up to `timeout`) for it to finish.
pub fn interrupt_and_finish(tracer: Running, timeout: Duration) -> Finished {
    tracer.signal(libc::SIGINT);
    tracer.finish(timeout)
}

/// Runs `fdr-profiled --out OUT -- CMD ARGS...` to completion (panics after
/// `timeout`). The child's stdout comes out on the daemon's stdout.
pub fn run_launch<S: AsRef<OsStr>>(
    out: &Path,
    cmd: &Path,
    args: &[S],
    timeout: Duration,
) -> Finished {
    run_launch_with(out, &[], cmd, args, timeout)
}

/// [`run_launch`] with extra daemon options before `--` (e.g. `--fdr-version 5`).
pub fn run_launch_with<S: AsRef<OsStr>>(
    out: &Path,
    daemon_args: &[&str],
    cmd: &Path,
    args: &[S],
    timeout: Duration,
) -> Finished {
    let mut c = Command::new(fdr_profiled());
    c.arg("--out")
        .arg(out)
        .args(daemon_args)
        .arg("--")
        .arg(cmd)
        .args(args);
    Running::spawn("fdr-profiled", &mut c).finish(timeout)
}

/// Starts a fixture binary with `args` (stdout/stderr collected).
pub fn spawn_fixture<S: AsRef<OsStr>>(label: &str, bin: &Path, args: &[S]) -> Running {
    Running::spawn(label, Command::new(bin).args(args))
}

/// Panics unless the process exited with status 0.
pub fn assert_success(what: &str, f: &Finished) {
    assert!(
        f.status.success(),
        "{what} failed: {}\n--- stdout:\n{}\n--- stderr:\n{}",
        f.status,
        f.stdout,
        f.stderr
    );
}

/// The pid of the process `parent` launched from `bin`: found by scanning /proc, since the
/// daemon may fork it from any of its threads.
pub fn launched_child(parent: u32, bin: &Path, timeout: Duration) -> i32 {
    let want = std::fs::canonicalize(bin).unwrap();
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        for dir in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = dir.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let ppid = stat.rfind(')').and_then(|at| {
                stat[at + 2..]
                    .split_whitespace()
                    .nth(1)?
                    .parse::<u32>()
                    .ok()
            });
            if ppid == Some(parent)
                && std::fs::read_link(format!("/proc/{pid}/exe"))
                    .ok()
                    .as_deref()
                    == Some(want.as_path())
            {
                return pid;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no child of {parent} runs {}", bin.display());
}

/// A signal mask of `pid`'s main thread from /proc/PID/status (`field`: "SigBlk", "SigCgt",
/// "SigIgn", "SigPnd"); None when the process or the field is gone.
pub fn signal_mask(pid: i64, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    u64::from_str_radix(mask.trim(), 16).ok()
}
