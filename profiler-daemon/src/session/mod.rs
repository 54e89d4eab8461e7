//! A recording session: events in, one FDR file per thread out.
//!
//! Events arrive in each thread's program order (see [`crate::session::order`]); [`files`]
//! routes them to the thread's [`ThreadTrace`], creating the process directory and the
//! thread's file on the thread's first event and closing the file when the thread exits; this
//! module holds what the session knows besides (objects, names, exits, notes) and writes the
//! manifest at its end from every part of the threads' files.
//!
//! Stage 4 of the pipeline: [`pipeline`] drains the rings, [`order`] puts each thread's events
//! back in program order, [`files`] writes them (through the `xray-fdr` crate) into the
//! directory [`output`] creates safely, and [`summary`] is what the session reports at its
//! end.
mod files;
pub mod flight;
mod latencies;
pub mod live;
pub mod order;
pub mod output;
pub mod pipeline;
pub mod summary;
#[cfg(test)]
mod tests;
mod thread;

/// When a frame is gone by the stack pointer: the rule the service's slow-call trigger and
/// export match frames by too.
pub use thread::{slot_at_or_below, slot_below};

use crate::kernel::intake::Event;
use crate::plan::exits::ExitsChoice;
use crate::plan::objects::Executable;
use crate::plan::{AttachPlan, FunctionNames};
use crate::session::order::Gap;
use crate::session::output::OutputDir;
use crate::session::summary::{
    ExitMethods, ObjectReport, ProbeCosts, ProcessReport, SessionReport, ThreadReport, Totals,
};
use anyhow::Result;
use files::Place;
pub use files::{monotonic_ns, ThreadFiles, CYCLE_FREQUENCY};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
pub use thread::{ThreadCounts, ThreadTrace};
use xray_fdr::FdrVersion;

use fdr_session::manifest::MANIFEST;

/// Losses and anomalies only the kernel side and the intake know about.
#[derive(Clone, Copy, Debug, Default)]
pub struct IntakeLosses {
    /// Events lost that belong to no known thread.
    pub unattributed_lost: u64,
    /// Records that could not be decoded or numbered.
    pub malformed: u64,
    /// Return probes of calls entered before recording began (no event).
    pub returns_before_tracing: u64,
}

/// The state of one recording.
pub struct Session {
    /// The output directory and what the threads' files share.
    place: Arc<Place>,
    executable: Executable,
    /// The objects probed so far, by object id.
    objects: Vec<ObjectReport>,
    /// Each probed object's file held open, by build-id, so that the end-of-session report
    /// can read it even if it is deleted meanwhile (see `object_files`).
    object_files: Vec<(String, std::fs::File)>,
    names: FunctionNames,
    /// Functions (trace ids) whose exits a return probe observes.
    return_probed: HashSet<u32>,
    /// The threads' files, for [`Session::record`].
    files: ThreadFiles,
    /// The threads' files the parallel pipeline's workers record into (see
    /// [`Session::parts`]), each locked by its worker while it records.
    parts: Vec<Arc<Mutex<ThreadFiles>>>,
    version: FdrVersion,
    exits: ExitsChoice,
    /// For a flight-recorder snapshot: what the recorder held and let go of, in all and by
    /// thread id.
    window: Option<flight::FlightStats>,
    thread_windows: BTreeMap<u32, flight::ThreadWindow>,
    /// `--exits repair`: what the repairs did, by thread id.
    repairs: Option<BTreeMap<u32, summary::RepairStats>>,
    /// `--kernel-stats`: the time the kernel spent in each recording program.
    kernel_programs: Vec<crate::kernel::bpf::ProgramCost>,
    /// What a probe hit cost (see [`Session::set_probe_costs`]).
    probe_costs: Option<ProbeCosts>,
    /// `--max-overhead`: what the budget did (see [`Session::set_budget`]).
    budget: Option<fdr_session::schema::BudgetReport>,
    /// See [`SessionReport::notes`].
    notes: Vec<String>,
    /// `--live`: the parts keep each function's durations (see [`Session::live_view`]).
    latencies: bool,
}

impl Session {
    /// Starts a session writing FDR files of `version` under `out` for processes running
    /// `executable`; the objects probed are added with [`Session::add_object`].
    pub fn new(
        out: OutputDir,
        executable: Executable,
        version: FdrVersion,
        exits: ExitsChoice,
    ) -> Session {
        let place = Arc::new(Place::new(out, executable.name.clone(), version));
        Session {
            files: ThreadFiles::new(place.clone()),
            place,
            executable,
            objects: Vec::new(),
            object_files: Vec::new(),
            names: FunctionNames::default(),
            return_probed: HashSet::new(),
            parts: Vec::new(),
            version,
            exits,
            window: None,
            thread_windows: BTreeMap::new(),
            repairs: None,
            kernel_programs: Vec::new(),
            probe_costs: None,
            budget: None,
            notes: Vec::new(),
            latencies: false,
        }
    }

