//! What a session produced, for the terminal and for `session.json`: the totals a session adds
//! up as it writes, and the summary printed from its [`SessionReport`]. The report's types are
//! `fdr-session`'s (`fdr_session::schema`), the ones the readers read `session.json` with.
use crate::plan::FunctionNames;
use crate::session::latencies::Latencies;
pub use fdr_session::schema::{
    ExitMethods, FunctionReport, ObjectReport, ProbeCosts, ProcessReport, RepairStats,
    RepairsByThread, SessionReport, ThreadReport, TrapCosts,
};
use fdr_session::units::human_ns;
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::collections::HashSet;
use std::fmt::Write as _;

/// Per-function totals, accumulated from matched entry/exit pairs as they are written.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct FunctionTotals {
    /// Completed calls (an entry with its exit or tail exit).
    pub calls: u64,
    /// Sum of the calls' inclusive durations in nanoseconds (recursive calls count at every level,
    /// as `llvm-xray account` counts them).
    pub total_ns: u64,
}

/// Per-function totals of a session, by function id. Each function's totals stay at one place
/// in a list once it is in, so a thread's [`CallTimes`] can remember where a function's are
/// and add to them without a hash lookup per call.
#[derive(Debug, Default)]
pub struct Totals {
    /// Where each function's totals are in `list`.
    index: FxHashMap<u32, u32>,
    list: Vec<(u32, FunctionTotals)>,
    /// Calls whose exit a return probe observed, and an exit sled (or a tail sled).
    by_return_probe: u64,
    by_exit_sled: u64,
    /// For `--live`: each function's durations, at its place in `list`.
    latencies: Option<Vec<Latencies>>,
}

impl Totals {
    /// Totals that also keep each function's durations (`--live`: `top` shows its p99).
    pub fn with_latencies() -> Totals {
        Totals {
            latencies: Some(Vec::new()),
            ..Totals::default()
        }
    }

    /// Every function with its totals and, if kept, its durations.
    pub fn iter_latencies(
        &self,
    ) -> impl Iterator<Item = (u32, &FunctionTotals, Option<&Latencies>)> {
        let latencies = self.latencies.as_deref().unwrap_or_default();
        (self.list.iter().enumerate()).map(|(i, (id, t))| (*id, t, latencies.get(i)))
    }

    /// Counts one call's exit by the method that observed it (`event_flags::BY_RETURN_PROBE`).
    #[inline]
    pub fn observed(&mut self, by_return_probe: bool) {
        if by_return_probe {
            self.by_return_probe += 1;
        } else {
            self.by_exit_sled += 1;
        }
    }

    /// Calls whose exit a return probe observed, and an exit or tail sled.
    pub fn observed_calls(&self) -> (u64, u64) {
        (self.by_return_probe, self.by_exit_sled)
    }

    /// Where the totals of `function_id` are in the list, adding them if new.
    fn place(&mut self, function_id: u32) -> u32 {
        let (list, latencies) = (&mut self.list, &mut self.latencies);
        *self.index.entry(function_id).or_insert_with(|| {
            list.push((function_id, FunctionTotals::default()));
            if let Some(latencies) = latencies {
                latencies.push(Latencies::default());
            }
            (list.len() - 1) as u32
        })
    }

    /// Adds `other`'s totals (another part of the session's threads) to these.
    pub fn add(&mut self, other: &Totals) {
        for &(function_id, t) in &other.list {
            let at = self.place(function_id) as usize;
            let mine = &mut self.list[at].1;
            mine.calls += t.calls;
            mine.total_ns = mine.total_ns.saturating_add(t.total_ns);
        }
        self.by_return_probe += other.by_return_probe;
        self.by_exit_sled += other.by_exit_sled;
    }

    /// Every function with its totals, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &FunctionTotals)> {
        self.list.iter().map(|(id, t)| (*id, t))
    }

    /// The totals of one function.
    pub fn get(&self, function_id: u32) -> Option<&FunctionTotals> {
        let &at = self.index.get(&function_id)?;
        Some(&self.list[at as usize].1)
    }
}

/// Entries of a thread's memory of where functions' totals are (a power of two).
const PLACES: usize = 64;

