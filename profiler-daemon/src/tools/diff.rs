//! `fdr-profiled diff A B`: two recorded sessions (or FDR files) compared function by function.
use anyhow::Result;
use fdr_analysis::report::render::Format;
use std::path::PathBuf;

/// Options of `diff`.
#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    /// The baseline: a session directory (a recording's --out) or one FDR file.
    pub a: PathBuf,
    /// The session compared with it.
    pub b: PathBuf,
    /// The instrumented binary of A, when its session does not record it (or it moved).
    #[arg(long, value_name = "BIN")]
    pub binary_a: Option<PathBuf>,
    /// The instrumented binary of B, likewise.
    #[arg(long, value_name = "BIN")]
    pub binary_b: Option<PathBuf>,
    /// Directory searched for separate debug files (`.build-id/` and debug-link paths).
    #[arg(long, value_name = "DIR", default_value = fdr_analysis::symbolize::debuginfo::SYSTEM_DEBUG_ROOT)]
    pub debug_dir: PathBuf,
    /// Show only the N functions that changed most; 0 shows all.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub top: usize,
    /// Output format: text or json (times in ns).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write to this file instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Runs `diff`; returns the exit code.
pub fn run(args: &DiffArgs) -> Result<u8> {
    if args.format == Format::Csv {
        anyhow::bail!("diff: --format csv is not offered: text or json");
    }
    let symbolizer = fdr_analysis::symbolize::Symbolizer::new(vec![args.debug_dir.clone()]);
    let report = |dir: &PathBuf, binary: Option<&std::path::Path>| -> Result<_> {
        let mut session = fdr_analysis::replay::Session::open(dir, binary, &symbolizer)?;
        Ok(fdr_analysis::report::build(&mut session, false))
    };
    let a = report(&args.a, args.binary_a.as_deref())?;
    let b = report(&args.b, args.binary_b.as_deref())?;
    let diff = fdr_analysis::diff::diff(
        &a,
        &args.a.display().to_string(),
        &b,
        &args.b.display().to_string(),
        args.top,
    );
    let text = match args.format {
        Format::Json => {
            for w in &diff.warnings {
                errln!("fdr-profiled: warning: {w}");
            }
            let mut s = serde_json::to_string_pretty(&fdr_analysis::diff::to_json(&diff))?;
            s.push('\n');
            s
        }
        _ => fdr_analysis::diff::text(&diff),
    };
    super::report::write_output(args.output.as_deref(), text.as_bytes())?;
    Ok(0)
}
