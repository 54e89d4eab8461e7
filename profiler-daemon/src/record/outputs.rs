//! What a recording leaves beside its trace files: the report and the timeline
//! (`fdr_analysis::outputs`), the timeline as JSON while a browser can open it, else in
//! Perfetto's own format.
use crate::session::output::OutputDir;
use fdr_analysis::symbolize::Symbolizer;

/// Above this many events the timeline is written in Perfetto's own format instead of JSON:
/// the JSON would be several gigabytes, more than a browser opens (`fdr-profiled convert
/// --format chrome` still writes it on request).
const MAX_JSON_TIMELINE_EVENTS: u64 = 2_000_000;

/// The report and timeline written next to the trace files (see `fdr_analysis::outputs`).
pub fn write_outputs(dir: &OutputDir, events: u64, symbolizer: &Symbolizer) {
    let timeline = if events > MAX_JSON_TIMELINE_EVENTS {
        fdr_analysis::outputs::Timeline::Perfetto
    } else {
        fdr_analysis::outputs::Timeline::Json
    };
    match fdr_analysis::outputs::write_session_outputs_in(dir, symbolizer, timeline) {
        Ok(outputs) => {
            for w in &outputs.warnings {
                errln!("fdr-profiled: warning: {w}");
            }
            errln!(
                "fdr-profiled: report: {}, timeline: {}{}",
                outputs.report.display(),
                outputs.trace.display(),
                match timeline {
                    fdr_analysis::outputs::Timeline::Perfetto => format!(
                        " (Perfetto's format: {events} events, too many for JSON; ui.perfetto.dev opens it)"
                    ),
                    fdr_analysis::outputs::Timeline::Json => String::new(),
                }
            );
        }
        Err(err) => errln!("fdr-profiled: warning: could not write the report: {err:#}"),
    }
}
