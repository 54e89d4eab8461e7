//! `fdr-profiled report` against `llvm-xray account` (LLVM 19): on traces of the C++ and Rust
//! fixtures recorded by the daemon, and on synthetic sessions, every thread's rows give the
//! same calls, min, median, p90, p99, max and sum as `account` on that thread's file, and the
//! same names; the report over all threads adds them up. Then bad input: a missing binary, a
//! corrupt file among good ones, a replaced binary, a missing file: clear warnings, and the
//! good files still reported. Also the end-of-session outputs and custom-event locations.

use std::collections::BTreeMap;
use std::path::Path;
use tests::scenario::{trace_launched, CPP, RUST};
use tests::synthetic_session::*;
use tests::{cpp_fixture, scratch_dir};

const ITERATIONS: u32 = 50;

/// Every thread of a recorded session against `llvm-xray account`, and the overall report
/// against the per-thread one.
fn check_recorded(dir: &Path, bin: &Path) {
    let (per_thread, stderr) = report_json(dir, &["--per-thread"]);
    assert!(
        per_thread["warnings"].as_array().unwrap().is_empty(),
        "{per_thread}\n{stderr}"
    );
    let rows = rows_by_thread(&per_thread);
    let session = tests::read_session(dir);
    let mut threads = 0;
    for p in &session.processes {
        for t in &p.threads {
            assert_thread_matches_account(&rows, p.pid, t.tid, bin, &dir.join(&t.file));
            threads += 1;
        }
    }
    assert!(threads >= 4, "{threads} threads");
    // Overall: per function, the calls of all threads, the smallest min, the largest max.
    let (overall, _) = report_json(dir, &[]);
    let mut want: BTreeMap<u32, (u64, u64, u64, u64)> = BTreeMap::new();
    for ((_, _, id), r) in &rows {
        let e = want.entry(*id).or_insert((0, u64::MAX, 0, 0));
        e.0 += r["calls"].as_u64().unwrap();
        e.1 = e.1.min(r["min_ns"].as_u64().unwrap());
        e.2 = e.2.max(r["max_ns"].as_u64().unwrap());
        e.3 += r["self_ns"].as_u64().unwrap();
    }
    let got: BTreeMap<u32, (u64, u64, u64, u64)> = rows_by_thread(&overall)
        .into_iter()
        .map(|((_, _, id), r)| {
            let n = |k: &str| r[k].as_u64().unwrap();
            (id, (n("calls"), n("min_ns"), n("max_ns"), n("self_ns")))
        })
        .collect();
    assert_eq!(got, want);
    // The text report names every function.
    let (ok, text, _) = run_tool(&["report".as_ref(), dir.as_os_str()]);
    assert!(ok);
    for r in overall["functions"].as_array().unwrap() {
        assert!(text.contains(r["name"].as_str().unwrap()), "{r}\n{text}");
    }
}

#[test]
fn cpp_fixture_report_matches_llvm_xray_account() {
    let run = trace_launched(&CPP, ITERATIONS);
    check_recorded(&run.trace.dir, &run.bin);
}

#[test]
fn rust_fixture_report_matches_llvm_xray_account() {
    let run = trace_launched(&RUST, ITERATIONS);
    check_recorded(&run.trace.dir, &run.bin);
}

fn cpp_ids(bin: &Path) -> (u32, u32, u32) {
    (
        function_id(bin, "fx::outer(int)"),
        function_id(bin, "fx::middle(int)"),
        function_id(bin, "fx::leaf(int)"),
    )
}

#[test]
fn synthetic_session_matches_llvm_xray_account_and_sorts() {
    let bin = cpp_fixture();
    let ids = cpp_ids(&bin);
    let dir = scratch_dir("report-synth");
    let files = write_session(
        dir.path(),
        &[SynthProcess {
            pid: 100,
            binary: bin.clone(),
            build_id: Some(build_id(&bin)),
            threads: vec![
                (100, nested_calls(ids, 200, 1_000)),
                (101, nested_calls(ids, 77, 5_000)),
            ],
        }],
    );
    let (json, _) = report_json(dir.path(), &["--per-thread"]);
    let rows = rows_by_thread(&json);
    for ((pid, tid), file) in &files {
        assert_thread_matches_account(&rows, *pid, *tid, &bin, file);
    }
    // Self time by construction: leaf has no children; outer's self time is its own gaps.
    let leaf = &rows[&(100, 100, ids.2)];
    assert_eq!(leaf["self_ns"], leaf["total_ns"]);
    let outer = &rows[&(100, 100, ids.0)];
    let middle = &rows[&(100, 100, ids.1)];
    assert_eq!(
        outer["self_ns"].as_u64().unwrap(),
        outer["total_ns"].as_u64().unwrap() - middle["total_ns"].as_u64().unwrap()
    );
    // --sort and --top.
    let (top, _) = report_json(dir.path(), &["--sort", "calls", "--top", "1"]);
    let f = top["functions"].as_array().unwrap();
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["id"].as_u64().unwrap() as u32, ids.2);
    assert_eq!(f[0]["calls"].as_u64().unwrap(), 2 * (200 + 77));
    // CSV: a header and one line per function, names with commas quoted.
    let (ok, csv, _) = run_tool(&[
        "report".as_ref(),
        dir.path().as_os_str(),
        "--format".as_ref(),
        "csv".as_ref(),
    ]);
    assert!(ok);
    let lines: Vec<&str> = csv.lines().collect();
    assert!(lines[0].starts_with("pid,tid,id,function,file,line,calls,"));
    assert_eq!(lines.len(), 4, "{csv}");
    assert!(csv.contains(",fx::leaf(int),"), "{csv}");
}

