//! The probes under a budget: each function's probes placed as a set of their own (see
//! `Tracer::attach_probes`), its calls counted in a slot of the kernel's counters, so that
//! [`BudgetedProbes::tick`] can remove the hottest and place them again later.
use super::{Change, Controller, Estimate, Sample};
use crate::kernel::bpf::{Attachment, Scope, Tracer};
use crate::plan::{AttachPlan, Probe};
use anyhow::{bail, Result};
use fdr_session::schema::{BudgetChange, BudgetReport, ProbeCosts, TrapCosts};
use profiler_common::SledKind;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One function under the budget.
struct Function {
    binary: PathBuf,
    scope: Scope,
    function_id: u32,
    name: String,
    slot: u16,
    probes: Vec<Probe>,
    /// Its probes while they are placed.
    placed: Option<Attachment>,
}

/// Every budgeted function of a session (or of a service target), and what the budget did.
pub struct BudgetedProbes {
    controller: Controller,
    functions: Vec<Function>,
    costs: ProbeCosts,
    /// Functions placed without the budget (no slot left).
    unbudgeted: usize,
    /// Probes not of one function (event sleds), and unbudgeted functions' probes.
    rest: Vec<Attachment>,
    changes: Vec<BudgetChange>,
    started_ns: u64,
    peak: f64,
    last: Estimate,
    /// Removals still under way (each on a thread of its own), and whether the last period
    /// had one: no decision until a whole period without (see [`Controller::observe`]).
    removing: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    settling: bool,
}

impl BudgetedProbes {
    /// A budget of `limit` (a fraction), on a host where a probe hit costs `traps`.
    pub fn new(limit: f64, traps: TrapCosts, started_ns: u64) -> BudgetedProbes {
        BudgetedProbes {
            controller: Controller::new(limit),
            functions: Vec::new(),
            costs: ProbeCosts {
                traps,
                ..ProbeCosts::default()
            },
            unbudgeted: 0,
            rest: Vec::new(),
            changes: Vec::new(),
            started_ns,
            peak: 0.0,
            last: Estimate::default(),
            removing: std::sync::Arc::default(),
            settling: false,
        }
    }

    /// Places `plan`'s probes (its exits decided, see `plan::exits::decide`), one set per
    /// function; `id_of` gives, for the function id in the probes' cookies, the id its events
    /// have in a session and its name. Returns how many probes were placed. What fails to be
    /// placed is removed again and is the error.
    pub fn attach(
        &mut self,
        tracer: &mut Tracer,
        plan: &AttachPlan,
        scope: Scope,
        id_of: &dyn Fn(u32) -> (u32, String),
    ) -> Result<usize> {
        let Some(counts) = tracer.call_counts() else {
            bail!("the programs were loaded without call counters");
        };
        let slots = counts.slots();
        let mut by_function: BTreeMap<u32, Vec<Probe>> = BTreeMap::new();
        let mut rest = Vec::new();
        for probe in &plan.probes {
            match SledKind::from_u8(probe.cookie.kind) {
                Some(
                    SledKind::Entry | SledKind::LogArgsEntry | SledKind::Exit | SledKind::Tail,
                ) => by_function
                    .entry(probe.cookie.function_id)
                    .or_default()
                    .push(*probe),
                _ => rest.push(*probe),
            }
        }
        // A link (one descriptor) per function's sled probes, and one per return probe.
        crate::kernel::rlimit::reserve_open_files(2 * by_function.len() + 1)?;
        let mut placed = 0;
        let before = (self.functions.len(), self.unbudgeted);
        for (function_id, mut probes) in by_function {
            let next = self.functions.len() + 1;
            if next >= slots as usize {
                rest.extend(probes);
                self.unbudgeted += 1;
                continue;
            }
            let slot = next as u16;
            for p in &mut probes {
                p.cookie = p.cookie.with_call_slot(slot);
            }
            let (n, set) = match tracer.attach_probes(&plan.binary, &probes, scope) {
                Ok(placed) => placed,
                Err(err) => {
                    self.undo(tracer, before);
                    return Err(err);
                }
            };
            placed += n;
            let hooks = probes.iter().any(|p| p.cookie.return_probed());
            let exit = if hooks { "return" } else { "sleds" };
            let count = counts_of(tracer, slot);
            self.controller
                .add(self.costs.per_call_ns(exit), count, hooks);
            let (function_id, name) = id_of(function_id);
            self.functions.push(Function {
                binary: plan.binary.clone(),
                scope,
                function_id,
                name,
                slot,
                probes,
                placed: Some(set),
            });
        }
        if !rest.is_empty() {
            match tracer.attach_probes(&plan.binary, &rest, scope) {
                Ok((n, set)) => {
                    placed += n;
                    self.rest.push(set);
                }
                Err(err) => {
                    self.undo(tracer, before);
                    return Err(err);
                }
            }
        }
        Ok(placed)
    }

    /// Removes the functions placed since there were `before` (budgeted, unbudgeted), with
    /// their entries in the controller: an attach that failed part way leaves nothing.
    fn undo(&mut self, tracer: &mut Tracer, (functions, unbudgeted): (usize, usize)) {
        for f in self.functions.drain(functions..) {
            if let Some(set) = f.placed {
                tracer.detach(set);
            }
        }
        self.controller.truncate(functions);
        self.unbudgeted = unbudgeted;
    }

