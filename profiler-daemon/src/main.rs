//! `fdr-profiled`: see the README and `fdr-profiled --help`.
use clap::Parser as _;
use profiler_daemon::cli::{Cli, Tool};
use profiler_daemon::record;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.tool {
        None => record::run(&cli.record),
        Some(Tool::BuildInfo) => {
            println!(
                "fdr-profiled {} (eBPF event size {} bytes)",
                env!("CARGO_PKG_VERSION"),
                profiler_common::SledEvent::SIZE
            );
            Ok(0)
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            // One line: the whole cause chain, with any embedded newlines folded.
            let text = format!("{err:#}").replace('\n', " ");
            eprintln!("fdr-profiled: error: {text}");
            ExitCode::from(1)
        }
    }
}
