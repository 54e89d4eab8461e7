//! The `cxx_pid` benchmark (issue 27): running C++ traced by `--pid`, whose outer frames were
//! entered long before the tracer came, throwing from deep recursion: what the defaults cost
//! the program and record, against `--exits sleds` and untraced.
//!
//! Two workloads, each traced for [`traced_secs`] by `fdr-profiled --pid PID --duration`,
//! once with the defaults (`auto`: the stack repaired, for a process that can unwind), once
//! with `--exits sleds` and once with `--engine inline` (by pid only), and run as long
//! untraced:
//! - `tests/fixtures/deep_server.cpp`: a serving loop in `main` that throws from 100 frames deep
//!   every fifth request (about every 300 calls); its throughput is its requests a second;
//! - yaml-cpp's own gtest suite (the `cxx_suite` benchmark's build) repeated forever
//!   (`--gtest_repeat=-1`); its throughput is its passes through the suite a second, and no
//!   test may fail.
//!
//! Each row says the calls a second recorded (calls whose exit a probe observed, from
//! `session.json`), the program's own throughput meanwhile, and whether the session fell back
//! to exit sleds.
use super::support;
use anyhow::{bail, Context as _, Result};
use std::fmt::Write as _;
use std::io::BufRead as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Seconds each traced session lasts, and each untraced run: 20, or `FDR_BENCH_SECS` (the
/// issue's minute-long check: `FDR_BENCH_SECS=60 cargo xtask bench cxx_pid`).
fn traced_secs() -> u64 {
    std::env::var("FDR_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&s| s > 0)
        .unwrap_or(20)
}

/// A program to measure: its name, how to start it, the start of the lines that count its work.
type Workload<'a> = (&'static str, Box<dyn Fn() -> Command + 'a>, &'static str);

/// One measured run.
struct Row {
    name: &'static str,
    exits: String,
    /// The program's own units of work a second (requests, suite passes).
    throughput: f64,
    /// Calls a second recorded.
    calls: f64,
    lost: u64,
    fell_back: bool,
}

/// Runs the benchmark by `--pid`; returns its markdown section.
pub fn run() -> Result<String> {
    run_by(false)
}

/// The `cxx_attach` benchmark: the same, traced by `--attach BINARY` (the process runs it
/// already, as under `--pid`; the way every process of a binary is traced, and the service's).
pub fn run_attach() -> Result<String> {
    run_by(true)
}

fn run_by(by_attach: bool) -> Result<String> {
    let daemon = support::daemon()?;
    let work = support::scratch("cxx_pid")?;
    let machine = support::machine_description();
    let server = support::build_deep_server(&work)?;
    // yaml-cpp is downloaded: a host that cannot measures the server alone, and says so.
    let suite = super::cxx_suite::build();
    let mut workloads: Vec<Workload> = vec![(
        "deep_server",
        Box::new(|| Command::new(&server)),
        "deep_server: rounds=",
    )];
    if let Ok(suite) = &suite {
        workloads.push((
            "yaml-cpp suite",
            Box::new(move || {
                let mut c = Command::new(suite);
                c.args([super::cxx_suite::FILTER, "--gtest_repeat=-1"]);
                c
            }),
            "Repeating all tests",
        ));
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## Running C++ by `{}`: the defaults against exit sleds\n",
        if by_attach { "--attach" } else { "--pid" }
    );
    let _ = writeln!(
        s,
        "Each program started untraced, then traced by `fdr-profiled {} --duration \
         {}` (its outer frames entered long before): `deep_server` \
         (tests/fixtures/deep_server.cpp, a throw from 100 frames deep every fifth request, \
         caught in `main`) and yaml-cpp's gtest suite repeated forever (the `cxx_suite` \
         build, `{}`). Throughput: the program's requests (or passes through the suite) a \
         second while traced; calls: calls a second whose exit a probe observed.\n",
        if by_attach {
            "--attach BINARY"
        } else {
            "--pid PID"
        },
        traced_secs(),
        super::cxx_suite::FILTER
    );
    if let Err(err) = &suite {
        let _ = writeln!(s, "yaml-cpp's suite not measured: {err:#}\n");
    }
    let _ = writeln!(s, "{machine}\n");
    let _ = writeln!(
        s,
        "| program | configuration | exits | throughput | / untraced | calls recorded/s | lost | fell back to exit sleds |"
    );
    let _ = writeln!(s, "|---|---|---|---:|---:|---:|---:|---|");
    let mut verdicts = Vec::new();
    for (program, command, unit) in &workloads {
        let measure = |traced| measure(&daemon, &work, command(), unit, traced, by_attach);
        let untraced = measure(None)?;
        let defaults = measure(Some(&[]))?;
        let sleds = measure(Some(&["--exits", "sleds"]))?;
        let base = untraced.throughput;
        let mut rows = vec![untraced, defaults, sleds];
        if !by_attach {
            rows.push(measure(Some(&["--engine", "inline"]))?);
            let (d, i) = (&rows[1], &rows[3]);
            let ratio = i.calls / d.calls.max(1.0);
            verdicts.push(format!(
                "- {program}: `--engine inline` recorded {:.0} calls/s, {ratio:.1}x the defaults' {:.0} \
                 (issue 31's target: at least 10x: {}); the program kept {:.2}x of its untraced throughput",
                i.calls,
                d.calls,
                if ratio >= 10.0 { "met" } else { "NOT met" },
                i.throughput / base
            ));
        }
        for row in rows.iter() {
            let _ = writeln!(
                s,
                "| {program} | {} | {} | {:.1}/s | {:.2}x | {} | {} | {} |",
                row.name,
                row.exits,
                row.throughput,
                row.throughput / base,
                if row.calls > 0.0 {
                    format!("{:.0}", row.calls)
                } else {
                    String::new()
                },
                row.lost,
                if row.name == "untraced" {
                    ""
                } else if row.fell_back {
                    "yes"
                } else {
                    "no"
                }
            );
        }
    }
    if !verdicts.is_empty() {
        let _ = writeln!(s, "\n{}", verdicts.join("\n"));
    }
    Ok(s)
}

/// Runs `program`, counting its units of work (lines of stdout starting with `unit`, or, for
/// the server, its closing `rounds=` line); with `traced`, attaches fdr-profiled by pid with
/// those options for [`traced_secs`] after a second, else runs it as long untraced.
fn measure(
    daemon: &Path,
    work: &Path,
    mut program: Command,
    unit: &str,
    traced: Option<&[&str]>,
    by_attach: bool,
) -> Result<Row> {
    let mut child = program
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the program")?;
    let pid = child.id();
    let units = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let closing = Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let stdout = child.stdout.take().context("no stdout")?;
        let (units, failed, closing, unit) = (
            units.clone(),
            failed.clone(),
            closing.clone(),
            unit.to_owned(),
        );
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if line.starts_with(&unit) {
                    units.fetch_add(1, Ordering::Relaxed);
                    *closing.lock().unwrap_or_else(|e| e.into_inner()) = line.clone();
                }
                if line.starts_with("[  FAILED  ]") {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    std::thread::sleep(Duration::from_secs(1));
    let out = work.join("out");
    let _ = std::fs::remove_dir_all(&out);
    let before = units.load(Ordering::Relaxed);
    let started = Instant::now();
    let mut row = Row {
        name: "untraced",
        exits: String::new(),
        throughput: 0.0,
        calls: 0.0,
        lost: 0,
        fell_back: false,
    };
    match traced {
        None => std::thread::sleep(Duration::from_secs(traced_secs())),
        Some(options) => {
            let (how, whom) = if by_attach {
                ("--attach", program.get_program().to_owned())
            } else {
                ("--pid", pid.to_string().into())
            };
            let status = Command::new(daemon)
                .arg(how)
                .arg(whom)
                .args([
                    "--duration",
                    &traced_secs().to_string(),
                    "--no-report",
                    "--out",
                ])
                .arg(&out)
                .args(options)
                .stderr(Stdio::null())
                .status()
                .context("running fdr-profiled")?;
            if !status.success() {
                bail!("fdr-profiled {how} {options:?} failed ({status})");
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let during = units.load(Ordering::Relaxed) - before;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let _ = child.wait();
    let _ = reader.join();
    if failed.load(Ordering::Relaxed) > 0 {
        bail!("the program's tests failed ({options:?})", options = traced);
    }
    // The server says its rounds once, at its end: counted over its whole life, the second
    // before tracing included (a small share of it).
    let closing = closing.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let done = match closing
        .split_whitespace()
        .find_map(|w| w.strip_prefix("rounds="))
        .and_then(|n| n.parse::<f64>().ok())
    {
        Some(rounds) => rounds / (secs + 1.0),
        None => during as f64 / secs,
    };
    row.throughput = done;
    if let Some(options) = traced {
        row.name = match options {
            [] => "defaults",
            ["--engine", "inline"] => "`--engine inline`",
            _ => "`--exits sleds`",
        };
        let session: serde_json::Value = serde_json::from_slice(
            &std::fs::read(out.join("session.json")).context("reading session.json")?,
        )?;
        let m = &session["exit_methods"];
        let calls = m["return_probe_calls"].as_u64().unwrap_or(0)
            + m["exit_sled_calls"].as_u64().unwrap_or(0);
        row.calls = calls as f64 / traced_secs() as f64;
        row.lost = session["events_lost"].as_u64().unwrap_or(0);
        row.exits = session["exits"].as_str().unwrap_or_default().to_owned();
        row.fell_back = session["exits_reason"]
            .as_str()
            .is_some_and(|r| r.contains("exits observed by their sleds from"));
    }
    eprintln!(
        "xtask bench cxx_pid: {} {}: {:.1}/s, {:.0} calls/s recorded",
        row.name, row.exits, row.throughput, row.calls
    );
    Ok(row)
}
