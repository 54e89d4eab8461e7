//! A target with `engine = "inline"`: every process of one of its binaries patched by an
//! inline engine of its own (`crate::inline::processes`: those running when the binary is
//! attached where they are, each that starts held from its exec and patched at its entry
//! point), its shared memory drained with the kernel's rings, down the same route; each
//! process put back as it was when it is let go (the service stops, a reload removes the
//! target). Only the executable's own sleds: the libraries' would need their own probes,
//! whose events could not be put in order with the engine's.
use crate::inline::processes::{Processes, Seen};
use crate::inline::Engine;
use crate::kernel::bpf::Tracer;
use crate::kernel::caps::Cap;
use crate::kernel::intake::Event;
use crate::plan::AttachPlan;
use crate::session::order::Gap;
use crate::session::pipeline::EventPipeline;
use anyhow::Result;
use profiler_common::ThreadState;
use std::path::Path;

/// The patched processes of one binary of a target.
pub struct InlineBinary {
    processes: Processes,
    /// What the log and the status call it (`target NAME (PATH)`).
    name: String,
    /// Processes patched so far, and those that exited since.
    patched: u64,
    exited: u64,
}

/// The route every event takes, and the pipeline that puts each thread's in order.
pub type Route<'a> = dyn FnMut(&mut Event, Option<Gap>) + 'a;

impl InlineBinary {
    /// Patches the processes running `binary` now and, from now on, each that starts running
    /// it (held with `tag`), with rings of `ring_bytes` per thread; `plan` is its tagged plan.
    pub fn start(
        tracer: &mut Tracer,
        name: String,
        binary: &Path,
        plan: AttachPlan,
        tag: u32,
        ring_bytes: u64,
    ) -> Result<InlineBinary> {
        // The keepers trace the processes; the shared memory is mapped here through
        // `/proc/PID/map_files`, which needs CAP_SYS_ADMIN (not in the shipped unit's set).
        crate::kernel::caps::require(&[Cap::SysPtrace, Cap::SysAdmin], "engine = \"inline\"")
            .map_err(|e| {
                anyhow::anyhow!(
                    "{e:#}; under the systemd unit, a drop-in adds them to its CapabilityBoundingSet"
                )
            })?;
        let mut patched = 0;
        let processes =
            Processes::of_executable(tracer, binary, vec![plan], ring_bytes, tag, &mut |seen| {
                said(&name, &seen, &mut patched)
            })?;
        Ok(InlineBinary {
            processes,
            name,
            patched,
            exited: 0,
        })
    }

    /// Patches the processes held since the last call, hands every event written since to
    /// `route` in order, ends the threads found gone, and finishes the engines of the
    /// processes that exited.
    pub fn drain(&mut self, events: &mut EventPipeline, route: &mut Route<'_>) {
        let (name, patched) = (&self.name, &mut self.patched);
        self.processes
            .take_held(&mut |seen| said(name, &seen, patched));
        let mut route = |e: &mut Event, g: Option<Gap>| route(e, g);
        for engine in self.processes.drain(events, &mut route) {
            let pid = engine.pid();
            let books = finish(&self.name, engine, events, &mut route);
            events.end_exited(books, crate::kernel::intake::DRAIN_BUDGET, &mut route);
            self.exited += 1;
            tracing::debug!(fdr_pid = pid, "{}: process {pid} exited", self.name);
        }
    }

    /// Puts every process back as it was (the service stops, or a reload removes the
    /// target), their last events handed to `route`.
    pub fn finish(self, events: &mut EventPipeline, route: &mut Route<'_>) {
        let mut route = |e: &mut Event, g: Option<Gap>| route(e, g);
        let name = self.name;
        for engine in self.processes.into_engines() {
            let books = finish(&name, engine, events, &mut route);
            events.end_exited(books, crate::kernel::intake::DRAIN_BUDGET, &mut route);
        }
    }

    /// The status's `inline` object.
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "processes_patched": self.patched,
            "processes_live": self.processes.pids().len(),
            "live": self.processes.pids(),
            "processes_ended": self.exited,
            "processes_not_traced": self.processes.not_traced(),
            // Of those patched: started, and taken only past their entry point.
            "processes_past_entry": self.processes.past_entry(),
        })
    }
}

/// Logs what happened to a process of `name`; counts it when it was patched.
fn said(name: &str, seen: &Seen, patched: &mut u64) {
    match seen {
        Seen::Patched {
            pid, past_entry, ..
        } => {
            *patched += 1;
            if *past_entry {
                tracing::warn!(fdr_pid = pid, "{name}: {}", seen.line());
            } else {
                tracing::info!(fdr_pid = pid, "{name}: {}", seen.line());
            }
        }
        Seen::Late { pid } | Seen::NotTraced { pid, .. } => {
            tracing::warn!(fdr_pid = pid, "{name}: {}", seen.line());
        }
    }
}

/// Ends one engine: its process put back (said), its last events handed on; the books of its
/// threads not ended yet.
fn finish(
    name: &str,
    engine: Engine,
    events: &mut EventPipeline,
    route: &mut impl FnMut(&mut Event, Option<Gap>),
) -> Vec<(u32, ThreadState)> {
    let pid = engine.pid();
    let (books, report, error) = events.deliver_from(route, |sink| engine.finish(sink));
    if let Some(err) = error {
        tracing::warn!(fdr_pid = pid, "{name}: process {pid}: {err:#}");
    }
    match report.restored {
        Some(r) if r.gone => {}
        Some(r) => tracing::info!(
            fdr_pid = pid,
            "{name}: process {pid} put back as it was: {} sleds restored{}",
            r.sleds,
            match r.changed {
                0 => String::new(),
                n => format!(", {n} found changed by something else and left"),
            }
        ),
        None => {}
    }
    if report.no_slot > 0 {
        tracing::warn!(
            fdr_pid = pid,
            "{name}: process {pid}: {} hits of threads that found no free slot (more than {} threads at once) were not recorded",
            report.no_slot,
            report.slots
        );
    }
    books
}
