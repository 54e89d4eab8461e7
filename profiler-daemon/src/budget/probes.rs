//! The probes under a budget: each function's probes placed as a set of their own (see
//! `Tracer::attach_probes`), its calls counted in a slot of the kernel's counters, so that
//! [`BudgetedProbes::tick`] can remove the hottest and place them again later.
use super::{Change, Controller, Counts, Estimate, Sample};
use crate::kernel::bpf::{Attachment, Scope, Tracer};
use crate::plan::{AttachPlan, Probe};
use crate::traced::mappings::FileId;
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
    /// Each return-probed function by its file and entry's offset (where its return probe
    /// is, which the kernel names a hooked frame by): the repair's stops are charged to it.
    by_entry: std::collections::HashMap<(FileId, u64), usize>,
    /// Probes not of one function (event sleds), and unbudgeted functions' probes.
    rest: Vec<Attachment>,
    changes: Vec<BudgetChange>,
    started_ns: u64,
    peak: f64,
    last: Estimate,
    /// Removals still under way (each on a thread of its own), since when, and whether the
    /// last period had one: no decision until a whole period without (see
    /// [`Controller::observe`]), or [`REMOVAL_WAIT_NS`] at most.
    removing: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    removing_since_ns: Option<u64>,
    settling: bool,
}

/// How long at most the budget waits for removals to end before it decides again. Closing a
/// `uprobe_multi` link takes its breakpoints out first, then waits for the kernel's
/// return-probe grace period (`synchronize_srcu`), which on Linux 6.12+ lasts until every
/// frame hooked before it returns or its lease expires; the lease timer (100 ms) starts again
/// at each new hooked frame of the thread, so a busy thread with a long-lived hooked frame (a
/// server's loop) holds every link's close for as long as it runs. The probes are gone long
/// before: what is measured after this wait is what is traced.
pub const REMOVAL_WAIT_NS: u64 = 3_000_000_000;

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
            by_entry: std::collections::HashMap::new(),
            rest: Vec::new(),
            changes: Vec::new(),
            started_ns,
            peak: 0.0,
            last: Estimate::default(),
            removing: std::sync::Arc::default(),
            removing_since_ns: None,
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
        let file = crate::traced::mappings::file_id(&plan.binary);
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
            // Its return probe: at its entry (see `Tracer::attach_probes`).
            let hooked_at = probes.iter().find(|p| p.carries_return_probe());
            let exit = if hooked_at.is_some() {
                "return"
            } else {
                "sleds"
            };
            if let (Some(file), Some(p)) = (file, hooked_at) {
                self.by_entry
                    .insert((file, p.file_offset), self.functions.len());
            }
            let calls = counts_of(tracer, slot);
            self.controller.add(
                self.costs.per_call_ns(exit),
                Counts {
                    calls,
                    stopped_ns: 0,
                },
            );
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
        self.by_entry.retain(|_, i| *i < functions);
        self.unbudgeted = unbudgeted;
    }

    /// Whether function `index` is dropped now.
    pub fn is_dropped(&self, index: usize) -> bool {
        self.controller.is_dropped(index)
    }

    /// The function whose return probe is at `offset` of `file`, if it is budgeted.
    pub fn hooked_at(&self, file: FileId, offset: u64) -> Option<usize> {
        self.by_entry.get(&(file, offset)).copied()
    }

    /// One period's look: measures, decides, and carries the changes out (removals on a
    /// thread of their own). Returns the estimate and the changes, described. `stopped_ns`:
    /// each function's share so far of the time threads were stopped for the repair.
    pub fn tick(
        &mut self,
        tracer: &mut Tracer,
        sample: &Sample,
        stopped_ns: &[u64],
    ) -> (Estimate, Vec<BudgetChange>) {
        let slots: Vec<u16> = self.functions.iter().map(|f| f.slot).collect();
        let under_way = self.removing.load(std::sync::atomic::Ordering::Acquire) > 0;
        if !under_way {
            self.removing_since_ns = None;
        }
        let removing = self
            .removing_since_ns
            .is_some_and(|since| sample.now_ns.saturating_sub(since) < REMOVAL_WAIT_NS);
        let decide = !removing && !self.settling;
        self.settling = removing;
        let counts = |i: usize| Counts {
            calls: counts_of(tracer, slots[i]),
            stopped_ns: stopped_ns.get(i).copied().unwrap_or(0),
        };
        let (estimate, changes) = self.controller.observe(sample, counts, decide);
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
            self.removing_since_ns = Some(sample.now_ns);
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
///
/// Together, not the sleds' before the return probes': a link's close waits for a grace
/// period that a frame hooked for the whole run can hold up, and closing the sleds' link
/// first kept a dropped function's return probe firing for the rest of a 14 s run (seen
/// here). Either probe may go first: a return probe left without its entry's makes no event
/// (the programs see its frame is not the thread's top pending one), and an entry left
/// without its return probe is closed at the next event that proves its frame gone.
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