/// Adds one thread's completed calls to the session's [`Totals`]. The thread's open calls and
/// when they were entered are its trace's frames (`session::thread`), the one call stack a
/// thread has in the daemon.
#[derive(Debug)]
pub struct CallTimes {
    /// Where in [`Totals`] the functions this thread returned from lately have their totals:
    /// `(function id, place + 1)` at `id % PLACES`, 0 for none. A thread returns from a few
    /// functions over and over, and this saves the hash lookup each return would cost.
    places: [(u32, u32); PLACES],
}

impl Default for CallTimes {
    fn default() -> Self {
        CallTimes {
            places: [(0, 0); PLACES],
        }
    }
}

impl CallTimes {
    /// A call of `function_id` entered at `entered` ended (returned, tail-called out, or was
    /// proven gone) at `ts` nanoseconds.
    #[inline(always)]
    pub fn add(&mut self, function_id: u32, entered: u64, ts: u64, totals: &mut Totals) {
        let remembered = self.places[function_id as usize % PLACES];
        let place = if remembered.1 != 0 && remembered.0 == function_id {
            remembered.1 - 1
        } else {
            self.look_up(function_id, totals)
        };
        let t = &mut totals.list[place as usize].1;
        let ns = ts.saturating_sub(entered);
        t.calls += 1;
        t.total_ns = t.total_ns.saturating_add(ns);
        if let Some(latencies) = &mut totals.latencies {
            latencies[place as usize].add(ns);
        }
    }

    /// Where the totals of `function_id` are, remembered from now on: out of line, so that
    /// [`CallTimes::add`] stays small enough to inline.
    #[inline(never)]
    fn look_up(&mut self, function_id: u32, totals: &mut Totals) -> u32 {
        let place = totals.place(function_id);
        self.places[function_id as usize % PLACES] = (function_id, place + 1);
        place
    }
}

/// Functions ordered by total time, longest first, named.
pub fn rank_functions(
    totals: &Totals,
    names: &FunctionNames,
    return_probed: &HashSet<u32>,
) -> Vec<FunctionReport> {
    let mut out: Vec<FunctionReport> = totals
        .iter()
        .map(|(id, t)| FunctionReport {
            id,
            name: names.name(id),
            calls: t.calls,
            total_ns: t.total_ns,
            exit: if return_probed.contains(&id) {
                "return"
            } else {
                "sleds"
            }
            .to_owned(),
            probe_cost_ns: 0,
        })
        .collect();
    out.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.id.cmp(&b.id)));
    out
}

/// Sets each function's estimated probe cost: its calls times what one call's probes cost
/// by its exit method.
pub fn estimate_costs(functions: &mut [FunctionReport], costs: &ProbeCosts) {
    for f in functions {
        f.probe_cost_ns = (f.calls as f64 * costs.per_call_ns(&f.exit)).round() as u64;
    }
}

/// How many of the budget's changes the summary lists (all are in `session.json`).
const BUDGET_CHANGES_LISTED: usize = 10;

/// The summary's lines on the overhead budget: the limit, the overhead estimated, and the
/// functions dropped and re-admitted.
fn budget_lines(s: &mut String, report: &SessionReport) {
    let Some(b) = &report.budget else {
        return;
    };
    let dropped = b.changes.iter().filter(|c| c.action == "dropped").count();
    let _ = writeln!(
        s,
        "  budget: at most {}% overhead; {} functions under it ({} without: no counter left), peak {:.1}%, last {:.1}%; {dropped} drops, {} re-admissions; {} not traced at the end",
        b.max_overhead_percent,
        b.functions,
        b.functions_unbudgeted,
        b.peak_overhead_percent,
        b.last_overhead_percent,
        b.changes.len() - dropped,
        b.dropped_at_end.len(),
    );
    for c in b.changes.iter().take(BUDGET_CHANGES_LISTED) {
        let _ = writeln!(s, "    {}", c.describe());
    }
    if b.changes.len() > BUDGET_CHANGES_LISTED {
        let _ = writeln!(
            s,
            "    and {} more (session.json: budget.changes)",
            b.changes.len() - BUDGET_CHANGES_LISTED
        );
    }
}

/// How many functions the summary names as the costliest.
const COSTLIEST: usize = 5;