    /// The session with wall-clock time fixed (before anything is recorded), so that tests
    /// write the same bytes on every run.
    #[cfg(test)]
    fn at_epoch(mut self) -> Session {
        let place = Place::new(
            self.place.out.try_clone().expect("a descriptor"),
            self.executable.name.clone(),
            self.version,
        )
        .at_epoch();
        self.place = Arc::new(place);
        self.files = ThreadFiles::new(self.place.clone());
        self
    }

    /// Has the parts made from now on keep each function's durations, for
    /// [`Session::live_view`].
    pub fn keep_latencies(&mut self) {
        self.latencies = true;
    }

    /// The parts' calls by function so far, named, with the events and losses: what `top`
    /// shows of a recording (`--live`). Locks each part in turn: call it between drains.
    pub fn live_view(&self) -> live::LiveView {
        let mut by_id: BTreeMap<u32, live::LiveFunction> = BTreeMap::new();
        let mut view = live::LiveView {
            at_ns: monotonic_ns(),
            ..live::LiveView::default()
        };
        for part in &self.parts {
            let part = part.lock().unwrap_or_else(|e| e.into_inner());
            view.events += part.events;
            view.lost += part.lost();
            for (id, t, latencies) in part.totals.iter_latencies() {
                let f = by_id.entry(id).or_default();
                f.calls += t.calls;
                f.total_ns = f.total_ns.saturating_add(t.total_ns);
                if let Some(l) = latencies {
                    f.latencies.merge(l);
                }
            }
        }
        view.functions = (by_id.into_iter())
            .map(|(id, f)| live::LiveFunction {
                name: self.names.name(id),
                ..f
            })
            .collect();
        view
    }

    /// `count` more parts of the session's threads' files, one for each worker of the
    /// parallel pipeline: the session reads them (flushes, counts, the report at its end)
    /// between the pipeline's drains, when no worker holds them.
    pub fn parts(&mut self, count: usize) -> Vec<Arc<Mutex<ThreadFiles>>> {
        let parts: Vec<_> = (0..count)
            .map(|_| {
                let mut part = ThreadFiles::new(self.place.clone());
                if self.latencies {
                    part.totals = Totals::with_latencies();
                }
                Arc::new(Mutex::new(part))
            })
            .collect();
        self.parts.extend(parts.iter().cloned());
        parts
    }

    /// Calls `f` with each part of the threads' files.
    fn each_files(&self, mut f: impl FnMut(&ThreadFiles)) {
        f(&self.files);
        for part in &self.parts {
            f(&part.lock().unwrap_or_else(|p| p.into_inner()));
        }
    }

    /// Calls `f` with each part of the threads' files, to change it.
    fn each_files_mut(&mut self, mut f: impl FnMut(&mut ThreadFiles)) {
        f(&mut self.files);
        for part in &self.parts {
            f(&mut part.lock().unwrap_or_else(|p| p.into_inner()));
        }
    }

    /// The thread (and its count) with the most frames proven gone by an event other than a
    /// catch (see `ThreadCounts::frames_closed_uncaught`), among the threads of the processes
    /// `process` selects.
    pub fn most_frames_closed_uncaught(&self, process: impl Fn(u32) -> bool) -> Option<(u32, u64)> {
        let mut most = None;
        self.each_files(|files| {
            if let Some((tid, n)) = files.most_frames_closed_uncaught(&process) {
                if most.is_none_or(|(_, m)| n > m) {
                    most = Some((tid, n));
                }
            }
        });
        most
    }

    /// Adds what happened to the exit method during the session to the reason the manifest
    /// and the summary give for it.
    pub fn note_exits(&mut self, note: &str) {
        self.exits.reason.push_str("; ");
        self.exits.reason.push_str(note);
    }

    /// Adds a sentence to the manifest's and the summary's notes (see
    /// [`SessionReport::notes`]).
    pub fn add_note(&mut self, note: String) {
        self.notes.push(note);
    }

    /// What a probe hit cost, for each function's estimated cost in the report.
    pub fn set_probe_costs(&mut self, costs: ProbeCosts) {
        self.probe_costs = Some(costs);
    }

    /// `--max-overhead`: what the budget did, for the manifest and the summary. The functions
    /// it dropped are noted as by [`Session::dropped`] (before events are replayed into it).
    pub fn set_budget(&mut self, budget: fdr_session::schema::BudgetReport) {
        for c in budget.changes.iter().filter(|c| c.action == "dropped") {
            self.dropped(c.function_id, c.at_ns);
        }
        self.budget = Some(budget);
    }

