//! The objects a session probes, once planned (`plan::objects`): their probes placed and the
//! session told, and, for a single traced process, the objects it maps later (`dlopen`),
//! found by rescanning its mappings while recording.
use crate::budget::probes::BudgetedProbes;
use crate::kernel::bpf::{Attachment, Scope, Tracer};
use crate::plan::discovery::Discovery;
use crate::plan::exits::ExitPolicy;
use crate::plan::objects::warn_all;
use crate::plan::select::FunctionFilter;
use crate::plan::AttachPlan;
use crate::session::Session;
use anyhow::Result;

/// The return probes of an object, kept so that its exits can be observed by its exit sleds
/// instead (see `record::exit_sleds_instead`).
pub struct ReturnProbes {
    pub plan: AttachPlan,
    pub links: Attachment,
}

/// How an object's probes are placed.
pub enum Placing<'a> {
    /// All together, in the tracer's set.
    Together,
    /// All together, the return probes kept apart, there.
    KeepingReturns(&'a mut Vec<ReturnProbes>),
    /// One set per function, under the budget (`--max-overhead`).
    Budgeted(&'a mut BudgetedProbes),
}

impl Placing<'_> {
    /// The placing for `keep` (the return probes) or `budget`, the budget first.
    pub fn of<'a>(
        keep: Option<&'a mut Vec<ReturnProbes>>,
        budget: Option<&'a mut BudgetedProbes>,
    ) -> Placing<'a> {
        match (budget, keep) {
            (Some(budget), _) => Placing::Budgeted(budget),
            (None, Some(kept)) => Placing::KeepingReturns(kept),
            (None, None) => Placing::Together,
        }
    }

    fn reborrow(&mut self) -> Placing<'_> {
        match self {
            Placing::Together => Placing::Together,
            Placing::KeepingReturns(kept) => Placing::KeepingReturns(kept),
            Placing::Budgeted(budget) => Placing::Budgeted(budget),
        }
    }
}

/// Decides how `plan`'s functions' exits are observed, places its probes as `placing` says,
/// says so, and adds the object to the session.
pub fn attach(
    tracer: &mut Tracer,
    session: &mut Session,
    mut plan: AttachPlan,
    policy: ExitPolicy,
    scope: Scope,
    placing: Placing<'_>,
) -> Result<usize> {
    crate::plan::exits::decide(&mut plan, policy);
    let placed = match placing {
        Placing::Budgeted(budget) => {
            budget.attach(tracer, &plan, scope, &|id| (id, plan.names.name(id)))?
        }
        Placing::KeepingReturns(kept) => {
            let (placed, links) = tracer.attach_keeping_returns(&plan, scope)?;
            kept.push(ReturnProbes {
                plan: plan.clone(),
                links,
            });
            placed
        }
        Placing::Together => tracer.attach(&plan, scope)?,
    };
    let attached_ns = crate::session::monotonic_ns();
    let object = if plan.object_id == 0 {
        String::new()
    } else {
        format!(" (object {})", plan.object_id)
    };
    errln!(
        "fdr-profiled: attached {placed} probes to {} functions in {}{object}",
        plan.functions,
        plan.display_path
    );
    session.add_object(plan, placed, attached_ns);
    Ok(placed)
}

/// The instrumented objects the process mapped since the last look, each with the functions
/// `filter` keeps (objects left with none are left out); where the others are is noted in
/// `session`. A process that is gone has nothing more to map: none then.
pub fn found(
    discovery: &mut Discovery,
    filter: &FunctionFilter,
    session: &mut Session,
) -> Vec<AttachPlan> {
    let Ok(found) = discovery.scan() else {
        return Vec::new();
    };
    warn_all(&found);
    for &(object_id, load_address) in &found.located {
        session.locate_object(object_id, load_address);
    }
    found
        .plans
        .into_iter()
        .filter_map(|mut plan| (filter.retain(&mut plan) > 0).then_some(plan))
        .collect()
}

/// Looks for objects the process mapped since the last look and probes the instrumented
/// ones. A process that is gone has nothing more to map: errors reading it are not reported
/// (its exit ends the session).
pub fn rescan(
    discovery: &mut Discovery,
    filter: &FunctionFilter,
    policy: ExitPolicy,
    tracer: &mut Tracer,
    session: &mut Session,
    scope: Scope,
    mut placing: Placing<'_>,
) {
    for plan in found(discovery, filter, session) {
        let path = plan.display_path.clone();
        if let Err(err) = attach(tracer, session, plan, policy, scope, placing.reborrow()) {
            errln!("fdr-profiled: warning: {path}: not traced: {err:#}");
        }
    }
}
