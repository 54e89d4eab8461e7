//! `--attach BIN --exits repair` in a recording: every process running the executable, traced
//! as [`crate::repair::processes`] says, with the session told what happened to each (the
//! objects, the repairs, the processes that could not be traced).
use crate::kernel::bpf::{KernelBooks, Tracer};
use crate::plan::exits::ExitPolicy;
use crate::plan::AttachPlan;
use crate::repair::processes::{Ended, Found, RepairedProcesses, Traced};
use crate::session::Session;
use anyhow::Result;
use std::path::Path;

/// The recording's traced processes.
pub struct AttachRepair {
    processes: RepairedProcesses,
    /// Whether the plans' objects are in the session's manifest yet (with the count of probes
    /// the first traced process got).
    objects_added: bool,
}

impl AttachRepair {
    /// Decides the plans' exits, places the probe that names the processes that start running
    /// `executable`, and traces those already running it. Call it once the probes are armed.
    pub fn start(
        tracer: &mut Tracer,
        session: &mut Session,
        executable: &Path,
        plans: Vec<AttachPlan>,
        policy: ExitPolicy,
    ) -> Result<AttachRepair> {
        let plans = plans
            .into_iter()
            .map(|mut plan| {
                crate::plan::exits::decide(&mut plan, policy);
                plan
            })
            .collect();
        let processes = RepairedProcesses::new(tracer, executable, plans, 0)?;
        if let Some(why) = processes.hold_error() {
            errln!("fdr-profiled: warning: repair: the processes that start running {} will be traced from their entry point, their first calls not recorded: {why}", executable.display());
        }
        let mut this = AttachRepair {
            processes,
            objects_added: false,
        };
        for pid in this.processes.running() {
            this.trace(pid, tracer, session, Found::Running);
        }
        Ok(this)
    }

    /// Traces the processes that started since the last call, and removes the probes of those
    /// that exited (adding what their keeper repaired to the session).
    pub fn poll(&mut self, tracer: &mut Tracer, session: &mut Session) {
        let started: Vec<u32> = tracer
            .started_processes()
            .into_iter()
            .map(|(_, pid)| pid)
            .collect();
        for (pid, traced) in self.processes.trace_started(&started, tracer) {
            self.said(pid, traced, session);
        }
        for (pid, report) in self.processes.ended(tracer) {
            match report {
                Ok(report) => {
                    match &report.let_go {
                        Some(why) => {
                            errln!("fdr-profiled: repair: {why}; its probes are removed, it is not traced any more");
                            session.add_note(why.clone());
                        }
                        None => errln!(
                            "fdr-profiled: repair: process {pid} exited; its probes are removed"
                        ),
                    }
                    session.add_repairs(report.repairs);
                }
                Err(err) => errln!("fdr-profiled: warning: {err:#}"),
            }
        }
    }

    fn trace(&mut self, pid: u32, tracer: &mut Tracer, session: &mut Session, found: Found) {
        let traced = self.processes.trace(pid, tracer, found);
        self.said(pid, traced, session);
    }

    /// Says what came of tracing `pid`.
    fn said(&mut self, pid: u32, traced: Result<Option<Traced>>, session: &mut Session) {
        match traced {
            Ok(Some(Traced {
                keeper,
                probes,
                found,
            })) => {
                let from = match found {
                    Found::AtExec => "from its exec",
                    Found::Running => "where it was",
                    Found::AtEntry | Found::AtExecLate => {
                        "from after its entry point (it was not held in time at its exec: its first calls are not recorded)"
                    }
                };
                errln!(
                    "fdr-profiled: repair: process {pid} traced {from}, {probes} probes (its tracer: process {keeper}, fdr-repair)"
                );
                if !self.objects_added {
                    self.objects_added = true;
                    self.add_objects(session, probes);
                }
            }
            Ok(None) => {}
            Err(err) => {
                errln!("fdr-profiled: warning: repair: process {pid} is not traced: {err:#}");
            }
        }
    }

    fn add_objects(&self, session: &mut Session, placed: usize) {
        let attached_ns = crate::session::monotonic_ns();
        let plans = self.processes.plans();
        let total: usize = plans.iter().map(|p| p.probes.len()).sum::<usize>().max(1);
        for plan in plans {
            // The probes of one process, shared out by the plans' sizes.
            let probes = placed * plan.probes.len() / total;
            session.add_object(plan.clone(), probes, attached_ns);
        }
    }

    /// A thread stuck at the kernel's limit of pending return probes makes its process's exits
    /// observed by their sleds from then on (see `record::exit_sleds_if_stuck`).
    pub fn exit_sleds_if_stuck(
        &mut self,
        books: &KernelBooks,
        tracer: &mut Tracer,
        session: &mut Session,
    ) {
        for pid in self.processes.with_return_probes() {
            let Some((tid, calls)) = super::stuck::stuck_thread(books, session, Some(pid)) else {
                continue;
            };
            let (placed, warnings) = self.processes.exit_sleds_instead(pid, tracer);
            for w in warnings {
                errln!("fdr-profiled: warning: {w}");
            }
            let note = super::stuck::stuck_note(&format!("process {pid}: "), tid, calls);
            errln!(
                "fdr-profiled: exits: {placed} exit sleds placed instead of return probes: {note}"
            );
            session.note_exits(&note);
        }
    }

    /// At the end of the session (recording disarmed): removes every process's probes, has each
    /// keeper let its process go, and says which processes were and were not traced. `unseen`:
    /// processes the start queue had no room for.
    pub fn finish(mut self, tracer: &mut Tracer, session: &mut Session, unseen: u64) {
        if !self.objects_added {
            self.add_objects(session, 0);
        }
        for (pid, ended) in self.processes.finish(tracer) {
            match ended {
                Ended::Report(Ok(report)) => session.add_repairs(report.repairs),
                Ended::Report(Err(err)) => errln!("fdr-profiled: warning: {err:#}"),
                Ended::NotLetGo { keeper } => errln!(
                    "fdr-profiled: warning: repair: the keeper of process {pid} (process {keeper}) has not let it go within {:?}: it goes on by itself, and its repairs are not in this summary",
                    crate::repair::keeper::RELEASE_WAIT
                ),
            }
        }
        let mut note = format!("{} processes traced", self.processes.traced());
        let (at_exec, late) = self.processes.traced_from();
        if at_exec + late > 0 {
            note.push_str(&format!(
                " ({at_exec} from their exec, {late} only once past their entry point, their first calls not recorded)"
            ));
        }
        let (not_traced, latest) = self.processes.not_traced();
        if not_traced > 0 {
            let named: Vec<String> = latest
                .iter()
                .map(|(pid, why)| format!("{pid} ({why})"))
                .collect();
            let earlier = if not_traced > latest.len() as u64 {
                "the latest: "
            } else {
                ""
            };
            note.push_str(&format!(
                "; {not_traced} not traced: {earlier}{}",
                named.join(", ")
            ));
        }
        if unseen > 0 {
            note.push_str(&format!(
                "; {unseen} started while the queue that names them was full, not traced"
            ));
        }
        errln!("fdr-profiled: repair: {note}");
        session.note_exits(&format!(
            "repair of every process running the executable: {note}"
        ));
    }
}
