//! A recording session: events in, one FDR file per thread out.
//!
//! Events arrive in each thread's program order (see [`crate::session::order`]); this module routes them
//! to the thread's [`ThreadTrace`], creating the process directory and the thread's file on the
//! thread's first event and closing the file when the thread exits, and keeps the totals the
//! summary shows.
//!
//! Stage 4 of the pipeline: [`order`] puts each thread's events back in program order, this
//! module writes them (through the `xray-fdr` crate) into the directory [`output`] creates
//! safely, and [`summary`] is what the session reports at its end.
pub mod flight;
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
    ExitMethods, ObjectReport, ProcessReport, SessionReport, ThreadReport, Totals,
};
use anyhow::Result;
use profiler_common::event_kind;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, HashMap, HashSet};
pub use thread::{ThreadCounts, ThreadTrace};
use xray_fdr::writer::{ThreadWriter, WallClock};
use xray_fdr::FdrVersion;

/// Timestamps are `bpf_ktime_get_ns()`: nanoseconds, so the FDR tick rate is 1 GHz.
pub const CYCLE_FREQUENCY: u64 = 1_000_000_000;

use fdr_session::manifest::MANIFEST;

struct Process {
    dir: OutputDir,
    dir_name: String,
    /// Threads whose file is open: where each is in `Session::open`.
    threads: BTreeMap<u32, usize>,
    /// Threads that exited: their files are final and closed.
    done: Vec<ThreadReport>,
    /// Files per tid so far (a tid the kernel reuses gets a second file).
    files_per_tid: HashMap<u32, u32>,
}

