//! `fdr-profiled convert --format pprof`, read by the reference consumer, `go tool pprof`
//! (Debian's golang-go): per function, its flat calls, wall and self time equal the calls,
//! total and self time of `fdr-profiled report` on the same session, and its cum self time
//! the report's total for every function that does not recurse. The mapping names the binary
//! and its build-id, functions have their source file and line, the profile its start time
//! and duration. On a hand-made session with known durations and on a recorded trace of the
//! C++ fixture, whose calls are checked against the counts the fixture printed.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};
use tests::pprof::{go_pprof, raw_time_ns, recursive_functions, top, Top};
use tests::scenario::{trace_launched, CPP};
use tests::synthetic_session::*;
use tests::{scratch_dir, CPP_FUNCTIONS};

/// Per function: (calls, total ns, self ns).
type Columns = BTreeMap<String, (u64, u64, u64)>;

/// Converts `dir` to pprof and checks it against `report` function by function; returns the
/// `-raw` text and the report's columns.
fn check_against_report(dir: &Path, name: &str) -> (String, Columns) {
    let out = scratch_dir(name);
    let profile = out.path().join("profile.pb.gz");
    let (ok, _, err) = run_tool(&[
        "convert".as_ref(),
        dir.as_os_str(),
        "--format".as_ref(),
        "pprof".as_ref(),
        "-o".as_ref(),
        profile.as_os_str(),
    ]);
    assert!(ok, "convert --format pprof: {err}");
    let bytes = std::fs::read(&profile).unwrap();
    assert_eq!(&bytes[..2], b"\x1f\x8b", "a gzip file");

    let (report, _) = report_json(dir, &[]);
    let mut want_calls = BTreeMap::new();
    let mut want_total = BTreeMap::new();
    let mut want_self = BTreeMap::new();
    for r in report["functions"].as_array().unwrap() {
        let name = r["name"].as_str().unwrap().to_owned();
        let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
        if n("calls") == 0 {
            continue;
        }
        assert!(
            want_calls.insert(name.clone(), n("calls")).is_none(),
            "{name} twice in the report"
        );
        want_total.insert(name.clone(), n("total_ns"));
        want_self.insert(name, n("self_ns"));
    }
    assert!(!want_calls.is_empty(), "the report has calls");

    let flat = |t: &Top| -> BTreeMap<String, u64> {
        t.iter()
            .filter(|(_, v)| v.0 > 0)
            .map(|(k, v)| (k.clone(), v.0))
            .collect()
    };
    let calls = top(&profile, "calls");
    let wall = top(&profile, "wall");
    let selft = top(&profile, "self");
    assert_eq!(flat(&calls), want_calls, "flat calls vs the report's calls");
    assert_eq!(flat(&wall), want_total, "flat wall vs the report's total");
    // A function whose every call took 0 ns of self time has no flat row for self.
    let want_self_nonzero: BTreeMap<String, u64> =
        want_self.into_iter().filter(|(_, v)| *v > 0).collect();
    assert_eq!(
        flat(&selft),
        want_self_nonzero,
        "flat self vs the report's self"
    );

    let raw = go_pprof(&["-raw"], &profile);
    let recursive = recursive_functions(&raw);
    let mut cum_checked = 0;
    for (name, total) in &want_total {
        if recursive.contains(name) {
            continue;
        }
        assert_eq!(
            selft[name].1, *total,
            "{name}: cum self vs the report's total"
        );
        cum_checked += 1;
    }
    assert!(cum_checked > 0);
    let columns = want_calls
        .iter()
        .map(|(k, &c)| {
            let s = flat(&selft).get(k).copied().unwrap_or(0);
            (k.clone(), (c, want_total[k], s))
        })
        .collect();
    (raw, columns)
}

