//! What a recording leaves next to its trace files by default: a text report (`report.txt`)
//! and a timeline with function names: Chrome trace-event JSON (`trace.json`), or for a
//! session too large for JSON, Perfetto's own format (`trace.perfetto-trace`).
use crate::convert::Format;
use crate::replay::Session;
use crate::report::render;
use crate::symbolize::Symbolizer;
use anyhow::Result;
use fdr_session::output_dir::OutputDir;
use std::path::{Path, PathBuf};

/// Name of the text report in a session directory.
pub const REPORT_FILE: &str = "report.txt";
/// Name of the Chrome trace-event timeline in a session directory.
pub const TRACE_FILE: &str = "trace.json";
/// Name of the Perfetto timeline in a session directory.
pub const PERFETTO_FILE: &str = "trace.perfetto-trace";

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
    write_session_outputs_in(&OutputDir::open_existing(dir)?, symbolizer, Timeline::Json)
}

/// Which timeline a session gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timeline {
    /// `trace.json`: Chrome trace-event JSON, which browsers open up to a few hundred MB.
    Json,
    /// `trace.perfetto-trace`: Perfetto's protobuf format, for any size.
    Perfetto,
}

/// [`write_session_outputs`] for the session in the directory `out` holds: read and written
/// through its descriptor, never by its path (see [`write_report_in`]).
pub fn write_session_outputs_in(
    out: &OutputDir,
    symbolizer: &Symbolizer,
    timeline: Timeline,
) -> Result<SessionOutputs> {
    let mut session = Session::open(&through(out), None, symbolizer)?;
    session.show_as(out.path());
    let (report_path, report) = report_into(&mut session, out)?;
    let (format, name) = match timeline {
        Timeline::Json => (Format::Chrome, TRACE_FILE),
        Timeline::Perfetto => (Format::Perfetto, PERFETTO_FILE),
    };
    let trace_path = out.path().join(name);
    let mut warnings = report.warnings.clone();
    for w in crate::convert::write_in(&session, format, out, name)? {
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
    write_report_in(&OutputDir::open_existing(dir)?, symbolizer)
}

/// [`write_report`] for the session in the directory `out` holds: read and written through its
/// descriptor, never by its path, which may lead elsewhere by now (the service's output, under
/// directories it does not own).
pub fn write_report_in(out: &OutputDir, symbolizer: &Symbolizer) -> Result<PathBuf> {
    let mut session = Session::open(&through(out), None, symbolizer)?;
    session.show_as(out.path());
    Ok(report_into(&mut session, out)?.0)
}

/// The directory `out` holds, as a path that leads to it whatever happened to its own path
/// since (`/proc/self/fd/N`: the kernel's link to the open directory).
fn through(out: &OutputDir) -> PathBuf {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    PathBuf::from(format!("/proc/self/fd/{}", out.as_fd().as_raw_fd()))
}

/// Builds the session's report and writes it as `report.txt` in `out`.
fn report_into(session: &mut Session, out: &OutputDir) -> Result<(PathBuf, crate::report::Report)> {
    use std::io::Write as _;
    let report = crate::report::build(session, false);
    let text = render::text(&report);
    out.write_new(REPORT_FILE, |f| f.write_all(text.as_bytes()))?;
    Ok((out.path().join(REPORT_FILE), report))
}
