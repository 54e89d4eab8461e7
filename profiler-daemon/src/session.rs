//! A recording session: events in, one FDR file per thread out.
//!
//! Events arrive in each thread's program order (see [`crate::intake`]); this module routes them
//! to the thread's [`ThreadWriter`], creating the process directory and the thread's file on the
//! thread's first event, and keeps the totals the summary shows.
use crate::fdr::records::FunctionAction;
use crate::fdr::writer::{Recorded, ThreadWriter, WallClock};
use crate::fdr::FdrVersion;
use crate::output::OutputDir;
use crate::plan::AttachPlan;
use crate::summary::{CallTimer, FunctionTotals, ProcessReport, SessionReport, ThreadReport};
use anyhow::Result;
use profiler_common::{Cookie, SledEvent, SledKind};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;

/// Timestamps are `bpf_ktime_get_ns()`: nanoseconds, so the FDR tick rate is 1 GHz.
pub const CYCLE_FREQUENCY: u64 = 1_000_000_000;

/// Name of the session manifest in the output directory.
pub const MANIFEST: &str = "session.json";

struct Thread {
    writer: Option<ThreadWriter<File>>,
    file: String,
    timer: CallTimer,
    events: u64,
    dropped_write_errors: u64,
}

struct Process {
    dir: OutputDir,
    dir_name: String,
    threads: BTreeMap<u32, Thread>,
}

/// The state of one recording.
pub struct Session {
    out: OutputDir,
    plan: AttachPlan,
    clock: Clock,
    processes: BTreeMap<u32, Process>,
    totals: HashMap<u32, FunctionTotals>,
    events: u64,
    ignored: u64,
    version: FdrVersion,
}

impl Session {
    /// Starts a session writing FDR files of `version` under `out` for the binary `plan`
    /// describes.
    pub fn new(out: OutputDir, plan: AttachPlan, version: FdrVersion) -> Session {
        Session {
            out,
            plan,
            clock: Clock::now(),
            processes: BTreeMap::new(),
            totals: HashMap::new(),
            events: 0,
            ignored: 0,
            version,
        }
    }

    /// Records one event. Write errors do not stop the session: the thread's file is closed as
    /// it stands (still loadable), a warning is printed, and its later events are counted as
    /// dropped.
    pub fn record(&mut self, event: &SledEvent) {
        self.events += 1;
        let cookie = Cookie::decode(event.cookie);
        let (kind, action) = match SledKind::from_u8(cookie.kind) {
            Some(kind @ SledKind::Entry) => (kind, FunctionAction::Entry),
            Some(kind @ SledKind::LogArgsEntry) => (kind, FunctionAction::EntryArgs),
            Some(kind @ SledKind::Exit) => (kind, FunctionAction::Exit),
            Some(kind @ SledKind::Tail) => (kind, FunctionAction::TailExit),
            _ => {
                self.ignored += 1;
                return;
            }
        };
        let thread = match thread_of(
            &mut self.processes,
            &self.out,
            &self.plan,
            &self.clock,
            self.version,
            event,
        ) {
            Ok(thread) => thread,
            Err(err) => {
                eprintln!("fdr-profiled: warning: {err:#}");
                self.ignored += 1;
                return;
            }
        };
        thread.events += 1;
        let Some(writer) = thread.writer.as_mut() else {
            thread.dropped_write_errors += 1;
            return;
        };
        // CPU numbers fit 16 bits on every machine Linux supports today; clamp rather than wrap.
        let cpu = u16::try_from(event.cpu).unwrap_or(u16::MAX);
        let written = if kind == SledKind::LogArgsEntry {
            writer.entry_with_args(cookie.function_id, event.ts_ns, cpu, &[event.arg])
        } else {
            writer.function(action, cookie.function_id, event.ts_ns, cpu)
        };
        match written {
            Ok(Recorded::Written | Recorded::WrittenAfterUnwind { .. }) => match action {
                FunctionAction::Entry | FunctionAction::EntryArgs => {
                    thread.timer.enter(cookie.function_id, event.ts_ns)
                }
                FunctionAction::Exit | FunctionAction::TailExit => {
                    thread
                        .timer
                        .exit(cookie.function_id, event.ts_ns, &mut self.totals)
                }
            },
            Ok(_) => {}
            Err(err) => {
                eprintln!(
                    "fdr-profiled: warning: writing {}: {err}; later events of thread {} are dropped",
                    thread.file, event.tid
                );
                thread.dropped_write_errors += 1;
                thread.writer = None;
            }
        }
    }

