//! The `pipeline` benchmark (issue 29): the daemon's event pipeline after the kernel (intake →
//! per-thread order → session → FDR files), fed from rings in memory in the kernel's own
//! layout, so that it needs no BPF and shows on any machine how many events a second the
//! daemon can take and what each million costs it, by number of workers, against one worker
//! (the calling thread alone: the service's path, and every drain's before the parallel
//! pipeline) in the same run. The program is `profiler-daemon/examples/pipeline.rs`, which checks at its
//! end that every event generated was recorded or counted lost.
use super::support;
use anyhow::{Context as _, Result};
use std::fmt::Write as _;
use std::process::Command;

/// Traced threads of each run, all on 16 rings (16 CPUs).
const THREADS: &[u32] = &[1, 4, 16];
/// Pipeline workers of each run (1 is the calling thread alone), and whether every worker
/// reads one shared ring per CPU (`--shared-rings`) rather than rings of its own.
const WORKERS: &[(u32, bool)] = &[(1, false), (2, true), (2, false), (4, false)];
const CPUS: u32 = 16;
/// Events of each run (unless `FDR_BENCH_PIPELINE_EVENTS` says otherwise).
const EVENTS: u64 = 20_000_000;
/// Runs per row; the row shows the median.
const REPEAT: usize = 5;

struct Row {
    threads: u32,
    workers: u32,
    shared: bool,
    events: u64,
    lost: u64,
    rate: f64,
    cpu_ms: f64,
    /// The slowest and fastest of the runs (events/s).
    range: (f64, f64),
}

pub fn run() -> Result<String> {
    crate::run::cargo(&[
        "build",
        "--release",
        "-p",
        "profiler-daemon",
        "--example",
        "pipeline",
    ])?;
    let program = support::target_dir().join("release/examples/pipeline");
    let scratch = support::scratch("pipeline")?;
    let events: u64 = std::env::var("FDR_BENCH_PIPELINE_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(EVENTS);
    let machine = support::machine_description();
    let mut rows = Vec::new();
    for &threads in THREADS {
        for &(workers, shared) in WORKERS {
            let mut runs = Vec::new();
            for _ in 0..REPEAT {
                let mut command = Command::new(&program);
                command
                    .args(["--threads", &threads.to_string()])
                    .args(["--cpus", &CPUS.to_string()])
                    .args(["--events", &events.to_string()])
                    .args(["--workers", &workers.to_string()])
                    .arg("--out")
                    .arg(scratch.join("out"));
                if shared {
                    command.arg("--shared-rings");
                }
                let out = crate::run::output(&mut command)
                    .with_context(|| format!("{} failed", program.display()))?;
                let json: serde_json::Value =
                    serde_json::from_str(out.trim()).context("the pipeline program's output")?;
                let number = |key: &str| json[key].as_f64().unwrap_or(f64::NAN);
                runs.push(Row {
                    threads,
                    workers,
                    shared,
                    events: number("events") as u64,
                    lost: number("lost") as u64,
                    rate: number("events_per_second"),
                    cpu_ms: number("cpu_ms_per_million"),
                    range: (0.0, 0.0),
                });
            }
            runs.sort_by(|a, b| a.rate.total_cmp(&b.rate));
            let range = (runs[0].rate, runs[REPEAT - 1].rate);
            let mut median = runs.swap_remove(REPEAT / 2);
            median.range = range;
            rows.push(median);
        }
    }
    let mut text = String::from("## Event pipeline (in memory, no kernel)\n\n");
    writeln!(text, "{machine}\n")?;
    writeln!(
        text,
        "`profiler-daemon/examples/pipeline.rs`: traced threads of four processes call and return through a call tree up to 12 deep; the events are written, in the kernel's ring-buffer layout, to rings in memory for {CPUS} CPUs (8 MiB per CPU, the default), in runs of 256 events to a ring of the CPU a thread is on, a thread moving to another CPU every 32,768 events on average. As `record` has the programs do, each CPU's 8 MiB is split into one ring per worker, a thread writing to the one of its worker (`profiler_common::ring_index`), so that each worker reads its own rings only; \"shared rings\" is the design before, one ring per CPU that every worker reads, skipping the others' records. Each round writes 25,000 events of each thread (25 ms, `record`'s drain period, of a thread calling at 1M calls/s), evicts them from the caches (the kernel's records are written on other CPUs), then drains the rings into a session writing FDR files to disk, as `record` does, through the pipeline (`session::pipeline::EventPipeline`) with N workers, the draining thread one of them (1 worker: the draining thread alone, the service's path and every drain's before issue 29). Only the drains are timed; CPU is the whole process's during them. At its end the program checks that the session counted every event written and every one lost. The losses with rings per worker are the generator's: it writes 25,000 events of each thread a round whatever the number of threads on its CPU, so that the threads of one worker crowded on one CPU fill that worker's ring (half of the CPU's 8 MiB with 2 workers, a quarter with 4), where on a real CPU the threads take turns and the CPU writes no faster than it does alone. Median of {REPEAT} runs of {events} events. The ratio is to 1 worker of the same row.\n"
    )?;
    writeln!(
        text,
        "| traced threads | pipeline | events | lost | events/s | slowest – fastest run | ratio to 1 worker | CPU per 1M events |"
    )?;
    writeln!(text, "|---:|---|---:|---:|---:|---:|---:|---:|")?;
    for row in &rows {
        let one = rows
            .iter()
            .find(|r| r.threads == row.threads && r.workers == 1 && !r.shared)
            .map_or(f64::NAN, |r| r.rate);
        let pipeline = match (row.workers, row.shared) {
            (1, _) => "1 worker".to_owned(),
            (n, false) => format!("{n} workers"),
            (n, true) => format!("{n} workers, shared rings"),
        };
        writeln!(
            text,
            "| {} | {pipeline} | {} | {} | {:.2}M | {:.1}M – {:.1}M | {:.2}x | {:.1} ms |",
            row.threads,
            row.events,
            row.lost,
            row.rate / 1e6,
            row.range.0 / 1e6,
            row.range.1 / 1e6,
            row.rate / one,
            row.cpu_ms
        )?;
    }
    Ok(text)
}
