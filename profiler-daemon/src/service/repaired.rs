//! A target with `exits = "repair"`: every process of one of its binaries traced as
//! [`crate::repair::processes`] says (a keeper each, probes of its own once the keeper holds
//! it), what happened to each logged, and what the repairs did kept for the status.
use crate::kernel::bpf::Tracer;
use crate::plan::AttachPlan;
use crate::repair::keeper::KeeperReport;
use crate::repair::processes::{Ended, Found, RepairedProcesses, Traced};
use crate::session::summary::RepairStats;
use anyhow::Result;
use std::path::Path;

/// The repaired processes of one binary of a target.
pub struct Repaired {
    processes: RepairedProcesses,
    /// What the log and the status call it (`target NAME (PATH)`).
    name: String,
    /// What the keepers of the processes that exited (or were let go) repaired.
    repairs: RepairStats,
}

impl Repaired {
    /// Places the probe that names the processes starting `binary` with `tag`; `plan` is its
    /// tagged plan, exits decided.
    pub fn new(
        tracer: &mut Tracer,
        name: String,
        binary: &Path,
        plan: AttachPlan,
        tag: u32,
    ) -> Result<Repaired> {
        let processes = RepairedProcesses::new(tracer, binary, vec![plan], tag)?;
        if let Some(why) = processes.hold_error() {
            tracing::warn!("{name}: the processes that start running it will be traced from their entry point, their first calls not recorded: {why}");
        }
        Ok(Repaired {
            processes,
            name,
            repairs: RepairStats::default(),
        })
    }

    /// The processes running the binary now.
    pub fn running(&self) -> Vec<u32> {
        self.processes.running()
    }

    /// The tag of the processes that start running the binary.
    pub fn tag(&self) -> u32 {
        self.processes.tag()
    }

    /// Traces the processes held since their exec, then those of `started` (named at their
    /// entry point) not traced yet.
    pub fn trace_started(&mut self, started: &[u32], tracer: &mut Tracer) {
        for (pid, traced) in self.processes.trace_started(started, tracer) {
            self.said(pid, traced);
        }
    }

    /// Traces `pid` (said in the log, as is a process that cannot be traced).
    pub fn trace(&mut self, pid: u32, tracer: &mut Tracer, found: Found) {
        let traced = self.processes.trace(pid, tracer, found);
        self.said(pid, traced);
    }

    fn said(&mut self, pid: u32, traced: Result<Option<Traced>>) {
        match traced {
            Ok(Some(Traced {
                keeper,
                probes,
                found,
            })) => {
                let from = match found {
                    Found::AtExec => "from its exec",
                    Found::Running => "where it was",
                    Found::AtEntry | Found::AtExecLate => "from after its entry point (not held in time at its exec: its first calls are not recorded)",
                };
                tracing::info!(
                    fdr_pid = pid,
                    "{}: process {pid} traced with its stack repaired ({from}), {probes} probes (its tracer: process {keeper}, fdr-repair)",
                    self.name
                );
            }
            Ok(None) => {}
            Err(err) => {
                tracing::warn!(
                    fdr_pid = pid,
                    "{}: process {pid} is not traced: {err:#}",
                    self.name
                );
            }
        }
    }

    /// Removes the probes of the processes that exited, keeping what their keepers repaired.
    pub fn reap(&mut self, tracer: &mut Tracer) {
        for (pid, report) in self.processes.ended(tracer) {
            match report.as_ref().ok().and_then(|r| r.let_go.as_deref()) {
                Some(why) => tracing::warn!(
                    fdr_pid = pid,
                    "{}: {why}; its probes are removed, it is not traced any more",
                    self.name
                ),
                None => tracing::debug!(fdr_pid = pid, "{}: process {pid} exited", self.name),
            }
            self.add(report);
        }
    }

    /// Removes every process's probes and has each keeper let its process go (the service
    /// stops, or a reload removes the target).
    pub fn finish(mut self, tracer: &mut Tracer) {
        for (pid, ended) in self.processes.finish(tracer) {
            match ended {
                Ended::Report(report) => {
                    tracing::info!(fdr_pid = pid, "{}: process {pid} let go, no frame left hooked", self.name);
                    self.add(report);
                }
                Ended::NotLetGo { keeper } => tracing::warn!(
                    fdr_pid = pid,
                    "{}: the keeper of process {pid} (process {keeper}) has not let it go within {:?}: it goes on by itself",
                    self.name,
                    crate::repair::keeper::RELEASE_WAIT
                ),
            }
        }
    }

    fn add(&mut self, report: Result<KeeperReport>) {
        match report {
            Ok(report) => report.repairs.values().for_each(|t| self.repairs.add(t)),
            Err(err) => tracing::warn!("{}: {err:#}", self.name),
        }
    }

    /// The status's `repair` object.
    pub fn status(&self) -> serde_json::Value {
        let (not_traced, latest) = self.processes.not_traced();
        let (at_exec, late) = self.processes.traced_from();
        serde_json::json!({
            "processes_traced": self.processes.traced(),
            // Of those that started while the service ran: held from their exec (recorded from
            // their first instruction), or traced only once past their entry point.
            "traced_from_exec": at_exec,
            "traced_late": late,
            "processes_live": self.processes.live().count(),
            "live": self.processes.live().collect::<Vec<u32>>(),
            "processes_ended": self.processes.ended_count(),
            "processes_not_traced": not_traced,
            "not_traced": latest.iter().map(|(pid, why)| serde_json::json!({
                "pid": pid,
                "why": why,
            })).collect::<Vec<_>>(),
            "of_processes_ended": self.repairs,
        })
    }
}
