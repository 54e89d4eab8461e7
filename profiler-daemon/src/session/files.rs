//! The threads' files of a session: each event routed to its thread's [`ThreadTrace`], the
//! process directory and the thread's file created on the thread's first event, the file
//! closed when the thread ends, and the totals the summary shows.
//!
//! A session's threads may be split between several [`ThreadFiles`], one per worker of the
//! parallel pipeline ([`super::pipeline`]): each thread is in exactly one, so each owns its
//! threads' files outright and records without a lock. What they share ([`Place`]: the output
//! directory, the process directories, the clock) is touched only on a thread's first event.
use super::order::Gap;
use super::output::{self, OutputDir};
use super::summary::{ThreadReport, Totals};
use super::thread::ThreadTrace;
use crate::kernel::intake::Event;
use anyhow::Result;
use profiler_common::event_kind;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use xray_fdr::writer::{ThreadWriter, WallClock};
use xray_fdr::FdrVersion;

/// Timestamps are `bpf_ktime_get_ns()`: nanoseconds, so the FDR tick rate is 1 GHz.
pub const CYCLE_FREQUENCY: u64 = 1_000_000_000;

/// What every [`ThreadFiles`] of one session shares.
pub(super) struct Place {
    pub(super) out: OutputDir,
    exe_name: String,
    clock: Clock,
    version: FdrVersion,
    /// Each process's directory, created by whichever part sees the process first.
    dirs: Mutex<BTreeMap<u32, ProcessDir>>,
    /// The functions the budget stopped tracing, and when: every thread's frames of one are
    /// counted apart when closed (see `thread::Drops`).
    pub(super) drops: Arc<super::thread::Drops>,
}

#[derive(Clone)]
struct ProcessDir {
    dir: Arc<OutputDir>,
    name: String,
}

impl Place {
    pub(super) fn new(out: OutputDir, exe_name: String, version: FdrVersion) -> Place {
        Place {
            out,
            exe_name,
            clock: Clock::now(),
            version,
            dirs: Mutex::new(BTreeMap::new()),
            drops: Arc::default(),
        }
    }

    /// Wall-clock time fixed at the epoch, so that tests write the same bytes on every run.
    #[cfg(test)]
    pub(super) fn at_epoch(mut self) -> Place {
        self.clock = Clock { offset_ns: 0 };
        self
    }

    /// The directory of process `pid`, created on first sight.
    fn process_dir(&self, pid: u32) -> Result<ProcessDir> {
        let mut dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(dir) = dirs.get(&pid) {
            return Ok(dir.clone());
        }
        let dir = self
            .out
            .create_subdir(&format!("{}-{pid}", output::name_part(&self.exe_name)))?;
        let name = dir
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dir = ProcessDir {
            dir: Arc::new(dir),
            name,
        };
        dirs.insert(pid, dir.clone());
        Ok(dir)
    }
}

/// The threads of one process this part has recorded.
pub(super) struct Process {
    dir: ProcessDir,
    /// Threads whose file is open: where each is in `ThreadFiles::open`.
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

/// The files of some of a session's threads (all of them, but for the parallel pipeline).
// A cache line pair of its own: its counts change on every event, and each of the parallel
// pipeline's workers has one, allocated one after the other.
#[repr(align(128))]
pub struct ThreadFiles {
    place: Arc<Place>,
    processes: BTreeMap<u32, Process>,
    /// The threads whose file is open, in no particular order (each process's `threads` says
    /// where its are).
    open: Vec<Open>,
    /// Which process each live thread belongs to (end markers carry no pid).
    pid_of: FxHashMap<u32, u32>,
    /// The (tid, pid) of the last event written and where its thread is in `open`: `pid_of`
    /// has it, and the next event is most often that thread's.
    last: Option<(u32, u32, usize)>,
    pub(super) totals: Totals,
    pub(super) events: u64,
    pub(super) ignored: u64,
    /// Threads whose file could not be created: said once, their later events only counted
    /// (in `ignored`), until the thread ends.
    pub(super) unwritable: FxHashSet<(u32, u32)>,
    pub(super) unattributed_lost: u64,
}

/// What one part recorded, by process, once its files are final.
pub(super) struct Recorded {
    /// By pid: the process's directory name and its threads' reports.
    pub(super) processes: BTreeMap<u32, (String, Vec<ThreadReport>)>,
}

impl ThreadFiles {
    pub(super) fn new(place: Arc<Place>) -> ThreadFiles {
        ThreadFiles {
            place,
            processes: BTreeMap::new(),
            open: Vec::new(),
            pid_of: FxHashMap::default(),
            last: None,
            totals: Totals::default(),
            events: 0,
            ignored: 0,
            unwritable: FxHashSet::default(),
            unattributed_lost: 0,
        }
    }

