//! The `service` benchmark (issue 15): what the always-on flight recorder costs.
//!
//! - Per call: the `calls.c` workload (one thread calling `cx_tiny`, timing its own loop) run
//!   while `fdr-profiled --attach BIN` records it, and while `fdr-profiled service` (flight
//!   recorder) holds it instead; both attach the same probes to every process of the binary.
//!   Each round runs both; the ratio is taken within the round. Target: no measurable
//!   difference (the eBPF side is the same; only what the daemon does with events differs).
//! - Memory: the service's own report (`fdr-profiled status --json`) of what its recorder holds
//!   after 4 threads called `cx_tiny` for 3 s with a 2 s window: bytes per thread held, bytes
//!   per event, and the events per second that filled it.
use super::support::{self, median, Background};
use anyhow::{bail, Context as _, Result};
use std::fmt::Write as _;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Rounds of the per-call comparison.
const ROUNDS: usize = 5;
/// Calls per run (about a second with return probes).
const CALLS: u64 = 1_000_000;
/// The memory run: threads, seconds of calls, the window.
const THREADS: u32 = 4;
const SECONDS: u32 = 3;
const WINDOW: &str = "2s";

/// Runs the benchmark; returns its markdown section.
pub fn run() -> Result<String> {
    let daemon = support::daemon()?;
    let work = support::scratch("service")?;
    let bin = support::build_calls(&work)?;
    let machine = support::machine_description();

    let mut attach = Vec::new();
    let mut service = Vec::new();
    let mut ratios = Vec::new();
    for round in 0..ROUNDS {
        let dir = work.join(format!("round-{round}"));
        std::fs::create_dir_all(&dir)?;
        let mut pair = [0.0; 2];
        // Alternate which runs first, so a drift in load favours neither.
        for k in 0..2 {
            let which = (k + round) % 2;
            pair[which] = if which == 0 {
                under_attach(&daemon, &bin, &dir)?
            } else {
                under_service(&daemon, &bin, &dir)?.0
            };
        }
        eprintln!(
            "xtask bench service: round {round}: --attach {:.1} ns/call, service {:.1} ns/call",
            pair[0], pair[1]
        );
        attach.push(pair[0]);
        service.push(pair[1]);
        ratios.push(pair[1] / pair[0]);
        let _ = std::fs::remove_dir_all(&dir);
    }
    let dir = work.join("memory");
    std::fs::create_dir_all(&dir)?;
    let memory = memory_held(&daemon, &bin, &dir)?;

    let mut s = String::new();
    let _ = writeln!(s, "## Service: the flight recorder's cost\n");
    let _ = writeln!(
        s,
        "Per call: one thread calls `cx_tiny` (tests/fixtures/calls.c) {CALLS} times and times \
         its loop, while `fdr-profiled --attach BIN` records every call to files, and while \
         `fdr-profiled service` holds them in its flight recorder (same probes, the default \
         exits: return probes for this C program). {ROUNDS} rounds, both in each, the order \
         alternating; the ratio is taken within a round.\n"
    );
    let _ = writeln!(s, "{machine}\n");
    let cell = |v: &[f64]| median(v).map_or("-".to_owned(), |x| format!("{x:.1}"));
    let _ = writeln!(s, "| configuration | ns/call, median | min - max |");
    let _ = writeln!(s, "|---|---:|---:|");
    for (name, v) in [
        ("`fdr-profiled --attach BIN` (files)", &attach),
        ("`fdr-profiled service` (flight recorder)", &service),
    ] {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(0.0, f64::max);
        let _ = writeln!(s, "| {name} | {} | {min:.1} - {max:.1} |", cell(v));
    }
    let ratio = median(&ratios).unwrap_or(f64::NAN);
    let _ = writeln!(
        s,
        "\nService / `--attach`, median of per-round ratios: {ratio:.3}x (target: no measurable \
         difference; per-round ratios {}).\n",
        ratios
            .iter()
            .map(|r| format!("{r:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(
        s,
        "Memory: {THREADS} threads call `cx_tiny` for {SECONDS} s under the service with \
         `window = \"{WINDOW}\"`; then `fdr-profiled status --json` reports what the recorder \
         holds.\n"
    );
    let _ = writeln!(s, "| events/s while filling | threads | events held | bytes held | bytes per thread | bytes per event |");
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|");
    let _ = writeln!(
        s,
        "| {:.0} | {} | {} | {} | {:.0} | {:.1} |",
        memory.rate,
        memory.threads,
        memory.events,
        memory.bytes,
        memory.bytes as f64 / memory.threads.max(1) as f64,
        memory.bytes as f64 / memory.events.max(1) as f64
    );
    Ok(s)
}

/// Starts `cmd` and waits until a stderr line starts with `ready`.
fn start(cmd: &mut Command, ready: &str) -> Result<Background> {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting fdr-profiled")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let ready = ready.to_owned();
    std::thread::spawn(move || {
        let mut seen = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !seen && line.starts_with(&ready) {
                seen = true;
                let _ = tx.send(());
            }
        }
    });
    let daemon = Background(child);
    rx.recv_timeout(Duration::from_secs(60))
        .context("fdr-profiled did not get ready within 60 s")?;
    Ok(daemon)
}

/// ns per call of the workload while `--attach` records it.
fn under_attach(daemon: &Path, bin: &Path, dir: &Path) -> Result<f64> {
    let _recorder = start(
        Command::new(daemon)
            .args(["--no-report", "--attach"])
            .arg(bin)
            .arg("--out")
            .arg(dir.join("attach")),
        "fdr-profiled: recording",
    )?;
    ns_per_call(
        bin,
        &["--iterations", &CALLS.to_string(), "--bench", "--quiet"],
    )
}

/// Writes a service configuration for `bin` into `dir`.
fn service_config(dir: &Path, bin: &Path, window: &str) -> Result<PathBuf> {
    let config = dir.join("service.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"calls\"\nbinary = \"{}\"\nwindow = \"{window}\"\n",
            dir.join("snapshots").display(),
            bin.display()
        ),
    )?;
    Ok(config)
}

