//! `fdr-profiled report DIR`: per-function statistics of a recorded session.
use anyhow::{Context as _, Result};
use fdr_analysis::report::render::{self, Format};
use fdr_analysis::report::SortKey;
use std::io::Write as _;
use std::path::PathBuf;

/// Options of `report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The session, and how its functions are named.
    #[command(flatten)]
    pub input: super::SessionInput,
    /// One table per thread instead of one over all threads and processes.
    #[arg(long)]
    pub per_thread: bool,
    /// Row order.
    #[arg(long, value_enum, default_value_t = SortKey::Total)]
    pub sort: SortKey,
    /// Show only the first N functions (per thread with --per-thread); 0 shows all.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub top: usize,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write to this file instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Runs `report`; returns the exit code.
pub fn run(args: &ReportArgs) -> Result<u8> {
    let symbolizer = args.input.symbolizer();
    let mut session = args.input.open(&symbolizer)?;
    let mut report = fdr_analysis::report::build(&mut session, args.per_thread);
    report.sort_and_cut(args.sort, args.top);
    let text = render::render(&report, args.format);
    // In text the warnings are part of the report; otherwise they go to stderr, where they
    // do not break the machine-readable output.
    if args.format != Format::Text {
        for w in &report.warnings {
            errln!("fdr-profiled: warning: {w}");
        }
    }
    write_output(args.output.as_deref(), text.as_bytes())?;
    Ok(0)
}

/// Writes `bytes` to `path`, a new file (`0600`, never over an existing one, see
/// [`fdr_session::output_dir`]), or to standard output (a closed pipe is not an error).
pub fn write_output(path: Option<&std::path::Path>, bytes: &[u8]) -> Result<()> {
    match path {
        Some(p) => {
            let (dir, name) = fdr_session::output_dir::OutputDir::for_new_file(p)?;
            dir.write_new(&name, |f| f.write_all(bytes))
        }
        None => {
            let mut out = std::io::stdout().lock();
            match out.write_all(bytes).and_then(|()| out.flush()) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    Err(e).context("writing to stdout")
                }
                _ => Ok(()),
            }
        }
    }
}