    /// Records a thread's next event (in its program order, see [`crate::session::order`]);
    /// `gap` says how many of its events were lost right before it.
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

    /// [`ThreadFiles::record`] for any event.
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
        let slot = match self.open_thread(pid, h) {
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

    /// Where the thread's trace is in `open`, creating its process directory and file on
    /// first sight.
    fn open_thread(&mut self, pid: u32, h: &profiler_common::EventHeader) -> Result<usize> {
        let process = match self.processes.entry(pid) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => e.insert(Process {
                dir: self.place.process_dir(pid)?,
                threads: BTreeMap::new(),
                done: Vec::new(),
                files_per_tid: HashMap::new(),
            }),
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
                let file = format!("{}/{}", process.dir.name, name);
                let handle = process.dir.dir.create_file(&staging)?;
                let writer = ThreadWriter::with_version(
                    handle,
                    h.tid,
                    pid,
                    CYCLE_FREQUENCY,
                    self.place.clock.wall_clock(h.ts_ns),
                    self.place.version,
                )
                .map_err(|err| anyhow::anyhow!("writing {file}: {err}"))?;
                // The header and preamble are on disk: only now does the file get its name.
                process.dir.dir.publish(&staging, &name)?;
                self.open.push(Open {
                    pid,
                    tid: h.tid,
                    trace: ThreadTrace::new(writer, file, self.place.drops.clone()),
                });
                *e.insert(self.open.len() - 1)
            }
        };
        Ok(slot)
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

    /// The thread (and its count) with the most frames proven gone by an event other than a
    /// catch, among the threads of the processes `process` selects.
    pub(super) fn most_frames_closed_uncaught(
        &self,
        process: &impl Fn(u32) -> bool,
    ) -> Option<(u32, u64)> {
        self.processes
            .iter()
            .filter(|(&pid, _)| process(pid))
            .flat_map(|(_, p)| p.threads.iter())
            .map(|(&tid, &slot)| (tid, self.open[slot].trace.frames_closed_uncaught()))
            .max_by_key(|&(_, n)| n)
    }

    /// Makes every file on disk a complete, loadable trace of what was recorded so far.
    pub fn flush(&mut self) {
        for process in self.processes.values() {
            for &slot in process.threads.values() {
                self.open[slot].trace.flush();
            }
        }
    }

    /// Events the kernel lost in these threads so far (their gaps): those of open and ended
    /// threads, and of threads with no file.
    pub(super) fn lost(&self) -> u64 {
        let open: u64 = self.open.iter().map(|o| o.trace.counts.lost).sum();
        let ended: u64 = (self.processes.values())
            .flat_map(|p| &p.done)
            .map(|r| r.events_lost)
            .sum();
        open + ended + self.unattributed_lost
    }

    /// Open thread files.
    pub fn open_files(&self) -> usize {
        self.processes.values().map(|p| p.threads.len()).sum()
    }

    /// Finalizes every file still open.
    pub(super) fn finish(&mut self) -> Recorded {
        let mut open: Vec<Option<ThreadTrace>> = std::mem::take(&mut self.open)
            .into_iter()
            .map(|o| Some(o.trace))
            .collect();
        self.last = None;
        let mut processes = BTreeMap::new();
        for (pid, process) in std::mem::take(&mut self.processes) {
            let mut threads = process.done;
            for (tid, slot) in process.threads {
                if let Some(thread) = open[slot].take() {
                    threads.push(thread.finish(tid));
                }
            }
            processes.insert(pid, (process.dir.name, threads));
        }
        Recorded { processes }
    }
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

/// The time of `clock` in nanoseconds.
pub(super) fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec; the clocks used (monotonic, realtime) always exist
    // on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}
