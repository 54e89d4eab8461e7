//! `--engine inline` in a recording: the process's sleds patched by the inline engine's keeper
//! instead of probed, its shared memory drained into the session's pipeline with the kernel's
//! rings (which then hold nothing of it), and every sled put back at the end.
use super::args::RecordArgs;
use crate::inline::{Engine, Target};
use crate::kernel::intake::DRAIN_BUDGET;
use crate::plan::discovery::Discovery;
use crate::plan::exits::{ExitMode, ExitPolicy, ExitsChoice};
use crate::plan::select::FunctionFilter;
use crate::plan::AttachPlan;
use crate::session::pipeline::{locked, EventPipeline, Sink};
use crate::session::Session;
use anyhow::{bail, Result};
use profiler_common::ThreadState;
use std::sync::Mutex;

/// How often the handler's rings are drained: it writes without waking fdr-profiled, and a
/// thread calling flat out fills its ring (8 MiB by default: 262,144 hits) in about 40 ms.
pub const DRAIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

/// Why `cli` cannot run the inline engine, if it cannot.
pub fn refused(cli: &RecordArgs) -> Result<()> {
    if cli.attach.is_some() {
        bail!("--engine inline: only with --pid or -- COMMAND for now (not --attach)");
    }
    if cli.max_overhead.is_some() {
        bail!("--engine inline: --max-overhead budgets uprobes; not with the inline engine");
    }
    if cli.follow_forks {
        bail!("--engine inline: not with --follow-forks yet");
    }
    if !matches!(cli.exits, ExitMode::Auto | ExitMode::Sleds) {
        bail!(
            "--engine inline: every exit is observed at its patched sled; --exits does not apply"
        );
    }
    if cli.floor {
        bail!("--engine inline: --floor measures uprobes; not with the inline engine");
    }
    Ok(())
}

/// How exits are observed: at their patched sleds.
pub fn exits(image: &[std::path::PathBuf]) -> (ExitPolicy, ExitsChoice) {
    let (policy, mut choice) = crate::plan::exits::choose(ExitMode::Sleds, image);
    choice.reason = "--engine inline: a patched exit sled costs what an entry does".into();
    (policy, choice)
}

/// Patches `target`'s sleds of `plans` (a launched command at its entry point: its keeper
/// lets it go) and adds the objects to the session.
pub fn start(
    target: &mut super::target::Target,
    plans: Vec<AttachPlan>,
    ring_bytes: u64,
    session: &mut Session,
) -> Result<Engine> {
    let target = match target {
        super::target::Target::Pid(pid, ..) => Target::Running(*pid),
        super::target::Target::Launch(child, _) => {
            // The keeper lets it go, whatever happens next (an error kills it).
            child.let_go_elsewhere();
            Target::Launched(child.pid(), child.go_fd())
        }
        super::target::Target::Attach => bail!("--engine inline: not with --attach"),
    };
    let pid = target.pid();
    let engine = Engine::start(target, &plans, ring_bytes)?;
    let patched = engine.patched();
    let attached_ns = crate::session::monotonic_ns();
    errln!(
        "fdr-profiled: inline engine: {} sleds patched in process {pid}{}; its keeper puts them back at the end",
        patched.sleds,
        match patched.skipped {
            0 => String::new(),
            n => format!(" ({n} left as they were: not as the compiler leaves them, or no room for the handler within reach)"),
        }
    );
    for plan in plans {
        let sleds = plan.probes.len();
        session.add_object(plan, sleds, attached_ns);
    }
    Ok(engine)
}

/// Patches the instrumented objects the process mapped since the last look (`dlopen`).
pub fn rescan(
    discovery: &mut Discovery,
    filter: &FunctionFilter,
    engine: &mut Engine,
    session: &mut Session,
) {
    for plan in super::objects::found(discovery, filter, session) {
        match engine.patch_more(std::slice::from_ref(&plan)) {
            Ok((sleds, skipped)) => {
                errln!(
                    "fdr-profiled: inline engine: {sleds} sleds patched in {} (object {}){}",
                    plan.display_path,
                    plan.object_id,
                    match skipped {
                        0 => String::new(),
                        n => format!(" ({n} left as they were)"),
                    }
                );
                session.add_object(plan, sleds, crate::session::monotonic_ns());
            }
            Err(err) => errln!(
                "fdr-profiled: warning: {}: not traced: {err:#}",
                plan.display_path
            ),
        }
    }
}

/// Hands the events the handler wrote since the last drain to the pipeline, and ends the
/// threads found gone.
pub fn drain<S: Sink>(engine: &mut Engine, events: &mut EventPipeline<S>, own: &Mutex<S>) {
    let mut local = locked(own);
    events.deliver_from(&mut local, |sink| engine.drain(sink));
    let ended = engine.take_ended();
    if !ended.is_empty() {
        events.end_exited(ended, DRAIN_BUDGET, &mut local);
    }
}

/// The end: every sled put back, the last events drained; the books of the threads still
/// open, for the pipeline's end.
pub fn finish<S: Sink>(
    engine: Engine,
    events: &mut EventPipeline<S>,
    own: &Mutex<S>,
    session: &mut Session,
) -> Vec<(u32, ThreadState)> {
    let mut local = locked(own);
    let (books, report, error) = events.deliver_from(&mut local, |sink| engine.finish(sink));
    if let Some(err) = error {
        errln!("fdr-profiled: warning: {err:#}");
        session.add_note(format!("inline engine: {err:#}"));
    }
    match &report.restored {
        Some(r) if r.gone && r.forked > 0 => errln!(
            "fdr-profiled: inline engine: {} of {} processes it forked put back",
            r.forked_restored,
            r.forked
        ),
        Some(r) if r.gone => {}
        Some(r) => {
            errln!(
                "fdr-profiled: inline engine: {} sleds put back{}{}{}{}",
                r.sleds,
                match r.forked {
                    0 => String::new(),
                    n => format!(" (and in {} of {n} processes it forked)", r.forked_restored),
                },
                match r.changed {
                    0 => String::new(),
                    n => format!(", {n} found changed by something else and left"),
                },
                match r.unmapped_sleds {
                    0 => String::new(),
                    n => format!(", {n} gone with the objects the process unmapped"),
                },
                if r.unmapped {
                    ""
                } else {
                    "; the handler's page is left mapped (a thread's stack still points into it)"
                }
            );
        }
        None => {}
    }
    if report.no_slot > 0 {
        let note = format!(
            "inline engine: {} hits of threads that found no free slot (more than {} threads at once) are not recorded",
            report.no_slot, report.slots
        );
        errln!("fdr-profiled: warning: {note}");
        session.add_note(note);
    }
    books
}
