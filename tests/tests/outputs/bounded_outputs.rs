//! Reports and conversions of a trace full of unwound frames stay small: memory and output
//! grow with the events and the distinct stacks, not with events × depth.
//!
//! The exceptions fixture throws 10,200 times through five traced frames each, caught by the
//! thread's own long-lived loop (`--catch-in-thread`). Frames left open by unwinding would
//! nest deeper under it with every throw (a real YAML parser's test suite gave
//! a 1,718-level Chrome trace, 6.2 GB of folded stacks and 6.6 GB of memory to draw them). The
//! daemon closes them at the catch, so every conversion here is measured: peak memory of the
//! converting process (its own rusage) under 200 MiB, folded stacks under 64 KiB (a few dozen
//! distinct stacks), the timelines under 300 bytes per event.
//!
//! compiler-rt's own trace of the same 10,200 throws has no exit for an unwound frame and no
//! stack pointer: those frames stay open until the thread's loop returns, 25,500 levels deep
//! at the end. No reader can tell them from live recursion, so the conversions show the first
//! 256 levels and fold what is deeper into one marked frame, with a warning that counts the
//! calls folded; `report` stays exact. Before that cap, 3,000 throws gave 304 MB of folded
//! stacks (331 MB of memory), growing as throws x depth.
//!
//! Both traces are first read by llvm-xray 14 and 19, which must agree on every record and find
//! the calls the fixture counted.
//!
//! Needs root, BPF, clang-19 (with compiler-rt's XRay runtime), llvm-xray 14/19 and a built
//! daemon.
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tests::counts::{expected_calls, parse_count_lines};
use tests::fixtures::workloads::{
    exceptions_fixture, exceptions_native_fixture, native_records, native_trace,
    parse_returned_lines,
};
use tests::launched::launch;
use tests::scratch_dir;
use tests::structure::entries_and_exits;

/// Peak memory bound of one conversion, in KiB (the stated bound of the issue).
const MAX_RSS_KIB: i64 = 200 * 1024;

/// The last line of `exceptions.cpp --iterations 3400 --catch-in-thread`.
const DONE_10200: &str = "exceptions: done caught=10200 rounds=20400";

/// Runs `fdr-profiled ARGS` to its end; returns its peak resident memory in KiB.
fn peak_rss_kib(args: &[&std::ffi::OsStr]) -> i64 {
    measured(args, None).0
}

