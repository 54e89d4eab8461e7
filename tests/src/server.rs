//! The C++ server fixture (tests/fixtures/server.cpp) the repair tests trace while it runs: it
//! serves requests on worker threads (every third throws through instrumented frames and is
//! caught), handles SIGUSR1 and SIGTERM, and runs "long requests" on commands from a FIFO, so
//! that a test decides when frames are entered, blocked in, thrown through and left.
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::run::{spawn_fixture, Running};

/// How long a server gets to stop.
const TIMEOUT: Duration = Duration::from_secs(120);

/// The server fixture, built once.
pub fn server_fixture() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = crate::fixtures::fixture_cache_dir().join("server-cpp");
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("server");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/server.cpp");
        let built = Command::new(crate::tools::clangxx())
            .args(crate::fixtures::workloads::CXX_XRAY_FLAGS)
            .arg(&source)
            .arg("-o")
            .arg(&out)
            .output()
            .expect("running clang++");
        assert!(
            built.status.success(),
            "building {}: {}",
            source.display(),
            String::from_utf8_lossy(&built.stderr)
        );
        out
    })
    .clone()
}

/// A running server and the FIFO that feeds its long requests.
pub struct Server {
    pub running: Running,
    fifo: std::fs::File,
}

impl Server {
    /// Starts the server fixture, its FIFO in `scratch`; returns once it serves.
    pub fn start(scratch: &Path) -> Server {
        Server::start_copy(scratch, &server_fixture())
    }

    /// [`Server::start`] with `bin`, a copy of the fixture (a test that traces every process
    /// of a binary runs its own copy, so that the servers of tests running beside it are not
    /// among them).
    pub fn start_copy(scratch: &Path, bin: &Path) -> Server {
        let fifo_path = scratch.join("commands");
        let c = std::ffi::CString::new(fifo_path.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let mut running = spawn_fixture("server", bin, &["--fifo", fifo_path.to_str().unwrap()]);
        wait_stdout(&mut running, "server: ready");
        // The server holds it open read-write: this open does not block.
        let fifo = std::fs::OpenOptions::new()
            .write(true)
            .open(&fifo_path)
            .unwrap();
        Server { running, fifo }
    }

    pub fn pid(&self) -> u32 {
        self.running.pid()
    }

    /// One command for the long-request thread: `r` return, `t` throw, `q` quit, `d` throw from
    /// a 100-deep recursion to the thread's loop, `a`/`b` 20,000 calls of `sv_leaf_a`/`sv_leaf_b`.
    pub fn command(&mut self, c: u8) {
        self.fifo.write_all(&[c]).unwrap();
    }

    /// SIGTERM (after letting the long-request thread quit): the server stops through its
    /// handler. Returns its last line, after checking it exited 0.
    pub fn stop(mut self) -> String {
        self.command(b'q');
        self.running.signal(libc::SIGTERM);
        let done = self.running.finish(TIMEOUT);
        crate::run::assert_success("server", &done);
        done.stdout.lines().last().unwrap_or_default().to_owned()
    }
}

pub fn wait_stdout(running: &mut Running, line: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !running.output_so_far().0.lines().any(|l| l == line) {
        assert!(
            std::time::Instant::now() < deadline,
            "no {line:?}: {:?}",
            running.output_so_far()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `key=<n>` in the server's last line.
pub fn total(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// The tracer of every thread of `pid` (TracerPid in /proc).
pub fn tracers(pid: u32) -> Vec<u64> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        let tracer = status
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .and_then(|t| t.trim().parse().ok())
            .unwrap();
        out.push(tracer);
    }
    out
}

/// Asserts that no thread of `pid` has a tracer.
pub fn assert_untraced(pid: u32) {
    let now = tracers(pid);
    assert_eq!(now, vec![0; now.len()], "no ptrace relation is left");
}

/// Waits (at most 10 s) until no thread of `pid` has a tracer: its keeper lets it go by itself
/// once `gone` (fdr-profiled, the service) has died.
pub fn wait_untraced(pid: u32, gone: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while tracers(pid).iter().any(|&t| t != 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "still traced 10 s after {gone} died: {:?}",
            tracers(pid)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `deep_server`'s own count at its end (`deep_server: rounds=N caught=M`): the requests it
/// served and the exceptions it caught. Panics when it did not say (it did not end normally).
pub fn deep_server_rounds(stdout: &str) -> (u64, u64) {
    stdout
        .lines()
        .find_map(|l| {
            let rest = l.strip_prefix("deep_server: rounds=")?;
            let (r, c) = rest.split_once(" caught=")?;
            Some((r.parse().ok()?, c.trim().parse().ok()?))
        })
        .unwrap_or_else(|| panic!("no rounds line:\n{stdout}"))
}
