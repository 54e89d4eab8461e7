//! End to end: `--max-overhead` (issue 30). A program calling a tiny function 100,000 times a
//! second and a tick function once a second, under a budget of 1%: the kernel counts each
//! function's calls, the budget drops the tiny one within seconds and keeps the tick, whose
//! calls stay exact in the files (as llvm-xray 14 and 19 read them), the loop around them
//! complete; the summary and `session.json` say what was dropped, when and at what rate.
//!
//! Needs root, BPF, clang-19, llvm-xray 14/19 and a built daemon.

use std::time::Duration;

use tests::counts::{expected_calls, parse_count_lines};
use tests::fixtures::workloads::calls_fixture;
use tests::launched::launch;

const TIMEOUT: Duration = Duration::from_secs(300);

#[test]
fn a_budget_drops_the_hot_function_and_keeps_the_rest_exact() {
    let run = launch(
        "budget",
        &calls_fixture(),
        &["--exits", "return", "--max-overhead", "1%"],
        &["--seconds", "5", "--per-second"],
        TIMEOUT,
    );
    let stderr = &run.done.stderr;
    let text = std::fs::read_to_string(run.out.join("session.json")).unwrap();
    let session: serde_json::Value = serde_json::from_str(&text).unwrap();
    let budget = &session["budget"];
    assert_eq!(
        budget["max_overhead_percent"].as_f64(),
        Some(1.0),
        "{budget}"
    );
    assert!(budget["functions"].as_u64().unwrap() >= 3, "{budget}");
    let changes = budget["changes"].as_array().unwrap();
    let tiny = changes
        .iter()
        .find(|c| c["function"] == "cx_tiny")
        .unwrap_or_else(|| panic!("cx_tiny was not dropped: {budget}\n{stderr}"));
    assert_eq!(tiny["action"], "dropped", "{tiny}");
    // About 100,000 a second (10 ms of sleep after each 1,024 calls).
    let rate = tiny["calls_per_second"].as_f64().unwrap();
    assert!((20_000.0..200_000.0).contains(&rate), "{tiny}");
    assert!(tiny["overhead_percent"].as_f64().unwrap() > 1.0, "{tiny}");
    // Nothing else was worth dropping: the tick costs a microsecond a second.
    assert!(
        changes.iter().all(|c| c["function"] == "cx_tiny"),
        "{budget}"
    );
    assert_eq!(budget["dropped_at_end"], serde_json::json!(["cx_tiny"]));
    // The files: the tick's and the loop's calls exact; the tiny function's up to its drop.
    let counted = expected_calls(&parse_count_lines(&run.done.stdout));
    let trace = tests::trace::check_trace_dir(&run.out, &run.bin);
    assert_eq!(trace.threads.len(), 1);
    let t = &trace.threads[0];
    let calls = t.calls();
    let want = &counted[&t.tid];
    for f in ["cx_tick", "cx_loop"] {
        assert_eq!(calls[f].entries(), want[f], "{f}");
        assert_eq!(calls[f].exits(), want[f], "{f}");
    }
    let recorded = calls["cx_tiny"].entries();
    assert!(
        recorded > 0 && recorded < want["cx_tiny"] / 2,
        "cx_tiny: {recorded} recorded of {}",
        want["cx_tiny"]
    );
    assert_eq!(calls["cx_tiny"].exits(), recorded);
    // Said as it happened, and in the summary.
    assert!(
        stderr.contains("fdr-profiled: budget: dropped 1 functions"),
        "{stderr}"
    );
    assert!(stderr.contains("  budget: at most 1% overhead"), "{stderr}");
    assert!(stderr.contains("    dropped cx_tiny: "), "{stderr}");
    // `report` reads it back from session.json, in its text and its JSON.
    let report = |format: &str| {
        let out = tests::tools::run_output(
            std::process::Command::new(tests::tools::fdr_profiled())
                .arg("report")
                .arg(&run.out)
                .args(["--format", format]),
        );
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let text = report("text");
    assert!(
        text.contains("budget (at most 1% overhead): 1 of ")
            && text.contains("\n  dropped cx_tiny: "),
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&report("json")).unwrap();
    assert_eq!(json["budget"], *budget);
}

/// `--pid` on a C++ server (its serving loop entered before tracing, the stack repaired at
/// its throws) whose requests make 100,000 tiny calls each: under 5% the tiny function and
/// the recursion go, the request function stays, and the trace holds every request from
/// its first to its last by their numbers (ds_request logs its argument), each complete.
#[test]
fn a_server_by_pid_keeps_its_requests_under_a_budget() {
    let bin = tests::fixtures::workloads::deep_server_fixture();
    let dir = tests::tools::scratch_dir("budget-pid");
    let out = dir.path().join("out");
    let server = tests::run::spawn_fixture("deep_server", &bin, &["1000", "100", "100000"]);
    // Serving, and its first second reported.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !server.output_so_far().0.contains("deep_server: second=1 ") {
        assert!(
            std::time::Instant::now() < deadline,
            "the server did not serve"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let daemon = tests::tools::run_output(
        std::process::Command::new(tests::tools::fdr_profiled())
            .args(["--pid", &server.pid().to_string(), "--duration", "8"])
            .args(["--max-overhead", "5%", "--out"])
            .arg(&out),
    );
    server.signal(libc::SIGTERM);
    let done = server.finish(TIMEOUT);
    tests::run::assert_success("deep_server", &done);
    let stderr = String::from_utf8_lossy(&daemon.stderr);
    assert!(daemon.status.success(), "{stderr}");
    let session: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("session.json")).unwrap()).unwrap();
    let budget = &session["budget"];
    let changes = budget["changes"].as_array().unwrap();
    let dropped: Vec<&str> = changes
        .iter()
        .filter(|c| c["action"] == "dropped")
        .map(|c| c["function"].as_str().unwrap())
        .collect();
    assert!(dropped.contains(&"ds_leaf"), "{budget}\n{stderr}");
    assert!(!dropped.contains(&"ds_request"), "{budget}\n{stderr}");
    let leaf = changes.iter().find(|c| c["function"] == "ds_leaf").unwrap();
    assert!(
        leaf["calls_per_second"].as_f64().unwrap() > 10_000.0,
        "{leaf}"
    );
    // Every request between the first and the last traced, once, complete.
    let trace = tests::trace::check_trace_dir(&out, &bin);
    assert_eq!(trace.threads.len(), 1);
    let t = &trace.threads[0];
    let mut numbers: Vec<i64> = t
        .records_of("ds_request")
        .filter(|r| !r.args.is_empty())
        .map(|r| r.args[0] as i64)
        .collect();
    let calls = &t.calls()["ds_request"];
    assert_eq!(
        numbers.len() as u64,
        calls.entries(),
        "every entry logs its number"
    );
    // The one serving as the recording ended has no exit in it.
    assert!(
        calls.entries() - calls.exits() <= 1,
        "{} entries, {} exits",
        calls.entries(),
        calls.exits()
    );
    numbers.sort_unstable();
    let twice: Vec<i64> = numbers
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0])
        .collect();
    numbers.dedup();
    assert_eq!(
        numbers.len() as u64,
        calls.entries(),
        "a request entered twice: {twice:?}\n{stderr}"
    );
    // Every request between the first and the last, but those whose entry a counted loss
    // took (a loaded host's rings can overflow; the session says how many events it lost).
    let (first, last) = (numbers[0], numbers[numbers.len() - 1]);
    let missing = (last - first + 1) as u64 - numbers.len() as u64;
    assert!(
        missing <= trace.session.events_lost,
        "requests {first}..={last}: {missing} missing, {} events lost",
        trace.session.events_lost
    );
    // Seconds of it: more than a few requests.
    assert!(numbers.len() > 100, "{} requests traced", numbers.len());
    let served: i64 = done
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("deep_server: rounds="))
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(last <= served + 1, "request {last} traced, {served} served");
}