/// A thread whose file is open.
struct Open {
    pid: u32,
    tid: u32,
    trace: ThreadTrace,
}

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
    out: OutputDir,
    executable: Executable,
    /// The objects probed so far, by object id.
    objects: Vec<ObjectReport>,
    /// Each probed object's file held open, by build-id, so that the end-of-session report
    /// can read it even if it is deleted meanwhile (see `object_files`).
    object_files: Vec<(String, std::fs::File)>,
    names: FunctionNames,
    /// Functions (trace ids) whose exits a return probe observes.
    return_probed: HashSet<u32>,
    clock: Clock,
    processes: BTreeMap<u32, Process>,
    /// The threads whose file is open, in no particular order (each process's `threads` says
    /// where its are).
    open: Vec<Open>,
    /// Which process each live thread belongs to (end markers carry no pid).
    pid_of: FxHashMap<u32, u32>,
    /// The (tid, pid) of the last event written and where its thread is in `open`: `pid_of`
    /// has it, and the next event is most often that thread's.
    last: Option<(u32, u32, usize)>,
    totals: Totals,
    events: u64,
    ignored: u64,
    /// Threads whose file could not be created: said once, their later events only counted
    /// (in `ignored`), until the thread ends.
    unwritable: FxHashSet<(u32, u32)>,
    unattributed_lost: u64,
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
    /// See [`SessionReport::notes`].
    notes: Vec<String>,
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
        Session {
            out,
            executable,
            objects: Vec::new(),
            object_files: Vec::new(),
            names: FunctionNames::default(),
            return_probed: HashSet::new(),
            clock: Clock::now(),
            processes: BTreeMap::new(),
            open: Vec::new(),
            pid_of: FxHashMap::default(),
            last: None,
            totals: Totals::default(),
            events: 0,
            ignored: 0,
            unwritable: FxHashSet::default(),
            unattributed_lost: 0,
            version,
            exits,
            window: None,
            thread_windows: BTreeMap::new(),
            repairs: None,
            kernel_programs: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// The thread (and its count) with the most frames proven gone by an event other than a
    /// catch (see `ThreadCounts::frames_closed_uncaught`), among the threads of the processes
    /// `process` selects.
    pub fn most_frames_closed_uncaught(&self, process: impl Fn(u32) -> bool) -> Option<(u32, u64)> {
        self.processes
            .iter()
            .filter(|(&pid, _)| process(pid))
            .flat_map(|(_, p)| p.threads.iter())
            .map(|(&tid, &slot)| (tid, self.open[slot].trace.frames_closed_uncaught()))
            .max_by_key(|&(_, n)| n)
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
        let (return_probe_calls, exit_sled_calls) = self.totals.observed_calls();
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
        // Nearly every event: the thread of the event before, not its end.
        let h = &event.header;
        if let Some((tid, pid, slot)) = self.last {
            if tid == h.tid && pid == h.pid && h.kind != event_kind::THREAD_EXIT {
                self.events += 1;
                self.open[slot].trace.apply(event, gap, &mut self.totals);
                return;
            }
        }
        self.record_any(event, gap);
    }

    /// [`Session::record`] for any event.
    #[inline(never)]
    fn record_any(&mut self, event: &Event, gap: Option<Gap>) {
        let h = &event.header;
        let tid = h.tid;
        let ending = h.kind == event_kind::THREAD_EXIT;
        if !ending {
            self.events += 1;
        }
        let pid = if h.pid != 0 {
            h.pid
        } else {
            self.pid_of.get(&tid).copied().unwrap_or(0)
        };
        let slot = match self.last {
            Some((t, p, slot)) if t == tid && p == pid => Some(slot),
            _ => self
                .processes
                .get(&pid)
                .and_then(|p| p.threads.get(&tid))
                .copied(),
        };
        if let Some(slot) = slot {
            // A thread with an open file (never an unwritable one: see below). `last` saves
            // looking it up, and setting `pid_of` again, for the thread of the event before.
            if self.last != Some((tid, pid, slot)) {
                self.pid_of.insert(tid, pid);
                self.last = Some((tid, pid, slot));
            }
            self.open[slot].trace.apply(event, gap, &mut self.totals);
            if ending {
                self.end_thread(pid, tid);
            }
            return;
        }
        if ending {
            // A thread whose every event was lost, or that never reached instrumented code.
            self.unattributed_lost += gap.map_or(0, |g| g.lost);
            self.pid_of.remove(&tid);
            self.last = None;
            self.unwritable.remove(&(pid, tid));
            return;
        }
        if self.unwritable.contains(&(pid, tid)) {
            self.ignored += 1;
            self.unattributed_lost += gap.map_or(0, |g| g.lost);
            return;
        }
        let slot = match thread_of(
            &mut self.processes,
            &mut self.open,
            &self.out,
            &self.executable.name,
            &self.clock,
            self.version,
            pid,
            h,
        ) {
            Ok(slot) => slot,
            Err(err) => {
                errln!(
                    "fdr-profiled: warning: {err:#}; the events of thread {tid} are counted as ignored",
                );
                // Never created, so never found above until the thread ends.
                self.unwritable.insert((pid, tid));
                self.ignored += 1;
                self.unattributed_lost += gap.map_or(0, |g| g.lost);
                return;
            }
        };
        self.pid_of.insert(tid, pid);
        self.last = Some((tid, pid, slot));
        self.open[slot].trace.apply(event, gap, &mut self.totals);
    }

    /// Closes the file of a thread that ended.
    fn end_thread(&mut self, pid: u32, tid: u32) {
        self.pid_of.remove(&tid);
        self.last = None;
        let Some(slot) = self
            .processes
            .get_mut(&pid)
            .and_then(|p| p.threads.remove(&tid))
        else {
            return;
        };
        let ended = self.open.swap_remove(slot);
        if let Some(moved) = self.open.get(slot) {
            if let Some(at) = self
                .processes
                .get_mut(&moved.pid)
                .and_then(|p| p.threads.get_mut(&moved.tid))
            {
                *at = slot;
            }
        }
        if let Some(process) = self.processes.get_mut(&pid) {
            process.done.push(ended.trace.finish(tid));
        }
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
        for process in self.processes.values() {
            for &slot in process.threads.values() {
                self.open[slot].trace.flush();
            }
        }
    }

    /// Open thread files.
    pub fn open_files(&self) -> usize {
        self.processes.values().map(|p| p.threads.len()).sum()
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
            kernel_programs: std::mem::take(&mut self.kernel_programs),
            notes: std::mem::take(&mut self.notes),
            events: self.events,
            events_lost: 0,
            events_lost_unattributed: self.unattributed_lost + losses.unattributed_lost,
            events_malformed: losses.malformed,
            events_dropped_write_errors: 0,
            records_not_stored: 0,
            daemon_peak_rss_kib: peak_rss_kib(),
            dropped_unmatched_exits: 0,
            exits_entered_before_tracing: 0,
            returns_before_tracing: losses.returns_before_tracing,
            events_ignored: self.ignored,
            custom_events: 0,
            custom_events_truncated: 0,
            typed_events: 0,
            processes: Vec::new(),
            functions: summary::rank_functions(&self.totals, &self.names, &self.return_probed),
        };
        let mut open: Vec<Option<ThreadTrace>> = std::mem::take(&mut self.open)
            .into_iter()
            .map(|o| Some(o.trace))
            .collect();
        for (pid, process) in self.processes {
            let mut threads = process.done;
            for (tid, slot) in process.threads {
                if let Some(thread) = open[slot].take() {
                    threads.push(thread.finish(tid));
                }
            }
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
                dir: process.dir_name,
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
        let written = self.out.write_atomically(MANIFEST, &json).err();
        Ok((report, written))
    }

    /// The session's output directory.
    pub fn out_dir(&self) -> &std::path::Path {
        self.out.path()
    }

    /// The output directory, held (the end-of-session report is written through it).
    pub fn out(&self) -> &OutputDir {
        &self.out
    }
}

