//! `fdr-profiled convert`: each format checked against what llvm-xray (19) reads from the same
//! files. On a recorded trace of the C++ fixture: per thread and function, the Chrome trace's
//! `B` events and speedscope's `O` events number the entries `llvm-xray convert` lists, and
//! every `E`/`C` closes the innermost open call; the logged arguments are there. Folded stacks
//! add up to the report's self time; the SVG names the functions. Custom events appear as
//! instants with their payload and where they were emitted.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use tests::scenario::{trace_launched, CPP};
use tests::synthetic_session::*;
use tests::{scratch_dir, CPP_LOGGED};

fn convert(dir: &Path, format: &str) -> String {
    let (ok, out, err) = run_tool(&[
        "convert".as_ref(),
        dir.as_os_str(),
        "--format".as_ref(),
        format.as_ref(),
    ]);
    assert!(ok, "convert --format {format}: {err}");
    out
}

/// Per (pid, tid): entries per function name, from llvm-xray.
type Entries = BTreeMap<(u32, u32), BTreeMap<String, u64>>;

fn llvm_entries(run: &tests::scenario::ScenarioRun) -> Entries {
    run.trace
        .threads
        .iter()
        .map(|t| {
            let calls = t.calls();
            let entries = calls
                .into_iter()
                .map(|(name, c)| (name, c.entries()))
                .collect();
            ((t.pid, t.tid), entries)
        })
        .collect()
}

