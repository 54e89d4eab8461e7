//! `fdr-profiled service`: fdr-profiled as an always-on system service that traces the
//! programs its configuration names. Built so far: the configuration ([`config`]) and
//! `service --check-config FILE`, which validates a configuration the way the service will
//! read it.
pub mod config;

use anyhow::Result;
use std::path::PathBuf;

/// Options of `service`.
#[derive(Debug, clap::Args)]
pub struct ServiceArgs {
    /// Validate this configuration file and exit: 0 when the service would accept it, else one
    /// line naming the file, line and column of the first problem.
    #[arg(long, value_name = "FILE")]
    pub check_config: PathBuf,
}

/// Runs `service`.
pub fn run(args: &ServiceArgs) -> Result<u8> {
    let config = config::ServiceConfig::load(&args.check_config)?;
    println!(
        "{}: ok: output {}, {} target{}",
        config.path.display(),
        config.output.display(),
        config.targets.len(),
        if config.targets.len() == 1 { "" } else { "s" }
    );
    for t in &config.targets {
        println!(
            "  {}: {} ({})",
            t.name,
            t.binary,
            match t.mode {
                config::Mode::FlightRecorder => format!("flight recorder, window {:?}", t.window),
                config::Mode::Record => "record".to_owned(),
            }
        );
    }
    Ok(0)
}
