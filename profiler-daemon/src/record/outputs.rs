//! What a recording leaves beside its trace files: the report and the timeline
//! (`fdr_analysis::outputs`), the timeline only while a browser can open it.
use crate::session::output::OutputDir;
use fdr_analysis::symbolize::Symbolizer;

/// Above this many events the timeline is not written by default: its JSON would be several
/// gigabytes, more than a browser opens (`fdr-profiled convert` writes it on request).
const MAX_DEFAULT_TIMELINE_EVENTS: u64 = 2_000_000;

/// The report and timeline written next to the trace files (see `fdr_analysis::outputs`).
pub fn write_outputs(dir: &OutputDir, events: u64, symbolizer: &Symbolizer) {
    if events > MAX_DEFAULT_TIMELINE_EVENTS {
        match fdr_analysis::outputs::write_report_in(dir, symbolizer) {
            Ok(path) => errln!(
                "fdr-profiled: report: {} (no trace.json: {events} events; `fdr-profiled convert` writes one)",
                path.display()
            ),
            Err(err) => errln!("fdr-profiled: warning: could not write the report: {err:#}"),
        }
        return;
    }
    match fdr_analysis::outputs::write_session_outputs_in(dir, symbolizer) {
        Ok(outputs) => {
            for w in &outputs.warnings {
                errln!("fdr-profiled: warning: {w}");
            }
            errln!(
                "fdr-profiled: report: {}, timeline: {}",
                outputs.report.display(),
                outputs.trace.display()
            );
        }
        Err(err) => errln!("fdr-profiled: warning: could not write the report: {err:#}"),
    }
}
