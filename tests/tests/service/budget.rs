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

/// The program's own count at its end (`deep_server: rounds=N caught=M`): it ended normally,
/// every fifth request's exception caught.
fn deep_server_ended_well(done: &tests::run::Finished) -> u64 {
    tests::run::assert_success("deep_server", done);
    let (rounds, caught) = tests::server::deep_server_rounds(&done.stdout);
    assert_eq!(caught, rounds / 5, "{}", done.stdout);
    rounds
}

/// The probes a repaired process got, from the service's line saying it is traced.
fn probes_of(line: &str) -> u64 {
    line.split(", ")
        .find_map(|part| part.split_once(" probes (its tracer")?.0.parse().ok())
        .unwrap_or_else(|| panic!("no probe count in {line:?}"))
}

/// A C++ target, its stack repaired (`exits = "auto"`: each process probed on its own), under
/// the default 2%: a server serving flat out when the service starts gets its hottest functions
/// dropped, their probes removed from its process; a server started afterwards is traced
/// without them (fewer probes); both serve and end as untraced, every exception caught, and
/// the status and a snapshot (loaded by llvm-xray) say what the budget did.
#[test]
fn a_repaired_cpp_target_is_budgeted_in_each_process() {
    let scratch = tests::scratch_dir("service-budget-repair");
    let bin = private_copy(
        &tests::fixtures::workloads::deep_server_fixture(),
        scratch.path(),
    );
    let first = tests::run::spawn_fixture("deep_server", &bin, &["5", "100", "50", "60"]);
    let deadline = Instant::now() + TIMEOUT;
    while !first.output_so_far().0.contains("deep_server: second=1 ") {
        assert!(Instant::now() < deadline, "the server did not serve");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (start, _output) = one_target(scratch.path(), "cpp", &bin, "1s", "");
    let mut service = start.start();
    let socket = start.socket_path().to_path_buf();
    let traced = |pid: u32| {
        move |l: &str| l.contains(&format!("process {pid} traced with its stack repaired"))
    };
    let line =
        service.wait_for_stderr_match("the running server traced", TIMEOUT, traced(first.pid()));
    let all = probes_of(&line);
    service.wait_for_stderr_match("a drop", TIMEOUT, |l| {
        l.contains("budget: dropped") && l.contains("ds_leaf")
    });
    let status = || -> serde_json::Value {
        let out = run_output(
            Command::new(tests::fdr_profiled())
                .args(["status", "--json", "--socket"])
                .arg(&socket),
        );
        assert!(out.status.success());
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let json = status();
    let budget = &json["targets"][0]["binaries"][0]["budget"];
    assert_eq!(budget["max_overhead_percent"].as_f64(), Some(2.0), "{json}");
    let dropped: Vec<&str> = budget["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    assert!(dropped.contains(&"ds_leaf"), "{json}");
    // A server started now gets the functions traced now, not the dropped ones.
    let second = tests::run::spawn_fixture("deep_server", &bin, &["5", "100", "50", "3"]);
    let line =
        service.wait_for_stderr_match("the new server traced", TIMEOUT, traced(second.pid()));
    let fewer = probes_of(&line);
    assert!(
        fewer < all,
        "{fewer} probes after the drops, {all} before:\n{line}"
    );
    let rounds = deep_server_ended_well(&second.finish(TIMEOUT));
    assert!(rounds > 0);
    let snapshot = run_output(
        Command::new(tests::fdr_profiled())
            .args(["snapshot", "cpp", "--socket"])
            .arg(&socket),
    );
    assert!(snapshot.status.success(), "{snapshot:?}");
    let dir = std::path::PathBuf::from(
        String::from_utf8_lossy(&snapshot.stdout)
            .lines()
            .next()
            .expect("a snapshot"),
    );
    let trace = check_trace_dir(&dir, &bin);
    assert!(
        trace.session.json["budget"]["changes"]
            .as_array()
            .is_some_and(|c| !c.is_empty()),
        "{}",
        trace.session.json
    );
    first.signal(libc::SIGTERM);
    deep_server_ended_well(&first.finish(TIMEOUT));
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
}
