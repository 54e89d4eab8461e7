//! `--exits per-function` decides each function's exit method from its machine code: a return
//! probe where no exception can leave the function, exit sleds elsewhere.
//!
//! - Ground truth: for every function of `unwind_cases.cpp` (a leaf, a caller of a leaf, mutual
//!   recursion, a thrower, a caller and a tail-caller of a thrower, a call through a pointer,
//!   PLT calls to `strlen` and to `qsort`, `noexcept`, `catch (...)`, a typed catch, `operator
//!   new`), `fdr-profiled list` gives exactly the known method and reason.
//! - With those methods, the same program throws through every function that may unwind
//!   (an int, a double through the typed catch, an int out of qsort's comparator,
//!   `std::bad_alloc` out of `operator new`, a throw through the function pointer; all but
//!   `main` and the tail caller, whose frames no exception can leave while the program goes on),
//!   thousands of times, and ends normally; per function, entries are the calls it counted,
//!   every entry is closed exactly once (its return, or the exit the daemon writes at the
//!   catch), the return-probed functions all returned, and llvm-xray 14 and 19 read the files.
//!
//! Needs root, BPF, llvm-xray 14/19, clang-19 and a built daemon.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use tests::counts::{expected_calls, parse_count_lines};
use tests::fixtures::workloads::{parse_returned_lines, unwind_cases_fixture, UNWIND_CASES};
use tests::launched::launch;
use tests::tools::run_output;

const ROUNDS: &str = "3000";

/// `fdr-profiled list` of the fixture: its header, and per function name (exit method, reason).
fn listed() -> (String, BTreeMap<String, (String, String)>) {
    let (headers, rows) = tests::tools::list(unwind_cases_fixture().as_os_str());
    let table = rows
        .into_iter()
        .map(|f| (f.name, (f.exit, f.why)))
        .collect();
    (headers[0].clone(), table)
}

#[test]
fn list_decides_every_rule_as_known() {
    let (header, table) = listed();
    assert_eq!(table.len(), UNWIND_CASES.len(), "{table:#?}");
    for (name, exit, why) in UNWIND_CASES {
        let (got_exit, got_why) = table
            .get(*name)
            .unwrap_or_else(|| panic!("{name} not listed: {table:#?}"));
        assert_eq!(got_exit, exit, "{name}: {got_why}");
        assert!(
            got_why.starts_with(why),
            "{name}: reason {got_why:?}, want {why:?}"
        );
    }
    let returns = UNWIND_CASES.iter().filter(|c| c.1 == "return").count();
    assert!(
        header.ends_with(&format!(
            "--exits per-function: {returns} by return probe, {} by exit sleds",
            UNWIND_CASES.len() - returns
        )),
        "{header}"
    );
}

#[test]
fn exceptions_through_every_function_that_may_unwind_under_per_function() {
    let untraced = run_output(Command::new(unwind_cases_fixture()).args(["--rounds", ROUNDS]));
    assert!(untraced.status.success());
    let untraced = String::from_utf8_lossy(&untraced.stdout).into_owned();
    let run = launch(
        "exits-per-function",
        &unwind_cases_fixture(),
        &["--exits", "per-function"],
        &["--rounds", ROUNDS],
        Duration::from_secs(300),
    );
    let stdout = &run.done.stdout;
    assert_eq!(
        stdout.lines().last(),
        untraced.lines().last(),
        "the traced program ends normally, as untraced:\n{stdout}"
    );
    let by_content = |s: &str| {
        let mut v: Vec<_> = expected_calls(&parse_count_lines(s))
            .into_values()
            .collect();
        v.sort();
        v
    };
    assert_eq!(by_content(stdout), by_content(&untraced));

    let returns = UNWIND_CASES.iter().filter(|c| c.1 == "return").count();
    assert!(
        run.exits_line().starts_with(&format!(
            "per function: {returns} return probes, {} exit sleds (",
            UNWIND_CASES.len() - returns
        )),
        "{}",
        run.exits_line()
    );
    assert_eq!(run.session_str("exits"), "per-function");
    assert_eq!(run.session.events_lost, 0, "{}", run.session.json);
    tests::assert_every_event_accounted(&run.session);

    // session.json: each function's method, and the calls by method.
    let json = &run.session.json;
    let methods = &json["exit_methods"];
    assert_eq!(methods["return_probe_functions"], returns, "{methods}");
    assert_eq!(
        methods["exit_sled_functions"],
        UNWIND_CASES.len() - returns,
        "{methods}"
    );
    let calls = expected_calls(&parse_count_lines(stdout));
    let returned = parse_returned_lines(stdout);
    let pid = run.pid();
    let (want_calls, want_returned) = (&calls[&pid], &returned[&pid]);
    // Exceptions left every function that may unwind (some of its calls did not return), but
    // main (its frame cannot be left with the program going on) and the tail caller (its frame
    // is the callee's by the time that throws; its tail exit is its return).
    for (name, exit, _) in UNWIND_CASES {
        if *exit == "sleds" && !["main", "uc_tail_thrower"].contains(name) {
            assert!(
                want_calls[*name] > want_returned[*name],
                "{name}: no exception left it ({} calls, all returned)",
                want_calls[*name]
            );
        }
    }
    let functions = json["functions"].as_array().expect("functions");
    let mut return_probe_calls = 0;
    for (name, exit, _) in UNWIND_CASES {
        let f = functions
            .iter()
            .find(|f| f["name"] == *name)
            .unwrap_or_else(|| panic!("{name} not in session.json functions"));
        assert_eq!(f["exit"], *exit, "{name}");
        if *exit == "return" {
            // Nothing can unwind out of these: every call returned.
            assert_eq!(want_calls[*name], want_returned[*name], "{name}");
            assert_eq!(f["calls"], want_calls[*name], "{name}");
            return_probe_calls += want_calls[*name];
        }
    }
    assert_eq!(methods["return_probe_calls"], return_probe_calls);

    assert_files_close_every_entry(&run, stdout);
}

