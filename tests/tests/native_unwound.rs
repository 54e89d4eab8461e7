//! Our readers accept what XRay's own runtime writes when exceptions unwind traced frames.
//!
//! compiler-rt's FDR mode writes no exit for a frame an exception left: the exit of the frame
//! that caught it comes next, with the unwound frames still open above it (`llvm-xray convert`
//! reads that; `llvm-xray account` refuses it). `fdr-profiled verify` and `dump` must read such a trace in full, count
//! the frames closed that way, and call the file valid: a trace written by the reference
//! runtime is never invalid. The counts are checked against what the fixture itself counted
//! (calls that returned normally versus calls made).
//!
//! Needs clang-19 with compiler-rt's XRay runtime and a built daemon (no BPF).

use std::process::Command;

use tests::counts::{expected_calls, parse_count_lines};
use tests::fixtures::workloads::{
    exceptions_native_fixture, native_trace, parse_returned_lines, EXCEPTIONS_DONE_20,
};
use tests::tools::{fdr_profiled, run_output, scratch_dir};

/// Frames the fixture entered and did not return from, over all threads and functions.
fn unwound_by_the_fixture(stdout: &str) -> u64 {
    let calls = expected_calls(&parse_count_lines(stdout));
    let returned = parse_returned_lines(stdout);
    let mut unwound = 0;
    for (tid, functions) in &calls {
        for (function, n) in functions {
            let r = returned[tid][function];
            assert!(r <= *n, "{function} returned more often than it was called");
            unwound += n - r;
        }
    }
    unwound
}

#[test]
fn verify_and_dump_read_the_native_trace_of_unwound_frames() {
    let dir = scratch_dir("native-unwound");
    let bin = exceptions_native_fixture();
    let (file, stdout) = native_trace(&bin, dir.path(), &["--iterations", "20"]);
    assert_eq!(stdout.lines().last(), Some(EXCEPTIONS_DONE_20));
    let expected = unwound_by_the_fixture(&stdout);
    // 60 throws, each leaving four ex_thrower frames and one ex_middle frame.
    assert_eq!(expected, 60 * 5);

    // The reference readers: convert reads it (checked elsewhere); account refuses the exit
    // that skips open frames, which is why the daemon writes an exit for each such frame.
    for major in tests::LLVM_XRAY_VERSIONS {
        let account = run_output(
            Command::new(tests::llvm_xray(major))
                .arg("account")
                .arg(format!("-instr_map={}", bin.display()))
                .arg(&file),
        );
        assert!(
            !account.status.success()
                && String::from_utf8_lossy(&account.stderr).contains("Error processing record"),
            "llvm-xray {major} account accepted the trace: {account:?}"
        );
    }

    let out = run_output(Command::new(fdr_profiled()).arg("verify").arg(&file));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "verify rejected compiler-rt's own trace:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!(
            ", {expected} frames closed by a caller's exit (unwound)"
        )),
        "verify: {text}"
    );

    let out = run_output(
        Command::new(fdr_profiled())
            .arg("dump")
            .arg(&file)
            .arg("--binary")
            .arg(&bin),
    );
    assert!(
        out.status.success(),
        "dump stopped on compiler-rt's own trace:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump = String::from_utf8_lossy(&out.stdout);
    let mut closed = 0u64;
    let mut closing_lines = 0u64;
    for line in dump.lines() {
        let Some((_, rest)) = line.split_once(" (also closes ") else {
            continue;
        };
        let n: u64 = rest
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count in {line}"));
        // Only the catching function's exit closes frames in this program.
        assert!(
            line.contains("<Function Exit:") && line.contains(" ex_catcher"),
            "{line}"
        );
        assert_eq!(n, 5, "{line}");
        closed += n;
        closing_lines += 1;
    }
    assert_eq!(closed, expected);
    assert_eq!(closing_lines, 60);
}

/// `report` (and `convert`) read the same trace as a session of its own: every thread of the
/// file, each replayed from its buffers alone. Per function over all threads, the calls that
/// returned and the calls ended by a caller's exit (unwound) are what the fixture counted.
#[test]
fn report_reads_the_native_trace_of_every_thread() {
    let dir = scratch_dir("native-unwound-report");
    let bin = exceptions_native_fixture();
    let (file, stdout) = native_trace(&bin, dir.path(), &["--iterations", "20"]);
    let calls = expected_calls(&parse_count_lines(&stdout));
    let returned = parse_returned_lines(&stdout);
    let out = run_output(
        Command::new(fdr_profiled())
            .arg("report")
            .arg(&file)
            .arg("--binary")
            .arg(&bin)
            .args(["--format", "json"]),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "report on compiler-rt's own trace:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_str(&text).expect("report JSON");
    assert_eq!(json["totals"]["threads"], 3, "{}", json["totals"]);
    let mut checked = 0;
    for row in json["functions"].as_array().expect("functions") {
        let name = row["name"].as_str().unwrap_or_default();
        if !name.starts_with("ex_") {
            continue;
        }
        let want_calls: u64 = calls.values().filter_map(|f| f.get(name)).sum();
        let want_returned: u64 = returned.values().filter_map(|f| f.get(name)).sum();
        assert_eq!(
            (row["calls"].as_u64(), row["unwound"].as_u64()),
            (Some(want_returned), Some(want_calls - want_returned)),
            "{name}: (returned, unwound) as the fixture counted them: {row}"
        );
        checked += 1;
    }
    assert_eq!(checked, 6, "every ex_ function has a row: {text}");

    let folded = run_output(
        Command::new(fdr_profiled())
            .arg("convert")
            .arg(&file)
            .arg("--binary")
            .arg(&bin)
            .args(["--format", "folded"]),
    );
    assert!(
        folded.status.success(),
        "convert on compiler-rt's own trace"
    );
    assert!(
        String::from_utf8_lossy(&folded.stdout).contains("ex_catcher;ex_middle;ex_thrower"),
        "folded stacks of the native trace"
    );
}
