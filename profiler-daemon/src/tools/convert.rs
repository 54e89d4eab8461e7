//! `fdr-profiled convert DIR --format chrome|speedscope|folded|svg`.
use crate::convert::{chrome, folded, speedscope, Format};
use crate::replay::Session;
use anyhow::{Context as _, Result};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

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
        eprintln!("fdr-profiled: warning: {w}");
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
        eprintln!("fdr-profiled: warning: {w}");
    }
    Ok(0)
}

/// Writes `session` in `format` to `out`; returns problems found while reading.
pub fn write(
    session: &Session,
    format: Format,
    out: &mut impl Write,
) -> std::io::Result<Vec<String>> {
    match format {
        Format::Chrome => chrome::write(session, out),
        Format::Speedscope => speedscope::write(session, out),
        Format::Folded => folded::write_folded(session, out),
        Format::Svg => folded::write_svg(session, out),
    }
}

/// Writes `session` in `format` to the file `path`, created anew (through a temporary file
/// renamed into place, so a failed conversion leaves no half-written file).
pub fn write_file(session: &Session, format: Format, path: &Path) -> Result<Vec<String>> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let file =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut out = BufWriter::new(file);
    let result = write(session, format, &mut out).and_then(|w| {
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(w)
    });
    match result {
        Ok(w) => {
            std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
            Ok(w)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e).with_context(|| format!("writing {}", path.display()))
        }
    }
}
