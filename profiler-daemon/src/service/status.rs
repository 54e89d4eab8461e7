//! What the service says of itself: the `STATUS=` line systemd shows, and the reply to
//! `fdr-profiled status` (its JSON; the command renders it as text).
use super::repaired::Repaired;
use super::router::Router;
use super::targets::Target;
use crate::service::config::ServiceConfig;
use crate::service::export::Exporter;
use crate::service::retention::Retention;
use crate::service::triggers::Triggers;
use std::path::Path;

/// What [`status_json`] reads.
#[derive(Clone, Copy)]
pub(super) struct View<'a> {
    pub config: &'a ServiceConfig,
    pub retention: &'a Retention,
    pub targets: &'a [Target],
    pub router: &'a Router,
    pub triggers: &'a Triggers,
    /// Events the kernel lost that belong to no thread.
    pub unattributed: u64,
    /// Records that could not be decoded or numbered (never expected; counted as lost).
    pub malformed: u64,
    /// Events per second over the last status period.
    pub rate: f64,
    pub last_snapshot: Option<&'a Path>,
    pub exporter: Option<&'a Exporter>,
    /// What a probe hit costs, where it was measured.
    pub costs: Option<&'a crate::session::summary::ProbeCosts>,
}

/// The `STATUS=` line: targets, events, what the recorders hold, losses, and what the
/// probes cost (`costs`: whether that is known). `lost_elsewhere`: events lost that no
/// thread's count has (the kernel's unattributed losses, records that could not be read).
pub(super) fn status_line(
    targets: &[Target],
    router: &Router,
    lost_elsewhere: u64,
    rate: f64,
    costs: bool,
) -> String {
    let binaries: usize = targets.iter().map(|t| t.binaries.len()).sum();
    let (mut held, mut bytes, mut evicted) = (0, 0, 0);
    for w in targets.iter().flat_map(|t| &t.binaries) {
        let s = w.recorder.stats();
        held += s.events;
        bytes += s.bytes;
        evicted += s.evicted;
    }
    let probes = if costs {
        format!("; probes ~{:.1}% of a CPU", probes_cpu_percent(targets))
    } else {
        String::new()
    };
    format!(
        "{} targets ({binaries} binaries); {} events, {rate:.0}/s{probes}; holding {held} events in {:.1} MiB; lost {}, evicted {evicted}, not written {}, snapshots not written {}",
        targets.len(),
        router.events,
        bytes as f64 / f64::from(1 << 20),
        router.lost + router.unrouted + lost_elsewhere,
        not_written(targets),
        targets
            .iter()
            .flat_map(|t| &t.binaries)
            .map(|w| w.snapshots_not_written.get())
            .sum::<u64>(),
    )
}

/// What every binary's probes cost over the last status period, estimated, in percent of
/// one CPU.
fn probes_cpu_percent(targets: &[Target]) -> f64 {
    targets
        .iter()
        .flat_map(|t| &t.binaries)
        .map(|w| w.calls.cpu_share * 100.0)
        .sum()
}

/// Events of record-mode targets not written because writing had stopped (`min_free`).
fn not_written(targets: &[Target]) -> u64 {
    targets
        .iter()
        .flat_map(|t| &t.binaries)
        .filter_map(|w| w.segments.as_ref())
        .map(|g| g.not_written)
        .sum()
}

