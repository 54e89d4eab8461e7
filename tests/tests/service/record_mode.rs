//! Record mode: every call written, in segments rotated by age; processes started at any moment
//! after `ready` recorded whole; SIGTERM finalizes every file within a bounded time.

use std::process::Command;
use std::time::Duration;

use tests::fixtures::private_copy;
use tests::fixtures::workloads::calls_fixture;
use tests::run::Running;
use tests::service::ServiceStart;
use tests::tools::run_output;
use tests::trace::check_trace_dir;

use crate::common::{recorded_runs, run_calls, snapshots, TIMEOUT};

/// Record mode: every call written, in segments closed past their age; each segment a valid
/// session, and over all of them every call of every run has its entry exactly once (and its
/// exit, or, for a call a rotation cut, an exit counted as without entry in the next one).
#[test]
fn record_mode_writes_every_call_into_rotated_segments() {
    let scratch = tests::scratch_dir("service-record");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"rec\"\nbinary = \"{}\"\n\
             mode = \"record\"\nsegment_age = \"1s\"\nsegment_size = \"1MB\"\n",
            output.display(),
            bin.display()
        ),
    )
    .unwrap();
    let service = ServiceStart::config(&config)
        .socket(&scratch.path().join("control.sock"))
        .start();
    let mut pids = Vec::new();
    for _ in 0..3 {
        let run = Running::spawn("calls", Command::new(&bin).args(["--iterations", "700"]));
        pids.push(run.pid());
        assert!(run.finish(TIMEOUT).status.success());
        std::thread::sleep(Duration::from_millis(1_300));
    }
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    let dirs = snapshots(&output, "rec");
    assert!(dirs.len() >= 2, "rotated by age: {dirs:?}\n{}", done.stderr);
    let (mut entries, mut exits, mut unmatched) = (0, 0, 0);
    let mut seen_pids = std::collections::BTreeSet::new();
    for d in &dirs {
        assert!(d.to_string_lossy().ends_with("-segment"), "{d:?}");
        let trace = check_trace_dir(d, &bin);
        seen_pids.extend(trace.pids());
        for t in &trace.threads {
            let c = t.calls().get("cx_tiny").copied().unwrap_or_default();
            entries += c.entries();
            exits += c.exits();
        }
        unmatched += trace.session.dropped_unmatched_exits;
    }
    assert_eq!(
        seen_pids,
        pids.iter().copied().collect(),
        "every run is recorded"
    );
    assert_eq!(entries, 3 * 700, "every call's entry, exactly once");
    assert!(
        exits <= entries && exits + unmatched >= entries,
        "{exits} exits, {unmatched} unmatched"
    );
}

/// Processes started at 0.5 s steps from the moment the service is ready up to 4 s after it
/// (across the service's periodic work: the targets' patterns matched again every other
/// status tick, at 1 s and 3 s; every process's mappings read again every 200 ms) are each
/// recorded whole: `status` counts every event of every run, and each run's segment holds
/// exactly the calls it counted. A report of runs started about 2 s after ready recording
/// nothing came from a reproduction that waited for `ready` in the log file of the previous
/// service before the new one truncated it: those runs started before the service was ready.
#[test]
fn processes_started_at_any_moment_after_ready_are_recorded_whole() {
    const ITERATIONS: u32 = 200;
    let scratch = tests::scratch_dir("service-after-ready");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"calls\"\nbinary = \"{}\"\nmode = \"record\"\n",
            output.display(),
            bin.display()
        ),
    )
    .unwrap();
    let service = ServiceStart::config(&config)
        .socket(&scratch.path().join("control.sock"))
        .start();
    let ready = std::time::Instant::now();
    let mut runs = Vec::new();
    for step in 0..=8u32 {
        let at = ready + Duration::from_millis(500) * step;
        std::thread::sleep(at.saturating_duration_since(std::time::Instant::now()));
        runs.push(run_calls(&bin, ITERATIONS));
    }
    // Every run is over: its last events are drained within a few 10 ms drains.
    std::thread::sleep(Duration::from_millis(300));
    let status = run_output(
        Command::new(tests::fdr_profiled())
            .args(["status", "--json", "--socket"])
            .arg(scratch.path().join("control.sock")),
    );
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    // Per run: main, cx_loop, the iterations' cx_tiny and cx_report, entries and exits (the
    // thread's end is no event).
    let per_run = 2 * (u64::from(ITERATIONS) + 3);
    assert_eq!(
        json["events"],
        per_run * runs.len() as u64,
        "{} runs of {per_run} events each: {json}",
        runs.len()
    );
    assert_eq!(json["lost"], 0, "{json}");
    assert_eq!(json["events_malformed"], 0, "{json}");
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    let found = recorded_runs(&output, "calls", &|_| bin.clone(), &runs);
    let mut recorded: Vec<u32> = found.into_values().flatten().collect();
    recorded.sort_unstable();
    let mut started: Vec<u32> = runs.iter().map(|(pid, _)| *pid).collect();
    started.sort_unstable();
    assert_eq!(recorded, started, "{}", done.stderr);
}

/// SIGTERM while a traced process keeps calling (about 100k calls a second): the service
/// disarms, drains and closes its open segment well within a generous bound, and the segment is
/// complete and valid. With `stop_timeout = "0s"` it is made final without its `report.txt`,
/// and says so.
#[test]
fn sigterm_finalizes_every_file_within_a_bounded_time() {
    for (settings, report) in [("", true), ("stop_timeout = \"0s\"\n", false)] {
        let scratch = tests::scratch_dir("service-stop");
        let bin = private_copy(&calls_fixture(), scratch.path());
        let output = scratch.path().join("out");
        let config = scratch.path().join("fdr-profiled.toml");
        std::fs::write(
            &config,
            format!(
                "output = \"{}\"\n{settings}[[target]]\nname = \"rec\"\nbinary = \"{}\"\n\
                 mode = \"record\"\nsegment_size = \"1GB\"\nsegment_age = \"1h\"\n",
                output.display(),
                bin.display()
            ),
        )
        .unwrap();
        let service = ServiceStart::config(&config)
            .socket(&scratch.path().join("control.sock"))
            .start();
        let busy = Running::spawn(
            "calls",
            Command::new(&bin).args(["--seconds", "120", "--per-second", "--quiet"]),
        );
        std::thread::sleep(Duration::from_millis(2_500));
        let start = std::time::Instant::now();
        service.signal(libc::SIGTERM);
        let done = service.finish(TIMEOUT);
        let took = start.elapsed();
        busy.signal(libc::SIGKILL);
        busy.finish(TIMEOUT);
        assert!(done.status.success(), "{}", done.stderr);
        eprintln!("{settings:?}: SIGTERM to exit: {took:?}");
        assert!(took < Duration::from_secs(15), "{took:?}: {}", done.stderr);
        let segments = snapshots(&output, "rec");
        assert_eq!(segments.len(), 1, "{segments:?}");
        let trace = check_trace_dir(&segments[0], &bin);
        let tiny: u64 = trace
            .threads
            .iter()
            .map(|t| t.calls().get("cx_tiny").map_or(0, |c| c.entries()))
            .sum();
        assert!(tiny > 100_000, "{tiny} calls recorded in 2.5 s");
        assert_eq!(segments[0].join("report.txt").exists(), report);
        assert_eq!(
            done.stderr
                .contains("report.txt not written: past the stop deadline"),
            !report,
            "{}",
            done.stderr
        );
        assert!(done.stderr.contains("stopped in "), "{}", done.stderr);
    }
}
