//! The engines of one traced executable: a keeper for each process that runs it. Those
//! running when tracing begins are patched where they are; each that starts later is held
//! from its exec by the exec holder (`repair::hold`, as `--exits repair` holds them), taken
//! by a keeper of its own, run to its entry point and patched there, none of its code run.
//! `--attach` and a service target with `engine = "inline"` both trace this way; a recording
//! of one process (`--pid`, a launched command) has one engine and no holder.
use super::buffers::TscClock;
use super::{Engine, Target};
use crate::kernel::bpf::Tracer;
use crate::kernel::intake::{Event, DRAIN_BUDGET};
use crate::plan::AttachPlan;
use crate::repair::hold::ExecHold;
use crate::session::order::Gap;
use crate::session::pipeline::{EventPipeline, Sink};
use anyhow::{Context as _, Result};
use std::path::Path;
use std::sync::Arc;

/// The engines of the processes traced, one each.
pub struct Processes {
    engines: Vec<Engine>,
    /// The executable's processes that start: held from their exec until an engine has them.
    starting: Option<Starting>,
    /// The clock of the first engine, shared by the others (one clock for every process;
    /// measuring takes 20 ms).
    clock: Option<TscClock>,
    /// Processes that could not be patched (not traced).
    not_traced: u64,
    /// Processes that started, patched only once past their entry point.
    past_entry: u64,
}

/// The processes that exec the executable, held until an engine has them.
struct Starting {
    hold: Arc<ExecHold>,
    tag: u32,
    plans: Vec<AttachPlan>,
    ring_bytes: u64,
}

/// What happened to a process, for the caller to say in its log.
pub enum Seen {
    /// Patched: `sleds` of them, `skipped` left as they were; `past_entry`: a process that
    /// started, taken only once past its entry point (the exec holder let it go and it ran on
    /// before its keeper could seize it, on a loaded host): its first calls are not recorded.
    Patched {
        pid: u32,
        sleds: usize,
        skipped: usize,
        past_entry: bool,
    },
    /// Could not be taken at its entry point; patched where it was found instead.
    Late { pid: u32 },
    /// Not traced, and why.
    NotTraced { pid: u32, why: anyhow::Error },
}

impl Seen {
    /// One line of it.
    pub fn line(&self) -> String {
        match self {
            Seen::Patched {
                pid,
                sleds,
                skipped,
                past_entry,
            } => format!(
                "inline engine: {sleds} sleds patched in process {pid}{}; its keeper puts them back at the end{}",
                match skipped {
                    0 => String::new(),
                    n => format!(" ({n} left as they were: not as the compiler leaves them, or no room for the handler within reach)"),
                },
                if *past_entry {
                    "; taken past its entry point (it ran on between its exec holder and its keeper): its first calls are not recorded"
                } else {
                    ""
                }
            ),
            Seen::Late { pid } => {
                format!("process {pid} traced from where it was found, not from its entry point")
            }
            Seen::NotTraced { pid, why } => format!("process {pid} not traced: {why:#}"),
        }
    }
}

impl Processes {
    /// No process yet.
    pub fn new() -> Processes {
        Processes {
            engines: Vec::new(),
            starting: None,
            clock: None,
            not_traced: 0,
            past_entry: 0,
        }
    }

    /// Every process running `executable` now patched where it is (one that cannot be is
    /// said and left as it is), and from now on each that starts running it held from its
    /// exec, with `tag` its name to the exec holder (no probe at the entry point, as repair
    /// places: the keeper puts a breakpoint of its own there).
    pub fn of_executable(
        tracer: &mut Tracer,
        executable: &Path,
        plans: Vec<AttachPlan>,
        ring_bytes: u64,
        tag: u32,
        said: &mut dyn FnMut(Seen),
    ) -> Result<Processes> {
        let hold = crate::repair::hold::shared(tracer, executable, tag)
            .context("holding the processes that start")?;
        let mut processes = Processes::new();
        let running = crate::traced::mappings::file_id(executable)
            .map(crate::traced::process::running)
            .unwrap_or_default();
        for pid in running {
            let seen = match processes.add(Target::Running(pid), &plans, ring_bytes, || {}) {
                Ok(seen) => seen,
                Err(why) => {
                    processes.not_traced += 1;
                    Seen::NotTraced { pid, why }
                }
            };
            said(seen);
        }
        processes.starting = Some(Starting {
            hold,
            tag,
            plans,
            ring_bytes,
        });
        Ok(processes)
    }

