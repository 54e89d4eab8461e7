//! The `report` benchmark (issue 6): `fdr-profiled report` over a session of about 10 million
//! events, against the time it takes to read the same files at all, with its peak memory.
//!
//! The session is recorded from the `calls.c` workload (two threads calling `cx_tiny` in a
//! loop). "Reading the files at all" is measured two ways in the same run: reading their bytes
//! (page cache warm), and `fdr-profiled verify`, which decodes and checks every record with the
//! same reader `report` uses. Each command runs [`ROUNDS`] times; the table gives medians.
//! Targets: `report` within 3x of reading, peak resident memory under 200 MiB.
use super::support::{self, median};
use anyhow::{bail, Context as _, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Runs of each measured command.
const ROUNDS: usize = 3;
/// Calls of `cx_tiny` per thread: 2 threads x 2.5M calls x (entry + exit) = 10M events.
const CALLS_PER_THREAD: u64 = 2_500_000;
const THREADS: u32 = 2;
/// Targets of the issue.
const TARGET_RATIO: f64 = 3.0;
const TARGET_RSS_MIB: f64 = 200.0;

/// Runs the benchmark; returns its markdown section.
pub fn run() -> Result<String> {
    let daemon = support::daemon()?;
    let work = support::scratch("report")?;
    let bin = support::build_calls(&work)?;
    let session = work.join("session");
    let out = Command::new(&daemon)
        .arg("--out")
        .arg(&session)
        .arg("--buffer-size")
        .arg((64u32 << 20).to_string())
        .arg("--")
        .arg(&bin)
        .args(["--threads", &THREADS.to_string()])
        .args(["--iterations", &CALLS_PER_THREAD.to_string(), "--quiet"])
        .output()
        .context("recording the workload")?;
    if !out.status.success() {
        bail!(
            "recording failed: {}",
            support::last_lines(&String::from_utf8_lossy(&out.stderr), 3)
        );
    }
    let files = fdr_files(&session)?;
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(session.join("session.json"))?)?;
    let events = manifest["events"].as_u64().unwrap_or(0);

    let mut read = Vec::new();
    let mut verify = Vec::new();
    let mut report = Vec::new();
    let mut verify_rss = 0u64;
    let mut report_rss = 0u64;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let mut total = 0usize;
        for f in &files {
            total += std::fs::read(f)?.len();
        }
        read.push(t.elapsed().as_secs_f64());
        if total as u64 != bytes {
            bail!("files changed while reading");
        }
        let (secs, rss) = measured(Command::new(&daemon).arg("verify").arg(&session))?;
        verify.push(secs);
        verify_rss = verify_rss.max(rss);
        let (secs, rss) = measured(
            Command::new(&daemon)
                .args(["report", "--output", "/dev/null"])
                .arg(&session),
        )?;
        report.push(secs);
        report_rss = report_rss.max(rss);
    }
    let (read, verify, report) = (
        median(&read).unwrap_or(0.0),
        median(&verify).unwrap_or(0.0),
        median(&report).unwrap_or(0.0),
    );
    render(
        events,
        bytes,
        files.len(),
        read,
        verify,
        report,
        verify_rss,
        report_rss,
    )
}

#[allow(clippy::too_many_arguments)]
fn render(
    events: u64,
    bytes: u64,
    files: usize,
    read: f64,
    verify: f64,
    report: f64,
    verify_rss: u64,
    report_rss: u64,
) -> Result<String> {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let ratio = report / verify.max(f64::MIN_POSITIVE);
    let mut s = String::new();
    writeln!(s, "## report: {events} events")?;
    writeln!(s)?;
    writeln!(
        s,
        "`fdr-profiled report` over a recorded session of the `calls.c` workload ({THREADS} threads, {files} files, {:.1} MiB, {events} events), median of {ROUNDS} runs.",
        mib(bytes)
    )?;
    writeln!(s)?;
    writeln!(s, "| what | time | peak memory |")?;
    writeln!(s, "|---|---|---|")?;
    writeln!(s, "| read the bytes (page cache warm) | {:.3} s | |", read)?;
    writeln!(
        s,
        "| `fdr-profiled verify` (decode and check every record) | {:.3} s | {:.1} MiB |",
        verify,
        mib(verify_rss)
    )?;
    writeln!(
        s,
        "| `fdr-profiled report` | {:.3} s | {:.1} MiB |",
        report,
        mib(report_rss)
    )?;
    writeln!(s)?;
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    writeln!(
        s,
        "report / verify: {ratio:.2}x (target at most {TARGET_RATIO}x: {}); report / reading the bytes: {:.1}x; peak memory {:.1} MiB (target under {TARGET_RSS_MIB} MiB: {}).",
        verdict(ratio <= TARGET_RATIO),
        report / read.max(f64::MIN_POSITIVE),
        mib(report_rss),
        verdict(mib(report_rss) < TARGET_RSS_MIB)
    )?;
    writeln!(s)?;
    writeln!(s, "{}", support::machine_description())?;
    Ok(s)
}

/// Wall time and peak resident memory (bytes) of a command that must succeed.
fn measured(cmd: &mut Command) -> Result<(f64, u64)> {
    let t = Instant::now();
    let child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("starting a measured command")?;
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value to be overwritten by wait4.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, whose pid we hold; pointers are to live locals.
    let rc = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let secs = t.elapsed().as_secs_f64();
    if rc < 0 {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("{cmd:?} failed (wait status {status})");
    }
    // ru_maxrss is in KiB on Linux.
    Ok((secs, usage.ru_maxrss as u64 * 1024))
}

fn fdr_files(session: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for dir in std::fs::read_dir(session)? {
        let dir = dir?.path();
        if dir.is_dir() {
            for f in std::fs::read_dir(&dir)? {
                let f = f?.path();
                if f.extension().is_some_and(|e| e == "fdr") {
                    files.push(f);
                }
            }
        }
    }
    if files.is_empty() {
        bail!(
            "the recording wrote no trace files in {}",
            session.display()
        );
    }
    Ok(files)
}
