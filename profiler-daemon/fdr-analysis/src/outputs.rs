//! What a recording leaves next to its trace files by default: a text report (`report.txt`)
//! and a Chrome/Perfetto timeline (`trace.json`), both with function names.
use crate::convert::Format;
use crate::output_dir::OutputDir;
use crate::replay::Session;
use crate::report::render;
use crate::symbolize::Symbolizer;
use anyhow::Result;
use std::path::{Path, PathBuf};

/// Name of the text report in a session directory.
pub const REPORT_FILE: &str = "report.txt";
/// Name of the Chrome trace-event timeline in a session directory.
pub const TRACE_FILE: &str = "trace.json";

/// What [`write_session_outputs`] wrote.
#[derive(Debug)]
pub struct SessionOutputs {
    /// The text report.
    pub report: PathBuf,
    /// The timeline.
    pub trace: PathBuf,
    /// Problems found while reading the session (missing binary, corrupt file...), one line
    /// each; they are in the report too.
    pub warnings: Vec<String>,
}

/// Writes `report.txt` and `trace.json` into the session directory `dir` (which must hold a
/// finished session: its `session.json` and trace files), naming functions with `symbolizer`.
/// Both are created new (`0600`, never over anything, see [`crate::output_dir`]).
pub fn write_session_outputs(dir: &Path, symbolizer: &Symbolizer) -> Result<SessionOutputs> {
    let mut session = Session::open(dir, None, symbolizer)?;
    let out = OutputDir::open_existing(dir)?;
    let (report_path, report) = report_into(&mut session, &out)?;
    let trace_path = dir.join(TRACE_FILE);
    let mut warnings = report.warnings.clone();
    for w in crate::convert::write_in(&session, Format::Chrome, &out, TRACE_FILE)? {
        if !warnings.contains(&w) {
            warnings.push(w);
        }
    }
    Ok(SessionOutputs {
        report: report_path,
        trace: trace_path,
        warnings,
    })
}

/// Writes only `report.txt` into the session directory `dir` (for sessions too large for a
/// default timeline).
pub fn write_report(dir: &Path, symbolizer: &Symbolizer) -> Result<PathBuf> {
    let mut session = Session::open(dir, None, symbolizer)?;
    let out = OutputDir::open_existing(dir)?;
    Ok(report_into(&mut session, &out)?.0)
}

/// Builds the session's report and writes it as `report.txt` in `out`.
fn report_into(session: &mut Session, out: &OutputDir) -> Result<(PathBuf, crate::report::Report)> {
    use std::io::Write as _;
    let report = crate::report::build(session, false);
    let text = render::text(&report);
    out.write_new(REPORT_FILE, |f| f.write_all(text.as_bytes()))?;
    Ok((out.path().join(REPORT_FILE), report))
}
