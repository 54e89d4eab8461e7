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
    function_id: u32,
    name: String,
    slot: u16,
    probes: Vec<Probe>,
    /// Its probes while they are placed: a set per scope.
    placed: Vec<(Scope, Attachment)>,
}

/// What one [`BudgetedProbes::attach`] did so far, to undo it.
struct Attempt {
    /// Functions before it.
    functions: usize,
    /// The functions it placed a set of.
    placed_in: Vec<usize>,
    /// Probes it placed.
    probes: usize,
}

/// Every budgeted function of a session (or of a service target), and what the budget did.
pub struct BudgetedProbes {
    controller: Controller,
    functions: Vec<Function>,
    costs: ProbeCosts,
    /// Every function seen, by its binary and the function id in its probes' cookies: its
    /// index, or `None` for one placed without the budget (no slot left).
    known: std::collections::HashMap<(PathBuf, u32), Option<usize>>,
    /// The scopes placed (the budget's probes are placed again in each at a re-admission).
    scopes: Vec<Scope>,
    /// Each return-probed function by its file and entry's offset (where its return probe
    /// is, which the kernel names a hooked frame by): the repair's stops are charged to it.
    by_entry: std::collections::HashMap<(FileId, u64), usize>,
    /// Probes not of one function (event sleds), and unbudgeted functions' probes, by scope.
    rest: Vec<(Scope, Attachment)>,
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
            known: std::collections::HashMap::new(),
            scopes: Vec::new(),
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

    /// Places `plan`'s probes (its exits decided, see `plan::exits::decide`) for `scope`, one
    /// set per function; `id_of` gives, for the function id in the probes' cookies, the id its
    /// events have in a session and its name. Returns how many probes were placed. What fails
    /// to be placed is removed again and is the error.
    ///
    /// Called again for another scope (a process of its own, see `repair::processes`), the
    /// same functions are placed there too, but those dropped now: each function's probes
    /// are one set per scope, dropped and re-admitted in all of them together.
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
        let mut attempt = Attempt {
            functions: self.functions.len(),
            placed_in: Vec::new(),
            probes: 0,
        };
        let file = crate::traced::mappings::file_id(&plan.binary);
        for (function_id, mut probes) in by_function {
            let key = (plan.binary.clone(), function_id);
            let index = match self.known.get(&key) {
                Some(&known) => known,
                None => {
                    let next = self.functions.len() + 1;
                    let index = (next < slots as usize).then(|| {
                        self.add_function(tracer, plan, file, next as u16, &probes, id_of)
                    });
                    self.known.insert(key, index);
                    index
                }
            };
            let Some(index) = index else {
                rest.extend(probes);
                continue;
            };
            if self.controller.is_dropped(index) {
                continue;
            }
            let slot = self.functions[index].slot;
            for p in &mut probes {
                p.cookie = p.cookie.with_call_slot(slot);
            }
            match tracer.attach_probes(&plan.binary, &probes, scope) {
                Ok((n, set)) => {
                    attempt.probes += n;
                    self.functions[index].placed.push((scope, set));
                    attempt.placed_in.push(index);
                }
                Err(err) => {
                    self.undo(tracer, attempt);
                    return Err(err);
                }
            }
        }
        if !rest.is_empty() {
            match tracer.attach_probes(&plan.binary, &rest, scope) {
                Ok((n, set)) => {
                    attempt.probes += n;
                    self.rest.push((scope, set));
                }
                Err(err) => {
                    self.undo(tracer, attempt);
                    return Err(err);
                }
            }
        }
        if !self.scopes.contains(&scope) {
            self.scopes.push(scope);
        }
        Ok(attempt.probes)
    }

    /// Adds a function to the budget, counted in `slot`; returns its index.
    fn add_function(
        &mut self,
        tracer: &Tracer,
        plan: &AttachPlan,
        file: Option<FileId>,
        slot: u16,
        probes: &[Probe],
        id_of: &dyn Fn(u32) -> (u32, String),
    ) -> usize {
        let index = self.functions.len();
        // Its return probe: at its entry (see `Tracer::attach_probes`).
        let hooked_at = probes.iter().find(|p| {
            p.cookie.return_probed()
                && SledKind::from_u8(p.cookie.kind).is_some_and(SledKind::is_entry)
        });
        let exit = if hooked_at.is_some() {
            "return"
        } else {
            "sleds"
        };
        if let (Some(file), Some(p)) = (file, hooked_at) {
            self.by_entry.insert((file, p.file_offset), index);
        }
        let calls = counts_of(tracer, slot);
        self.controller.add(
            self.costs.per_call_ns(exit),
            Counts {
                calls,
                stopped_ns: 0,
            },
        );
        let (function_id, name) = id_of(probes[0].cookie.function_id);
        self.functions.push(Function {
            binary: plan.binary.clone(),
            function_id,
            name,
            slot,
            probes: probes.to_vec(),
            placed: Vec::new(),
        });
        index
    }

    /// Removes what the `attempt` placed, and the functions it added with their entries in
    /// the controller: an attach that failed part way leaves nothing.
    fn undo(&mut self, tracer: &mut Tracer, attempt: Attempt) {
        for index in attempt.placed_in {
            if let Some((_, set)) = self.functions[index].placed.pop() {
                tracer.detach(set);
            }
        }
        self.functions.truncate(attempt.functions);
        self.controller.truncate(attempt.functions);
        self.by_entry.retain(|_, i| *i < attempt.functions);
        self.known
            .retain(|_, i| i.is_none_or(|i| i < attempt.functions));
    }

    /// Forgets `scope` (a process gone, or let go): its probes, to remove.
    pub fn forget_scope(&mut self, scope: Scope) -> Vec<Attachment> {
        self.scopes.retain(|s| *s != scope);
        let mut sets = Vec::new();
        for f in &mut self.functions {
            let (theirs, kept): (Vec<_>, Vec<_>) =
                f.placed.drain(..).partition(|(s, _)| *s == scope);
            f.placed = kept;
            sets.extend(theirs.into_iter().map(|(_, set)| set));
        }
        let (theirs, kept): (Vec<_>, Vec<_>) = self.rest.drain(..).partition(|(s, _)| *s == scope);
        self.rest = kept;
        sets.extend(theirs.into_iter().map(|(_, set)| set));
        sets
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
            removed.extend(f.placed.drain(..).map(|(_, set)| set));
        } else {
            for &scope in &self.scopes {
                match tracer.attach_probes(&f.binary, &f.probes, scope) {
                    Ok((_, set)) => f.placed.push((scope, set)),
                    // A process that ended meanwhile: forgotten at its end.
                    Err(err) if self.scopes.len() > 1 => {
                        tracing::debug!("budget: {} not placed again in {scope:?}: {err:#}", f.name)
                    }
                    Err(err) => {
                        errln!(
                            "fdr-profiled: warning: budget: {} stays dropped: {err:#}",
                            f.name
                        );
                        return None;
                    }
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
        self.scopes.clear();
        let mut sets: Vec<Attachment> = self
            .functions
            .iter_mut()
            .flat_map(|f| f.placed.drain(..).map(|(_, set)| set))
            .collect();
        sets.extend(self.rest.drain(..).map(|(_, set)| set));
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
            functions_unbudgeted: self.known.values().filter(|i| i.is_none()).count(),
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
