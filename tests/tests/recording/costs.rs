//! End to end: what the probes cost (issue 30). Before placing its probes a session measures
//! what a hit costs on this host (its traps, on empty programs), samples its programs' own
//! time at the start of the recording, and estimates each function's cost from its calls and
//! how its exits are observed: `session.json`'s `probe_costs` and each function's
//! `probe_cost_ns`, and the summary's lines, for return probes and for exit sleds; the
//! files hold every call the fixture counted, as llvm-xray 14 and 19 read them.
//!
//! Needs root, BPF, clang-19, llvm-xray 14/19 and a built daemon.

use std::time::Duration;

use tests::counts::{expected_calls, parse_count_lines};
use tests::fixtures::workloads::calls_fixture;
use tests::launched::launch;
use tests::tools::{fdr_profiled, run_output};

const TIMEOUT: Duration = Duration::from_secs(300);

fn number(v: &serde_json::Value, what: &str) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

/// The calls fixture under `daemon_args`, whose exits are observed by `exit`: the costs
/// measured, and every function's estimate its calls times the cost of one call.
fn costs_under(daemon_args: &[&str], exit: &str, iterations: &str) {
    // Rings that hold the whole run: a loaded host (the suite's tests side by side on two
    // CPUs) that keeps the daemon from reading would otherwise lose events, and the counts
    // below are exact.
    let daemon_args: Vec<&str> = daemon_args
        .iter()
        .copied()
        .chain(["--buffer-size", "67108864"])
        .collect();
    let run = launch(
        &format!("costs-{exit}"),
        &calls_fixture(),
        &daemon_args,
        &["--threads", "2", "--iterations", iterations],
        TIMEOUT,
    );
    let text = std::fs::read_to_string(run.out.join("session.json")).unwrap();
    let session: serde_json::Value = serde_json::from_str(&text).unwrap();
    let costs = &session["probe_costs"];
    let traps = &costs["traps"];
    let entry = number(&traps["entry_ns"], "entry_ns");
    let return_probe = number(&traps["return_probe_ns"], "return_probe_ns");
    let exit_sled = number(&traps["exit_sled_ns"], "exit_sled_ns");
    assert!(entry > 0.0 && return_probe > 0.0, "{traps}");
    // A `ret` single-stepped out of line costs more than a `jmp` the kernel emulates.
    assert!(exit_sled > entry, "{traps}");
    // The programs ran while their statistics were on.
    let sled_program = number(&costs["sled_program_ns"], "sled_program_ns");
    let return_program = number(&costs["return_program_ns"], "return_program_ns");
    assert!(sled_program > 0.0, "{costs}");
    assert!(number(&costs["program_stats_seconds"], "program_stats_seconds") > 0.0);
    assert!(number(&costs["recorded_ns"], "recorded_ns") > 0.0);
    let per_call = if exit == "return" {
        assert!(return_program > 0.0, "{costs}");
        entry + sled_program + return_probe + return_program
    } else {
        entry + sled_program + exit_sled + sled_program
    };
    // Every function: its calls times one call's cost, by its exit method.
    let counted = expected_calls(&parse_count_lines(&run.done.stdout));
    let tiny_calls: u64 = counted.values().filter_map(|f| f.get("cx_tiny")).sum();
    assert!(tiny_calls > 0);
    let functions = session["functions"].as_array().unwrap();
    for f in functions {
        assert_eq!(f["exit"], exit, "{f}");
        let calls = f["calls"].as_u64().unwrap();
        let want = (calls as f64 * per_call).round() as u64;
        assert_eq!(f["probe_cost_ns"].as_u64(), Some(want), "{f}");
    }
    let tiny = functions.iter().find(|f| f["name"] == "cx_tiny").unwrap();
    assert_eq!(tiny["calls"].as_u64(), Some(tiny_calls));
    // The files: read by llvm-xray 14 and 19, each thread's calls of cx_tiny as counted.
    let trace = tests::trace::check_trace_dir(&run.out, &run.bin);
    assert_eq!(trace.threads.len(), counted.len());
    for t in &trace.threads {
        let calls = t.calls();
        let want = counted[&t.tid]["cx_tiny"];
        assert_eq!(calls["cx_tiny"].entries(), want, "tid {}", t.tid);
        assert_eq!(calls["cx_tiny"].exits(), want, "tid {}", t.tid);
    }
    // The summary says it, the costliest function first.
    let stderr = &run.done.stderr;
    assert!(stderr.contains("probe cost (estimated): "), "{stderr}");
    let costliest = stderr
        .lines()
        .skip_while(|l| !l.contains("costliest functions to trace"))
        .nth(2)
        .unwrap_or_else(|| panic!("no costliest functions:\n{stderr}"));
    assert!(costliest.ends_with("  cx_tiny"), "{costliest}");
    // `report` reads the same costs from session.json: the same estimate for each function
    // (its calls counted from the files), and the costliest first in its text.
    let report = |format: &str| {
        let out = run_output(
            std::process::Command::new(fdr_profiled())
                .arg("report")
                .arg(&run.out)
                .args(["--format", format]),
        );
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let json: serde_json::Value = serde_json::from_str(&report("json")).unwrap();
    for row in json["functions"].as_array().unwrap() {
        let recorded = functions.iter().find(|f| f["id"] == row["id"]).unwrap();
        assert_eq!(row["probe_cost_ns"], recorded["probe_cost_ns"], "{row}");
    }
    let text = report("text");
    let first = text
        .lines()
        .skip_while(|l| !l.starts_with("probe cost (estimated"))
        .nth(2)
        .unwrap_or_else(|| panic!("no probe cost section:\n{text}"));
    assert!(first.ends_with("  cx_tiny"), "{first}");
}

#[test]
fn a_session_estimates_each_function_s_cost_with_return_probes() {
    costs_under(&["--exits", "return"], "return", "100000");
}

#[test]
fn a_session_estimates_each_function_s_cost_with_exit_sleds() {
    costs_under(&["--exits", "sleds"], "sleds", "10000");
}
