//! A traced dso fixture's records resolved to (object, function) through each object's own map,
//! and counted per run against the fixture's `count` lines.

use std::collections::{BTreeMap, BTreeSet};

use crate::counts::{expected_calls, parse_count_lines, ExpectedCalls};
use crate::extract_sleds;
use crate::fixtures::dso::{thread_kinds, MARKER_BEGIN, MARKER_END};
use crate::trace::TraceDir;

use super::Object;

/// One function record of the traced process, resolved.
#[derive(Debug, Clone)]
pub struct Call {
    pub tid: u32,
    pub tsc: u64,
    /// The object id in the record's high bits.
    pub object: u32,
    /// The function's name in that object's map.
    pub name: String,
    /// Entry (else an exit of some kind).
    pub entry: bool,
}

/// Every function record of `pid`, its packed id `(object << 24) | function` resolved with
/// `llvm-xray 19 extract --symbolize` of that object's file. Records naming no function of a
/// known object come back as problems.
pub fn resolve_calls(trace: &TraceDir, pid: u32, objects: &[Object]) -> (Vec<Call>, Vec<String>) {
    let names: BTreeMap<u32, BTreeMap<u32, String>> = objects
        .iter()
        .map(|o| {
            let sleds = extract_sleds(19, &o.file);
            (
                o.id,
                sleds.into_iter().map(|s| (s.id, s.function_name)).collect(),
            )
        })
        .collect();
    let (mut calls, mut problems) = (Vec::new(), Vec::new());
    for t in trace.process(pid) {
        for r in t.records.iter().filter(|r| r.kind.is_function()) {
            let (object, fid) = ((r.func_id >> 24) as u32, (r.func_id & 0xff_ffff) as u32);
            match names.get(&object).and_then(|m| m.get(&fid)) {
                Some(name) => calls.push(Call {
                    tid: t.tid,
                    tsc: r.tsc,
                    object,
                    name: name.clone(),
                    entry: r.kind.is_entry(),
                }),
                None => problems.push(format!(
                    "tid {}: id {:#x} (object {object}, function {fid}) is no known function: {r:?}",
                    t.tid, r.func_id
                )),
            }
        }
    }
    (calls, problems)
}

/// Per thread and function, the trace of `pid` against the fixture's `count` lines of its first
/// run; markers bound everything (when the executable is instrumented).
pub fn assert_counts(trace: &TraceDir, pid: u32, objects: &[Object], section: &str, markers: bool) {
    assert_runs_counts(trace, pid, objects, &[section.to_string()], markers);
}

/// [`assert_counts`] for several runs: with markers, the k-th pair of marker entries (on the
/// main thread) bounds run k, whose `count` lines are `sections[k]`; nothing lies outside them.
/// The objects' functions are told apart by name (the dso fixture's three objects share none).
pub fn assert_runs_counts(
    trace: &TraceDir,
    pid: u32,
    objects: &[Object],
    sections: &[String],
    markers: bool,
) {
    assert!(markers || sections.len() == 1, "without markers: one run");
    // Only the calls of instrumented objects (not dx_* of the plain executable).
    let traced: BTreeSet<&str> = objects.iter().flat_map(|o| o.functions.clone()).collect();
    let is_marker = |f: &str| f == MARKER_BEGIN || f == MARKER_END;
    let runs: Vec<(BTreeMap<u32, String>, ExpectedCalls)> = sections
        .iter()
        .map(|s| {
            let mut expected = expected_calls(&parse_count_lines(s));
            for fns in expected.values_mut() {
                fns.retain(|f, _| traced.contains(f.as_str()));
            }
            (thread_kinds(s), expected)
        })
        .collect();
    for f in traced.iter().filter(|f| !is_marker(f)) {
        assert!(
            runs.iter()
                .any(|(_, e)| e.values().any(|c| c.get(*f).copied().unwrap_or(0) > 0)),
            "the fixture never called {f}:\n{sections:?}"
        );
    }
    let (calls, mut problems) = resolve_calls(trace, pid, objects);
    let seen: BTreeSet<u32> = calls.iter().map(|c| c.object).collect();
    let want: BTreeSet<u32> = objects.iter().map(|o| o.id).collect();
    assert_eq!(seen, want, "objects in the records' high bits");
    let windows: Vec<(u64, u64)> = if markers {
        let entries = |m: &str| -> Vec<u64> {
            let mut at: Vec<u64> = calls
                .iter()
                .filter(|c| c.name == m && c.entry)
                .map(|c| {
                    assert_eq!(
                        c.tid, pid,
                        "{m} entered on thread {}, not the main thread",
                        c.tid
                    );
                    c.tsc
                })
                .collect();
            at.sort();
            at
        };
        let (begins, ends) = (entries(MARKER_BEGIN), entries(MARKER_END));
        assert_eq!(begins.len(), sections.len(), "{MARKER_BEGIN} entries");
        assert_eq!(ends.len(), sections.len(), "{MARKER_END} entries");
        let w: Vec<(u64, u64)> = begins.into_iter().zip(ends).collect();
        let ordered = w.iter().all(|(b, e)| b < e) && w.windows(2).all(|p| p[0].1 < p[1].0);
        assert!(ordered, "marker entries out of order: {w:?}");
        w
    } else {
        let marks: Vec<&Call> = calls.iter().filter(|c| is_marker(&c.name)).collect();
        assert!(
            marks.is_empty(),
            "markers are not instrumented here: {marks:?}"
        );
        vec![(0, u64::MAX)]
    };
    // Per run, thread and function: (entries, exits) in the trace.
    let mut got = vec![BTreeMap::<u32, BTreeMap<String, (u64, u64)>>::new(); windows.len()];
    for c in calls.iter().filter(|c| !is_marker(&c.name)) {
        let Some(k) = windows.iter().position(|(b, e)| *b < c.tsc && c.tsc < *e) else {
            problems.push(format!(
                "tid {}: {} at {}, outside the markers {windows:?}",
                c.tid, c.name, c.tsc
            ));
            continue;
        };
        let n = got[k].entry(c.tid).or_default();
        let n = n.entry(c.name.clone()).or_default();
        if c.entry {
            n.0 += 1;
        } else {
            n.1 += 1;
        }
    }
    let tids: BTreeSet<u32> = trace.process(pid).map(|t| t.tid).collect();
    let fixture_tids: BTreeSet<u32> = runs.iter().flat_map(|(k, _)| k.keys().copied()).collect();
    assert_eq!(
        tids, fixture_tids,
        "threads with files vs the fixture's threads"
    );
    for (k, ((kinds, expected), got)) in runs.iter().zip(&got).enumerate() {
        let run = k + 1;
        let fresh = kinds.values().filter(|k| *k == "fresh").count();
        assert_eq!(fresh, 2, "run {run}:\n{}", sections[k]);
        for (tid, fns) in expected {
            for (f, n) in fns {
                let (entries, exits) = got
                    .get(tid)
                    .and_then(|g| g.get(f))
                    .copied()
                    .unwrap_or_default();
                if (entries, exits) != (*n, *n) {
                    problems.push(format!("run {run}: tid {tid} ({}) {f}: fixture counted {n}, trace has {entries} entries, {exits} exits", kinds[tid]));
                }
            }
        }
        for (tid, fns) in got {
            let counted = |f: &String| expected.get(tid).is_some_and(|e| e.contains_key(f));
            for (f, n) in fns.iter().filter(|(f, _)| !counted(f)) {
                problems.push(format!(
                    "run {run}: tid {tid}: {f} in the trace but not counted: {n:?}"
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "pid {pid}: trace does not match the fixture:\n{}",
        problems.join("\n")
    );
}