/// A launched C++ server (the defaults: return probes, the stack repaired at each throw) under
/// 50%: every throw through a hooked frame stops the thread for its repair, and the keeper
/// times each stop and charges it to the functions whose frames it restored. `main`, called
/// once, hooked for the whole run, is charged its share of every stop and dropped for it
/// (at no call a second); its frame, hooked before the drop, is left unhooked at the next
/// catch, so throws no longer stop the thread: none stops it after the second that follows the
/// drop, and it ends as it would untraced.
#[test]
fn a_launched_server_drops_a_long_lived_frame_for_its_stops_and_unhooks_it() {
    let run = launch(
        "budget-stops",
        &tests::fixtures::workloads::deep_server_fixture(),
        &["--max-overhead", "50%"],
        &["5", "100", "50", "14"],
        TIMEOUT,
    );
    let stderr = &run.done.stderr;
    let session = &run.session.json;
    let budget = &session["budget"];
    let changes = budget["changes"].as_array().unwrap();
    let main = changes
        .iter()
        .find(|c| c["function"] == "main")
        .unwrap_or_else(|| panic!("main was not dropped: {budget}\n{stderr}"));
    assert_eq!(main["action"], "dropped", "{main}");
    assert!(main["calls_per_second"].as_f64().unwrap() < 1.0, "{main}");
    assert!(main["overhead_percent"].as_f64().unwrap() > 1.0, "{main}");
    let repair = &session["repair"];
    assert!(
        repair["frames_left_unhooked"].as_u64().unwrap() >= 1,
        "{repair}"
    );
    // The program's own count of what it did: it ended normally.
    let (rounds, caught) = tests::server::deep_server_rounds(&run.done.stdout);
    assert_eq!(caught, rounds / 5, "every fifth request throws");
    // Once `main` is dropped and its frame unhooked, throws no longer stop the thread: every
    // stop came before the end of the second after the drop's (the program's own `second=K
    // served=N` lines; every fifth request throws). Timed by the program's clock, not ours,
    // so a loaded host that decides later still passes, as long as it decides at all.
    let stops = repair["throws"].as_u64().unwrap();
    let dropped_at = main["at_seconds"].as_f64().unwrap();
    let by_second: Vec<(u64, u64)> = run
        .done
        .stdout
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("deep_server: second=")?;
            let (k, n) = rest.split_once(" served=")?;
            Some((k.parse().ok()?, n.trim().parse().ok()?))
        })
        .collect();
    let limit_second = dropped_at.ceil() as u64 + 2;
    let (_, served_then) = by_second
        .iter()
        .find(|(k, _)| *k == limit_second)
        .unwrap_or_else(|| {
            panic!("main dropped at {dropped_at:.1} s, too late to see the throws stop:\n{stderr}")
        });
    assert!(
        stops <= served_then / 5,
        "{stops} throws stopped the thread, {} thrown by second {limit_second} (main dropped \
         at {dropped_at:.1} s), {caught} in all: {repair}\n{stderr}",
        served_then / 5
    );
    assert!(stops < caught, "{stops} stops of {caught} throws: {repair}");
    // The files load, every call in them complete or closed and counted.
    tests::trace::check_trace_dir(&run.out, &run.bin);
}

