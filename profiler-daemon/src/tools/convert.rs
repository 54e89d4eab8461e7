//! `fdr-profiled convert DIR --format chrome|speedscope|folded|svg|pprof`.
use anyhow::{Context as _, Result};
use fdr_analysis::convert::{write, write_file, Format};
use std::io::BufWriter;
use std::path::PathBuf;

/// Options of `convert`.
#[derive(Debug, clap::Args)]
pub struct ConvertArgs {
    /// The session, and how its functions are named.
    #[command(flatten)]
    pub input: super::SessionInput,
    /// What to write.
    #[arg(long, value_enum)]
    pub format: Format,
    /// Write to this file instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Runs `convert`; returns the exit code.
pub fn run(args: &ConvertArgs) -> Result<u8> {
    let symbolizer = args.input.symbolizer();
    let session = args.input.open(&symbolizer)?;
    for w in &session.warnings {
        errln!("fdr-profiled: warning: {w}");
    }
    let warnings = match &args.output {
        Some(path) => write_file(&session, args.format, path)?,
        None => {
            let mut out = BufWriter::new(std::io::stdout().lock());
            match write(&session, args.format, &mut out) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(0),
                r => r.context("writing to stdout")?,
            }
        }
    };
    for w in warnings {
        errln!("fdr-profiled: warning: {w}");
    }
    Ok(0)
}