    /// The budget stopped tracing function `function_id` at `at_ns`: its frames open then are
    /// counted apart when they are closed (`frames_closed_by_budget`).
    pub fn dropped(&self, function_id: u32, at_ns: u64) {
        self.place.drops.add(function_id, at_ns);
    }

    /// `--kernel-stats`: the time the kernel spent in each recording program.
    pub fn set_kernel_programs(&mut self, costs: Vec<crate::kernel::bpf::ProgramCost>) {
        self.kernel_programs = costs;
    }

    /// `--exits repair`: what the repairs did, by thread id, for the threads' reports.
    pub fn set_repairs(&mut self, by_thread: BTreeMap<u32, summary::RepairStats>) {
        self.repairs = Some(by_thread);
    }

    /// Adds the repairs of one more process (`--exits repair --attach`: a keeper each).
    pub fn add_repairs(&mut self, by_thread: BTreeMap<u32, summary::RepairStats>) {
        self.repairs
            .get_or_insert_with(BTreeMap::new)
            .extend(by_thread);
    }

    /// Marks the session as a flight-recorder snapshot: `stats`, and what each thread let go
    /// of (`by_thread`, by thread id), go into its manifest.
    pub fn set_window(
        &mut self,
        stats: flight::FlightStats,
        by_thread: BTreeMap<u32, flight::ThreadWindow>,
    ) {
        self.window = Some(stats);
        self.thread_windows = by_thread;
    }

    /// Records that `plan`'s object was probed with `probes` probes, `attached_ns`
    /// (CLOCK_MONOTONIC, the trace clock) being when they were all in place.
    pub fn add_object(&mut self, plan: AttachPlan, probes: usize, attached_ns: u64) {
        if let (Some(build_id), Ok(file)) = (&plan.build_id, std::fs::File::open(&plan.binary)) {
            self.object_files.push((build_id.clone(), file));
        }
        self.objects.push(ObjectReport {
            object_id: plan.object_id,
            path: plan.display_path.clone(),
            deleted: plan.deleted,
            build_id: plan.build_id,
            load_address: plan.load_address,
            functions: plan.functions,
            return_probe_functions: plan.return_probed.len(),
            probes,
            attached_ns,
        });
        self.return_probed
            .extend(plan.return_probed.iter().copied());
        self.objects.sort_by_key(|o| o.object_id);
        let names = match plan.object_id {
            0 => plan.names,
            _ => plan.names.tagged(&plan.exe_name),
        };
        self.names.extend(names);
    }

    /// Functions and calls so far by exit method.
    pub fn exit_methods(&self) -> ExitMethods {
        let functions: usize = self.objects.iter().map(|o| o.functions).sum();
        let return_probe_functions: usize =
            self.objects.iter().map(|o| o.return_probe_functions).sum();
        let (mut return_probe_calls, mut exit_sled_calls) = (0, 0);
        self.each_files(|files| {
            let (by_return_probe, by_exit_sled) = files.totals.observed_calls();
            return_probe_calls += by_return_probe;
            exit_sled_calls += by_exit_sled;
        });
        ExitMethods {
            return_probe_functions,
            exit_sled_functions: functions.saturating_sub(return_probe_functions),
            return_probe_calls,
            exit_sled_calls,
        }
    }

    /// Every function's exits are observed by their sleds from now on (the kernel stuck at its
    /// limit of pending return probes): the summary counts the functions so.
    pub fn exit_sleds_instead(&mut self) {
        self.return_probed.clear();
        for o in &mut self.objects {
            o.return_probe_functions = 0;
        }
    }

    /// Records a thread's next event (in its program order, see [`crate::session::order`]); `gap` says
    /// how many of its events were lost right before it.
    #[inline]
    pub fn record(&mut self, event: &Event, gap: Option<Gap>) {
        self.files.record(event, gap);
    }

    /// Records where an object probed before it was mapped was found mapped.
    pub fn locate_object(&mut self, object_id: u32, load_address: u64) {
        for o in &mut self.objects {
            if o.object_id == object_id && o.load_address == 0 {
                o.load_address = load_address;
            }
        }
    }

    /// The probed objects' files, held open since they were probed, by build-id: readable
    /// through `/proc/self/fd/N` whatever happened to their paths since.
    pub fn take_object_files(&mut self) -> Vec<(String, std::fs::File)> {
        std::mem::take(&mut self.object_files)
    }

    /// Makes every file on disk a complete, loadable trace of what was recorded so far.
    pub fn flush(&mut self) {
        self.each_files_mut(ThreadFiles::flush);
    }

    /// Open thread files.
    pub fn open_files(&self) -> usize {
        let mut open = 0;
        self.each_files(|files| open += files.open_files());
        open
    }

