//! `--engine inline` in a recording: the process's sleds patched by the inline engine's keeper
//! instead of probed, its shared memory drained into the session's pipeline with the kernel's
//! rings (which then hold nothing of it), and every sled put back at the end. Under `--attach`
//! every process running the executable gets an engine (a keeper) of its own: those running
//! at the start where they are, those that start later held from their exec by the same
//! holder as `--exits repair` (`repair::hold`) and patched at their entry point.
use super::args::RecordArgs;
use crate::inline::processes::{Processes, Seen};
use crate::inline::{Engine, Target};
use crate::kernel::bpf::Tracer;
use crate::kernel::intake::Event;
use crate::kernel::intake::DRAIN_BUDGET;
use crate::plan::discovery::Discovery;
use crate::plan::exits::{ExitMode, ExitPolicy, ExitsChoice};
use crate::plan::select::FunctionFilter;
use crate::plan::AttachPlan;
use crate::session::order::Gap;
use crate::session::pipeline::{locked, EventPipeline, Sink};
use crate::session::Session;
use anyhow::{bail, Context as _, Result};
use profiler_common::ThreadState;
use std::path::Path;
use std::sync::Mutex;

/// How often the handler's rings are drained: it writes without waking fdr-profiled, and a
/// thread calling flat out fills its ring (8 MiB by default: 262,144 hits) in about 40 ms.
pub const DRAIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

/// Why `cli` cannot run the inline engine, if it cannot.
pub fn refused(cli: &RecordArgs) -> Result<()> {
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

/// Under `--attach`, the offsets the programs that hold each new process from its exec need
/// (those of `--exits repair`, which holds them the same way).
pub fn hold_offsets(cli: &RecordArgs) -> Result<Option<crate::kernel::btf::RepairOffsets>> {
    if cli.engine != super::args::Engine::Inline || cli.attach.is_none() {
        return Ok(None);
    }
    crate::kernel::btf::repair_offsets()
        .map(Some)
        .map_err(|e| anyhow::anyhow!("--engine inline --attach: {e}"))
}

/// How exits are observed: at their patched sleds.
pub fn exits(image: &[std::path::PathBuf]) -> (ExitPolicy, ExitsChoice) {
    let (policy, mut choice) = crate::plan::exits::choose(ExitMode::Sleds, image);
    choice.reason = "--engine inline: a patched exit sled costs what an entry does".into();
    (policy, choice)
}

/// The engines of a recording: one per traced process.
pub struct Inline {
    processes: Processes,
}

/// The name the holder knows the executable by (one executable per recording).
const ATTACH_TAG: u32 = 0;

/// Patches `target`'s sleds of `plans` (a launched command at its entry point: its keeper
/// lets it go; under `--attach`, every process running `executable` now, and from now on
/// each that starts running it) and adds the objects to the session.
pub fn start(
    target: &mut super::target::Target,
    tracer: &mut Tracer,
    executable: &Path,
    plans: Vec<AttachPlan>,
    ring_bytes: u64,
    session: &mut Session,
) -> Result<Inline> {
    let processes = match target {
        super::target::Target::Pid(pid, ..) => one(Target::Running(*pid), &plans, ring_bytes)?,
        super::target::Target::Launch(child, _) => {
            // The keeper lets it go, whatever happens next (an error kills it).
            child.let_go_elsewhere();
            one(
                Target::Launched(child.pid(), child.go_fd()),
                &plans,
                ring_bytes,
            )?
        }
        // Under --attach a process that cannot be patched is left as it is.
        super::target::Target::Attach => Processes::of_executable(
            tracer,
            executable,
            plans.clone(),
            ring_bytes,
            ATTACH_TAG,
            &mut say,
        )
        .context("--engine inline --attach")?,
    };
    let attached_ns = crate::session::monotonic_ns();
    for plan in plans {
        let sleds = plan.probes.len();
        session.add_object(plan, sleds, attached_ns);
    }
    Ok(Inline { processes })
}

/// The engine of one process.
fn one(target: Target, plans: &[AttachPlan], ring_bytes: u64) -> Result<Processes> {
    let mut processes = Processes::new();
    say(processes.add(target, plans, ring_bytes, || {})?);
    Ok(processes)
}

/// Says what happened to a process.
fn say(seen: Seen) {
    match seen {
        Seen::Patched {
            past_entry: false, ..
        } => errln!("fdr-profiled: {}", seen.line()),
        _ => errln!("fdr-profiled: warning: {}", seen.line()),
    }
}

impl Inline {
    /// Lets a launched command go from its entry point (see [`Engine::go`]).
    pub fn go(&mut self) -> Result<()> {
        self.processes
            .engines_mut()
            .iter_mut()
            .try_for_each(Engine::go)
    }
}

/// Patches the instrumented objects the process mapped since the last look (`dlopen`).
pub fn rescan(
    discovery: &mut Discovery,
    filter: &FunctionFilter,
    inline: &mut Inline,
    session: &mut Session,
) {
    let Some(engine) = inline.processes.only_mut() else {
        return;
    };
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

/// Hands the events the handlers wrote since the last drain to the pipeline, and ends the
/// threads found gone; under `--attach`, patches the processes that started and ends the
/// engines of those that exited.
pub fn drain<S: Sink>(
    inline: &mut Inline,
    events: &mut EventPipeline<S>,
    own: &Mutex<S>,
    session: &mut Session,
) {
    inline.processes.take_held(&mut say);
    let mut local = locked(own);
    for engine in inline.processes.drain(events, &mut local) {
        let pid = engine.pid();
        let books = finish_engine(engine, events, &mut local, session);
        events.end_exited(books, DRAIN_BUDGET, &mut local);
        errln!("fdr-profiled: inline engine: process {pid} exited");
    }
}

/// The end: every sled put back, the last events drained; the books of the threads still
/// open, for the pipeline's end.
pub fn finish<S: Sink>(
    inline: Inline,
    events: &mut EventPipeline<S>,
    own: &Mutex<S>,
    session: &mut Session,
) -> Vec<(u32, ThreadState)> {
    let mut local = locked(own);
    let mut books = Vec::new();
    let not_traced = inline.processes.not_traced();
    let past_entry = inline.processes.past_entry();
    for engine in inline.processes.into_engines() {
        books.extend(finish_engine(engine, events, &mut local, session));
    }
    if past_entry > 0 {
        let note = format!(
            "inline engine: {past_entry} processes that started running the executable were patched only past their entry point (their first calls are not recorded)"
        );
        errln!("fdr-profiled: warning: {note}");
        session.add_note(note);
    }
    if not_traced > 0 {
        let note = format!(
            "inline engine: {not_traced} processes that ran the executable could not be patched (not traced)"
        );
        errln!("fdr-profiled: warning: {note}");
        session.add_note(note);
    }
    books
}

/// Ends one engine: its process put back (or found gone), its last events delivered.
fn finish_engine<S: Sink>(
    engine: Engine,
    events: &mut EventPipeline<S>,
    local: &mut impl FnMut(&mut Event, Option<Gap>),
    session: &mut Session,
) -> Vec<(u32, ThreadState)> {
    let pid = engine.pid();
    let (books, report, error) = events.deliver_from(local, |sink| engine.finish(sink));
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
                "fdr-profiled: inline engine: {} sleds put back in process {pid}{}{}{}{}",
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
            "inline engine: {} hits of threads of process {pid} that found no free slot (more than {} threads at once) are not recorded",
            report.no_slot, report.slots
        );
        errln!("fdr-profiled: warning: {note}");
        session.add_note(note);
    }
    books
}