    /// Starts an engine for `target` (see [`Engine::start`]); a held process goes from its
    /// entry point once its memory is mapped here.
    pub fn add(
        &mut self,
        target: Target,
        plans: &[AttachPlan],
        ring_bytes: u64,
        let_go: impl FnOnce(),
    ) -> Result<Seen> {
        let pid = target.pid();
        let mut engine = Engine::start(target, plans, ring_bytes, self.clock, let_go)?;
        if let Target::Held(..) = target {
            engine.go()?;
        }
        self.clock.get_or_insert(engine.clock());
        let patched = engine.patched();
        let seen = Seen::Patched {
            pid,
            sleds: patched.sleds,
            skipped: patched.skipped,
            past_entry: patched.past_entry,
        };
        self.past_entry += u64::from(patched.past_entry);
        self.engines.push(engine);
        Ok(seen)
    }

    /// Patches the processes held since the last call, each said.
    pub fn take_held(&mut self, said: &mut dyn FnMut(Seen)) {
        let Some(starting) = &self.starting else {
            return;
        };
        let hold = starting.hold.clone();
        let held = hold.held(starting.tag);
        if held.is_empty() {
            // Called every 10 ms: the plans are copied only when a process is there to patch.
            return;
        }
        let (plans, ring_bytes) = (starting.plans.clone(), starting.ring_bytes);
        for (pid, _) in held {
            let target = Target::Held(pid, hold.handover_fd());
            let seen = match self.add(target, &plans, ring_bytes, || hold.let_go(pid)) {
                Ok(seen) => seen,
                Err(err) => {
                    // Let go if the keeper never asked; then patched where it is, if it can be.
                    hold.let_go(pid);
                    let late = match super::keeper::gone(pid) {
                        true => Err(err),
                        false => self
                            .add(Target::Running(pid), &plans, ring_bytes, || {})
                            .map_err(|again| err.context(again)),
                    };
                    match late {
                        Ok(patched) => {
                            said(patched);
                            self.past_entry += 1;
                            Seen::Late { pid }
                        }
                        Err(why) => {
                            self.not_traced += 1;
                            Seen::NotTraced { pid, why }
                        }
                    }
                }
            };
            said(seen);
        }
    }

    /// The engines, one per process traced.
    pub fn engines_mut(&mut self) -> &mut [Engine] {
        &mut self.engines
    }

    /// Hands the events every engine's handlers wrote since the last drain to `events` (the
    /// calling thread's share down `local`), and ends the threads found gone; returns the
    /// engines of the processes that exited, taken out, for the caller to finish.
    pub fn drain<S: Sink>(
        &mut self,
        events: &mut EventPipeline<S>,
        local: &mut impl FnMut(&mut Event, Option<Gap>),
    ) -> Vec<Engine> {
        for engine in &mut self.engines {
            events.deliver_from(local, |sink| engine.drain(sink));
            let ended = engine.take_ended();
            if !ended.is_empty() {
                events.end_exited(ended, DRAIN_BUDGET, local);
            }
        }
        self.take_gone()
    }

    /// The engine of the one process traced, when processes that start are not traced too
    /// (`--pid`, a launched command).
    pub fn only_mut(&mut self) -> Option<&mut Engine> {
        match (&self.starting, &mut self.engines[..]) {
            (None, [engine]) => Some(engine),
            _ => None,
        }
    }

    /// The processes traced now.
    pub fn pids(&self) -> Vec<u32> {
        self.engines.iter().map(Engine::pid).collect()
    }

    /// The engines of the processes that exited, taken out (to be finished), when processes
    /// come and go (the executable's processes that start are traced).
    fn take_gone(&mut self) -> Vec<Engine> {
        if self.starting.is_none() {
            return Vec::new();
        }
        let (gone, live) = std::mem::take(&mut self.engines)
            .into_iter()
            .partition(Engine::process_gone);
        self.engines = live;
        gone
    }

    /// Processes that could not be patched.
    pub fn not_traced(&self) -> u64 {
        self.not_traced
    }

    /// Processes that started, patched only once past their entry point (or, when their
    /// keeper could not take them, where they were found).
    pub fn past_entry(&self) -> u64 {
        self.past_entry
    }

    /// The end: the engines, to be finished, and no process held for them any more.
    pub fn into_engines(self) -> Vec<Engine> {
        if let Some(starting) = &self.starting {
            starting.hold.unwatch(starting.tag);
        }
        self.engines
    }
}

impl Default for Processes {
    fn default() -> Self {
        Processes::new()
    }
}
