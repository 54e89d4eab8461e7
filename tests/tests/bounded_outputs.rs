//! Reports and conversions of a trace full of unwound frames stay small: memory and output
//! grow with the events and the distinct stacks, not with events × depth.
//!
//! The exceptions fixture throws 10,200 times through five traced frames each, caught by the
//! thread's own long-lived loop (`--catch-in-thread`). Frames left open by unwinding would
//! nest deeper under it with every throw (a real YAML parser's test suite gave
//! a 1,718-level Chrome trace, 6.2 GB of folded stacks and 6.6 GB of memory to draw them). The
//! daemon closes them at the catch, so every conversion here is measured: peak memory of the
//! converting process (its own rusage) under 200 MiB, folded stacks under 64 KiB (a few dozen
//! distinct stacks), the timelines under 300 bytes per event.
//!
//! Needs root, BPF, clang-19 and a built daemon.
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tests::fixtures::workloads::exceptions_fixture;
use tests::launched::launch;

/// Peak memory bound of one conversion, in KiB (the stated bound of the issue).
const MAX_RSS_KIB: i64 = 200 * 1024;

/// Runs `fdr-profiled ARGS` to its end; returns its peak resident memory in KiB.
// The child is reaped by `wait4`, which also gives its own peak memory (std's `wait` does not).
#[allow(clippy::zombie_processes)]
fn peak_rss_kib(args: &[&std::ffi::OsStr]) -> i64 {
    let child = Command::new(tests::fdr_profiled())
        .args(args)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn fdr-profiled");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, writing into locals that outlive the call.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "fdr-profiled {args:?} failed: {status:#x}"
    );
    usage.ru_maxrss
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .len()
}

#[test]
fn conversions_of_ten_thousand_throws_are_bounded() {
    let run = launch(
        "bounded-outputs",
        &exceptions_fixture(),
        &["--no-report"],
        &["--iterations", "3400", "--catch-in-thread"],
        Duration::from_secs(600),
    );
    assert_eq!(
        run.done.stdout.lines().last(),
        Some("exceptions: done caught=10200 rounds=20400"),
        "{}",
        run.done.stdout
    );
    assert_eq!(run.session.events_lost, 0, "{}", run.session.json);
    let unwound: u64 = run.thread_u64("frames_unwound").values().sum();
    assert_eq!(unwound, 10_200 * 5);
    let events = run.session.events;
    let out = run.out.as_os_str();
    let scratch = run.scratch.path();

    let rss = peak_rss_kib(&["report".as_ref(), out]);
    assert!(rss < MAX_RSS_KIB, "report: {rss} KiB");
    for (format, file, max_bytes) in [
        ("folded", "stacks.folded", 64 << 10),
        ("svg", "flame.svg", 1 << 20),
        ("chrome", "trace.json", 300 * events),
        ("speedscope", "profile.json", 300 * events),
    ] {
        let path = scratch.join(file);
        let rss = peak_rss_kib(&[
            "convert".as_ref(),
            out,
            "--format".as_ref(),
            format.as_ref(),
            "-o".as_ref(),
            path.as_os_str(),
        ]);
        let bytes = size(&path);
        eprintln!("convert --format {format}: {bytes} bytes, peak {rss} KiB, {events} events");
        assert!(
            rss < MAX_RSS_KIB,
            "convert --format {format}: peak {rss} KiB"
        );
        assert!(
            bytes < max_bytes,
            "convert --format {format}: {bytes} bytes for {events} events (bound {max_bytes})"
        );
    }
}
