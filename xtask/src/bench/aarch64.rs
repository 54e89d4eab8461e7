//! The `aarch64` benchmark (issue 33): what a traced call costs on arm64, by how exits are
//! observed, measured in the emulated arm64 machine, and the same on this host for contrast.
//!
//! Under software emulation every trap costs far more than on hardware, so only ratios mean
//! anything, and only between runs of the same machine: `calls.c` (the `calls` benchmark's
//! workload, one hot function of one entry and one exit sled) untraced, traced with
//! `--exits sleds` (a uprobe on the entry sled and one on the exit sled) and with
//! `--exits return` (the entry's uprobe and a return probe). On x86-64 the kernel single-steps
//! an exit sled's `ret`, so an exit sled costs many times a return probe; on arm64 it simulates
//! the sled's `b` instead, and `--exits auto` chooses exit sleds there when they cost no more
//! (`profiler-daemon/src/arch.rs`).
use super::support;
use crate::{cross, run, vm};
use anyhow::{bail, Context as _, Result};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

/// Calls of the hot function per run, in the machine and here.
const CALLS_ARM64: u32 = 100_000;
const CALLS_HOST: u32 = 200_000;
/// Runs of each mode (the median is reported).
const ROUNDS: usize = 3;
/// The modes: label and the daemon's options (`None`: untraced).
const MODES: &[(&str, Option<&str>)] = &[
    ("untraced", None),
    ("exit sleds", Some("--exits sleds")),
    ("return probes", Some("--exits return")),
];

/// Runs the benchmark; returns its markdown section.
pub fn run() -> Result<String> {
    cross::prepare()?;
    let work = support::scratch("aarch64")?;
    let resource = cross::compiler_rt()?;
    let arm64_calls = work.join("calls-aarch64");
    let resource_dir = format!("-resource-dir={}", resource.display());
    run::xray_build(
        "clang-19",
        &run::workspace_root().join("tests/fixtures/calls.c"),
        &arm64_calls,
        &[
            "--target=aarch64-linux-gnu",
            &resource_dir,
            "-static",
            "-pthread",
        ],
    )?;
    let arm64_daemon = run::target_dir()
        .join(cross::TARGET)
        .join("release/fdr-profiled");
    let in_machine = script(&arm64_daemon, &arm64_calls, CALLS_ARM64);
    let image = vm::image()?;
    let console = vm::boot_capture(&image, &in_machine, std::time::Duration::from_secs(1800))?;
    let arm64 = medians(&console)?;

    let host_calls = support::build_calls(&work)?;
    let host = sh_output(&script(&support::daemon()?, &host_calls, CALLS_HOST))?;
    let host = medians(&host)?;

    let mut out = String::new();
    writeln!(out, "## aarch64: a traced call by how exits are observed")?;
    writeln!(out)?;
    writeln!(
        out,
        "`calls.c`'s hot function (one entry and one exit sled), nanoseconds per call, median of \
         {ROUNDS} runs: in the emulated arm64 machine (`cargo xtask vm aarch64`: qemu-system-aarch64 \
         software emulation, Debian's 6.12 arm64 kernel; {CALLS_ARM64} calls a run), where only \
         ratios mean anything, and on this x86-64 host ({CALLS_HOST} calls a run)."
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "| mode | arm64 ns/call | arm64 vs return probes | x86-64 ns/call | x86-64 vs return probes |"
    )?;
    writeln!(out, "|---|---:|---:|---:|---:|")?;
    let ratio = |m: &[(String, f64)], label: &str| {
        let of = |l: &str| m.iter().find(|(k, _)| k == l).map(|(_, v)| *v);
        match (of(label), of("return probes")) {
            (Some(v), Some(r)) if r > 0.0 => format!("{:.2}x", v / r),
            _ => "-".into(),
        }
    };
    for (label, _) in MODES {
        let value = |m: &[(String, f64)]| {
            m.iter()
                .find(|(k, _)| k == label)
                .map_or("-".into(), |(_, v)| format!("{v:.0}"))
        };
        writeln!(
            out,
            "| {label} | {} | {} | {} | {} |",
            value(&arm64),
            ratio(&arm64, label),
            value(&host),
            ratio(&host, label)
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "An exit sled costs what a return probe does on arm64 (the kernel simulates the sled's \
         `b`), many times more on x86-64 (it single-steps the `ret`): `--exits auto` is exit \
         sleds on arm64, safe under exceptions and `longjmp` with no stack repair."
    )?;
    writeln!(out)?;
    writeln!(out, "{}", support::machine_description())?;
    Ok(out)
}

/// The measuring script: each mode `ROUNDS` times, one `bench-aarch64: MODE ns_per_call=X`
/// line a run.
fn script(daemon: &Path, calls: &Path, iterations: u32) -> String {
    let mut s = String::from("set -e\ncd /tmp\n");
    for _ in 0..ROUNDS {
        for (label, options) in MODES {
            let traced = match options {
                None => String::new(),
                Some(o) => format!("'{}' --out /tmp/bench-session {o} -- ", daemon.display()),
            };
            let _ = writeln!(
                s,
                "rm -rf /tmp/bench-session; {traced}'{}' --iterations {iterations} --bench --quiet 2>/dev/null | sed -n 's/.*ns_per_call=\\([0-9.]*\\).*/bench-aarch64: {label} ns_per_call=\\1/p'",
                calls.display()
            );
        }
    }
    s.push_str("rm -rf /tmp/bench-session\n");
    s
}

/// Runs `script` here with `sh`; its stdout.
fn sh_output(script: &str) -> Result<String> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .context("sh")?;
    if !out.status.success() {
        bail!(
            "the x86-64 runs failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Per mode, the median of the `bench-aarch64:` lines of `output`.
fn medians(output: &str) -> Result<Vec<(String, f64)>> {
    let mut result = Vec::new();
    for (label, _) in MODES {
        let prefix = format!("bench-aarch64: {label} ns_per_call=");
        let values: Vec<f64> = output
            .lines()
            .filter_map(|l| l.trim_end_matches('\r').strip_prefix(&prefix))
            .filter_map(|v| v.trim().parse().ok())
            .collect();
        if values.len() != ROUNDS {
            bail!("{label}: {} results of {ROUNDS}:\n{output}", values.len());
        }
        result.push((label.to_string(), support::median(&values).unwrap_or(0.0)));
    }
    Ok(result)
}
