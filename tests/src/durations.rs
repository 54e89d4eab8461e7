//! Durations bounded by the caller: every call, the ones an exception or panic unwound
//! included, lies within the call that made it, in the timeline and in the report.
//!
//! [`assert_durations_within_callers`] converts a session to the Chrome trace with
//! `fdr-profiled convert` and replays each thread's `B`/`E` events: each call begins no
//! earlier than its parent and ends no later. Then `fdr-profiled report --format json
//! --per-thread`: per thread, every call of the unwound functions is timed (as many calls as
//! the fixture made, none left for the reader to close), and no function's longest call is
//! longer than the longest call of the functions it was called from (as the timeline shows
//! them).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use crate::counts::ExpectedCalls;
use crate::tools::{fdr_profiled, run_output};

/// A thread of a session: (pid, tid).
pub type ThreadKey = (u64, u64);

/// Per thread, per function: the functions its calls were made from ([`TOP_LEVEL`] for a
/// call made with no traced call open).
pub type Callers = BTreeMap<ThreadKey, BTreeMap<String, BTreeSet<String>>>;

/// The caller of a call made with no traced call open (no function is named so).
pub const TOP_LEVEL: &str = "";

struct Open {
    name: String,
    start: u64,
    /// The latest end of the calls it made.
    children_end: u64,
}

/// Microseconds with nanosecond digits (the trace-event unit) as nanoseconds.
fn ns(v: &serde_json::Value) -> u64 {
    let us = v.as_f64().unwrap_or_else(|| panic!("a timestamp, not {v}"));
    (us * 1000.0).round() as u64
}

/// Converts `dir` to a Chrome trace in `scratch` and checks that every call lies within its
/// parent's; returns the callers of each function, per thread.
pub fn assert_timeline_nested(dir: &Path, scratch: &Path) -> Callers {
    let path = scratch.join("nesting-trace.json");
    let out = run_output(
        Command::new(fdr_profiled())
            .arg("convert")
            .arg(dir)
            .args(["--format", "chrome", "-o"])
            .arg(&path),
    );
    assert!(
        out.status.success(),
        "convert --format chrome: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&path).expect("the Chrome trace");
    let json: serde_json::Value = serde_json::from_str(&text).expect("Chrome JSON");
    let mut stacks: BTreeMap<ThreadKey, Vec<Open>> = BTreeMap::new();
    let mut callers = Callers::new();
    let mut calls = 0u64;
    for e in json["traceEvents"].as_array().expect("traceEvents") {
        let ph = e["ph"].as_str().unwrap_or_default();
        if ph != "B" && ph != "E" {
            continue;
        }
        let thread = (
            e["pid"].as_u64().expect("pid"),
            e["tid"].as_u64().expect("tid"),
        );
        let name = e["name"].as_str().expect("name").to_owned();
        let ts = ns(&e["ts"]);
        let stack = stacks.entry(thread).or_default();
        if ph == "B" {
            let caller = match stack.last() {
                Some(parent) => {
                    assert!(
                        ts >= parent.start,
                        "{thread:?}: {name} begins at {ts} ns, before its caller {} ({} ns)",
                        parent.name,
                        parent.start
                    );
                    parent.name.clone()
                }
                None => TOP_LEVEL.to_owned(),
            };
            callers
                .entry(thread)
                .or_default()
                .entry(name.clone())
                .or_default()
                .insert(caller);
            stack.push(Open {
                name,
                start: ts,
                children_end: ts,
            });
            continue;
        }
        let open = stack
            .pop()
            .unwrap_or_else(|| panic!("{thread:?}: an end of {name} with nothing open"));
        assert_eq!(open.name, name, "{thread:?}: ends pair with begins");
        assert!(
            ts >= open.start && ts >= open.children_end,
            "{thread:?}: {name} ends at {ts} ns, before a call it made ({} ns) or its begin ({} ns)",
            open.children_end,
            open.start
        );
        if let Some(parent) = stack.last_mut() {
            parent.children_end = parent.children_end.max(ts);
        }
        calls += 1;
    }
    for (thread, stack) in &stacks {
        assert!(stack.is_empty(), "{thread:?}: calls left open");
    }
    assert!(calls > 0, "no call in the timeline of {}", dir.display());
    callers
}

/// Both checks of this module on the session `dir`. `unwound` names functions that
/// exceptions or panics left: each must have been called from some function, in some thread,
/// and be checked against it, and in each thread the report times as many of its calls as
/// `calls` (the fixture's count, by tid) says were made.
pub fn assert_durations_within_callers(
    dir: &Path,
    scratch: &Path,
    unwound: &[&str],
    calls: &ExpectedCalls,
) {
    let callers = assert_timeline_nested(dir, scratch);
    let out = run_output(Command::new(fdr_profiled()).arg("report").arg(dir).args([
        "--format",
        "json",
        "--per-thread",
    ]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "report --per-thread: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_str(&text).expect("report JSON");
    // (thread, function) -> its longest call.
    let mut max: BTreeMap<(ThreadKey, String), u64> = BTreeMap::new();
    for row in json["functions"].as_array().expect("functions") {
        let thread = (
            row["pid"].as_u64().expect("pid"),
            row["tid"].as_u64().expect("tid"),
        );
        let name = row["name"].as_str().expect("name").to_owned();
        if unwound.contains(&name.as_str()) {
            let made = calls
                .get(&(thread.1 as u32))
                .and_then(|c| c.get(&name))
                .copied()
                .unwrap_or(0);
            assert_eq!(
                (row["calls"].as_u64(), row["unwound"].as_u64()),
                (Some(made), Some(0)),
                "{thread:?} {name}: (calls timed, calls the reader closed) in the report: {row}"
            );
        }
        max.insert((thread, name), row["max_ns"].as_u64().expect("max_ns"));
    }
    let mut checked: BTreeSet<&str> = BTreeSet::new();
    for (thread, functions) in &callers {
        for (function, from) in functions {
            if from.contains(TOP_LEVEL) {
                // Its longest call may be one no traced call bounds (a thread's last
                // deallocations, made after its traced calls returned).
                continue;
            }
            let own = max[&(*thread, function.clone())];
            let longest_caller = from
                .iter()
                .map(|c| max[&(*thread, c.clone())])
                .max()
                .unwrap_or(0);
            assert!(
                own <= longest_caller,
                "{thread:?}: {function}'s longest call ({own} ns) outlasts the longest of its callers {from:?} ({longest_caller} ns)"
            );
            if let Some(f) = unwound.iter().find(|f| **f == function) {
                assert!(own > 0, "{thread:?}: {function} has no timed call");
                checked.insert(f);
            }
        }
    }
    assert_eq!(
        checked,
        unwound.iter().copied().collect(),
        "every unwound function is checked against its callers"
    );
}