/// Where the thread's trace is in `open`, creating its process directory and file on first
/// sight.
#[allow(clippy::too_many_arguments)]
fn thread_of(
    processes: &mut BTreeMap<u32, Process>,
    open: &mut Vec<Open>,
    out: &OutputDir,
    exe_name: &str,
    clock: &Clock,
    version: FdrVersion,
    pid: u32,
    h: &profiler_common::EventHeader,
) -> Result<usize> {
    let process = match processes.entry(pid) {
        std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::btree_map::Entry::Vacant(e) => {
            let dir = out.create_subdir(&format!("{}-{pid}", output::name_part(exe_name)))?;
            let dir_name = dir
                .path()
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            e.insert(Process {
                dir,
                dir_name,
                threads: BTreeMap::new(),
                done: Vec::new(),
                files_per_tid: HashMap::new(),
            })
        }
    };
    let slot = match process.threads.entry(h.tid) {
        std::collections::btree_map::Entry::Occupied(e) => *e.get(),
        std::collections::btree_map::Entry::Vacant(e) => {
            let n = process.files_per_tid.entry(h.tid).or_insert(0);
            *n += 1;
            let name = if *n == 1 {
                format!("tid-{}.fdr", h.tid)
            } else {
                format!("tid-{}.{}.fdr", h.tid, n)
            };
            let staging = format!(".{name}.tmp");
            let file = format!("{}/{}", process.dir_name, name);
            let handle = process.dir.create_file(&staging)?;
            let writer = ThreadWriter::with_version(
                handle,
                h.tid,
                pid,
                CYCLE_FREQUENCY,
                clock.wall_clock(h.ts_ns),
                version,
            )
            .map_err(|err| anyhow::anyhow!("writing {file}: {err}"))?;
            // The header and preamble are on disk: only now does the file get its name.
            process.dir.publish(&staging, &name)?;
            open.push(Open {
                pid,
                tid: h.tid,
                trace: ThreadTrace::new(writer, file),
            });
            *e.insert(open.len() - 1)
        }
    };
    Ok(slot)
}

/// Converts the kernel's monotonic timestamps to wall-clock time for WallClockTime records.
struct Clock {
    /// Realtime minus monotonic, in nanoseconds, sampled once at session start.
    offset_ns: i128,
}

impl Clock {
    fn now() -> Clock {
        let mono = clock_ns(libc::CLOCK_MONOTONIC);
        let real = clock_ns(libc::CLOCK_REALTIME);
        Clock {
            offset_ns: real - mono,
        }
    }

    fn wall_clock(&self, monotonic_ns: u64) -> WallClock {
        let ns = (monotonic_ns as i128 + self.offset_ns).max(0);
        WallClock {
            secs: (ns / 1_000_000_000) as u64,
            micros: ((ns % 1_000_000_000) / 1_000) as u32,
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock `bpf_ktime_get_ns` reads, so comparable with
/// the trace's timestamps.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC) as u64
}

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec; both clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
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
