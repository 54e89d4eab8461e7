//! The `cost` benchmark (issue 30: know the cost): how much of what tracing adds to a
//! program's time the session's own estimate accounts for. Each program runs untraced (the
//! median of a few runs), then launched under `fdr-profiled` with the defaults; the time it
//! ran traced is the session's recording time (`probe_costs.recorded_ns`: armed to disarmed,
//! the program's whole run), the estimate the sum of every function's `probe_cost_ns` plus the
//! repairs' measured stops. A thread calling a tiny leaf flat out (`calls.c`), and a real C++
//! library's tests (yaml-cpp's node and parser tests, which throw: repaired).
use super::support::{self, median};
use anyhow::{bail, Context as _, Result};
use std::fmt::Write as _;
use std::process::Command;
use std::time::Instant;

/// Untraced runs of each program (median taken).
const UNTRACED_RUNS: usize = 3;

struct Row {
    program: String,
    untraced_s: f64,
    traced_s: f64,
    estimate_s: f64,
    repairs_s: f64,
    per_hit: String,
}

/// Runs the benchmark; returns its markdown section.
pub fn run() -> Result<String> {
    let daemon = support::daemon()?;
    let work = support::scratch("cost")?;
    let machine = support::machine_description();
    let calls = support::build_calls(&work)?;
    let yaml = super::cxx_suite::build()?;
    let programs: Vec<(String, Vec<String>)> = vec![
        (
            "`calls --iterations 3000000` (one thread, a tiny leaf)".to_owned(),
            vec![
                calls.display().to_string(),
                "--iterations".into(),
                "3000000".into(),
            ],
        ),
        (
            "yaml-cpp 0.7.0's node and parser tests".to_owned(),
            vec![
                yaml.display().to_string(),
                super::cxx_suite::FILTER.to_owned(),
            ],
        ),
    ];
    let mut rows = Vec::new();
    for (name, command) in &programs {
        let mut untraced = Vec::new();
        for _ in 0..UNTRACED_RUNS {
            let started = Instant::now();
            let out = Command::new(&command[0])
                .args(&command[1..])
                .output()
                .with_context(|| format!("running {}", command[0]))?;
            if !out.status.success() {
                bail!("{} failed untraced: {}", command[0], out.status);
            }
            untraced.push(started.elapsed().as_secs_f64());
        }
        let out_dir = work.join("out");
        let _ = std::fs::remove_dir_all(&out_dir);
        let mut args = vec![
            "--out".to_owned(),
            out_dir.display().to_string(),
            "--".into(),
        ];
        args.extend(command.iter().cloned());
        support::run_limited(1800, &daemon.display().to_string(), &args)?;
        let session: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out_dir.join("session.json")).context("session.json")?,
        )?;
        let costs = &session["probe_costs"];
        if costs.is_null() {
            bail!("{name}: the session has no probe_costs");
        }
        let estimate_ns: u64 = session["functions"]
            .as_array()
            .map(|fs| fs.iter().filter_map(|f| f["probe_cost_ns"].as_u64()).sum())
            .unwrap_or(0);
        let traps = &costs["traps"];
        let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
        rows.push(Row {
            program: name.clone(),
            untraced_s: median(&untraced).unwrap_or(f64::NAN),
            traced_s: f(&costs["recorded_ns"]) / 1e9,
            estimate_s: estimate_ns as f64 / 1e9,
            repairs_s: f(&session["repair"]["repair_ns_total"]).max(0.0) / 1e9,
            per_hit: format!(
                "{:.0} / +{:.0} / +{:.0} ns; programs {:.0} / {:.0} ns",
                f(&traps["entry_ns"]),
                f(&traps["return_probe_ns"]),
                f(&traps["exit_sled_ns"]),
                f(&costs["sled_program_ns"]),
                f(&costs["return_program_ns"]),
            ),
        });
        let _ = std::fs::remove_dir_all(&out_dir);
    }
    let mut text = String::from("## What tracing costs, and how much of it the estimate sees\n\n");
    writeln!(text, "{machine}\n")?;
    writeln!(
        text,
        "Each program runs untraced (median of {UNTRACED_RUNS} runs), then launched under `fdr-profiled` with the defaults. Traced: the session's recording time (`probe_costs.recorded_ns`, the program's whole run). Estimate: the sum of every function's `probe_cost_ns` (its calls times what one call's probes cost: the traps measured at the session's start on the daemon's own XRay-shaped function with empty programs, plus the programs' own time from the kernel's BPF run-time statistics over the first second), plus the repairs' measured stops. Accounted: that sum over the time tracing added. A hit: entry / return probe / exit sled traps, and the programs at a sled / at a return.\n"
    )?;
    writeln!(
        text,
        "| program | untraced | traced | added | estimated probes | repairs (measured) | accounted | a hit |"
    )?;
    writeln!(text, "|---|---:|---:|---:|---:|---:|---:|---|")?;
    for r in &rows {
        let added = r.traced_s - r.untraced_s;
        writeln!(
            text,
            "| {} | {:.3} s | {:.3} s | {:.3} s | {:.3} s | {:.3} s | {:.0}% | {} |",
            r.program,
            r.untraced_s,
            r.traced_s,
            added,
            r.estimate_s,
            r.repairs_s,
            (r.estimate_s + r.repairs_s) / added * 100.0,
            r.per_hit
        )?;
    }
    Ok(text)
}
