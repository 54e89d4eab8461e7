//! The control socket: `fdr-profiled status` and `fdr-profiled snapshot [TARGET]`.

use std::process::Command;
use std::time::Duration;

use tests::fixtures::private_copy;
use tests::fixtures::workloads::calls_fixture;
use tests::run::Running;
use tests::tools::run_output;
use tests::trace::check_trace_dir;

use crate::common::{one_target, snapshots, tree_bytes, TIMEOUT};

/// `fdr-profiled ARGS --socket SOCKET`: a request to the service.
fn client(socket: &std::path::Path, args: &[&str]) -> std::process::Output {
    run_output(
        Command::new(tests::fdr_profiled())
            .args(args)
            .arg("--socket")
            .arg(socket),
    )
}

/// `fdr-profiled status` and `fdr-profiled snapshot [TARGET]` over the control socket: the
/// status counts what the service holds, a requested snapshot is written and named, an unknown
/// target is refused, and only root gets in.
#[test]
fn status_and_snapshot_requests_over_the_control_socket() {
    let scratch = tests::scratch_dir("service-control");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let (start, output) = one_target(scratch.path(), "calls", &bin, "60s", "");
    let service = start.start();
    let socket = scratch.path().join("control.sock");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&socket).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    let run = run_output(Command::new(&bin).args(["--iterations", "1000"]));
    assert!(run.status.success());
    std::thread::sleep(Duration::from_millis(300));
    let client = |args: &[&str]| client(&socket, args);
    let status = client(&["status", "--json"]);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let b = &json["targets"][0]["binaries"][0];
    assert_eq!(json["targets"][0]["name"], "calls", "{json}");
    // main, cx_loop, 1000 cx_tiny, cx_report: entries and exits; the thread's end is held to
    // close its file, but is not an event (as in a session).
    assert_eq!(b["events"], 2 * 1003, "{json}");
    assert_eq!(b["thread_ends"], 1, "{json}");
    assert_eq!(json["events"], 2 * 1003, "{json}");
    assert_eq!(json["disk_used"], 0, "nothing written yet: {json}");
    assert_eq!(json["not_written"], 0, "{json}");
    assert_eq!(json["snapshots_not_written"], 0, "{json}");
    // Events per second, over the last second: the run's events, then none.
    let status_json = || -> serde_json::Value {
        let out = client(&["status", "--json"]);
        assert!(out.status.success());
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let rate = loop {
        let json = status_json();
        let rate = json["events_per_second"]
            .as_u64()
            .expect("events_per_second");
        if rate > 0 || std::time::Instant::now() > deadline {
            break rate;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // 2006 events in a period of about a second (ticks may come late, not early).
    assert!((1..=2 * 2006).contains(&rate), "{rate} events/s");
    std::thread::sleep(Duration::from_millis(2_200));
    assert_eq!(status_json()["events_per_second"], 0);
    let human = client(&["status"]);
    let text = String::from_utf8_lossy(&human.stdout).into_owned();
    assert!(text.contains("  calls ("), "{text}");
    assert!(
        text.starts_with(
            "fdr-profiled service: 2006 events, 0/s, 0 lost, 0 not written, 0 snapshots not written; output "
        )
            && text.contains(": 0 B used;"),
        "{text}"
    );

    let snap = client(&["snapshot", "calls"]);
    assert!(
        snap.status.success(),
        "{}",
        String::from_utf8_lossy(&snap.stderr)
    );
    let printed = String::from_utf8_lossy(&snap.stdout).trim().to_owned();
    let dirs = snapshots(&output, "calls");
    assert_eq!(dirs.len(), 1);
    assert_eq!(printed, dirs[0].display().to_string());
    assert!(printed.ends_with("Z-request"), "{printed}");
    let trace = check_trace_dir(&dirs[0], &bin);
    // The snapshot has the events the window held, no more, no fewer.
    assert_eq!(trace.session.events, 2 * 1003);
    let status = client(&["status", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(json["last_snapshot"], printed.as_str(), "{json}");
    // The disk used is the snapshot's bytes.
    let used = tree_bytes(&dirs[0]);
    assert!(used > 0);
    assert_eq!(json["disk_used"], used, "{json}");
    let text = String::from_utf8_lossy(&client(&["status"]).stdout).into_owned();
    assert!(
        text.contains(&format!(": {used} B (")) && text.contains(" used; last snapshot "),
        "{text}"
    );

    let unknown = client(&["snapshot", "nope"]);
    assert!(!unknown.status.success());
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("no target named \"nope\""),
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );
    // A process running now is listed under its binary, in the text too.
    let go = scratch.path().join("go");
    let mut waiting = Running::spawn(
        "calls",
        Command::new(&bin)
            .args(["--iterations", "10", "--wait-file"])
            .arg(&go),
    );
    waiting.wait_for_stderr_line("fixture: waiting for ", TIMEOUT);
    let deadline = std::time::Instant::now() + TIMEOUT;
    let listed = format!("      process {} (0 libraries probed)", waiting.pid());
    loop {
        let text = String::from_utf8_lossy(&client(&["status"]).stdout).into_owned();
        if text.lines().any(|l| l == listed) {
            // Asked after the text: the process, still waiting, is there too.
            let json = status_json();
            let processes = &json["targets"][0]["binaries"][0]["processes"];
            assert_eq!(processes[0]["pid"], waiting.pid(), "{json}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{listed:?} in {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(&go, "").unwrap();
    assert!(waiting.finish(TIMEOUT).status.success());
    // Not root: the socket is closed to it.
    let nobody = run_output(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(tests::fdr_profiled())
            .args(["status", "--socket"])
            .arg(&socket),
    );
    assert!(!nobody.status.success());
    assert!(
        String::from_utf8_lossy(&nobody.stderr).contains("cannot reach the service"),
        "{}",
        String::from_utf8_lossy(&nobody.stderr)
    );
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    assert!(!socket.exists(), "the socket is removed at the end");
}

/// `status` says what the probes cost (issue 30): what a hit costs, measured at the
/// service's start; each binary's calls per second over the last status period, their
/// estimated share of a CPU and the costliest functions, in the JSON and the text; nothing
/// once the calls stop.
#[test]
fn status_says_what_the_probes_cost() {
    let scratch = tests::scratch_dir("service-costs");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let (start, _output) = one_target(scratch.path(), "calls", &bin, "60s", "");
    let _service = start.start();
    let socket = scratch.path().join("control.sock");
    let client = |args: &[&str]| client(&socket, args);
    let status_json = || -> serde_json::Value {
        let out = client(&["status", "--json"]);
        assert!(out.status.success());
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let traps = &status_json()["probe_costs"]["traps"];
    assert!(traps["entry_ns"].as_f64().unwrap() > 0.0, "{traps}");
    assert!(
        traps["exit_sled_ns"].as_f64().unwrap() > traps["entry_ns"].as_f64().unwrap(),
        "{traps}"
    );
    // Calls for a few status periods.
    let run = run_output(Command::new(&bin).args(["--iterations", "1000000"]));
    assert!(run.status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let (json, probes) = loop {
        let json = status_json();
        let probes = json["targets"][0]["binaries"][0]["probes"].clone();
        if probes["calls_per_second"].as_u64().unwrap_or(0) > 0 {
            break (json, probes);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no calls seen: {json}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // A period is half a second at least: at most twice the calls made.
    let per_second = probes["calls_per_second"].as_u64().unwrap();
    assert!(per_second <= 2 * 1_000_003, "{probes}");
    let first = &probes["costliest"][0];
    assert_eq!(first["function"], "cx_tiny", "{probes}");
    assert!(first["cpu_percent"].as_f64().unwrap() > 0.0, "{probes}");
    assert!(probes["cpu_percent"].as_f64().unwrap() >= first["cpu_percent"].as_f64().unwrap());
    assert!(json["probes_cpu_percent"].as_f64().unwrap() > 0.0, "{json}");
    let text = String::from_utf8_lossy(&client(&["status"]).stdout).into_owned();
    assert!(
        text.lines()
            .any(|l| l.starts_with("      probes: ") && l.contains("costliest: cx_tiny (")),
        "{text}"
    );
    // The calls are over: a period later, none.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let probes = status_json()["targets"][0]["binaries"][0]["probes"].clone();
        if probes["calls_per_second"] == 0 {
            assert_eq!(probes["costliest"], serde_json::json!([]));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{probes}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
