//! `fdr-profiled`: see the README and `fdr-profiled --help`.
use clap::Parser as _;
use profiler_daemon::{cli::Cli, record};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match record::run(&cli) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            // One line: the whole cause chain, with any embedded newlines folded.
            let text = format!("{err:#}").replace('\n', " ");
            eprintln!("fdr-profiled: error: {text}");
            ExitCode::from(1)
        }
    }
}