/// ns per call of the workload while the service holds it; and the service's socket.
fn under_service(daemon: &Path, bin: &Path, dir: &Path) -> Result<(f64, PathBuf)> {
    let config = service_config(dir, bin, "30s")?;
    let socket = dir.join("control.sock");
    let _service = start(
        Command::new(daemon)
            .args(["service", "--config"])
            .arg(&config)
            .arg("--socket")
            .arg(&socket),
        "fdr-profiled: service: ready",
    )?;
    let ns = ns_per_call(
        bin,
        &["--iterations", &CALLS.to_string(), "--bench", "--quiet"],
    )?;
    Ok((ns, socket))
}

/// Runs the workload; its `ns_per_call=` figure.
fn ns_per_call(bin: &Path, args: &[&str]) -> Result<f64> {
    let out = Command::new(bin).args(args).output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("the workload failed: {}", support::last_lines(&stdout, 3));
    }
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("ns_per_call="))
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no ns_per_call in {stdout}"))
}

/// What the recorder held after the memory run.
struct Memory {
    rate: f64,
    threads: u64,
    events: u64,
    bytes: u64,
}

fn memory_held(daemon: &Path, bin: &Path, dir: &Path) -> Result<Memory> {
    let config = service_config(dir, bin, WINDOW)?;
    let socket = dir.join("control.sock");
    let _service = start(
        Command::new(daemon)
            .args(["service", "--config"])
            .arg(&config)
            .arg("--socket")
            .arg(&socket),
        "fdr-profiled: service: ready",
    )?;
    let started = Instant::now();
    let out = Command::new(bin)
        .args([
            "--threads",
            &THREADS.to_string(),
            "--seconds",
            &SECONDS.to_string(),
            "--bench",
            "--quiet",
        ])
        .output()?;
    let elapsed = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let calls: u64 = stdout
        .lines()
        .filter_map(|l| l.split("calls=").nth(1)?.trim().parse::<u64>().ok())
        .sum();
    std::thread::sleep(Duration::from_millis(200));
    let status = Command::new(daemon)
        .args(["status", "--json", "--socket"])
        .arg(&socket)
        .output()?;
    if !status.status.success() {
        bail!(
            "fdr-profiled status failed: {}",
            String::from_utf8_lossy(&status.stderr)
        );
    }
    let json: serde_json::Value = serde_json::from_slice(&status.stdout)?;
    let b = &json["targets"][0]["binaries"][0];
    Ok(Memory {
        rate: (2 * calls) as f64 / elapsed,
        threads: b["threads"].as_u64().unwrap_or(0),
        events: b["events"].as_u64().unwrap_or(0),
        bytes: b["bytes"].as_u64().unwrap_or(0),
    })
}