/// The service's state for `fdr-profiled status`; `rate` is the events per second of the
/// last status period.
pub(super) fn status_json(view: &View<'_>) -> serde_json::Value {
    let View {
        config,
        retention,
        targets,
        router,
        triggers,
        unattributed,
        malformed,
        rate,
        last_snapshot,
        exporter,
        costs,
    } = *view;
    let not_written = not_written(targets);
    let snapshots_not_written: u64 = targets
        .iter()
        .flat_map(|t| &t.binaries)
        .map(|w| w.snapshots_not_written.get())
        .sum();
    let disk_used = retention.disk_used();
    let targets: Vec<serde_json::Value> = targets
        .iter()
        .map(|t| {
            let binaries: Vec<serde_json::Value> = t
                .binaries
                .iter()
                .map(|w| {
                    let s = w.recorder.stats();
                    let mut binary = serde_json::json!({
                        "path": w.plan.display_path,
                        "processes": w.libraries.processes().into_iter().map(|(pid, libraries)| serde_json::json!({
                            "pid": pid,
                            "libraries": libraries,
                        })).collect::<Vec<_>>(),
                        "libraries": w.libraries.objects.iter().map(|l| serde_json::json!({
                            "object_id": l.object_id,
                            "path": l.plan.display_path,
                            "functions": l.plan.functions,
                            "probes_per_process": l.probes,
                        })).collect::<Vec<_>>(),
                        "mode": if w.segments.is_some() { "record" } else { "flight-recorder" },
                        "segment": w.segments.as_ref().and_then(|g| g.current()),
                        "segments_closed": w.segments.as_ref().map_or(0, |g| g.closed),
                        "not_written": w.segments.as_ref().map_or(0, |g| g.not_written),
                        "snapshots_not_written": w.snapshots_not_written.get(),

                        "threads": s.threads,
                        "events": s.events,
                        "thread_ends": s.thread_ends,
                        "bytes": s.bytes,
                        "expired": s.expired,
                        "evicted": s.evicted,
                        "seen": s.seen,
                        "lost": s.lost,
                        "threads_expired": s.threads_expired,
                        "threads_evicted": s.threads_evicted,
                        "window_ns": s.window_ns,
                        "repair": w.repaired.as_ref().map(Repaired::status),
                        "inline": w.inline.as_ref().map(super::inline::InlineBinary::status),
                        "export_calls_not_kept": w.export.as_ref().map(|e| e.stacks.calls_not_kept),
                        "budget": w.budget.as_ref().map(|b| budget_json(&b.probes)),
                    });
                    if let serde_json::Value::Object(map) = &mut binary {
                        triggers.status(w.tag, map);
                        if costs.is_some() {
                            map.insert("probes".into(), probes_json(w));
                        }
                    }
                    binary
                })
                .collect();
            serde_json::json!({
                "name": t.config.name,
                "pattern": t.config.binary,
                "binaries": binaries,
            })
        })
        .collect();
    serde_json::json!({
        "output": retention.root().path(),
        "output_refused": retention.root().refused(),
        "output_refusals": retention.root().refusals(),
        "events": router.events,
        "events_per_second": rate.round() as u64,
        "lost": router.lost + router.unrouted + unattributed + malformed,
        "events_malformed": malformed,
        "not_written": not_written,
        "snapshots_not_written": snapshots_not_written,
        "disk_used": disk_used,
        "max_disk": (config.max_disk != u64::MAX).then_some(config.max_disk),
        "last_snapshot": last_snapshot,
        "export": exporter.map(Exporter::status),
        "probe_costs": costs,
        "probes_cpu_percent": costs.map(|_| probes_cpu_percent(view.targets)),
        "targets": targets,
    })
}

/// A binary's budget now: its limit, the overhead estimated over the last second, and the
/// functions it does not trace now.
fn budget_json(b: &crate::budget::probes::BudgetedProbes) -> serde_json::Value {
    let report = b.report();
    serde_json::json!({
        "max_overhead_percent": report.max_overhead_percent,
        "overhead_percent": report.last_overhead_percent,
        "peak_overhead_percent": report.peak_overhead_percent,
        "functions": report.functions,
        "functions_unbudgeted": report.functions_unbudgeted,
        "dropped": report.dropped_at_end,
        "changes": report.changes.len(),
        "last_change": report.changes.last().map(|c| c.describe()),
    })
}

/// What a binary's probes cost over the last status period: its calls per second, their
/// estimated share of a CPU, and the costliest functions.
fn probes_json(w: &super::targets::Watched) -> serde_json::Value {
    let costliest: Vec<serde_json::Value> = w
        .calls
        .costliest()
        .iter()
        .map(|r| {
            serde_json::json!({
                "id": r.id,
                "function": w.function_name(r.id),
                "calls_per_second": r.calls_per_second.round() as u64,
                "cpu_percent": w.inline.is_none().then_some(r.cpu_share * 100.0),
            })
        })
        .collect();
    // The inline engine's calls trap nowhere: what they cost is not estimated (null).
    let inline = w.inline.is_some();
    serde_json::json!({
        "calls_per_second": w.calls.calls_per_second.round() as u64,
        "cpu_percent": (!inline).then_some(w.calls.cpu_share * 100.0),
        "costliest": costliest,
        "engine": if inline { "inline" } else { "uprobes" },
    })
}