#[test]
fn recorded_trace_converts_to_chrome_and_speedscope_with_every_call() {
    let run = trace_launched(&CPP, 20);
    let dir = &run.trace.dir;
    let want = llvm_entries(&run);

    // Chrome: B/E per thread, well nested, time never going back.
    let chrome: Value = serde_json::from_str(&convert(dir, "chrome")).unwrap();
    let mut got: Entries = BTreeMap::new();
    let mut stacks: BTreeMap<(u32, u32), Vec<String>> = BTreeMap::new();
    let mut last_ts: BTreeMap<(u32, u32), f64> = BTreeMap::new();
    let mut process_names = 0;
    let mut logged_args = 0;
    for e in chrome["traceEvents"].as_array().unwrap() {
        let key = (
            e["pid"].as_u64().unwrap() as u32,
            e["tid"].as_u64().unwrap() as u32,
        );
        match e["ph"].as_str().unwrap() {
            "M" => process_names += usize::from(e["name"] == "process_name"),
            "B" => {
                let name = e["name"].as_str().unwrap().to_owned();
                *got.entry(key).or_default().entry(name.clone()).or_default() += 1;
                if name == CPP_LOGGED {
                    assert_eq!(e["args"]["arg0"].as_u64().unwrap() % 3, 0, "{e}");
                    logged_args += 1;
                }
                stacks
                    .entry(key)
                    .or_default()
                    .push(e.to_string().replace("\"B\"", "\"E\""));
            }
            "E" => {
                // Well nested, and the same name and args as its B (speedscope pairs by them).
                let b = stacks.entry(key).or_default().pop();
                let mut e_only_ts = e.clone();
                let b: Value = serde_json::from_str(&b.expect("E without B")).unwrap();
                e_only_ts["ts"] = b["ts"].clone();
                assert_eq!(e_only_ts, b);
            }
            other => panic!("unexpected phase {other}: {e}"),
        }
        if let Some(ts) = e["ts"].as_f64() {
            let last = last_ts.entry(key).or_insert(0.0);
            assert!(ts >= *last, "time goes back on {key:?}: {e}");
            *last = ts;
        }
    }
    assert_eq!(process_names, 1);
    assert!(logged_args > 0);
    assert!(stacks.values().all(Vec::is_empty), "unclosed: {stacks:?}");
    assert_eq!(got, want, "Chrome B events vs llvm-xray entries");

    // speedscope: one evented profile per thread, O/C well nested.
    let ss: Value = serde_json::from_str(&convert(dir, "speedscope")).unwrap();
    let frames: Vec<String> = ss["shared"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_owned())
        .collect();
    let profiles = ss["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), want.len());
    let mut got: Entries = BTreeMap::new();
    for (p, key) in profiles.iter().zip(want.keys()) {
        assert_eq!(p["type"], "evented");
        assert_eq!(p["unit"], "nanoseconds");
        assert!(p["name"]
            .as_str()
            .unwrap()
            .ends_with(&format!("tid {}", key.1)));
        let mut stack = Vec::new();
        let mut last = p["startValue"].as_u64().unwrap();
        for e in p["events"].as_array().unwrap() {
            let frame = e["frame"].as_u64().unwrap() as usize;
            let at = e["at"].as_u64().unwrap();
            assert!(at >= last);
            last = at;
            if e["type"] == "O" {
                *got.entry(*key)
                    .or_default()
                    .entry(frames[frame].clone())
                    .or_default() += 1;
                stack.push(frame);
            } else {
                assert_eq!(stack.pop(), Some(frame), "C must close the innermost O");
            }
        }
        assert!(stack.is_empty());
        assert!(last <= p["endValue"].as_u64().unwrap());
    }
    assert_eq!(got, want, "speedscope O events vs llvm-xray entries");
}

#[test]
fn folded_stacks_add_up_to_the_self_time_and_the_svg_names_them() {
    let (dir, _) = cpp_session("convert-folded");
    let folded = convert(dir.path(), "folded");
    let mut by_stack = BTreeMap::new();
    for line in folded.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        by_stack.insert(stack.to_owned(), n.parse::<u64>().unwrap());
    }
    assert_eq!(
        by_stack.keys().collect::<Vec<_>>(),
        [
            "fx::outer(int)",
            "fx::outer(int);fx::middle(int)",
            "fx::outer(int);fx::middle(int);fx::leaf(int)"
        ]
    );
    let (report, _) = report_json(dir.path(), &[]);
    let self_of = |name: &str| {
        report["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap()["self_ns"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(by_stack["fx::outer(int)"], self_of("fx::outer(int)"));
    assert_eq!(
        by_stack["fx::outer(int);fx::middle(int);fx::leaf(int)"],
        self_of("fx::leaf(int)")
    );
    let svg = convert(dir.path(), "svg");
    assert!(
        svg.starts_with("<?xml") && svg.contains("<svg"),
        "{}",
        &svg[..200]
    );
    for name in ["fx::outer(int)", "fx::middle(int)", "fx::leaf(int)"] {
        assert!(svg.contains(name), "{name} not in the SVG");
    }
}

#[test]
fn custom_events_become_instants_with_payload_and_origin() {
    use tests::fixtures::symbolize::{fixture_line, inlined_events_fixture};
    let bin = inlined_events_fixture();
    let note = function_id(&bin, "ie_note");
    let dir = scratch_dir("convert-events");
    write_session(
        dir.path(),
        &[SynthProcess {
            pid: 9,
            binary: bin.clone(),
            build_id: Some(build_id(&bin)),
            threads: vec![(
                9,
                vec![
                    Ev::Enter(note, 100),
                    Ev::Custom(150, b"note round=0".to_vec()),
                    Ev::Exit(note, 200),
                    Ev::Custom(300, vec![0, 1, 2, 255]),
                ],
            )],
        }],
    );
    let chrome: Value = serde_json::from_str(&convert(dir.path(), "chrome")).unwrap();
    let instants: Vec<&Value> = chrome["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "i")
        .collect();
    assert_eq!(instants.len(), 2);
    let (_, line) = fixture_line("inlined_events.cpp", "// EVENT-NOTE");
    let first = &instants[0]["args"];
    assert_eq!(first["payload"], "note round=0");
    assert_eq!(first["function"], "ie_note");
    let emitted = first["emitted"].as_str().unwrap();
    assert!(
        emitted.contains(&format!(
            "inlined_events.cpp:{line} in note(char const*, long), inlined into ie_note"
        )),
        "{emitted}"
    );
    // Outside any call, binary payload: hex, no function.
    assert_eq!(instants[1]["args"]["payload"], "000102ff");
    assert_eq!(instants[1]["args"]["function"], Value::Null);
    assert_eq!(instants[1]["ts"].as_f64().unwrap(), 0.2);
}
