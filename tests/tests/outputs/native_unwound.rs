//! Our readers accept what XRay's own runtime writes when exceptions or `longjmp` leave traced
//! frames.
//!
//! compiler-rt's FDR mode writes no exit for a frame an exception or a `longjmp` left: the exit
//! of the frame that caught it (or that the jump landed in) comes next, with the frames left
//! still open above it (`llvm-xray convert` reads that; `llvm-xray account` refuses it).
//! `fdr-profiled verify`, `dump` and `report` must read such a trace in full, count the frames
//! closed that way, and call the file valid: a trace written by the reference runtime is never
//! invalid. The counts are checked against what each fixture itself counted (calls that
//! returned normally versus calls made), for `exceptions.cpp` and `longjmp.c`, and for both
//! layouts: version 5, as clang 19's runtime writes it, and version 1. That runtime has no
//! option for version 1 (its FDR flags are `buffer_size`, `buffer_max`, `no_file_flush`,
//! `func_duration_threshold_us` and `grace_period_ms`), so its trace is re-encoded
//! record for record in the version 1 layout (`native_trace_as_v1`), which llvm-xray 14 and 19
//! must read as the same records.
//!
//! Needs clang-19 with compiler-rt's XRay runtime, llvm-xray 14/19 and a built daemon (no BPF).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use tests::counts::{expected_calls, parse_count_lines, ExpectedCalls};
use tests::fixtures::workloads::{
    exceptions_native_fixture, longjmp_native_fixture, native_records, native_trace,
    native_trace_as_v1, parse_returned_lines, EXCEPTIONS_DONE_20, EXCEPTIONS_FUNCTIONS,
    LONGJMP_DONE_20, LONGJMP_FUNCTIONS,
};
use tests::structure::entries_and_exits;
use tests::tools::{fdr_profiled, run_output, scratch_dir};

/// A trace compiler-rt wrote, and what its program counted.
struct Native {
    label: &'static str,
    bin: PathBuf,
    file: PathBuf,
    /// The header version of `file`.
    version: u16,
    calls: ExpectedCalls,
    returned: ExpectedCalls,
    /// The functions the fixture counts.
    functions: &'static [&'static str],
    /// The function whose exit closes the frames left (the catcher, or where `longjmp` lands).
    closer: &'static str,
    /// Non-local exits, and the frames each leaves.
    exits: u64,
    frames_each: u64,
}

fn run_native(
    label: &'static str,
    bin: PathBuf,
    dir: &Path,
    done: &str,
    functions: &'static [&'static str],
    closer: &'static str,
) -> Native {
    let dir = dir.join(label);
    std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let (file, stdout) = native_trace(&bin, &dir, &["--iterations", "20"]);
    assert_eq!(stdout.lines().last(), Some(done), "{label}: {stdout}");
    Native {
        label,
        bin,
        file,
        version: 5,
        calls: expected_calls(&parse_count_lines(&stdout)),
        returned: parse_returned_lines(&stdout),
        functions,
        closer,
        // 60 throws or jumps, each leaving four recursive frames and the one that called them.
        exits: 60,
        frames_each: 5,
    }
}

/// `exceptions.cpp`: ex_catcher catches what ex_thrower throws through ex_middle.
fn exceptions(dir: &Path) -> Native {
    run_native(
        "exceptions",
        exceptions_native_fixture(),
        dir,
        EXCEPTIONS_DONE_20,
        EXCEPTIONS_FUNCTIONS,
        "ex_catcher",
    )
}

/// `longjmp.c`: lj_dive jumps back to lj_protected through lj_middle.
fn longjmp(dir: &Path) -> Native {
    run_native(
        "longjmp",
        longjmp_native_fixture(),
        dir,
        LONGJMP_DONE_20,
        LONGJMP_FUNCTIONS,
        "lj_protected",
    )
}

/// The same trace in the version 1 layout, in `dir`.
fn as_v1(n: Native, dir: &Path) -> Native {
    let file = dir.join(format!("{}-v1.fdr", n.label));
    native_trace_as_v1(&n.file, &file);
    Native {
        file,
        version: 1,
        ..n
    }
}

/// Over all threads, `function`'s count in `m`.
fn total(m: &ExpectedCalls, function: &str) -> u64 {
    m.values().filter_map(|f| f.get(function)).sum()
}