    /// Makes every file on disk a complete, loadable trace of what was recorded so far.
    pub fn flush(&mut self) {
        for process in self.processes.values_mut() {
            for thread in process.threads.values_mut() {
                if let Some(writer) = thread.writer.as_mut() {
                    if let Err(err) = writer.flush() {
                        eprintln!("fdr-profiled: warning: flushing {}: {err}", thread.file);
                    }
                }
            }
        }
    }

    /// Finalizes every file, writes `session.json` and returns the report.
    pub fn finish(self, events_lost: u64) -> Result<SessionReport> {
        let mut report = SessionReport {
            fdr_version: self.version.number(),
            events: self.events,
            events_lost,
            events_dropped_write_errors: 0,
            dropped_unmatched_exits: 0,
            events_ignored: self.ignored,
            processes: Vec::new(),
            functions: SessionReport::rank_functions(&self.totals, &self.plan.names),
        };
        for (pid, process) in self.processes {
            let mut threads = Vec::new();
            for (tid, thread) in process.threads {
                let mut records = 0;
                let mut dropped_unmatched_exits = 0;
                let mut dropped_write_errors = thread.dropped_write_errors;
                if let Some(writer) = thread.writer {
                    match writer.finish() {
                        Ok((_, stats)) => {
                            records = stats.records;
                            dropped_unmatched_exits = stats.dropped_unmatched_exits;
                        }
                        Err(err) => {
                            eprintln!("fdr-profiled: warning: finishing {}: {err}", thread.file);
                            dropped_write_errors += 1;
                        }
                    }
                }
                report.dropped_unmatched_exits += dropped_unmatched_exits;
                report.events_dropped_write_errors += dropped_write_errors;
                threads.push(ThreadReport {
                    tid,
                    file: thread.file,
                    records,
                    events: thread.events,
                    dropped_unmatched_exits,
                    dropped_write_errors,
                });
            }
            report.processes.push(ProcessReport {
                pid,
                binary: self.plan.display_path.clone(),
                binary_deleted: self.plan.deleted,
                dir: process.dir_name,
                threads,
            });
        }
        let json = serde_json::to_vec_pretty(&report)?;
        self.out.write_atomically(MANIFEST, &json)?;
        Ok(report)
    }

    /// The session's output directory.
    pub fn out_dir(&self) -> &std::path::Path {
        self.out.path()
    }
}

/// The thread's state, creating its process directory and file on first sight.
fn thread_of<'a>(
    processes: &'a mut BTreeMap<u32, Process>,
    out: &OutputDir,
    plan: &AttachPlan,
    clock: &Clock,
    version: FdrVersion,
    event: &SledEvent,
) -> Result<&'a mut Thread> {
    let process = match processes.entry(event.pid) {
        std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::btree_map::Entry::Vacant(e) => {
            let dir = out.create_subdir(&format!("{}-{}", plan.exe_name, event.pid))?;
            let dir_name = dir
                .path()
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            e.insert(Process {
                dir,
                dir_name,
                threads: BTreeMap::new(),
            })
        }
    };
    let thread = match process.threads.entry(event.tid) {
        std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::btree_map::Entry::Vacant(e) => {
            let name = format!("tid-{}.fdr", event.tid);
            let staging = format!(".{name}.tmp");
            let file = format!("{}/{}", process.dir_name, name);
            let handle = process.dir.create_file(&staging)?;
            let writer = ThreadWriter::with_version(
                handle,
                event.tid,
                event.pid,
                CYCLE_FREQUENCY,
                clock.wall_clock(event.ts_ns),
                version,
            )
            .map_err(|err| anyhow::anyhow!("writing {file}: {err}"))?;
            // The header and preamble are on disk: only now does the file get its name.
            process.dir.publish(&staging, &name)?;
            e.insert(Thread {
                writer: Some(writer),
                file,
                timer: CallTimer::default(),
                events: 0,
                dropped_write_errors: 0,
            })
        }
    };
    Ok(thread)
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

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec; both clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}
