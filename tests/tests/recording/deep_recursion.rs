//! End to end: a recursion deeper than the kernel's 64 pending return probes is not a thread
//! stuck at the limit. `deep.c` recurses 200 levels and calls a leaf 300,000 times at the
//! bottom (about half a second, so the daemon's 100 ms check for stuck threads lands inside
//! it): every call below the 64 hooked frames has no return probe, but those frames are all
//! live, and the session must keep its return probes (not turn to exit sleds, 10 to 30 times
//! slower per call) with every call in the trace. The stuck case itself (frames an exception
//! left) is `repair::pid`'s `a_thread_stuck_at_the_return_probe_limit_...`.
//!
//! Needs root, BPF, clang-19 and a built daemon.

use std::time::Duration;

use tests::fixtures::workloads::deep_fixture;
use tests::launched::launch;

const DEPTH: u64 = 200;
const CALLS: u64 = 300_000;

#[test]
fn a_deep_recursion_keeps_its_return_probes() {
    let run = launch(
        "deep-recursion",
        &deep_fixture(),
        // 300,000 events in half a second: rings big enough for all of them, so that a loaded
        // host (the suite runs tests side by side on two CPUs) that keeps the daemon from
        // reading for a while loses nothing (a loss is counted, and would fail the exact counts).
        &[
            "--exits",
            "repair",
            "--no-report",
            "--buffer-size",
            "67108864",
        ],
        &[&DEPTH.to_string(), &CALLS.to_string()],
        Duration::from_secs(120),
    );
    assert!(
        run.done
            .stdout
            .lines()
            .any(|l| l == format!("count function=dp_tiny calls={CALLS}")),
        "{}",
        run.done.stdout
    );
    let reason = run.session.json["exits_reason"]
        .as_str()
        .unwrap_or_default();
    assert!(
        !reason.contains("exits observed by their sleds from"),
        "a deep recursion was taken for a stuck thread: {reason}"
    );
    assert!(
        !run.done.stderr.contains("placed instead of return probes"),
        "{}",
        run.done.stderr
    );
    assert_eq!(run.session_u64("events_lost"), 0);
    let trace = tests::trace::check_trace_dir(&run.out, &run.bin);
    tests::assert_every_event_accounted(&trace.session);
    let calls = trace.threads[0].calls();
    assert_eq!(calls["dp_tiny"].entries(), CALLS, "{calls:?}");
    assert_eq!(calls["dp_deep"].entries(), DEPTH + 1, "{calls:?}");
    // Every call has its exit: main and the outer 63 levels (the kernel's 64 pending return
    // probes) their own, every call below them written where a later event proved it gone,
    // and counted as beyond the limit.
    assert_eq!(calls["dp_deep"].exits(), DEPTH + 1, "{calls:?}");
    assert_eq!(calls["dp_tiny"].exits(), CALLS, "{calls:?}");
    let beyond: u64 = run.thread_u64("frames_beyond_return_limit").values().sum();
    let hooked = u64::from(profiler_common::MAX_RETURN_PROBE_DEPTH) - 1;
    assert_eq!(beyond, DEPTH + 1 - hooked + CALLS, "{calls:?}");
}
