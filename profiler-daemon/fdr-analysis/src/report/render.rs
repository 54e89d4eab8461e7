//! A [`Report`] as text for people, CSV for spreadsheets, JSON for programs. CSV and JSON give
//! times in integer nanoseconds; text in units chosen per value.
use super::{EventRow, FunctionRow, Report, ThreadKey};
use fdr_session::units::human_ns;
use serde_json::json;
use std::fmt::Write as _;

/// Output formats of `report`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns.
    Text,
    /// Comma-separated values with a header line; times in ns.
    Csv,
    /// One JSON document; times in ns.
    Json,
}

/// Renders `report` in `format`.
pub fn render(report: &Report, format: Format) -> String {
    match format {
        Format::Text => text(report),
        Format::Csv => csv(report),
        Format::Json => {
            let mut s = serde_json::to_string_pretty(&to_json(report)).unwrap_or_default();
            s.push('\n');
            s
        }
    }
}

/// The function's name, followed by ` [libfoo.so]` for a function of a shared object: the
/// executable's functions are shown as they always were.
fn display_name(name: &str, shared_object: Option<&str>) -> String {
    match shared_object {
        Some(object) => format!("{name} [{object}]"),
        None => name.to_owned(),
    }
}

fn location(r: &FunctionRow) -> String {
    r.info
        .location
        .as_ref()
        .map(|l| l.short())
        .unwrap_or_default()
}

/// Text: a heading, warnings, one line per function (grouped by thread in a per-thread
/// report), then the events.
pub fn text(report: &Report) -> String {
    let t = &report.totals;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "fdr-profiled report of {}: {} process{}, {} thread{}, {} calls",
        report.dir,
        t.processes,
        if t.processes == 1 { "" } else { "es" },
        t.threads,
        if t.threads == 1 { "" } else { "s" },
        t.calls
    );
    for w in &report.warnings {
        let _ = writeln!(s, "warning: {w}");
    }
    let mut incomplete = Vec::new();
    if t.unwound > 0 {
        incomplete.push(format!("{} unwound (ended by a caller's exit)", t.unwound));
    }
    if t.unfinished > 0 {
        incomplete.push(format!(
            "{} unfinished at the end of the trace",
            t.unfinished
        ));
    }
    if t.unmatched_exits > 0 {
        incomplete.push(format!("{} exits without an entry", t.unmatched_exits));
    }
    if t.closed_by_recorder > 0 {
        let _ = writeln!(
            s,
            "closed by the recorder where they were proven gone (an exception caught, a longjmp, \
             a lost exit, the return-probe limit): {} calls, timed to that point",
            t.closed_by_recorder
        );
    }
    if !incomplete.is_empty() {
        let _ = writeln!(s, "not timed: {}", incomplete.join(", "));
    }
    let header = format!(
        "{:>10} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}  function",
        "calls", "total", "self", "min", "median", "p90", "p99", "max"
    );
    let mut thread: Option<Option<ThreadKey>> = None;
    let mut approximate = false;
    for r in &report.functions {
        if thread != Some(r.thread) {
            thread = Some(r.thread);
            s.push('\n');
            if let Some(k) = r.thread {
                let _ = writeln!(s, "pid {} tid {}:", k.pid, k.tid);
            }
            let _ = writeln!(s, "{header}");
        }
        let p = r.percentiles;
        let mark = if p.exact { "" } else { "~" };
        approximate |= !p.exact;
        let pct = |v: u64| format!("{mark}{}", human_ns(v));
        let loc = location(r);
        let _ = writeln!(
            s,
            "{:>10} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}  {}{}",
            r.calls,
            human_ns(r.total),
            human_ns(r.self_time),
            human_ns(r.min),
            pct(p.median),
            pct(p.p90),
            pct(p.p99),
            human_ns(r.max),
            display_name(&r.info.name, r.shared_object.as_deref()),
            if loc.is_empty() {
                String::new()
            } else {
                format!("  ({loc})")
            }
        );
    }
    if approximate {
        let _ = writeln!(
            s,
            "~: from a histogram (3 significant digits): too many calls to keep every duration"
        );
    }
    cost_text(&mut s, report);
    budget_text(&mut s, report);
    if !report.events.is_empty() {
        let _ = writeln!(s, "\nevents:");
        for e in &report.events {
            event_text(&mut s, e);
        }
    }
    s
}

fn event_text(s: &mut String, e: &EventRow) {
    let kind = match e.event_type {
        None => "custom events".to_owned(),
        Some(t) => format!("typed events (type {t})"),
    };
    let within = e
        .function
        .as_ref()
        .map_or("outside any traced call".to_owned(), |f| {
            format!("in {}", display_name(&f.name, e.shared_object.as_deref()))
        });
    let _ = writeln!(
        s,
        "{:>10} {kind} {within}, {} bytes; first: {:?}",
        e.count, e.bytes, e.example
    );
    if e.sites.len() > 1 {
        let _ = writeln!(
            s,
            "{:>10} the function has {} sleds of this kind; the trace does not say which fired:",
            "",
            e.sites.len()
        );
    }
    for site in &e.sites {
        let _ = writeln!(s, "{:>12}{}", "", site_text(site));
    }
}