#[test]
fn bad_input_is_reported_and_good_files_still_counted() {
    let cpp = cpp_fixture();
    let ids = cpp_ids(&cpp);
    let dir = scratch_dir("report-bad");
    // A copy of another binary where the session says the C++ fixture was.
    let replaced = dir.path().join("replaced").join("threads-cpp");
    std::fs::create_dir_all(replaced.parent().unwrap()).unwrap();
    std::fs::copy(tests::rust_fixture(), &replaced).unwrap();
    let files = write_session(
        dir.path(),
        &[
            SynthProcess {
                pid: 1,
                binary: cpp.clone(),
                build_id: Some(build_id(&cpp)),
                threads: vec![
                    (10, nested_calls(ids, 30, 1_000)),
                    (11, nested_calls(ids, 40, 1_000)),
                    (12, nested_calls(ids, 5, 1_000)),
                ],
            },
            SynthProcess {
                pid: 2,
                binary: dir.path().join("gone").join("threads-cpp"),
                build_id: Some(build_id(&cpp)),
                threads: vec![(20, nested_calls(ids, 3, 1_000))],
            },
            SynthProcess {
                pid: 3,
                binary: replaced.clone(),
                build_id: Some(build_id(&cpp)),
                threads: vec![(30, nested_calls(ids, 4, 1_000))],
            },
        ],
    );
    // Corrupt thread 11 in the middle: a metadata record of an undefined kind.
    let bad = &files[&(1, 11)];
    let mut bytes = std::fs::read(bad).unwrap();
    let at = bytes.len() / 2 / 8 * 8;
    bytes[at..at + 16].copy_from_slice(&[0x7f; 16]);
    std::fs::write(bad, &bytes).unwrap();
    // And a file the manifest lists that is not there.
    std::fs::remove_file(&files[&(1, 12)]).unwrap();

    let (json, stderr) = report_json(dir.path(), &["--per-thread"]);
    let warnings: Vec<&str> = json["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    let has = |needle: &str| warnings.iter().any(|w| w.contains(needle));
    assert!(has("tid-11.fdr: offset"), "{warnings:#?}");
    assert!(
        has("tid-12.fdr: listed in session.json but missing"),
        "{warnings:#?}"
    );
    assert!(has("gone/threads-cpp"), "{warnings:#?}");
    assert!(has("has changed since the recording"), "{warnings:#?}");
    assert!(stderr.contains("warning:"), "{stderr}");
    for w in &warnings {
        assert!(!w.contains('\n'), "one line each: {w:?}");
    }
    let rows = rows_by_thread(&json);
    // The good thread: complete, named.
    assert_thread_matches_account(&rows, 1, 10, &cpp, &files[&(1, 10)]);
    // The corrupt one: what came before the corruption, named.
    let leaf = &rows[&(1, 11, ids.2)];
    assert_eq!(leaf["name"], "fx::leaf(int)");
    assert!(leaf["calls"].as_u64().unwrap() > 0 && leaf["calls"].as_u64().unwrap() < 80);
    // Missing and replaced binaries: counted, named by id.
    for pid in [2, 3] {
        let tid = pid * 10;
        let r = &rows[&(pid, tid, ids.2)];
        assert_eq!(r["name"], format!("#{}", ids.2), "{r}");
        assert!(r["calls"].as_u64().unwrap() > 0);
    }
    // The text report carries the warnings too.
    let (ok, text, _) = run_tool(&["report".as_ref(), dir.path().as_os_str()]);
    assert!(ok);
    assert!(
        text.contains("warning:") && text.contains("fx::leaf(int)"),
        "{text}"
    );
    // A directory that is no session at all is a one-line error.
    let empty = scratch_dir("report-empty");
    let (ok, _, err) = run_tool(&["report".as_ref(), empty.path().as_os_str()]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("holds no session"), "{err}");
    // A directory of sessions (the service's output, a folder of recordings, named as a
    // process's directory would be): a one-line error naming them, not a report of nothing.
    let many = scratch_dir("report-many");
    for name in ["server-1", "server-2"] {
        let session = many.path().join(name);
        std::fs::create_dir(&session).unwrap();
        write_session(
            &session,
            &[SynthProcess {
                pid: 7,
                binary: cpp.clone(),
                build_id: Some(build_id(&cpp)),
                threads: vec![(7, nested_calls(ids, 10, 1_000))],
            }],
        );
    }
    let (ok, _, err) = run_tool(&["report".as_ref(), many.path().as_os_str()]);
    assert!(!ok);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("holds 2 sessions, not one") && err.contains("server-2"),
        "{err}"
    );
}