/// Frames the fixture entered and did not return from, over all threads and functions.
fn unwound_by_the_fixture(n: &Native) -> u64 {
    let mut unwound = 0;
    for (tid, functions) in &n.calls {
        for (function, calls) in functions {
            let r = n.returned[tid][function];
            assert!(
                r <= *calls,
                "{function} returned more often than it was called"
            );
            unwound += calls - r;
        }
    }
    assert_eq!(unwound, n.exits * n.frames_each, "{}", n.label);
    unwound
}

/// The reference readers: llvm-xray 14 and 19 read the same records (`convert`, thread by
/// thread), per
/// function as many entries as calls and as many exits as returns (no exit for a frame left);
/// `account` refuses the exit that skips open frames, which is why the daemon writes an exit
/// for each such frame. Returns the records.
fn reference(n: &Native) -> BTreeMap<u32, Vec<tests::Record>> {
    let map = format!("-instr_map={}", n.bin.display());
    let (header, by_thread) = native_records(&n.bin, &n.file);
    assert_eq!(header.version, n.version, "{}", n.label);
    let records: Vec<_> = by_thread.values().flatten().collect();
    for f in n.functions {
        assert_eq!(
            entries_and_exits(records.iter().copied(), f),
            (total(&n.calls, f), total(&n.returned, f)),
            "{} v{} {f}: (entries, exits) in compiler-rt's trace",
            n.label,
            n.version
        );
    }
    for major in tests::LLVM_XRAY_VERSIONS {
        let account = run_output(
            Command::new(tests::llvm_xray(major))
                .arg("account")
                .arg(&map)
                .arg(&n.file),
        );
        assert!(
            !account.status.success()
                && String::from_utf8_lossy(&account.stderr).contains("Error processing record"),
            "llvm-xray {major} account accepted {} v{}: {account:?}",
            n.label,
            n.version
        );
    }
    by_thread
}

/// `verify` calls the file valid and counts the frames closed by a caller's exit; `dump` reads
/// it to the end and marks each such exit: the closer's, closing the frames one exit left.
fn verify_and_dump(n: &Native) {
    let expected = unwound_by_the_fixture(n);
    let out = run_output(Command::new(fdr_profiled()).arg("verify").arg(&n.file));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "verify rejected compiler-rt's own trace of {} v{}:\n{text}{}",
        n.label,
        n.version,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("ok: version {}, 3 thread buffer", n.version))
            && text.contains(&format!(
                ", {expected} frames closed by a caller's exit (unwound)"
            )),
        "verify: {text}"
    );

    let out = run_output(
        Command::new(fdr_profiled())
            .arg("dump")
            .arg(&n.file)
            .arg("--binary")
            .arg(&n.bin),
    );
    assert!(
        out.status.success(),
        "dump stopped on compiler-rt's own trace of {} v{}:\n{}",
        n.label,
        n.version,
        String::from_utf8_lossy(&out.stderr)
    );
    let dump = String::from_utf8_lossy(&out.stdout);
    let mut closed = 0u64;
    let mut closing_lines = 0u64;
    let mut function_lines = 0u64;
    for line in dump.lines() {
        if line.contains("<Function ") {
            function_lines += 1;
        }
        let Some((_, rest)) = line.split_once(" (also closes ") else {
            continue;
        };
        let count: u64 = rest
            .split_whitespace()
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no count in {line}"));
        // Only the closer's exit closes frames in these programs.
        assert!(
            line.contains("<Function Exit:") && line.contains(&format!(" {}", n.closer)),
            "{line}"
        );
        assert_eq!(count, n.frames_each, "{line}");
        closed += count;
        closing_lines += 1;
    }
    assert_eq!((closed, closing_lines), (expected, n.exits), "{}", n.label);
    // Read to the end: every function record of the file is a line.
    let records: u64 = n
        .functions
        .iter()
        .map(|f| total(&n.calls, f) + total(&n.returned, f))
        .sum();
    assert!(
        function_lines >= records,
        "{function_lines} function lines, {records} records"
    );
}

