//! End to end: load (issue 18, item 4; three pipeline workers, issue 29). 64 busy threads calling as fast as they can while
//! 1,000 short-lived threads start, call and end beside them (`calls.c --threads 64
//! --short-threads 1000`), on this machine's few CPUs, traced by the release daemon:
//! - it does not crash, and ends with the program (status 0);
//! - its peak memory is reported (`session.json`'s `daemon_peak_rss_kib`, the summary's
//!   `fdr-profiled peak memory` line) and stays under [`MAX_PEAK_RSS_KIB`];
//! - per thread, the events received plus the events lost equal what the thread did by its own
//!   count (an entry and an exit per call; `main`'s in the main thread), and a thread none of
//!   whose events arrived is in the unattributed losses; every file is read by our reader and
//!   holds the records `session.json` says, a sample of them by llvm-xray 14 and 19 too.
//!
//! Needs root, BPF, clang-19, llvm-xray 14/19 and the release daemon
//! (`cargo build --release -p profiler-daemon`).

use std::collections::BTreeMap;
use std::time::Duration;

use tests::fixtures::workloads::calls_fixture;
use tests::launched::{launch_with, release_daemon};
use tests::parse_count_lines;

const TIMEOUT: Duration = Duration::from_secs(180);
const BUSY: &str = "64";
const SHORT: u64 = 1000;
/// Bound of the daemon's peak resident memory: the per-CPU ring buffers it maps (8 MiB each
/// by default) and, per thread with a file, a writer holding up to 64 KiB of pending records;
/// 1,065 threads make the second term about 70 MiB at worst.
const MAX_PEAK_RSS_KIB: u64 = 256 << 10;

#[test]
fn a_thousand_short_threads_beside_64_busy_ones() {
    let run = launch_with(
        &release_daemon(),
        "load",
        &calls_fixture(),
        // Three workers (more than this machine's CPUs by default): threads that start and end
        // all the time, spread over them.
        &["--no-report", "--workers", "3"],
        &[
            "--threads",
            BUSY,
            "--iterations",
            "20000",
            "--short-threads",
            &SHORT.to_string(),
            "--short-calls",
            "100",
        ],
        TIMEOUT,
    );
    let stdout = &run.done.stdout;
    assert_eq!(stdout.lines().last(), Some("calls: done threads=64"));

    // What each thread did, by its own count.
    let pid = run.pid();
    let mut expected: BTreeMap<u32, u64> = BTreeMap::new();
    for c in parse_count_lines(stdout) {
        *expected.entry(c.tid).or_default() += 2 * c.calls;
    }
    *expected.get_mut(&pid).expect("the main thread counted") += 2;
    let short = parse_count_lines(stdout)
        .iter()
        .filter(|c| c.function == "cx_short")
        .count() as u64;
    assert_eq!(short, SHORT, "every short thread reported");
    assert_eq!(expected.len() as u64, SHORT + 64);

    let events = run.thread_u64("events");
    let lost = run.thread_u64("events_lost");
    let mut unfiled = 0;
    for (tid, did) in &expected {
        match events.get(tid) {
            Some(got) => assert_eq!(
                got + lost[tid],
                *did,
                "tid {tid}: events received ({got}) + lost ({}) != the thread's calls x 2",
                lost[tid]
            ),
            None => unfiled += did,
        }
    }
    for tid in events.keys() {
        assert!(
            expected.contains_key(tid),
            "a file for thread {tid}, which counted nothing"
        );
    }
    assert_eq!(
        run.session_u64("events_lost_unattributed"),
        unfiled,
        "the threads none of whose events arrived are the unattributed losses"
    );
    tests::assert_every_event_accounted(&run.session);

    // Every file read by our reader holds what session.json says.
    let records = run.thread_u64("records");
    let files = run.files();
    assert_eq!(files.len(), events.len());
    for f in &files {
        let n = f
            .trace
            .records
            .iter()
            .filter(|r| matches!(r.kind, xray_fdr::reader::RecordKind::Function { .. }))
            .count() as u64;
        assert_eq!(n, records[&f.tid], "tid {}: records in its file", f.tid);
    }
    // A sample by llvm-xray: the main thread, busy and short threads.
    let map = format!("-instr_map={}", run.bin.display());
    for f in files.iter().step_by(files.len() / 8 + 1) {
        tests::xray_reference::both::convert(&f.path, &[&map]);
    }

    let rss = run.session_u64("daemon_peak_rss_kib");
    eprintln!(
        "load: peak RSS {rss} KiB, {} events, {} lost",
        run.session.events, run.session.events_lost
    );
    assert!(
        rss > 0 && rss < MAX_PEAK_RSS_KIB,
        "fdr-profiled's peak memory {rss} KiB (bound {MAX_PEAK_RSS_KIB} KiB)"
    );
    assert!(
        run.done.stderr.contains("  fdr-profiled peak memory: "),
        "{}",
        run.done.stderr
    );
}
