//! `fdr-profiled bench-rescan PID` (hidden; run by `cargo xtask bench attach`): what finding a
//! running process's objects costs a `--pid` session — the first scan (every mapped file
//! screened, the instrumented ones planned) and each later rescan (done every 200 ms to find
//! what `dlopen` loads: nothing new, so only `/proc/PID/maps` is read). Prints one JSON object.
use crate::plan::discovery::Discovery;
use crate::traced::mappings;
use anyhow::Result;
use std::time::Instant;

/// Options of `bench-rescan`.
#[derive(Debug, clap::Args)]
pub struct BenchRescanArgs {
    /// Rescans to time after the first scan.
    #[arg(long, default_value_t = 200)]
    pub rounds: u32,
    /// The process.
    pub pid: u32,
}

/// Runs the measurement and prints its JSON result.
pub fn run(args: &BenchRescanArgs) -> Result<u8> {
    let mut discovery = Discovery::new(args.pid, mappings::executable_id(args.pid));
    let start = Instant::now();
    let first = discovery.scan()?;
    let first_s = start.elapsed().as_secs_f64();
    let rounds = args.rounds.max(1);
    let start = Instant::now();
    for _ in 0..rounds {
        discovery.scan()?;
    }
    let rescan_us = start.elapsed().as_secs_f64() * 1e6 / f64::from(rounds);
    outln!(
        "{}",
        serde_json::json!({
            "files": first.new_files,
            "instrumented": first.plans.len(),
            "functions": first.plans.iter().map(|p| p.functions).sum::<usize>(),
            "first_scan_s": first_s,
            "rescan_us": rescan_us,
        })
    );
    Ok(0)
}