/// `report` (and `convert`) read the same trace as a session of its own: every thread of the
/// file, each replayed from its buffers alone. Per function over all threads, the calls that
/// returned and the calls ended by a caller's exit (unwound) are what the fixture counted.
fn report(n: &Native) {
    let out = run_output(
        Command::new(fdr_profiled())
            .arg("report")
            .arg(&n.file)
            .arg("--binary")
            .arg(&n.bin)
            .args(["--format", "json"]),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "report on compiler-rt's own trace of {} v{}:\n{text}{}",
        n.label,
        n.version,
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_str(&text).expect("report JSON");
    assert_eq!(json["totals"]["threads"], 3, "{}", json["totals"]);
    assert_eq!(
        json["totals"]["unwound"],
        unwound_by_the_fixture(n),
        "{}",
        json["totals"]
    );
    let mut checked = 0;
    for row in json["functions"].as_array().expect("functions") {
        let name = row["name"].as_str().unwrap_or_default();
        if !n.functions.contains(&name) {
            continue;
        }
        let (calls, returned) = (total(&n.calls, name), total(&n.returned, name));
        assert_eq!(
            (row["calls"].as_u64(), row["unwound"].as_u64()),
            (Some(returned), Some(calls - returned)),
            "{} v{} {name}: (returned, unwound) as the fixture counted them: {row}",
            n.label,
            n.version
        );
        checked += 1;
    }
    let called = n
        .functions
        .iter()
        .filter(|f| total(&n.calls, f) > 0)
        .count();
    assert_eq!(checked, called, "every function called has a row: {text}");

    let folded = run_output(
        Command::new(fdr_profiled())
            .arg("convert")
            .arg(&n.file)
            .arg("--binary")
            .arg(&n.bin)
            .args(["--format", "folded"]),
    );
    assert!(
        folded.status.success(),
        "convert on compiler-rt's own trace of {} v{}",
        n.label,
        n.version
    );
    let stacks = String::from_utf8_lossy(&folded.stdout);
    let deepest = if n.label == "exceptions" {
        "ex_catcher;ex_middle;ex_thrower"
    } else {
        "lj_protected;lj_middle;lj_dive"
    };
    assert!(stacks.contains(deepest), "folded stacks of {}", n.label);
}

#[test]
fn verify_and_dump_read_the_native_trace_of_unwound_frames() {
    let dir = scratch_dir("native-unwound");
    let n = exceptions(dir.path());
    reference(&n);
    verify_and_dump(&n);
}

#[test]
fn report_reads_the_native_trace_of_every_thread() {
    let dir = scratch_dir("native-unwound-report");
    report(&exceptions(dir.path()));
}

/// `longjmp.c` in compiler-rt's FDR mode: XRay writes no exit for the frames a `longjmp` left;
/// lj_protected's exit comes with them still open (after lj_after, entered above them).
#[test]
fn verify_dump_and_report_read_the_native_trace_of_longjmp() {
    let dir = scratch_dir("native-longjmp");
    let n = longjmp(dir.path());
    reference(&n);
    verify_and_dump(&n);
    report(&n);
}

/// Both traces in the version 1 layout: llvm-xray 14 and 19 read the records of the version 5
/// file from it (every function record, its thread, CPU and tick), and verify, dump and report
/// find what the fixtures counted, as for version 5.
#[test]
fn version_1_of_the_native_traces_reads_in_full() {
    let dir = scratch_dir("native-v1");
    for n in [exceptions(dir.path()), longjmp(dir.path())] {
        let v5 = reference(&n);
        let n = as_v1(n, dir.path());
        let v1 = reference(&n);
        let key = |r: &tests::Record| (r.cpu, r.tsc, r.func_id, r.kind.clone(), r.args.clone());
        let keys = |m: &BTreeMap<u32, Vec<tests::Record>>| -> Vec<(u32, Vec<_>)> {
            m.iter()
                .map(|(tid, rs)| (*tid, rs.iter().map(key).collect()))
                .collect()
        };
        assert_eq!(
            keys(&v1),
            keys(&v5),
            "{}: the version 1 file holds the records of the version 5 one, thread by thread",
            n.label
        );
        let records: usize = v5.values().map(Vec::len).sum();
        assert!(records > 1000, "{}: {records} records", n.label);
        verify_and_dump(&n);
        report(&n);
    }
}