/// Per function id: (calls, total, self), replayed from hand-made events.
fn replay(threads: &[Vec<Ev>]) -> BTreeMap<u32, (u64, u64, u64)> {
    let mut out: BTreeMap<u32, (u64, u64, u64)> = BTreeMap::new();
    for events in threads {
        // (id, entry time, time in callees)
        let mut stack: Vec<(u32, u64, u64)> = Vec::new();
        for e in events {
            match *e {
                Ev::Enter(id, t) => stack.push((id, t, 0)),
                Ev::Exit(id, t) => {
                    let (open, start, children) = stack.pop().expect("balanced");
                    assert_eq!(open, id);
                    let d = t - start;
                    let row = out.entry(id).or_default();
                    *row = (row.0 + 1, row.1 + d, row.2 + d - children);
                    if let Some(parent) = stack.last_mut() {
                        parent.2 += d;
                    }
                }
                _ => unreachable!("nested_calls makes entries and exits only"),
            }
        }
    }
    out
}

#[test]
fn a_hand_made_session_reads_the_same_in_go_tool_pprof_as_in_the_report() {
    let (dir, bin) = cpp_session("pprof-synthetic");
    let ids = cpp_nest_ids(&bin);
    let (raw, columns) = check_against_report(dir.path(), "pprof-synthetic-out");
    // The same numbers replayed here from the events written.
    let threads: Vec<Vec<Ev>> = cpp_session_threads(ids)
        .into_iter()
        .map(|(_, events)| events)
        .collect();
    let want = replay(&threads);
    let names = [
        (ids.0, "fx::outer(int)"),
        (ids.1, "fx::middle(int)"),
        (ids.2, "fx::leaf(int)"),
    ];
    let want: Columns = names
        .iter()
        .map(|(id, name)| (name.to_string(), want[id]))
        .collect();
    assert_eq!(columns, want, "(calls, total, self) per function");
    assert_eq!(columns["fx::leaf(int)"].0, 68, "(25 + 9) x 2 leaf calls");
    // The mapping: the binary and its build-id, functions symbolized with file and line.
    let mapping = raw
        .lines()
        .skip_while(|l| l.trim() != "Mappings")
        .nth(1)
        .expect("a mapping");
    assert!(mapping.contains(&build_id(&bin)), "{mapping}");
    assert!(mapping.contains(&bin.display().to_string()), "{mapping}");
    assert!(mapping.contains("[FN]"), "{mapping}");
    let leaf = raw
        .lines()
        .find(|l| l.contains(" fx::leaf(int) "))
        .unwrap_or_else(|| panic!("fx::leaf in the locations:\n{raw}"));
    assert!(
        leaf.contains("threads.cpp:"),
        "fx::leaf with its file and line: {leaf}"
    );
}

#[test]
fn a_recorded_trace_reads_the_same_in_go_tool_pprof_as_in_the_report() {
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let run = trace_launched(&CPP, 20);
    let after = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let (raw, columns) = check_against_report(&run.trace.dir, "pprof-recorded-out");
    // Calls as the fixture counted them, summed over its threads.
    let mut counted: BTreeMap<String, u64> = BTreeMap::new();
    for p in &run.processes {
        for per_thread in p.calls.values() {
            for (name, n) in per_thread {
                *counted.entry(name.clone()).or_default() += n;
            }
        }
    }
    assert!(!counted.is_empty());
    for (name, n) in &counted {
        if CPP_FUNCTIONS.contains(&name.as_str()) {
            assert_eq!(
                columns.get(name).map(|c| c.0),
                Some(*n),
                "{name}: calls in pprof vs the fixture's count"
            );
        }
    }
    // Start time within the run (to the second), and a duration.
    let t = raw_time_ns(&raw);
    assert!(
        t + 1_000_000_000 >= before && t <= after,
        "Time {t} not within [{before}, {after}]"
    );
    let duration = raw
        .lines()
        .find(|l| l.starts_with("Duration: "))
        .expect("Duration");
    assert_ne!(duration.trim(), "Duration: 0", "{duration}");
}