    /// One period's look: measures, decides, and carries the changes out (removals on a
    /// thread of their own). Returns the estimate and the changes, described.
    pub fn tick(&mut self, tracer: &mut Tracer, sample: &Sample) -> (Estimate, Vec<BudgetChange>) {
        let slots: Vec<u16> = self.functions.iter().map(|f| f.slot).collect();
        let removing = self.removing.load(std::sync::atomic::Ordering::Acquire) > 0;
        let decide = !removing && !self.settling;
        self.settling = removing;
        let (estimate, changes) =
            self.controller
                .observe(sample, |i| counts_of(tracer, slots[i]), decide);
        self.last = estimate;
        if estimate.overhead.is_finite() {
            self.peak = self.peak.max(estimate.overhead);
        }
        let mut removed = Vec::new();
        let mut described = Vec::new();
        for change in changes {
            if let Some(d) = self.carry_out(tracer, &change, sample.now_ns, &mut removed) {
                described.push(d);
            }
        }
        if !removed.is_empty() {
            remove_on_a_thread(tracer, removed, self.removing.clone());
            self.settling = true;
        }
        self.changes.extend(described.iter().cloned());
        (estimate, described)
    }

    fn carry_out(
        &mut self,
        tracer: &mut Tracer,
        change: &Change,
        now_ns: u64,
        removed: &mut Vec<Attachment>,
    ) -> Option<BudgetChange> {
        let f = &mut self.functions[change.function];
        if change.dropped {
            removed.push(f.placed.take()?);
        } else {
            match tracer.attach_probes(&f.binary, &f.probes, f.scope) {
                Ok((_, set)) => f.placed = Some(set),
                Err(err) => {
                    errln!(
                        "fdr-profiled: warning: budget: {} stays dropped: {err:#}",
                        f.name
                    );
                    return None;
                }
            }
        }
        Some(BudgetChange {
            at_seconds: now_ns.saturating_sub(self.started_ns) as f64 / 1e9,
            at_ns: now_ns,
            function_id: f.function_id,
            function: f.name.clone(),
            action: if change.dropped {
                "dropped"
            } else {
                "readmitted"
            }
            .into(),
            calls_per_second: change.calls_per_second,
            overhead_percent: finite(change.overhead) * 100.0,
        })
    }

    /// Every probe placed, to remove them all (a service target removed); the budget has no
    /// function placed after.
    pub fn take_sets(&mut self) -> Vec<Attachment> {
        let mut sets: Vec<Attachment> = self
            .functions
            .iter_mut()
            .filter_map(|f| f.placed.take())
            .collect();
        sets.append(&mut self.rest);
        sets
    }

    /// The functions dropped now, by name.
    pub fn dropped_now(&self) -> Vec<String> {
        (0..self.functions.len())
            .filter(|&i| self.controller.is_dropped(i))
            .map(|i| self.functions[i].name.clone())
            .collect()
    }

    /// The last period's estimate.
    pub fn last(&self) -> Estimate {
        self.last
    }

    /// What the budget did, for the session's report.
    pub fn report(&self) -> BudgetReport {
        BudgetReport {
            max_overhead_percent: self.controller.limit() * 100.0,
            functions: self.functions.len(),
            functions_unbudgeted: self.unbudgeted,
            changes: self.changes.clone(),
            dropped_at_end: self.dropped_now(),
            peak_overhead_percent: self.peak * 100.0,
            last_overhead_percent: finite(self.last.overhead) * 100.0,
        }
    }
}

fn counts_of(tracer: &Tracer, slot: u16) -> u64 {
    tracer.call_counts().map_or(0, |c| c.total(slot))
}

/// A huge overhead (probes costing more than the threads' whole time) as 1000x: JSON has no
/// infinity.
fn finite(overhead: f64) -> f64 {
    if overhead.is_finite() {
        overhead
    } else {
        1000.0
    }
}

/// Removes `sets` without waiting: the kernel takes a grace period per link, which the
/// event loop must not wait for. The links close together, on threads of their own.
/// `removing` counts the removals under way.
fn remove_on_a_thread(
    tracer: &mut Tracer,
    sets: Vec<Attachment>,
    removing: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::Ordering;
    let links: Vec<_> = sets
        .into_iter()
        .flat_map(|set| tracer.detach_later(set))
        .collect();
    removing.fetch_add(1, Ordering::AcqRel);
    let done = removing.clone();
    let spawned = std::thread::Builder::new()
        .name("budget-remove".into())
        .spawn(move || {
            std::thread::scope(|s| {
                let mut links = links;
                let per = links.len().div_ceil(8).max(1);
                while !links.is_empty() {
                    let part: Vec<_> = links.drain(..per.min(links.len())).collect();
                    s.spawn(move || drop(part));
                }
            });
            done.fetch_sub(1, Ordering::AcqRel);
        });
    if let Err(err) = spawned {
        // The links went with the closure, closed here.
        removing.fetch_sub(1, Ordering::AcqRel);
        errln!("fdr-profiled: warning: budget: removing probes: {err}");
    }
}
