//! Crash safety end to end: `fdr-profiled --out DIR -- <C++ fixture> --iterations 100000` is
//! killed with SIGKILL at random moments while the fixture runs hot. Every FDR file left
//! behind must pass `fdr-profiled verify` and load in `llvm-xray convert` (14 and 19) with the
//! same function records as our reader sees, and the files must hold what the daemon flushed
//! (it flushes every second, so a kill after two seconds leaves records).
//!
//! Needs root, BPF, llvm-xray 14/19, clang-19 and a built daemon (`cargo xtask test` builds it).
//! The kill moments come from a seed printed on stderr; set FDR_CRASH_SEED to replay one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use tests::fdr_agree;
use tests::run::{Running, RECORDING_PREFIX};
use tests::{cpp_fixture, fdr_profiled, private_copy, scratch_dir};
use xray_fdr::reader::read;

/// xorshift64*, seeded from the clock unless FDR_CRASH_SEED is set.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Pids of the processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // The parent pid is the second field after the parenthesised command name.
        let after = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
        if after.split_whitespace().nth(1).and_then(|p| p.parse().ok()) == Some(pid) {
            out.push(child);
        }
    }
    out
}

fn fdr_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            fdr_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "fdr") {
            out.push(p);
        }
    }
}

/// One run: start, wait for the probes, let the fixture run `delay`, SIGKILL the daemon and
/// the fixture. Returns the files left and the total function records our reader finds.
fn kill_run(bin: &Path, out: &Path, delay: Duration) -> (Vec<PathBuf>, usize) {
    let mut cmd = Command::new(fdr_profiled());
    cmd.arg("--out")
        .arg(out)
        .arg("--")
        .arg(bin)
        .args(["--iterations", "100000"]);
    let mut daemon = Running::spawn("fdr-profiled", &mut cmd);
    daemon.wait_for_stderr_line(RECORDING_PREFIX, Duration::from_secs(60));
    let start = Instant::now();
    std::thread::sleep(delay);
    let fixture = children_of(daemon.pid());
    daemon.signal(libc::SIGKILL);
    let killed_after = start.elapsed();
    for pid in &fixture {
        // SAFETY: kill(2) on the fixture we launched through the daemon.
        unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
    }
    let status = daemon.finish(Duration::from_secs(30)).status;
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL),
        "the daemon ended before the kill ({status}) after {killed_after:?}: the fixture ran too briefly"
    );
    let mut files = Vec::new();
    fdr_files(out, &mut files);
    files.sort();
    let records = std::sync::atomic::AtomicUsize::new(0);
    let failures = fdr_agree::parallel(&files, 2, |f| {
        let bytes = std::fs::read(f).unwrap();
        let trace = read(&bytes).map_err(|e| format!("{}: {e}", f.display()))?;
        let n = fdr_agree::ours(&trace).len();
        records.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        // Record by record for small files; big ones (millions of records) by counts.
        if n < 100_000 {
            fdr_agree::agree(f, &trace)
        } else {
            fdr_agree::agree_on_counts(f, &trace)
        }
    });
    assert!(
        failures.is_empty(),
        "killed after {killed_after:?}:\n{}",
        failures.join("\n")
    );
    (files, records.into_inner())
}

#[test]
fn sigkill_at_random_moments_leaves_valid_files() {
    let seed = std::env::var("FDR_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("fdr_crash: FDR_CRASH_SEED={seed}");
    let mut rng = Rng(seed | 1);
    let scratch = scratch_dir("fdr-crash");
    let bin = private_copy(&cpp_fixture(), scratch.path());
    // Early kills (before or around the first flush) and later ones (several flushes done,
    // large files, commits in flight).
    let delays: Vec<Duration> = [30, 400, 1100, 1800]
        .into_iter()
        .map(|base_ms| Duration::from_millis(base_ms + rng.next() % 400))
        .collect();
    for (i, delay) in delays.into_iter().enumerate() {
        let out = scratch.path().join(format!("run-{i}"));
        let (files, records) = kill_run(&bin, &out, delay);
        eprintln!(
            "fdr_crash: run {i}: killed after {delay:?}: {} files, {records} function records",
            files.len()
        );
        if delay >= Duration::from_millis(1100) {
            assert!(
                records > 0,
                "killed after {delay:?}, more than a flush interval: nothing on disk"
            );
        }
        if files.is_empty() {
            continue;
        }
        let verify = Command::new(fdr_profiled())
            .arg("verify")
            .args(&files)
            .output()
            .unwrap();
        assert!(
            verify.status.success(),
            "fdr-profiled verify failed after a kill at {delay:?}:\n{}{}",
            String::from_utf8_lossy(&verify.stdout),
            String::from_utf8_lossy(&verify.stderr)
        );
    }
}
