//! A real C++ library's parser, launched with the defaults: nlohmann/json parsing documents a
//! third of which are malformed, each error thrown from deep in its recursive descent through
//! frames whose locals' destructors run while the exception unwinds, and caught per document.
//!
//! Destructors run during unwinding are normal C++: they must not be taken for the kernel's
//! limit of pending return probes (this program once fell back to exit sleds, 4.5x slower).
//! Checked: no fall-back, every exit observed by a return probe, the program's output
//! unchanged, and, function by function, as many entries as XRay's own FDR runtime records on
//! the same program (read by llvm-xray 14 and 19), each closed by exactly one exit: the
//! runtime's own exits plus one for each frame an exception left (it writes none for those).
//!
//! The same program launched under `--engine inline`, its sleds patched at its entry point:
//! the same entries, each closed once (the frames an exception left by the stack pointer at
//! the thread's next event), and its output unchanged.
//!
//! Needs clang-19 with compiler-rt's XRay runtime, nlohmann-json3-dev, llvm-xray 14/19 and BPF.

use std::collections::BTreeMap;
use std::time::Duration;
use tests::fixtures::workloads::{
    json_parse_fixture, json_parse_native_fixture, native_records, native_trace,
};
use tests::launched::{launch, Launched};
use tests::scratch_dir;

const TIMEOUT: Duration = Duration::from_secs(120);
const DOCUMENTS: &str = "600";
/// What `json_parse 600` prints, traced or not.
const PARSED: &str = "json_parse: ok=400 bad=200 sum=121600";

/// Entries and exits per function (`main` left out: XRay's runtime is switched on inside it).
fn per_function<'a>(
    records: impl IntoIterator<Item = &'a tests::Record>,
) -> BTreeMap<String, (u64, u64)> {
    let mut m: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for r in records {
        if r.function == "main" || !r.kind.is_function() {
            continue;
        }
        let e = m.entry(r.function.clone()).or_default();
        if r.kind.is_entry() {
            e.0 += 1;
        } else if r.kind.is_exit() {
            e.1 += 1;
        }
    }
    m
}

/// XRay's own runtime on the program: entries and exits per function.
fn native_per_function(label: &str) -> BTreeMap<String, (u64, u64)> {
    let scratch = scratch_dir(label);
    let native_bin = json_parse_native_fixture();
    let (file, stdout) = native_trace(&native_bin, scratch.path(), &[DOCUMENTS]);
    assert_eq!(stdout.trim(), PARSED);
    let (_, native) = native_records(&native_bin, &file);
    assert_eq!(native.len(), 1, "one thread");
    per_function(native.values().flatten())
}

/// The recording `run` against XRay's runtime: the same functions, entered as often; each
/// entry closed once, by the runtime's own exit or, for the frames an exception left, by
/// ours (`session.json` counts those). Returns our entries and the frames closed that way.
fn assert_matches_native(run: &Launched, native: &BTreeMap<String, (u64, u64)>) -> (u64, u64) {
    assert_eq!(run.done.stdout.trim(), PARSED, "the output is unchanged");
    let json = &run.session.json;
    assert_eq!(json["events_lost"], 0);
    let converted = run.converted_both();
    let ours = per_function(&converted[&run.pid()].records);
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        native.keys().collect::<Vec<_>>()
    );
    let mut unwound = 0;
    for (name, &(entries, exits)) in &ours {
        let (native_entries, native_exits) = native[name];
        assert_eq!(entries, native_entries, "{name}: entries");
        assert_eq!(exits, entries, "{name}: every entry closed once");
        unwound += native_entries - native_exits;
    }
    assert!(
        unwound >= 200,
        "each malformed document leaves frames: {unwound}"
    );
    let frames_unwound: u64 = json["processes"][0]["threads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["frames_unwound"].as_u64().unwrap())
        .sum();
    assert_eq!(frames_unwound, unwound, "frames left by exceptions");
    (ours.values().map(|&(e, _)| e).sum(), unwound)
}

#[test]
fn a_json_parser_keeps_its_return_probes_and_matches_xray_s_own_runtime() {
    let native = native_per_function("json-parser-native");
    let run = launch(
        "json-parser",
        &json_parse_fixture(),
        &[],
        &[DOCUMENTS],
        TIMEOUT,
    );
    assert!(
        !run.done.stderr.contains("instead of return probes"),
        "a fall-back to exit sleds: {}",
        run.done.stderr
    );
    let json = &run.session.json;
    assert_eq!(json["exits"], "repair", "{}", json["exits_reason"]);
    let methods = &json["exit_methods"];
    assert_eq!(methods["exit_sled_calls"], 0, "{methods}");
    let (entries, unwound) = assert_matches_native(&run, &native);
    assert!(
        methods["return_probe_calls"].as_u64().unwrap() >= entries - unwound,
        "{methods}"
    );
}

#[test]
fn a_json_parser_launched_under_the_inline_engine_matches_xray_s_own_runtime() {
    let native = native_per_function("json-parser-native-inline");
    let run = launch(
        "json-parser-inline",
        &json_parse_fixture(),
        // The whole run in one ring (417,620 hits of 32 bytes): the program calls flat out
        // for ~40 ms, faster than fdr-profiled reads on two CPUs, and a loss, counted, would
        // make the counts inexact.
        &["--engine", "inline", "--buffer-size", "33554432"],
        &[DOCUMENTS],
        TIMEOUT,
    );
    assert!(
        run.done.stderr.contains("sleds patched in process"),
        "{}",
        run.done.stderr
    );
    assert_matches_native(&run, &native);
}
