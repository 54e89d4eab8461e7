//! The `budget` benchmark (issue 30): a C++ server traced by `--pid` under `--max-overhead`
//! of 1%, 5%, 20% and 50%, and with no budget: what it keeps of its throughput, measured in
//! one run of the server (its requests a second before tracing, and while traced), what the
//! budget promised (`1 / (1 + limit)` for a busy program), whether its request function is
//! still traced and at what rate, and what was dropped.
//!
//! Three shapes of `tests/fixtures/deep_server.cpp`: its defaults (requests of 50 tiny calls,
//! every fifth throwing from 100 frames deep: about 65,000 requests a second on the AMD host,
//! every traced throw stopping the thread for the stack repair), and servers whose requests
//! do more and throw rarely (one in 1,000): 100,000 tiny calls each (about 3,400 requests a
//! second), where all but the tiny function cost a few percent, and 10,000 (about 30,000),
//! where the request's six `ds_deep` calls cost about a fifth of the program's time: kept
//! under a loose budget, dropped under a tight one.
use super::support;
use anyhow::{bail, Context as _, Result};
use std::fmt::Write as _;
use std::io::BufRead as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BUDGETS: [Option<&str>; 5] = [None, Some("50%"), Some("20%"), Some("5%"), Some("1%")];

/// Seconds traced: 20, or `FDR_BENCH_SECS`.
fn traced_secs() -> u64 {
    std::env::var("FDR_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&s| s >= 6)
        .unwrap_or(20)
}

/// Seconds of a traced run left out of its steady rate: the budget looks after the first.
const SETTLE_SECS: usize = 3;

/// One run of the server.
struct Run {
    untraced: f64,
    /// Requests a second over the whole traced time, and after [`SETTLE_SECS`].
    traced: f64,
    steady: f64,
    session: serde_json::Value,
}

/// Starts the server, measures it untraced for 5 s, then traced with `options`.
fn measure(
    daemon: &Path,
    out: &Path,
    server: &Path,
    args: &[&str],
    options: &[&str],
) -> Result<Run> {
    let mut child = Command::new(server)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the server")?;
    let pid = child.id();
    // Requests served by the end of each second.
    let served: Arc<Mutex<Vec<u64>>> = Arc::default();
    let reader = {
        let stdout = child.stdout.take().context("no stdout")?;
        let served = served.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let Some(rest) = line.strip_prefix("deep_server: second=") else {
                    continue;
                };
                if let Some(n) = rest
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("served="))
                    .and_then(|n| n.parse().ok())
                {
                    served.lock().unwrap_or_else(|e| e.into_inner()).push(n);
                }
            }
        })
    };
    let seconds = || served.lock().unwrap_or_else(|e| e.into_inner()).clone();
    while seconds().len() < 6 {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(out);
    let before = seconds().len();
    let status = Command::new(daemon)
        .arg("--pid")
        .arg(pid.to_string())
        .args([
            "--duration",
            &traced_secs().to_string(),
            "--no-report",
            "--out",
        ])
        .arg(out)
        .args(options)
        .stderr(Stdio::null())
        .status()
        .context("running fdr-profiled")?;
    let after = seconds().len();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let _ = child.wait();
    let _ = reader.join();
    if !status.success() {
        bail!("fdr-profiled --pid {options:?} failed ({status})");
    }
    let s = seconds();
    let rate =
        |from: usize, to: usize| (s[to - 1] - s[from - 1]) as f64 / (to - from).max(1) as f64;
    if after < before + SETTLE_SECS + 2 {
        bail!(
            "the server reported {} seconds while traced",
            after - before
        );
    }
    let session: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join("session.json")).context("reading session.json")?,
    )?;
    Ok(Run {
        untraced: rate(2, 6),
        // The second the daemon started in is half traced: left out of both.
        traced: rate(before + 1, after),
        steady: rate(before + 1 + SETTLE_SECS, after),
        session,
    })
}

/// Runs the benchmark; returns its markdown section.
pub fn run() -> Result<String> {
    let daemon = support::daemon()?;
    let work = support::scratch("budget")?;
    let machine = support::machine_description();
    let server = support::build_deep_server(&work)?;
    let shapes: [(&str, &[&str]); 3] = [
        ("deep_server (defaults)", &[]),
        ("deep_server 1000 100 100000", &["1000", "100", "100000"]),
        ("deep_server 1000 100 10000", &["1000", "100", "10000"]),
    ];
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## An overhead budget: a C++ server by `--pid` under `--max-overhead`\n"
    );
    let _ = writeln!(
        s,
        "Each row one run of the server: its requests a second untraced (its seconds 2 to 6), \
         then traced by `fdr-profiled --pid PID --duration {}` with the budget (`FDR_BENCH_SECS` sets the seconds) (the defaults \
         otherwise: return probes, the stack repaired at throws), over the whole traced time \
         and after its first {SETTLE_SECS} s (the budget looks every second). Promised: \
         `1 / (1 + limit)` of untraced for a busy program. `ds_request`: its calls a second in \
         the trace (the server's request function; 0 when dropped). Peak / last: the overhead \
         the budget estimated over one second.\n",
        traced_secs()
    );
    let _ = writeln!(s, "{machine}\n");
    let _ = writeln!(
        s,
        "| server | budget | untraced/s | traced/s | / untraced | after {SETTLE_SECS} s | promised | `ds_request` calls/s | peak / last estimate | dropped (at s) |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
    let out = work.join("out");
    for (name, args) in shapes {
        for budget in BUDGETS {
            let options: Vec<&str> = match budget {
                Some(b) => vec!["--max-overhead", b],
                None => vec![],
            };
            let run = measure(&daemon, &out, &server, args, &options)?;
            let session = &run.session;
            let request = session["functions"]
                .as_array()
                .and_then(|f| f.iter().find(|f| f["name"] == "ds_request"))
                .and_then(|f| f["calls"].as_u64())
                .unwrap_or(0);
            let b = &session["budget"];
            let (promised, estimate) = match budget {
                Some(text) => {
                    let limit: f64 = text.trim_end_matches('%').parse::<f64>()? / 100.0;
                    (
                        format!("{:.2}x", 1.0 / (1.0 + limit)),
                        format!(
                            "{:.1}% / {:.1}%",
                            b["peak_overhead_percent"].as_f64().unwrap_or(0.0),
                            b["last_overhead_percent"].as_f64().unwrap_or(0.0)
                        ),
                    )
                }
                None => (String::new(), String::new()),
            };
            let dropped: Vec<String> = b["changes"]
                .as_array()
                .map(|c| {
                    c.iter()
                        .map(|c| {
                            format!(
                                "{}{} ({:.0})",
                                if c["action"] == "dropped" { "" } else { "+" },
                                c["function"].as_str().unwrap_or("?"),
                                c["at_seconds"].as_f64().unwrap_or(0.0)
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            eprintln!(
                "xtask bench budget: {name} {}: {:.0}/s untraced, {:.0}/s traced, {:.0}/s after {SETTLE_SECS} s",
                budget.unwrap_or("none"),
                run.untraced,
                run.traced,
                run.steady
            );
            let _ = writeln!(
                s,
                "| {name} | {} | {:.0} | {:.0} | {:.2}x | {:.2}x | {promised} | {:.0} | {estimate} | {} |",
                budget.unwrap_or("none"),
                run.untraced,
                run.traced,
                run.traced / run.untraced,
                run.steady / run.untraced,
                request as f64 / traced_secs() as f64,
                dropped.join(", "),
            );
        }
    }
    Ok(s)
}