/// Runs `fdr-profiled ARGS` to its end, its standard output into `stdout` (or nowhere);
/// returns its peak resident memory in KiB and its standard error. Measured by `peak_rss`
/// (this package's binary), a small process between us and it: a child's peak would count
/// this test process's own memory (inherited up to its `exec`).
fn measured(args: &[&std::ffi::OsStr], stdout: Option<&Path>) -> (i64, String) {
    let out = match stdout {
        Some(path) => std::process::Stdio::from(
            std::fs::File::create(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        ),
        None => std::process::Stdio::null(),
    };
    let done = Command::new(env!("CARGO_BIN_EXE_peak_rss"))
        .arg(tests::fdr_profiled())
        .args(args)
        .stdout(out)
        .output()
        .expect("run peak_rss");
    let stderr = String::from_utf8_lossy(&done.stderr).into_owned();
    assert!(
        done.status.success(),
        "fdr-profiled {args:?} failed: {}\n{stderr}",
        done.status
    );
    let kib = stderr
        .lines()
        .last()
        .and_then(|l| l.strip_prefix("peak_rss_kib="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no peak_rss_kib line:\n{stderr}"));
    (kib, stderr)
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .len()
}

#[test]
fn conversions_of_ten_thousand_throws_are_bounded() {
    let run = launch(
        "bounded-outputs",
        &exceptions_fixture(),
        &["--no-report"],
        &["--iterations", "3400", "--catch-in-thread"],
        Duration::from_secs(600),
    );
    assert_eq!(
        run.done.stdout.lines().last(),
        Some("exceptions: done caught=10200 rounds=20400"),
        "{}",
        run.done.stdout
    );
    assert_eq!(run.session.events_lost, 0, "{}", run.session.json);
    let unwound: u64 = run.thread_u64("frames_unwound").values().sum();
    assert_eq!(unwound, 10_200 * 5);
    // The files: llvm-xray 14 and 19 read the same records; per thread and function, entries
    // are the calls the fixture made, each closed by one exit (its return, or the catch's).
    let calls = expected_calls(&parse_count_lines(&run.done.stdout));
    for (tid, c) in run.converted_both() {
        for (function, n) in &calls[&tid] {
            assert_eq!(
                entries_and_exits(&c.records, function),
                (*n, *n),
                "tid {tid} {function}: (entries, exits)"
            );
        }
    }
    let events = run.session.events;
    let out = run.out.as_os_str();
    let scratch = run.scratch.path();

    let rss = peak_rss_kib(&["report".as_ref(), out]);
    assert!(rss < MAX_RSS_KIB, "report: {rss} KiB");
    for (format, file, max_bytes) in [
        ("folded", "stacks.folded", 64 << 10),
        ("svg", "flame.svg", 1 << 20),
        ("chrome", "trace.json", 300 * events),
        ("perfetto", "trace.perfetto-trace", 100 * events),
        ("speedscope", "profile.json", 300 * events),
    ] {
        let path = scratch.join(file);
        let rss = peak_rss_kib(&[
            "convert".as_ref(),
            out,
            "--format".as_ref(),
            format.as_ref(),
            "-o".as_ref(),
            path.as_os_str(),
        ]);
        let bytes = size(&path);
        eprintln!("convert --format {format}: {bytes} bytes, peak {rss} KiB, {events} events");
        assert!(
            rss < MAX_RSS_KIB,
            "convert --format {format}: peak {rss} KiB"
        );
        assert!(
            bytes < max_bytes,
            "convert --format {format}: {bytes} bytes for {events} events (bound {max_bytes})"
        );
    }
}

/// compiler-rt's own trace of the 10,200 throws above (`-DFX_NATIVE_FDR`, the thread's loop
/// catching): `report` reads it exactly, within the memory bound, and every conversion stays
/// within the same bounds, the frames deeper than the cap folded and counted.
#[test]
fn conversions_of_the_native_trace_of_ten_thousand_throws_are_bounded() {
    let dir = scratch_dir("bounded-outputs-native");
    let bin = exceptions_native_fixture();
    let traces = dir.path().join("trace");
    std::fs::create_dir(&traces).unwrap();
    let (file, stdout) = native_trace(
        &bin,
        &traces,
        &["--iterations", "3400", "--catch-in-thread"],
    );
    assert_eq!(stdout.lines().last(), Some(DONE_10200), "{stdout}");
    let calls = expected_calls(&parse_count_lines(&stdout));
    let returned = parse_returned_lines(&stdout);
    let sum =
        |m: &tests::ExpectedCalls, f: &str| -> u64 { m.values().filter_map(|c| c.get(f)).sum() };

    // The reference readers agree on every thread's records; per function, entries are the
    // calls the fixture made and exits the calls that returned (XRay writes none for an unwound
    // frame).
    let (_, by_thread) = native_records(&bin, &file);
    let records: Vec<_> = by_thread.values().flatten().collect();
    let events = records.len() as u64;
    for f in ["ex_thread", "ex_middle", "ex_thrower", "ex_report"] {
        assert_eq!(
            entries_and_exits(records.iter().copied(), f),
            (sum(&calls, f), sum(&returned, f)),
            "{f}: (entries, exits) in compiler-rt's trace"
        );
    }
    assert_eq!(
        sum(&calls, "ex_thrower") - sum(&returned, "ex_thrower"),
        10_200 * 4
    );

    let os = std::ffi::OsStr::new;
    let (file, bin_arg) = (file.as_os_str(), bin.as_os_str());

    // report: exact, every call counted (returned or unwound), no folding.
    let json_path = dir.path().join("report.json");
    let args = [
        os("report"),
        file,
        os("--binary"),
        bin_arg,
        os("--format"),
        os("json"),
    ];
    let (rss, stderr) = measured(&args, Some(&json_path));
    eprintln!("report: peak {rss} KiB, {events} records");
    assert!(rss < MAX_RSS_KIB, "report: peak {rss} KiB");
    assert!(!stderr.contains("folded"), "{stderr}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).expect("report JSON");
    assert_eq!(json["totals"]["unwound"], 10_200 * 5, "{}", json["totals"]);
    for f in ["ex_thread", "ex_middle", "ex_thrower", "ex_report"] {
        let row = json["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == f)
            .unwrap_or_else(|| panic!("no row for {f}"));
        assert_eq!(
            (row["calls"].as_u64(), row["unwound"].as_u64()),
            (
                Some(sum(&returned, f)),
                Some(sum(&calls, f) - sum(&returned, f))
            ),
            "{f}: (returned, unwound) as the fixture counted them: {row}"
        );
    }

    let mut folded_counts = Vec::new();
    for (format, name, max_bytes) in [
        ("folded", "stacks.folded", 1 << 20),
        ("svg", "flame.svg", 4 << 20),
        ("chrome", "trace.json", 300 * events),
        ("perfetto", "trace.perfetto-trace", 100 * events),
        ("speedscope", "profile.json", 300 * events),
    ] {
        let path = dir.path().join(name);
        let args = [
            os("convert"),
            file,
            os("--binary"),
            bin_arg,
            os("--format"),
            os(format),
            os("-o"),
            path.as_os_str(),
        ];
        let (rss, stderr) = measured(&args, None);
        let bytes = size(&path);
        eprintln!(
            "native, convert --format {format}: {bytes} bytes, peak {rss} KiB, {events} records"
        );
        assert!(
            rss < MAX_RSS_KIB,
            "convert --format {format}: peak {rss} KiB"
        );
        assert!(
            bytes < max_bytes,
            "convert --format {format}: {bytes} bytes for {events} records (bound {max_bytes})"
        );
        // One warning line counts the calls folded below the cap.
        let warning = stderr
            .lines()
            .find(|l| l.contains("levels (down to level"))
            .unwrap_or_else(|| panic!("convert --format {format}: no folding warning:\n{stderr}"));
        let n: u64 = warning
            .split_once("warning: ")
            .and_then(|(_, w)| w.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count in {warning}"));
        assert!(n > 0 && n < events, "{warning}");
        folded_counts.push(n);
        // (The Perfetto trace is binary: tests/tests/outputs/perfetto.rs decodes one.)
        let text = || std::fs::read_to_string(&path).unwrap();
        match format {
            "folded" => {
                let text = text();
                assert!(
                    text.contains(";[deeper calls folded];ex_thrower "),
                    "{format}"
                );
                let deepest = text.lines().map(|l| l.matches(';').count() + 1).max();
                assert!(deepest <= Some(256 + 2), "{format}: {deepest:?} frames");
            }
            "chrome" => {
                let text = text();
                // Nesting per thread stays within the cap (plus the folded frame).
                let json: serde_json::Value = serde_json::from_str(&text).expect("chrome JSON");
                let mut depth: std::collections::BTreeMap<u64, i64> = Default::default();
                let mut deepest = 0;
                for e in json["traceEvents"].as_array().unwrap() {
                    let d = depth.entry(e["tid"].as_u64().unwrap()).or_default();
                    match e["ph"].as_str() {
                        Some("B") => *d += 1,
                        Some("E") => *d -= 1,
                        _ => {}
                    }
                    assert!(*d >= 0);
                    deepest = deepest.max(*d);
                }
                assert!(depth.values().all(|d| *d == 0), "{depth:?}");
                assert_eq!(deepest, 256 + 1, "chrome nesting");
                assert!(text.contains("\"name\":\"[deeper calls folded]\""));
            }
            _ => {}
        }
    }
    assert!(
        folded_counts.windows(2).all(|w| w[0] == w[1]),
        "every format folds the same calls: {folded_counts:?}"
    );
}