/// The summary's lines on what the probes cost (see [`ProbeCosts`]): the whole session's
/// estimate, what a hit cost, and the costliest functions with their rates.
fn cost_lines(s: &mut String, report: &SessionReport) {
    let Some(costs) = &report.probe_costs else {
        return;
    };
    let seconds = costs.recorded_ns as f64 / 1e9;
    let total: u64 = report.functions.iter().map(|f| f.probe_cost_ns).sum();
    let share = |ns: u64| {
        if seconds > 0.0 {
            format!("{:.1}%", ns as f64 / 1e9 / seconds * 100.0)
        } else {
            "-".to_owned()
        }
    };
    let t = &costs.traps;
    let programs = if costs.program_stats_seconds > 0.0 {
        format!(
            "; programs {:.0} ns at a sled, {:.0} ns at a return (BPF run-time statistics, first {:.1} s)",
            costs.sled_program_ns, costs.return_program_ns, costs.program_stats_seconds
        )
    } else {
        "; the programs' own time not known (the kernel's BPF run-time statistics take CAP_SYS_ADMIN)".to_owned()
    };
    // The repairs' stops are measured, not estimated.
    let repairs = report.repair.map_or(String::new(), |r| {
        format!(
            ", and {} stopped for repairs (measured)",
            human_ns(r.repair_ns_total)
        )
    });
    let _ = writeln!(
        s,
        "  probe cost (estimated): {} over {}, {} of a CPU{repairs}; a hit: entry {:.0} ns, return probe +{:.0} ns, exit sled +{:.0} ns (measured at the start){programs}",
        human_ns(total),
        human_ns(costs.recorded_ns),
        share(total),
        t.entry_ns,
        t.return_probe_ns,
        t.exit_sled_ns,
    );
    // Those that cost something worth naming: a thousandth of the whole at least.
    let mut costliest: Vec<&FunctionReport> = report
        .functions
        .iter()
        .filter(|f| f.probe_cost_ns > 0 && f.probe_cost_ns >= total / 1000)
        .collect();
    costliest.sort_by(|a, b| b.probe_cost_ns.cmp(&a.probe_cost_ns).then(a.id.cmp(&b.id)));
    if costliest.is_empty() {
        return;
    }
    let _ = writeln!(s, "  costliest functions to trace (estimated):");
    let _ = writeln!(s, "         calls/s  share of a CPU  function");
    for f in costliest.iter().take(COSTLIEST) {
        let per_second = if seconds > 0.0 {
            f.calls as f64 / seconds
        } else {
            0.0
        };
        let _ = writeln!(
            s,
            "  {:>14}  {:>14}  {}",
            if per_second < 10.0 {
                format!("{per_second:.2}")
            } else {
                format!("{per_second:.0}")
            },
            share(f.probe_cost_ns),
            f.name
        );
    }
}