/// `--exits repair`: a return probe on every function, the C++ runtime's catches and the
/// unwinder's throws probed; the same thousands of rounds end as untraced, every entry closed
/// once, each throw repaired and each catch hooked again.
#[test]
fn exceptions_through_every_function_under_repair() {
    let untraced = run_output(Command::new(unwind_cases_fixture()).args(["--rounds", ROUNDS]));
    assert!(untraced.status.success());
    let untraced = String::from_utf8_lossy(&untraced.stdout).into_owned();
    let run = launch(
        "exits-repair",
        &unwind_cases_fixture(),
        &["--exits", "repair"],
        &["--rounds", ROUNDS],
        Duration::from_secs(300),
    );
    let stdout = &run.done.stdout;
    assert_eq!(
        stdout.lines().last(),
        untraced.lines().last(),
        "the traced program ends normally, as untraced:\n{stdout}\n{}",
        run.done.stderr
    );
    assert_eq!(run.session_str("exits"), "repair");
    let methods = &run.session.json["exit_methods"];
    assert_eq!(
        methods["return_probe_functions"],
        UNWIND_CASES.len(),
        "{methods}"
    );
    assert_eq!(run.session.events_lost, 0, "{}", run.session.json);
    tests::assert_every_event_accounted(&run.session);
    let catches: u64 = run.thread_u64("catches").values().sum();
    assert!(catches > 0);
    let (repair, _) = tests::trace::repair_books(&run.session, &run.done.stderr);
    assert!(
        repair.starts_with(&format!("{catches} throws (")),
        "every exception caught was thrown through a repair: {repair}"
    );
    assert!(
        repair.contains(&format!(", {catches} catches (")),
        "{repair}"
    );
    assert_files_close_every_entry(&run, stdout);
}

/// The files: per function, entries = calls and as many exits (each entry closed once: by
/// its return, or by the exit the daemon writes at the catch for a frame an exception left);
/// the frames left are those that did not return. llvm-xray 14 and 19 agree.
fn assert_files_close_every_entry(run: &tests::launched::Launched, stdout: &str) {
    let calls = expected_calls(&parse_count_lines(stdout));
    let returned = parse_returned_lines(stdout);
    let pid = run.pid();
    let (want_calls, want_returned) = (&calls[&pid], &returned[&pid]);
    let converted = run.converted_both();
    assert_eq!(converted.len(), 1, "one thread");
    let c = &converted[&pid];
    let mut unwound_total = 0;
    for (name, _, _) in UNWIND_CASES.iter().filter(|c| c.0 != "main") {
        let count = |exit: bool| {
            c.records
                .iter()
                .filter(|r| r.function == *name && r.kind.is_exit() == exit)
                .count() as u64
        };
        assert_eq!(
            (count(false), count(true)),
            (want_calls[*name], want_calls[*name]),
            "{name}: (entries, exits)"
        );
        unwound_total += want_calls[*name] - want_returned[*name];
    }
    assert!(unwound_total > 0, "exceptions unwound traced frames");
    assert_eq!(
        run.thread_u64("frames_unwound")[&pid],
        unwound_total,
        "session.json frames_unwound: the frames that did not return"
    );
}
