//! End to end: a thread sleeps 4.5 s between two calls, longer than the
//! 32-bit TSC delta of an FDR function record can hold (2^32 ns ≈ 4.29 s
//! with ns ticks). The file must carry a TSCWrap record, and the two entries'
//! timestamps as llvm-xray 14 and 19 read them must be the measured gap
//! apart (within 10 ms).

use std::time::Duration;

use tests::{
    assert_process_calls, assert_session_totals, assert_success, check_trace_dir, convert,
    cpp_fixture, expected_calls, fdr_dump, parse_count_lines, parse_gap_ns, private_copy,
    run_launch, scratch_dir, summary_events_lost, MainCall, ProcessExpectation, RecordKind,
    CPP_FUNCTIONS, CPP_GAP_PROBE, CPP_MAIN, LLVM_XRAY_VERSIONS,
};

const GAP_MS: u64 = 4500;
const TOLERANCE_NS: u64 = 10_000_000;

#[test]
fn long_gap_writes_tsc_wrap() {
    let scratch = scratch_dir("tsc-wrap");
    let bin = private_copy(&cpp_fixture(), scratch.path());
    let out = scratch.path().join("out");
    // Pinned to one CPU: the gap must be bridged by a TSCWrap, not by a
    // NewCPUId after a migration.
    let done = run_launch(
        &out,
        &bin,
        &[
            "--gap-ms",
            &GAP_MS.to_string(),
            "--iterations",
            "2",
            "--pin-cpu",
            "0",
        ],
        Duration::from_secs(120),
    );
    assert_success("fdr-profiled -- fixture --gap-ms", &done);
    assert_eq!(
        summary_events_lost(&done.stderr),
        Some(0),
        "{}",
        done.stderr
    );
    let gap_ns = parse_gap_ns(&done.stdout)
        .unwrap_or_else(|| panic!("no gap_ns line in the fixture output:\n{}", done.stdout));
    assert!(gap_ns >= GAP_MS * 1_000_000, "gap_ns={gap_ns}");

    let trace = check_trace_dir(&out, &bin);
    assert_eq!(trace.session.processes.len(), 1, "{}", trace.session.json);
    let pid = trace.session.processes[0].pid;
    let calls = expected_calls(&parse_count_lines(&done.stdout));
    assert_process_calls(
        &trace,
        &ProcessExpectation {
            pid,
            calls: &calls,
            known: CPP_FUNCTIONS,
            main_fn: CPP_MAIN,
            main: MainCall::Traced,
            only_known: true,
        },
    );
    assert_session_totals(&trace);

    // The gap is on the main thread.
    let main = trace
        .thread(pid, pid)
        .unwrap_or_else(|| panic!("no file for the main thread {pid}"));
    assert_eq!(
        main.header.cycle_frequency,
        1_000_000_000,
        "{}: ticks are ns",
        main.path.display()
    );
    for major in LLVM_XRAY_VERSIONS {
        let dump = fdr_dump(major, &main.path);
        let converted = convert(major, &bin, &main.path);
        let entries: Vec<u64> = converted
            .records
            .iter()
            .filter(|r| r.function == CPP_GAP_PROBE && r.kind == RecordKind::Enter)
            .map(|r| r.tsc)
            .collect();
        assert_eq!(
            entries.len(),
            2,
            "llvm-xray {major}: {CPP_GAP_PROBE} entries in {}",
            main.path.display()
        );
        // The writer's crash-safe commits leave no-op TSCWrap records (base unchanged) in every
        // file, so "some TSC Wrap" proves nothing: the wrap must reset the base exactly at the
        // second entry, the first record after the gap.
        let wraps: Vec<u64> = dump
            .lines()
            .filter_map(|l| l.trim().strip_prefix("<TSC Wrap: base = "))
            .filter_map(|rest| rest.trim_end_matches('>').trim().parse().ok())
            .collect();
        assert!(
            wraps.contains(&entries[1]),
            "llvm-xray {major} fdr-dump shows no TSC Wrap to {} (the entry after the gap) in {}; wraps: {wraps:?}\n{}",
            entries[1],
            main.path.display(),
            tests::tools::tail_lines(&dump, 80)
        );
        let traced = entries[1] - entries[0];
        assert!(
            traced.abs_diff(gap_ns) <= TOLERANCE_NS,
            "llvm-xray {major}: entries {traced} ns apart in the trace, fixture measured {gap_ns} ns"
        );
    }
}