/// `file:line in inner (inlined into a, inlined into b)` for an event site.
pub fn site_text(site: &crate::symbolize::EventSite) -> String {
    let Some(inner) = site.frames.first() else {
        return format!("at {:#x} (no debug information)", site.address);
    };
    let loc = inner
        .location
        .as_ref()
        .map_or("?".to_owned(), |l| format!("{}:{}", l.file, l.line));
    let mut text = format!("at {loc} in {}", inner.function);
    for outer in site.frames.iter().skip(1) {
        let at = outer
            .location
            .as_ref()
            .map_or(String::new(), |l| format!(" at {}", l.short()));
        let _ = write!(text, ", inlined into {}{at}", outer.function);
    }
    text
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// CSV: one line per function; `pid` and `tid` are empty in a report over all threads. `id`
/// is the id as in the trace; `object` the file of the function's object (last, so that the
/// columns before it stay where they were before sessions had several objects).
pub fn csv(report: &Report) -> String {
    let mut s = String::from(
        "pid,tid,id,function,file,line,calls,total_ns,self_ns,min_ns,median_ns,p90_ns,p99_ns,max_ns,percentiles_exact,unwound,unfinished,object\n",
    );
    for r in &report.functions {
        let (pid, tid) = r.thread.map_or((String::new(), String::new()), |k| {
            (k.pid.to_string(), k.tid.to_string())
        });
        let (file, line) = r
            .info
            .location
            .as_ref()
            .map_or((String::new(), String::new()), |l| {
                (l.file.clone(), l.line.to_string())
            });
        let p = r.percentiles;
        let _ = writeln!(
            s,
            "{pid},{tid},{},{},{},{line},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.info.id,
            csv_field(&r.info.name),
            csv_field(&file),
            r.calls,
            r.total,
            r.self_time,
            r.min,
            p.median,
            p.p90,
            p.p99,
            r.max,
            p.exact,
            r.unwound,
            r.unfinished,
            csv_field(r.object_path.as_deref().unwrap_or_default())
        );
    }
    s
}

/// What the probes cost each function, from what the recorder measured a hit to cost (see
/// [`RecordedCosts`](crate::replay::layout::RecordedCosts)): the costliest first, with their
/// calls per second over the recording and their share of a CPU.
fn cost_text(s: &mut String, report: &Report) {
    let Some(costs) = &report.costs else {
        return;
    };
    let seconds = costs.costs.recorded_ns as f64 / 1e9;
    if seconds <= 0.0 {
        return;
    }
    let _ = writeln!(
        s,
        "\nprobe cost (estimated from the hit costs the recorder measured): {} over {}, {:.1}% of a CPU",
        human_ns(report.probe_cost_ns as u64),
        human_ns(costs.costs.recorded_ns),
        report.probe_cost_ns / 1e9 / seconds * 100.0
    );
    let mut thread: Option<Option<ThreadKey>> = None;
    for r in &report.costliest {
        if thread != Some(r.thread) {
            thread = Some(r.thread);
            if let Some(k) = r.thread {
                let _ = writeln!(s, "pid {} tid {}:", k.pid, k.tid);
            }
            let _ = writeln!(
                s,
                "{:>12} {:>14} {:>11}  function",
                "calls/s", "share of a CPU", "per call"
            );
        }
        let _ = writeln!(
            s,
            "{:>12.0} {:>13.1}% {:>11}  {}",
            r.calls as f64 / seconds,
            report.probe_cost(r) / 1e9 / seconds * 100.0,
            human_ns(costs.per_call_ns(r.info.id) as u64),
            display_name(&r.info.name, r.shared_object.as_deref()),
        );
    }
}

/// What the budget did (`--max-overhead`): each function it stopped tracing, and when it came
/// back, so that a function's missing calls read as what they are.
fn budget_text(s: &mut String, report: &Report) {
    let Some(b) = &report.budget else {
        return;
    };
    let _ = writeln!(
        s,
        "\nbudget (at most {}% overhead): {} of {} functions not traced at the end{}",
        b.max_overhead_percent,
        b.dropped_at_end.len(),
        b.functions + b.functions_unbudgeted,
        if b.changes.is_empty() {
            "; nothing was dropped"
        } else {
            "; a function dropped has no calls from its drop to its re-admission:"
        }
    );
    for c in &b.changes {
        let _ = writeln!(s, "  {}", c.describe());
    }
}

/// The JSON document.
pub fn to_json(report: &Report) -> serde_json::Value {
    let functions: Vec<_> = report
        .functions
        .iter()
        .map(|r| {
            let p = r.percentiles;
            json!({
                "pid": r.thread.map(|k| k.pid),
                "tid": r.thread.map(|k| k.tid),
                "id": r.info.id,
                "object": (r.object != crate::replay::NO_OBJECT).then_some(r.object),
                "object_path": r.object_path,
                "shared_object": r.shared_object,
                "name": r.info.name,
                "name_source": r.info.source,
                "address": r.info.address,
                "location": r.info.location,
                "calls": r.calls,
                "total_ns": r.total,
                "self_ns": r.self_time,
                "min_ns": r.min,
                "median_ns": p.median,
                "p90_ns": p.p90,
                "p99_ns": p.p99,
                "max_ns": r.max,
                "percentiles_exact": p.exact,
                "unwound": r.unwound,
                "unfinished": r.unfinished,
                "probe_cost_ns": report.costs.as_ref().map(|_| report.probe_cost(r).round() as u64),
            })
        })
        .collect();
    let events: Vec<_> = report
        .events
        .iter()
        .map(|e| {
            json!({
                "function": e.function.as_ref().map(|f| &f.name),
                "function_id": e.function.as_ref().map(|f| f.id),
                "shared_object": e.shared_object,
                "event_type": e.event_type,
                "count": e.count,
                "bytes": e.bytes,
                "example": e.example,
                "sites": e.sites,
            })
        })
        .collect();
    json!({
        "session": report.dir,
        "per_thread": report.per_thread,
        "totals": report.totals,
        "warnings": report.warnings,
        "functions": functions,
        "events": events,
        "budget": report.budget,
    })
}
