//! End to end: a Rust program whose panics unwind traced frames and are caught with
//! `catch_unwind`, traced with the defaults (the stack repaired: the image has a personality
//! routine), with `--exits per-function` and with `--exits repair`.
//!
//! It runs to its normal end; per thread and function, entries equal the calls the fixture
//! counted and every entry has exactly one exit: its return, or the exit the daemon writes at
//! the catch (`__rust_panic_cleanup` is probed), which comes before the catching function goes
//! on. Exactly the frames the panics left are counted as unwound, the catches equal the panics
//! caught, every event is accounted for, and llvm-xray 14 and 19 read every file alike. Every
//! call, the unwound ones included, lies within its caller's in the Chrome timeline, and no
//! function's longest call in `report --per-thread` outlasts its callers'.
//!
//! Needs root, BPF, llvm-xray 14/19, nightly rustc and a built daemon.
use std::time::Duration;

use tests::counts::{expected_calls, parse_count_lines};
use tests::fixtures::workloads::{
    panics_fixture, parse_returned_lines, PANICS_DONE_20, PANICS_FUNCTIONS,
};
use tests::launched::launch;
use tests::structure::without_closing_exits;
use tests::LLVM_XRAY_VERSIONS;

/// The defaults: fdr-profiled launches a program that can unwind, so it repairs its stack.
#[test]
fn panics_caught_with_catch_unwind_under_the_defaults() {
    panics_under(&[], "repair");
}

/// `--exits per-function`: each function decided from its code.
#[test]
fn panics_caught_with_catch_unwind_under_per_function() {
    panics_under(&["--exits", "per-function"], "per-function");
}

/// `--exits repair`: return probes on every function, the stack repaired at each panic's
/// `_Unwind_RaiseException` and hooked again at `__rust_panic_cleanup`.
#[test]
fn panics_caught_with_catch_unwind_under_repair() {
    panics_under(&["--exits", "repair"], "repair");
}

fn panics_under(daemon_args: &[&str], exits: &str) {
    let run = launch(
        &format!("panics-{exits}-{}", daemon_args.len()),
        &panics_fixture(),
        daemon_args,
        &["--iterations", "20"],
        Duration::from_secs(300),
    );
    let stdout = &run.done.stdout;
    assert_eq!(
        stdout.lines().last(),
        Some(PANICS_DONE_20),
        "the traced fixture must end normally:\n{stdout}"
    );
    assert!(
        run.done
            .stderr
            .contains("fdr-profiled: catches: probed _RNv"),
        "the Rust runtime's catch function is probed:\n{}",
        run.done.stderr
    );
    // Rust links rust_eh_personality: the defaults repair the stack of a launched program.
    assert_eq!(run.session_str("exits"), exits);
    assert_eq!(run.session.events_lost, 0, "{}", run.session.json);
    tests::assert_every_event_accounted(&run.session);
    if exits == "repair" {
        // Every panic caught went through a repair, in its own thread.
        let (repair, throws) = tests::trace::repair_books(&run.session, &run.done.stderr);
        let caught: u64 = run.thread_u64("catches").values().sum();
        assert!(caught > 0 && throws >= caught, "{repair}");
    }
    let calls = expected_calls(&parse_count_lines(stdout));
    let returned = parse_returned_lines(stdout);

    let mut per_version = Vec::new();
    for major in LLVM_XRAY_VERSIONS {
        per_version.push(run.converted(major));
    }
    let unwound_by_thread = run.thread_u64("frames_unwound");
    for (tid, c) in &per_version[1] {
        let key = |r: &tests::xray_yaml::Record| (r.func_id, r.kind.clone(), r.tsc);
        assert_eq!(
            per_version[0][tid]
                .records
                .iter()
                .map(key)
                .collect::<Vec<_>>(),
            c.records.iter().map(key).collect::<Vec<_>>(),
            "tid {tid}: llvm-xray 14 and 19 disagree"
        );
        let (_, closing) =
            without_closing_exits(c.records.iter(), &run.session.closing_exits(*tid));
        let mut left = 0;
        for f in PANICS_FUNCTIONS {
            let count = |pred: fn(&tests::xray_yaml::RecordKind) -> bool| {
                c.records
                    .iter()
                    .filter(|r| r.function == *f && pred(&r.kind))
                    .count() as u64
            };
            let want = calls[tid].get(*f).copied().unwrap_or(0);
            let want_ret = returned[tid].get(*f).copied().unwrap_or(0);
            let closed = closing.get(&(*tid, f.to_string())).copied().unwrap_or(0);
            assert_eq!(
                (
                    count(|k| k.is_entry()),
                    count(|k| k.is_exit()) - closed,
                    closed
                ),
                (want, want_ret, want - want_ret),
                "tid {tid} {f}: (entries, returns, exits written at the catch)"
            );
            left += want - want_ret;
        }
        // The panics leave instrumented std code too (the closure catch_unwind runs, the
        // panic's own frames): every function's entries have one exit each, and every frame
        // the daemon closed at a catch is counted.
        let mut balance: std::collections::BTreeMap<&str, i64> = Default::default();
        for r in &c.records {
            let d = if r.kind.is_entry() {
                1
            } else if r.kind.is_exit() {
                -1
            } else {
                0
            };
            *balance.entry(r.function.as_str()).or_default() += d;
        }
        balance.retain(|f, b| *b != 0 && *f != "main");
        assert!(
            balance.is_empty(),
            "tid {tid}: entries without exits: {balance:?}"
        );
        let closed_here: u64 = closing
            .iter()
            .filter(|((t, _), _)| t == tid)
            .map(|(_, n)| n)
            .sum();
        assert!(left > 0 && closed_here >= left);
        assert_eq!(
            unwound_by_thread[tid], closed_here,
            "tid {tid}: frames_unwound"
        );
        // After each catch, the next record of a pn_ function is the catching function's own
        // exit, later: the frames were closed at the catch, before it went on (a run of exits
        // at one tick ending with pn_middle's; the payload's cleanup may call std code first).
        for (i, w) in c.records.windows(2).enumerate() {
            let closes_run = w[0].kind.is_exit()
                && w[1].kind.is_exit()
                && w[0].tsc == w[1].tsc
                && w[1].function == "pn_middle";
            if closes_run {
                let next = c.records[i + 2..]
                    .iter()
                    .find(|r| r.function.starts_with("pn_"))
                    .expect("a pn_ record after the catch");
                assert_eq!(
                    (
                        next.function.as_str(),
                        next.kind.is_exit(),
                        next.tsc > w[1].tsc
                    ),
                    ("pn_catcher", true, true),
                    "tid {tid}: after the frames closed at {}",
                    w[1].tsc
                );
            }
        }
    }
    let catches: u64 = run.thread_u64("catches").values().sum();
    assert_eq!(catches, 60, "session.json catches");

    // Durations bounded by the caller: in the timeline every call, the unwound ones included,
    // begins and ends within the call that made it, and in `report --per-thread` no function's
    // longest call outlasts its callers'.
    tests::durations::assert_durations_within_callers(
        &run.out,
        run.scratch.path(),
        &["pn_middle", "pn_thrower"],
        &calls,
    );
}
