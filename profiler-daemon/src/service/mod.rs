//! `fdr-profiled service`: fdr-profiled as an always-on system service (`dist/` has its
//! systemd unit) that traces the programs its configuration names ([`config`];
//! `service --check-config FILE` validates a file the way the service reads it). The event
//! loop ([`runtime`]) traces every process of every target, now or later, with the
//! instrumented libraries of each ([`libraries`]); a flight-recorder target keeps the last
//! `window` of each thread in memory and writes it as a snapshot on `SIGUSR1`, a request, a
//! crash or a slow call ([`triggers`]); a record-mode target writes every call into rotated
//! segments ([`segments`]). [`retention`] keeps the output under `max_disk` and stops writing
//! before `min_free`; [`control`] answers `fdr-profiled status` and `snapshot`; [`log`] goes
//! to the journal under systemd; [`export`] pushes each interval's calls as profiles
//! (Pyroscope, OTLP). SIGHUP reloads the configuration, SIGTERM finishes every file
//! within `stop_timeout`.
mod calls;
pub mod config;
pub mod control;
pub mod export;
pub mod inline;
pub mod libraries;
mod live;
pub mod log;
pub mod output;
pub mod repaired;
pub mod retention;
mod router;
pub mod runtime;
pub mod segments;
mod snapshot;
mod status;
mod targets;
pub mod triggers;

use anyhow::Result;
use std::path::PathBuf;

/// Options of `service`.
#[derive(Debug, clap::Args)]
pub struct ServiceArgs {
    /// Run the service with this configuration until SIGTERM.
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "check_config",
        conflicts_with = "check_config"
    )]
    pub config: Option<PathBuf>,
    /// Validate this configuration file and exit: 0 when the service would accept it, else one
    /// line naming the file, line and column of the first problem.
    #[arg(long, value_name = "FILE")]
    pub check_config: Option<PathBuf>,
    /// Where to listen for `fdr-profiled status` and `fdr-profiled snapshot`.
    #[arg(long, value_name = "PATH", default_value = control::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// Runs `service`.
pub fn run(args: &ServiceArgs) -> Result<u8> {
    match (&args.config, &args.check_config) {
        (Some(config), _) => {
            log::init();
            runtime::run(config, &args.socket)
        }
        (None, Some(path)) => check(path),
        (None, None) => anyhow::bail!("give --config FILE or --check-config FILE"),
    }
}

/// `--check-config`: validates and lists the targets.
fn check(path: &std::path::Path) -> Result<u8> {
    let config = config::ServiceConfig::load(path)?;
    outln!(
        "{}: ok: output {}, {} target{}",
        config.path.display(),
        config.output.display(),
        config.targets.len(),
        if config.targets.len() == 1 { "" } else { "s" }
    );
    for t in &config.targets {
        outln!(
            "  {}: {} ({})",
            t.name,
            t.binary,
            match t.mode {
                config::Mode::FlightRecorder => format!("flight recorder, window {:?}", t.window),
                config::Mode::Record => "record".to_owned(),
            }
        );
    }
    if let Some(e) = &config.export {
        let endpoints: Vec<String> = [("pyroscope", &e.pyroscope), ("otlp", &e.otlp)]
            .into_iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k} {}", v.base)))
            .collect();
        outln!(
            "  export: {} every {:?}, queue {}",
            endpoints.join(", "),
            e.interval,
            e.queue
        );
    }
    Ok(0)
}
