//! `--functions` / `--exclude`: only the selected functions are traced, each with exactly the
//! calls the fixture counted; a selection matching nothing is a one-line error.
use std::collections::BTreeSet;
use std::time::Duration;
use tests::counts::{expected_calls, parse_count_lines};
use tests::fixtures::{cpp_fixture, private_copy};
use tests::run::{assert_success, run_launch_with};
use tests::tools::scratch_dir;
use tests::trace::{check_trace_dir, summary_events_lost};

const TIMEOUT: Duration = Duration::from_secs(180);

#[test]
fn only_selected_functions_are_traced_with_exact_counts() {
    let scratch = scratch_dir("select-cpp");
    let bin = private_copy(&cpp_fixture(), scratch.path());
    let out = scratch.path().join("out");
    // Globs over whole names, a regex, and an exclusion that wins over an inclusion.
    let selection = [
        "--functions",
        "fx::*",
        "--functions",
        "re:^fx_tail_",
        "--exclude",
        "fx::leaf(*)",
    ];
    let done = run_launch_with(&out, &selection, &bin, &["--iterations", "20"], TIMEOUT);
    assert_success("fdr-profiled --functions ... -- fixture", &done);
    assert_eq!(
        summary_events_lost(&done.stderr),
        Some(0),
        "{}",
        done.stderr
    );
    let selected: BTreeSet<&str> = [
        "fx::work(int, int)",
        "fx::outer(int)",
        "fx::middle(int)",
        "fx_tail_caller",
        "fx_tail_target",
    ]
    .into();
    assert!(
        done.stderr
            .contains(&format!("to {} functions", selected.len())),
        "attach line should count the selected functions: {}",
        done.stderr
    );

    let trace = check_trace_dir(&out, &bin);
    let expected = expected_calls(&parse_count_lines(&done.stdout));
    let mut threads_with_selected_calls = BTreeSet::new();
    for (tid, functions) in &expected {
        if functions
            .iter()
            .any(|(f, n)| selected.contains(f.as_str()) && *n > 0)
        {
            threads_with_selected_calls.insert(*tid);
        }
    }
    assert!(threads_with_selected_calls.len() >= 2, "{expected:?}");
    let traced_threads: BTreeSet<u32> = trace.threads.iter().map(|t| t.tid).collect();
    assert_eq!(
        traced_threads, threads_with_selected_calls,
        "threads with a trace file"
    );

    for thread in &trace.threads {
        let calls = thread.calls();
        let unselected: Vec<&String> = calls
            .keys()
            .filter(|f| !selected.contains(f.as_str()))
            .collect();
        assert!(
            unselected.is_empty(),
            "tid {}: traced {unselected:?}",
            thread.tid
        );
        let want = &expected[&thread.tid];
        for function in &selected {
            let n = want.get(*function).copied().unwrap_or(0);
            let got = calls.get(*function).copied().unwrap_or_default();
            assert_eq!(
                (got.entries(), got.exits()),
                (n, n),
                "tid {}: entries and exits of {function}",
                thread.tid
            );
        }
    }
}

#[test]
fn a_selection_matching_nothing_is_one_error_line() {
    let scratch = scratch_dir("select-none");
    let bin = private_copy(&cpp_fixture(), scratch.path());
    let out = scratch.path().join("out");
    let ran = scratch.path().join("ran");
    for selection in [
        &["--functions", "no_such_function*"][..],
        &["--exclude", "*"][..],
        &["--functions", "re:("][..],
    ] {
        let done = run_launch_with(
            &out,
            selection,
            &bin,
            &["--wait-file", ran.to_str().unwrap()],
            TIMEOUT,
        );
        assert!(!done.status.success(), "{selection:?} succeeded");
        let lines: Vec<&str> = done.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{selection:?}: {}", done.stderr);
        assert!(
            lines[0].starts_with("fdr-profiled: error: "),
            "{}",
            lines[0]
        );
        assert!(!out.exists(), "{selection:?} created the output directory");
    }
}
