//! A target's overhead budget (`max_overhead`, 2% unless it says otherwise), under a load
//! that changes: quiet, flat out, quiet. The hot function is dropped when the calls would
//! cost more, and comes back once they would not; each change is logged once; `status` shows
//! the budget, its estimate and what is not traced; a snapshot's files load in llvm-xray 14
//! and 19 with every call of the runs made while traced, and `session.json` says what the
//! budget did.

use std::process::Command;
use std::time::{Duration, Instant};

use tests::fixtures::private_copy;
use tests::fixtures::workloads::calls_fixture;
use tests::run::Running;
use tests::tools::run_output;
use tests::trace::check_trace_dir;

use crate::common::{assert_calls_run, one_target, run_calls, snapshots, TIMEOUT};

#[test]
fn the_default_budget_drops_and_readmits_as_the_load_changes() {
    let scratch = tests::scratch_dir("service-budget");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let (start, output) = one_target(scratch.path(), "calls", &bin, "600s", "");
    let mut service = start.start();
    let socket = start.socket_path().to_path_buf();
    let status = || -> serde_json::Value {
        let out = run_output(
            Command::new(tests::fdr_profiled())
                .args(["status", "--json", "--socket"])
                .arg(&socket),
        );
        assert!(out.status.success());
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let budget = || status()["targets"][0]["binaries"][0]["budget"].clone();
    assert_eq!(budget()["max_overhead_percent"].as_f64(), Some(2.0));
    assert_eq!(budget()["dropped"], serde_json::json!([]));
    // Quiet: a short run, traced whole.
    let (quiet_pid, quiet_out) = run_calls(&bin, 1000);
    // Flat out: about 100,000 calls a second for 4 s, a tenth of its thread's time in probes.
    let busy = run_output(Command::new(&bin).args(["--seconds", "4", "--per-second"]));
    assert!(busy.status.success());
    let dropped_at = Instant::now();
    let b = budget();
    assert_eq!(b["dropped"], serde_json::json!(["cx_tiny"]), "{b}");
    service.wait_for_stderr_match("saying cx_tiny was dropped", TIMEOUT, |l| {
        l.contains("budget: dropped 1 functions") && l.contains("cx_tiny")
    });
    let text = String::from_utf8_lossy(
        &run_output(
            Command::new(tests::fdr_profiled())
                .args(["status", "--socket"])
                .arg(&socket),
        )
        .stdout,
    )
    .into_owned();
    assert!(
        text.lines()
            .any(|l| l.starts_with("      budget: at most 2% overhead, ")
                && l.ends_with(" functions not traced now: cx_tiny")),
        "{text}"
    );
    // Quiet again: a process that waits (its thread idle) gets cx_tiny back once the hold is
    // over, then calls it.
    let go = scratch.path().join("go");
    let mut waiting = Running::spawn(
        "calls",
        Command::new(&bin)
            .args(["--iterations", "1000", "--wait-file"])
            .arg(&go),
    );
    waiting.wait_for_stderr_line("fixture: waiting for ", TIMEOUT);
    let deadline = Instant::now() + Duration::from_secs(60);
    while budget()["dropped"] != serde_json::json!([]) {
        assert!(
            Instant::now() < deadline,
            "cx_tiny never came back: {}",
            budget()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        dropped_at.elapsed() >= Duration::from_secs(5),
        "readmitted within the hold"
    );
    std::fs::write(&go, b"").unwrap();
    let waited_pid = waiting.pid();
    let waited = waiting.finish(TIMEOUT);
    assert!(waited.status.success());
    // Logged once each.
    let (_, log) = service.output_so_far();
    assert_eq!(log.matches("budget: dropped ").count(), 1, "{log}");
    assert_eq!(log.matches("budget: readmitted ").count(), 1, "{log}");
    assert!(log.contains("budget: readmitted 1 functions"), "{log}");
    // The snapshot: the runs made while traced, every call; the busy one up to the drop.
    let snap = run_output(
        Command::new(tests::fdr_profiled())
            .args(["snapshot", "calls", "--socket"])
            .arg(&socket),
    );
    assert!(
        snap.status.success(),
        "{}",
        String::from_utf8_lossy(&snap.stderr)
    );
    let dirs = snapshots(&output, "calls");
    assert_eq!(dirs.len(), 1);
    let trace = check_trace_dir(&dirs[0], &bin);
    assert_calls_run(&trace, quiet_pid, &quiet_out);
    assert_calls_run(&trace, waited_pid, &waited.stdout);
    let session: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dirs[0].join("session.json")).unwrap()).unwrap();
    let changes = session["budget"]["changes"].as_array().unwrap();
    let actions: Vec<(&str, &str)> = changes
        .iter()
        .map(|c| {
            (
                c["action"].as_str().unwrap(),
                c["function"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [("dropped", "cx_tiny"), ("readmitted", "cx_tiny")],
        "{session}"
    );
    assert!(changes[0]["calls_per_second"].as_f64().unwrap() > 10_000.0);
}