/// The human summary printed at the end of a session.
pub fn render(report: &SessionReport, out_dir: &std::path::Path, top: usize) -> String {
    let threads: usize = report.processes.iter().map(|p| p.threads.len()).sum();
    let mut s = String::new();
    let _ = writeln!(s, "fdr-profiled: session summary");
    let _ = writeln!(
        s,
        "  processes: {}, threads: {}",
        report.processes.len(),
        threads
    );
    let _ = writeln!(s, "  exits: {} ({})", report.exits, report.exits_reason);
    for note in &report.notes {
        let _ = writeln!(s, "  note: {note}");
    }
    if !report.kernel_programs.is_empty() {
        let costs: Vec<String> = report
            .kernel_programs
            .iter()
            .map(|c| {
                format!(
                    "{} {} runs, {:.1} ns/run",
                    c.program,
                    c.runs,
                    c.ns_per_run()
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "  kernel programs (BPF run-time statistics): {}",
            costs.join("; ")
        );
    }
    cost_lines(&mut s, report);
    budget_lines(&mut s, report);
    let m = &report.exit_methods;
    let _ = writeln!(
        s,
        "  exits observed by return probe: {} functions, {} calls; by exit sleds: {} functions, {} calls",
        m.return_probe_functions, m.return_probe_calls, m.exit_sled_functions, m.exit_sled_calls
    );
    let _ = writeln!(
        s,
        "  events: {}, events lost: {}",
        report.events, report.events_lost
    );
    let lossy: Vec<String> = report
        .processes
        .iter()
        .flat_map(|p| &p.threads)
        .filter(|t| t.events_lost > 0)
        .map(|t| format!("tid {}: {}", t.tid, t.events_lost))
        .collect();
    if !lossy.is_empty() {
        let _ = writeln!(
            s,
            "  lost per thread: {}{}",
            lossy.iter().take(8).cloned().collect::<Vec<_>>().join(", "),
            if lossy.len() > 8 { ", ..." } else { "" }
        );
        let _ = writeln!(
            s,
            "  (files stay valid: frames left during a loss are closed at the next event; \
             exits of lost entries are not written; raise --buffer-size to lose less)"
        );
    }
    if report.events_lost_unattributed > 0 {
        let _ = writeln!(
            s,
            "  lost events of threads without a file: {}",
            report.events_lost_unattributed
        );
    }
    if report.custom_events + report.typed_events > 0 {
        let _ = writeln!(
            s,
            "  custom events: {}, typed events: {}, payloads truncated: {}",
            report.custom_events, report.typed_events, report.custom_events_truncated
        );
    }
    if report.events_dropped_write_errors + report.records_not_stored > 0 {
        let _ = writeln!(
            s,
            "  not stored (write errors, the disk full?): {} events dropped after the error, {} records lost in the failed write",
            report.events_dropped_write_errors, report.records_not_stored
        );
    }
    let threads_iter = || report.processes.iter().flat_map(|p| &p.threads);
    let unwound: u64 = threads_iter().map(|t| t.frames_unwound).sum();
    let by_loss: u64 = threads_iter().map(|t| t.frames_closed_by_loss).sum();
    let beyond: u64 = threads_iter().map(|t| t.frames_beyond_return_limit).sum();
    let by_budget: u64 = threads_iter().map(|t| t.frames_closed_by_budget).sum();
    let lost_entries: u64 = threads_iter().map(|t| t.exits_of_lost_entries).sum();
    let catches: u64 = threads_iter().map(|t| t.catches).sum();
    if unwound + by_loss + beyond + by_budget > 0 {
        let budget = if by_budget > 0 {
            format!(", {by_budget} of functions the budget dropped while they ran")
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "  frames closed where they were proven gone: {unwound} left by exceptions or longjmp \
             ({catches} exceptions caught), {by_loss} after lost events, {beyond} beyond the \
             kernel's return-probe limit{budget}"
        );
    }
    // The kernel drops the return-probe instances of frames an exception or longjmp left
    // only when a later call is hooked (and not at its limit of 64) or a traced caller
    // returns: a thread whose outer frames were entered before tracing began (--pid) can
    // stay at the limit, and then its calls have no exit of their own.
    let returned = report.exit_methods.return_probe_calls;
    if beyond > 1000 && beyond.saturating_mul(20) > returned {
        let _ = writeln!(
            s,
            "  warning: {beyond} calls got no return probe (the kernel's limit of 64 pending \
             per thread was reached: deep recursion, or return probes of frames an exception \
             or longjmp left that the kernel drops only when a traced caller returns); they \
             are timed to the next event that proves them gone. --exits sleds or \
             per-function observe every exit"
        );
    }
    if let Some(repair) = &report.repair {
        let _ = writeln!(s, "  {}", repair_line(repair));
        let mut stopped: Vec<(u32, u64)> = threads_iter()
            .filter_map(|t| Some((t.tid, t.repair?.repair_ns_total)))
            .filter(|&(_, ns)| ns > 0)
            .collect();
        stopped.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        if stopped.len() > 1 {
            let _ = writeln!(
                s,
                "  stopped for repairs per thread: {}{}",
                stopped
                    .iter()
                    .take(8)
                    .map(|(tid, ns)| format!("tid {tid}: {}", human_ns(*ns)))
                    .collect::<Vec<_>>()
                    .join(", "),
                if stopped.len() > 8 { ", ..." } else { "" }
            );
        }
    }
    let mut fates = ThreadReport::FATES.map(|name| (name, 0u64));
    for t in threads_iter() {
        for (sum, (_, n)) in fates.iter_mut().zip(t.fates()) {
            sum.1 += n;
        }
    }
    let in_files: u64 = threads_iter().map(|t| t.events).sum();
    let accounted: u64 = fates.iter().map(|(_, n)| n).sum();
    let terms: Vec<String> = fates
        .iter()
        .filter(|(name, n)| *n > 0 || *name == "written")
        .map(|(name, n)| format!("{n} {name}"))
        .collect();
    let _ = writeln!(
        s,
        "  events of traced threads: {in_files} = {}{}",
        terms.join(" + "),
        if accounted == in_files {
            String::new()
        } else {
            format!(" (INTERNAL ERROR: {accounted} accounted for)")
        }
    );
    if lost_entries > 0 {
        let _ = writeln!(s, "  exits of lost entries (not written): {lost_entries}");
    }
    if report.exits_entered_before_tracing > 0 || report.returns_before_tracing > 0 {
        let _ = writeln!(
            s,
            "  exits of calls entered before recording began or while their probes came and went (not written): {} events, {} return probes that made no event",
            report.exits_entered_before_tracing, report.returns_before_tracing
        );
    }
    let unexplained = report
        .dropped_unmatched_exits
        .saturating_sub(report.exits_entered_before_tracing);
    if unexplained > 0 {
        let _ = writeln!(
            s,
            "  exits without a traced entry, of frames left in a way no probe saw (not written): {unexplained}"
        );
    }
    if report.events_ignored > 0 {
        let _ = writeln!(s, "  events ignored: {}", report.events_ignored);
    }
    let _ = writeln!(s, "  files written: {} in {}", threads, out_dir.display());
    if let Some(kib) = report.daemon_peak_rss_kib {
        let _ = writeln!(
            s,
            "  fdr-profiled peak memory: {:.1} MiB (VmHWM)",
            kib as f64 / 1024.0
        );
    }
    if !report.functions.is_empty() {
        let _ = writeln!(s, "  top functions by total time:");
        let _ = writeln!(
            s,
            "  {:>14} {:>10} {:>12}  function",
            "total", "calls", "mean"
        );
        for f in report.functions.iter().take(top) {
            let mean = f.total_ns.checked_div(f.calls).unwrap_or(0);
            let _ = writeln!(
                s,
                "  {:>14} {:>10} {:>12}  {}",
                human_ns(f.total_ns),
                f.calls,
                human_ns(mean),
                f.name
            );
        }
    }
    s
}

/// What the repairs did, in one line for the end of the summary.
pub fn repair_line(stats: &RepairStats) -> String {
    let released = if stats.frames_released > 0 {
        format!(
            "; {} return addresses put back when the process was let go",
            stats.frames_released
        )
    } else {
        String::new()
    };
    let forks = if stats.forks_followed > 0 {
        format!(
            "; {} forked processes followed (repaired, not recorded)",
            stats.forks_followed
        )
    } else {
        String::new()
    };
    let passes = if stats.trampoline_passes > 0 {
        format!(
            "; {} passes through the return trampoline dropped {} instances of frames exceptions left",
            stats.trampoline_passes, stats.instances_dropped
        )
    } else {
        String::new()
    };
    let unhooked = if stats.frames_left_unhooked > 0 {
        format!(
            ", {} of functions the budget dropped left unhooked",
            stats.frames_left_unhooked
        )
    } else {
        String::new()
    };
    format!(
        "repair: {} throws ({} return addresses restored), {} catches ({} frames hooked again{unhooked}), {} slots left alone; stopped {:.3} ms for repairs (from each throw or catch to the thread running again, {:.1} us of it to resume), worst {:.1} us; {} signals passed on{}{}{passes}",
        stats.throws,
        stats.frames_restored,
        stats.catches,
        stats.frames_hooked_again,
        stats.slots_left_alone,
        stats.repair_ns_total as f64 / 1e6,
        stats.resumption_ns as f64 / 1e3,
        stats.repair_ns_max as f64 / 1e3,
        stats.signals_passed_on,
        released,
        forks
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_times_add_up_per_function() {
        let mut totals = Totals::default();
        let mut t = CallTimes::default();
        t.add(2, 110, 130, &mut totals);
        t.add(1, 100, 200, &mut totals);
        assert_eq!(totals.get(1).unwrap().calls, 1);
        assert_eq!(totals.get(1).unwrap().total_ns, 100);
        assert_eq!(totals.get(2).unwrap().total_ns, 20);
        assert!(totals.get(3).is_none());
        // 65 shares its place in the thread's memory with 1: both add up where they belong,
        // and a second thread adds to the same totals.
        t.add(65, 300, 305, &mut totals);
        t.add(1, 310, 320, &mut totals);
        CallTimes::default().add(65, 330, 340, &mut totals);
        t.add(65, 350, 351, &mut totals);
        assert_eq!(
            (
                totals.get(1).unwrap().calls,
                totals.get(1).unwrap().total_ns
            ),
            (2, 110)
        );
        assert_eq!(
            (
                totals.get(65).unwrap().calls,
                totals.get(65).unwrap().total_ns
            ),
            (3, 16)
        );
        // A clock that went back counts 0, never a huge duration.
        t.add(2, 500, 400, &mut totals);
        assert_eq!(totals.get(2).unwrap().total_ns, 20);
    }
}