/// `--attach` a C++ server's binary under `--max-overhead 5%` with the default exits: each
/// repaired process would have probes of its own, which a budget cannot drop, so the session
/// decides per function instead (said on stderr and in `session.json`); a server started
/// later gets the shared probes, the budget drops its hot functions with their rates, and the
/// server throws, catches and ends as untraced, its files loading in llvm-xray 14 and 19.
#[test]
fn attach_under_a_budget_decides_per_function_and_drops() {
    use tests::run::{
        assert_success, interrupt_and_finish, spawn_fixture, start_attach, wait_attached,
    };
    let scratch = tests::scratch_dir("budget-attach");
    let bin = tests::fixtures::private_copy(
        &tests::fixtures::workloads::deep_server_fixture(),
        scratch.path(),
    );
    let out = scratch.path().join("out");
    let mut tracer = start_attach(&bin, &out, &["--max-overhead", "5%", "--no-report"]);
    wait_attached(&mut tracer);
    let server = spawn_fixture("deep_server", &bin, &["5", "100", "50", "4"]);
    let done = server.finish(TIMEOUT);
    assert_success("deep_server", &done);
    let (rounds, caught) = tests::server::deep_server_rounds(&done.stdout);
    assert_eq!(caught, rounds / 5, "every fifth request throws");
    let traced = interrupt_and_finish(tracer, TIMEOUT);
    assert_success("fdr-profiled --attach", &traced);
    assert!(
        traced
            .stderr
            .contains("not repaired under --attach with --max-overhead"),
        "{}",
        traced.stderr
    );
    let trace = tests::trace::check_trace_dir(&out, &bin);
    let session = &trace.session.json;
    assert_eq!(session["exits"], "per-function", "{session}");
    let changes = session["budget"]["changes"].as_array().unwrap();
    let leaf = changes
        .iter()
        .find(|c| c["function"] == "ds_leaf")
        .unwrap_or_else(|| panic!("ds_leaf was not dropped: {session}\n{}", traced.stderr));
    assert_eq!(leaf["action"], "dropped", "{leaf}");
    assert!(
        leaf["calls_per_second"].as_f64().unwrap() > 1000.0,
        "{leaf}"
    );
}