    /// Finalizes every file, writes `session.json` and returns the report.
    pub fn finish(self, losses: IntakeLosses) -> Result<SessionReport> {
        match self.finish_keeping_report(losses)? {
            (_, Some(err)) => Err(err),
            (report, None) => Ok(report),
        }
    }

    /// [`Session::finish`], but a manifest that cannot be written (the disk full) does not
    /// lose the report: it comes back with that error, for the summary to be shown all the
    /// same.
    pub fn finish_keeping_report(
        mut self,
        losses: IntakeLosses,
    ) -> Result<(SessionReport, Option<anyhow::Error>)> {
        // Every part's files finalized, its threads' reports gathered by process, its
        // counts and per-function totals added up.
        let mut totals = Totals::default();
        let (mut events, mut ignored, mut unattributed_lost) = (0, 0, 0);
        let mut processes: BTreeMap<u32, (String, Vec<ThreadReport>)> = BTreeMap::new();
        self.each_files_mut(|files| {
            totals.add(&files.totals);
            events += files.events;
            ignored += files.ignored;
            unattributed_lost += files.unattributed_lost;
            for (pid, (dir, threads)) in files.finish().processes {
                processes
                    .entry(pid)
                    .or_insert_with(|| (dir, Vec::new()))
                    .1
                    .extend(threads);
            }
        });
        let mut report = SessionReport {
            fdr_version: self.version.number(),
            exits: self.exits.mode.to_owned(),
            exits_reason: self.exits.reason.clone(),
            exit_methods: self.exit_methods(),
            window: self.window,
            repair: self.repairs.as_ref().map(|by_thread| {
                let mut all = summary::RepairStats::default();
                by_thread.values().for_each(|t| all.add(t));
                all
            }),
            repair_unrecorded_threads: None,
            probe_costs: self.probe_costs,
            budget: self.budget.take(),
            kernel_programs: std::mem::take(&mut self.kernel_programs),
            notes: std::mem::take(&mut self.notes),
            events,
            events_lost: 0,
            events_lost_unattributed: unattributed_lost + losses.unattributed_lost,
            events_malformed: losses.malformed,
            events_dropped_write_errors: 0,
            records_not_stored: 0,
            daemon_peak_rss_kib: peak_rss_kib(),
            dropped_unmatched_exits: 0,
            exits_entered_before_tracing: 0,
            returns_before_tracing: losses.returns_before_tracing,
            events_ignored: ignored,
            custom_events: 0,
            custom_events_truncated: 0,
            typed_events: 0,
            processes: Vec::new(),
            functions: summary::rank_functions(&totals, &self.names, &self.return_probed),
        };
        if let Some(costs) = &self.probe_costs {
            summary::estimate_costs(&mut report.functions, costs);
        }
        for (pid, (dir, mut threads)) in processes {
            if let Some(repairs) = &mut self.repairs {
                for t in &mut threads {
                    // Taken: what remains was done in threads not recorded.
                    t.repair = repairs.remove(&t.tid);
                }
            }
            if self.window.is_some() {
                for t in &mut threads {
                    t.window = Some(self.thread_windows.remove(&t.tid).unwrap_or_default());
                }
            }
            threads.sort_by_key(|t| t.tid);
            for t in &threads {
                report.events_lost += t.events_lost;
                report.dropped_unmatched_exits += t.dropped_unmatched_exits;
                report.exits_entered_before_tracing += t.exits_entered_before_tracing;
                report.events_dropped_write_errors += t.dropped_write_errors;
                report.records_not_stored += t.records_not_stored;
                report.custom_events += t.custom_events;
                report.custom_events_truncated += t.custom_events_truncated;
                report.typed_events += t.typed_events;
            }
            let executable = self.objects.iter().find(|o| o.object_id == 0);
            report.processes.push(ProcessReport {
                pid,
                binary: self.executable.path.clone(),
                binary_deleted: self.executable.deleted,
                build_id: executable.and_then(|o| o.build_id.clone()),
                objects: self.objects.clone(),
                dir,
                threads,
            });
        }
        report.repair_unrecorded_threads = self
            .repairs
            .as_ref()
            .filter(|left| !left.is_empty())
            .map(|left| {
                let mut all = summary::RepairStats::default();
                left.values().for_each(|t| all.add(t));
                all
            });
        report.events_lost += report.events_lost_unattributed + report.events_malformed;
        let json = serde_json::to_vec_pretty(&report)?;
        let written = self.place.out.write_atomically(MANIFEST, &json).err();
        Ok((report, written))
    }

    /// The session's output directory.
    pub fn out_dir(&self) -> &std::path::Path {
        self.place.out.path()
    }

    /// The output directory, held (the end-of-session report is written through it).
    pub fn out(&self) -> &OutputDir {
        &self.place.out
    }
}

/// This process's peak resident memory in KiB (`VmHWM` of `/proc/self/status`); `None` if it
/// cannot be read.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}