#[test]
fn session_outputs_hold_a_named_report_and_a_trace() {
    let bin = cpp_fixture();
    let dir = scratch_dir("report-outputs");
    write_session(
        dir.path(),
        &[SynthProcess {
            pid: 7,
            binary: bin.clone(),
            build_id: Some(build_id(&bin)),
            threads: vec![(7, nested_calls(cpp_ids(&bin), 10, 1_000))],
        }],
    );
    let out = fdr_analysis::outputs::write_session_outputs(
        dir.path(),
        &fdr_analysis::symbolize::Symbolizer::default(),
    )
    .unwrap();
    let report = std::fs::read_to_string(&out.report).unwrap();
    assert!(report.contains("fx::middle(int)"), "{report}");
    assert!(report.contains("threads.cpp:"), "{report}");
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out.trace).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    assert!(events.iter().any(|e| e["name"] == "fx::leaf(int)"));
}

#[test]
fn inlined_custom_events_are_reported_where_they_were_emitted() {
    use tests::fixtures::symbolize::{fixture_line, inlined_events_fixture};
    let bin = inlined_events_fixture();
    let note = function_id(&bin, "ie_note");
    let twice = function_id(&bin, "ie_twice");
    let dir = scratch_dir("report-events");
    let mut ev = Vec::new();
    for r in 0..3u64 {
        let t = 1_000 + r * 10_000;
        ev.push(Ev::Enter(note, t));
        ev.push(Ev::Custom(t + 100, format!("note round={r}").into_bytes()));
        ev.push(Ev::Exit(note, t + 200));
        ev.push(Ev::Enter(twice, t + 300));
        ev.push(Ev::Custom(t + 400, b"twice a".to_vec()));
        ev.push(Ev::Custom(t + 500, b"twice b".to_vec()));
        ev.push(Ev::Exit(twice, t + 600));
    }
    write_session(
        dir.path(),
        &[SynthProcess {
            pid: 5,
            binary: bin.clone(),
            build_id: Some(build_id(&bin)),
            threads: vec![(5, ev)],
        }],
    );
    let (json, _) = report_json(dir.path(), &[]);
    let events = json["events"].as_array().unwrap();
    let (_, event_line) = fixture_line("inlined_events.cpp", "// EVENT-NOTE");
    let by_fn = |name: &str| {
        events
            .iter()
            .find(|e| e["function"] == name)
            .unwrap_or_else(|| panic!("{name}: {json}"))
    };
    let e = by_fn("ie_note");
    assert_eq!(e["count"], 3);
    let sites = e["sites"].as_array().unwrap();
    assert_eq!(sites.len(), 1);
    let frames = sites[0]["frames"].as_array().unwrap();
    assert_eq!(frames[0]["function"], "note(char const*, long)");
    assert_eq!(frames[0]["location"]["line"], event_line);
    assert_eq!(frames[1]["function"], "ie_note");
    assert_eq!(
        frames[1]["location"]["line"],
        fixture_line("inlined_events.cpp", "// CALL-NOTE").1
    );
    // Two sleds: both candidates listed, and the text says the trace cannot tell them apart.
    let e = by_fn("ie_twice");
    assert_eq!(e["count"], 6);
    assert_eq!(e["sites"].as_array().unwrap().len(), 2);
    let (ok, text, _) = run_tool(&["report".as_ref(), dir.path().as_os_str()]);
    assert!(ok);
    assert!(text.contains("does not say which fired"), "{text}");
    assert!(
        text.contains(&format!(
            "inlined_events.cpp:{event_line} in note(char const*, long), inlined into ie_note"
        )),
        "{text}"
    );
}
