//! What a session produced, for the terminal and for `session.json`.
use crate::plan::FunctionNames;
use fdr_analysis::report::render::human_ns;
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::collections::HashSet;
use std::fmt::Write as _;

/// Per-function totals, accumulated from matched entry/exit pairs as they are written.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct FunctionTotals {
    /// Completed calls (an entry with its exit or tail exit).
    pub calls: u64,
    /// Sum of the calls' inclusive durations in nanoseconds (recursive calls count at every level,
    /// as `llvm-xray account` counts them).
    pub total_ns: u64,
}

/// Per-function totals of a session, by function id. Each function's totals stay at one place
/// in a list once it is in, so a thread's [`CallTimes`] can remember where a function's are
/// and add to them without a hash lookup per call.
#[derive(Debug, Default)]
pub struct Totals {
    /// Where each function's totals are in `list`.
    index: FxHashMap<u32, u32>,
    list: Vec<(u32, FunctionTotals)>,
    /// Calls whose exit a return probe observed, and an exit sled (or a tail sled).
    by_return_probe: u64,
    by_exit_sled: u64,
}

impl Totals {
    /// Counts one call's exit by the method that observed it (`event_flags::BY_RETURN_PROBE`).
    #[inline]
    pub fn observed(&mut self, by_return_probe: bool) {
        if by_return_probe {
            self.by_return_probe += 1;
        } else {
            self.by_exit_sled += 1;
        }
    }

    /// Calls whose exit a return probe observed, and an exit or tail sled.
    pub fn observed_calls(&self) -> (u64, u64) {
        (self.by_return_probe, self.by_exit_sled)
    }

    /// Where the totals of `function_id` are in the list, adding them if new.
    fn place(&mut self, function_id: u32) -> u32 {
        let list = &mut self.list;
        *self.index.entry(function_id).or_insert_with(|| {
            list.push((function_id, FunctionTotals::default()));
            (list.len() - 1) as u32
        })
    }

    /// Every function with its totals, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &FunctionTotals)> {
        self.list.iter().map(|(id, t)| (*id, t))
    }

    /// The totals of one function.
    pub fn get(&self, function_id: u32) -> Option<&FunctionTotals> {
        let &at = self.index.get(&function_id)?;
        Some(&self.list[at as usize].1)
    }
}

/// Entries of a thread's memory of where functions' totals are (a power of two).
const PLACES: usize = 64;

/// Adds one thread's completed calls to the session's [`Totals`]. The thread's open calls and
/// when they were entered are its trace's frames (`session::thread`), the one call stack a
/// thread has in the daemon.
#[derive(Debug)]
pub struct CallTimes {
    /// Where in [`Totals`] the functions this thread returned from lately have their totals:
    /// `(function id, place + 1)` at `id % PLACES`, 0 for none. A thread returns from a few
    /// functions over and over, and this saves the hash lookup each return would cost.
    places: [(u32, u32); PLACES],
}

impl Default for CallTimes {
    fn default() -> Self {
        CallTimes {
            places: [(0, 0); PLACES],
        }
    }
}

impl CallTimes {
    /// A call of `function_id` entered at `entered` ended (returned, tail-called out, or was
    /// proven gone) at `ts` nanoseconds.
    #[inline(always)]
    pub fn add(&mut self, function_id: u32, entered: u64, ts: u64, totals: &mut Totals) {
        let remembered = self.places[function_id as usize % PLACES];
        let place = if remembered.1 != 0 && remembered.0 == function_id {
            remembered.1 - 1
        } else {
            self.look_up(function_id, totals)
        };
        let t = &mut totals.list[place as usize].1;
        t.calls += 1;
        t.total_ns = t.total_ns.saturating_add(ts.saturating_sub(entered));
    }

    /// Where the totals of `function_id` are, remembered from now on: out of line, so that
    /// [`CallTimes::add`] stays small enough to inline.
    #[inline(never)]
    fn look_up(&mut self, function_id: u32, totals: &mut Totals) -> u32 {
        let place = totals.place(function_id);
        self.places[function_id as usize % PLACES] = (function_id, place + 1);
        place
    }
}

/// One thread's output file.
#[derive(Debug, Serialize)]
pub struct ThreadReport {
    /// Kernel thread id.
    pub tid: u32,
    /// The FDR file, relative to the session directory.
    pub file: String,
    /// Function records written.
    pub records: u64,
    /// Events received for this thread. Each ends in exactly one of: `events_written`,
    /// `exits_of_lost_entries`, `dropped_unmatched_exits`, `dropped_too_deep`, `events_invalid`,
    /// `unreadable_events`, `catches`, `dropped_write_errors`, `events_unknown`.
    pub events: u64,
    /// Events written as a record (entries, exits, custom and typed events). `records` is
    /// these function records plus the exits the recorder wrote for frames it closed.
    pub events_written: u64,
    /// Entries not written: the file's stack of open calls was at its depth cap.
    pub dropped_too_deep: u64,
    /// Custom or typed events the format cannot hold.
    pub events_invalid: u64,
    /// Events of a kind this version does not know.
    pub events_unknown: u64,
    /// Events of this thread the kernel could not queue (buffer full). Exact: the kernel
    /// numbers every event of a thread.
    pub events_lost: u64,
    /// Frames whose exit was lost: closed in the file at the first event after the loss that
    /// proves them gone.
    pub frames_closed_by_loss: u64,
    /// Exits not written because their entry was lost.
    pub exits_of_lost_entries: u64,
    /// Frames an exception or `longjmp` left without an exit of their own: closed in the file
    /// with an `Exit` at the catch, or at the first event that proves them gone (native XRay
    /// writes no exit for them).
    pub frames_unwound: u64,
    /// Frames entered beyond the kernel's 64 pending return probes per thread (no return probe
    /// reports their exit): closed at the first event that proves them gone.
    pub frames_beyond_return_limit: u64,
    /// Exceptions caught in this thread (`__cxa_begin_catch` entered).
    pub catches: u64,
    /// Exits dropped because their entry was never seen (tracing started inside the call).
    pub dropped_unmatched_exits: u64,
    /// Of `dropped_unmatched_exits`: the exits proven to be of calls entered before tracing
    /// began (each above every frame the trace entered and above the previous one: at most one
    /// per frame open then). The rest are of frames left in a way no probe saw.
    #[serde(default)]
    pub exits_entered_before_tracing: u64,
    /// The `Exit` records this recorder wrote to close frames proven gone (unwound, skipped by
    /// a `longjmp`, beyond the return-probe limit, or whose exit was lost), which XRay's own
    /// runtime does not write: runs of `[index of the first among the file's function
    /// records, count]`. `fdr-profiled dump --session DIR --xray-stream` leaves them out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub closing_exits: Vec<[u64; 2]>,
    /// Events dropped because the file could not be written.
    pub dropped_write_errors: u64,
    /// Function records made from this thread's events (counted in `events_written` and the
    /// frames closed) that never reached the file: they waited for a write that failed (the
    /// disk full). The file holds `records`, written before.
    #[serde(default)]
    pub records_not_stored: u64,
    /// Custom events written.
    pub custom_events: u64,
    /// Custom/typed events whose payload was cut to `--max-event-bytes`.
    pub custom_events_truncated: u64,
    /// Typed events written.
    pub typed_events: u64,
    /// Custom/typed events whose payload could not be read from the program (not written).
    pub unreadable_events: u64,
    /// `--exits repair`: what the repairs did in this thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repair: Option<RepairStats>,
    /// A flight-recorder snapshot: this thread's events the recorder let go of before the
    /// first one the snapshot holds (aged out of the window, or evicted under the memory cap).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<crate::session::flight::ThreadWindow>,
}

impl ThreadReport {
    /// What became of the thread's events, one name per fate, in the order of [`Self::fates`].
    pub const FATES: [&'static str; 9] = [
        "written",
        "exits of lost entries",
        "exits without entry",
        "too deep",
        "invalid",
        "unreadable",
        "catches",
        "write errors",
        "unknown",
    ];

    /// Each fate of the thread's events with its count; they add up to `events`.
    pub fn fates(&self) -> [(&'static str, u64); 9] {
        let n = [
            self.events_written,
            self.exits_of_lost_entries,
            self.dropped_unmatched_exits,
            self.dropped_too_deep,
            self.events_invalid,
            self.unreadable_events,
            self.catches,
            self.dropped_write_errors,
            self.events_unknown,
        ];
        std::array::from_fn(|i| (Self::FATES[i], n[i]))
    }
}

/// One traced process.
#[derive(Debug, Serialize)]
pub struct ProcessReport {
    /// Process id.
    pub pid: u32,
    /// The instrumented binary it ran.
    pub binary: String,
    /// The binary was deleted or replaced on disk after the process started (the file traced
    /// is the one the process runs, not what `binary` names now).
    pub binary_deleted: bool,
    /// GNU build-id of the traced file (lowercase hex), read when the session started: lets
    /// `report` and `convert` notice a binary rebuilt or replaced since the recording.
    pub build_id: Option<String>,
    /// The instrumented objects probed in it, by object id: what the trace's function ids
    /// mean (`id >> 24` is the object, `id & 0xffffff` the function in its map).
    pub objects: Vec<ObjectReport>,
    /// Its directory, relative to the session directory.
    pub dir: String,
    /// Its threads that ran instrumented code.
    pub threads: Vec<ThreadReport>,
}

/// One instrumented object of a traced process.
#[derive(Clone, Debug, Serialize)]
pub struct ObjectReport {
    /// XRay object id: 0 for the executable, whose function ids are plain; a shared object's
    /// functions appear in the trace as `(object_id << 24) | function_id`.
    pub object_id: u32,
    /// The file as the process maps it.
    pub path: String,
    /// The file was deleted or replaced on disk after it was mapped.
    pub deleted: bool,
    /// GNU build-id (lowercase hex), read when it was probed.
    pub build_id: Option<String>,
    /// Where the process mapped the file's offset 0 (0 when unknown: an object probed before
    /// it was mapped, or by path for every process).
    pub load_address: u64,
    /// Instrumented functions probed.
    pub functions: usize,
    /// Of those, the functions whose exits a return probe observes (the others': exit sleds).
    pub return_probe_functions: usize,
    /// Probes placed.
    pub probes: usize,
    /// When its probes were all in place (CLOCK_MONOTONIC ns, the clock of the trace): calls
    /// into it before then are not in the trace.
    pub attached_ns: u64,
}

/// A function's line in the summary.
#[derive(Debug, Serialize)]
pub struct FunctionReport {
    /// XRay function id.
    pub id: u32,
    /// Demangled name (or `#id`).
    pub name: String,
    /// Completed calls.
    pub calls: u64,
    /// Total inclusive time in nanoseconds.
    pub total_ns: u64,
    /// How its exits were observed: `return` (a return probe) or `sleds`.
    pub exit: &'static str,
}

/// How many functions, and how many of their calls, had their exits observed each way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ExitMethods {
    /// Functions with a return probe.
    pub return_probe_functions: usize,
    /// Functions with probes on their exit sleds.
    pub exit_sled_functions: usize,
    /// Calls whose exit a return probe observed.
    pub return_probe_calls: u64,
    /// Calls whose exit an exit sled (or a tail sled) observed. Calls closed where they were
    /// proven gone (an exception, a `longjmp`, a lost exit) are in neither.
    pub exit_sled_calls: u64,
}

/// What `--exits repair` did, in one thread or in all (`repair::keeper`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RepairStats {
    /// Throws whose frames were repaired.
    pub throws: u64,
    /// Return addresses put back at throws.
    pub frames_restored: u64,
    /// Catches at which live frames were hooked again.
    pub catches: u64,
    /// Trampolines put back at catches.
    pub frames_hooked_again: u64,
    /// Slots that did not hold what the kernel's books said (left alone).
    pub slots_left_alone: u64,
    /// Signals and stops meant for the program, passed on.
    pub signals_passed_on: u64,
    /// A running process let go (`--pid`): return addresses put back into the frames still
    /// hooked at that moment.
    #[serde(default)]
    pub frames_released: u64,
    /// Processes this thread forked, followed by the repairs (their frames are hooked too;
    /// their calls are not recorded).
    #[serde(default)]
    pub forks_followed: u64,
    /// Catches after which the thread passed once through the kernel's return trampoline, the
    /// kernel at its limit of pending return probes: it dropped `instances_dropped` instances
    /// of frames the exception left, which it would otherwise have kept, hooking no new frame.
    #[serde(default)]
    pub trampoline_passes: u64,
    #[serde(default)]
    pub instances_dropped: u64,
    /// Time the program's thread stayed stopped for its repairs, in all and at worst
    /// (nanoseconds, from its stop being seen to its resumption).
    pub repair_ns_total: u64,
    pub repair_ns_max: u64,
}

impl RepairStats {
    /// Adds `other`'s counts (the worst of both worst times).
    pub fn add(&mut self, other: &RepairStats) {
        self.throws += other.throws;
        self.frames_restored += other.frames_restored;
        self.catches += other.catches;
        self.frames_hooked_again += other.frames_hooked_again;
        self.slots_left_alone += other.slots_left_alone;
        self.signals_passed_on += other.signals_passed_on;
        self.frames_released += other.frames_released;
        self.forks_followed += other.forks_followed;
        self.trampoline_passes += other.trampoline_passes;
        self.instances_dropped += other.instances_dropped;
        self.repair_ns_total += other.repair_ns_total;
        self.repair_ns_max = self.repair_ns_max.max(other.repair_ns_max);
    }

    /// One line for the end of the summary.
    pub fn line(&self) -> String {
        let released = if self.frames_released > 0 {
            format!(
                "; {} return addresses put back when the process was let go",
                self.frames_released
            )
        } else {
            String::new()
        };
        let forks = if self.forks_followed > 0 {
            format!(
                "; {} forked processes followed (repaired, not recorded)",
                self.forks_followed
            )
        } else {
            String::new()
        };
        let passes = if self.trampoline_passes > 0 {
            format!(
                "; {} passes through the return trampoline dropped {} instances of frames exceptions left",
                self.trampoline_passes, self.instances_dropped
            )
        } else {
            String::new()
        };
        format!(
            "repair: {} throws ({} return addresses restored), {} catches ({} frames hooked again), {} slots left alone; stopped {:.3} ms for repairs, worst {:.1} us; {} signals passed on{}{}{passes}",
            self.throws,
            self.frames_restored,
            self.catches,
            self.frames_hooked_again,
            self.slots_left_alone,
            self.repair_ns_total as f64 / 1e6,
            self.repair_ns_max as f64 / 1e3,
            self.signals_passed_on,
            released,
            forks
        )
    }
}

/// What `--exits repair` did, by thread id.
pub type RepairsByThread = std::collections::BTreeMap<u32, RepairStats>;

/// Everything a session produced; serialised as `session.json`.
#[derive(Debug, Serialize)]
pub struct SessionReport {
    /// FDR version of the trace files (1 or 5).
    pub fdr_version: u16,
    /// How exits were observed: `sleds` or `return`.
    pub exits: String,
    /// Why that exit mode.
    pub exits_reason: String,
    /// Functions and calls by exit method.
    pub exit_methods: ExitMethods,
    /// A flight-recorder snapshot: the window and what the recorder held and let go of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<crate::session::flight::FlightStats>,
    /// Events received from the kernel.
    pub events: u64,
    /// Events the kernel could not deliver (ring buffer full), in total: the threads' counts
    /// plus the unattributed and malformed ones.
    pub events_lost: u64,
    /// Lost events that belong to no thread with a file (all its events lost, or the
    /// per-thread table was full).
    pub events_lost_unattributed: u64,
    /// Records that could not be decoded or were numbered inconsistently (never expected).
    pub events_malformed: u64,
    /// Events that could not be written to a file.
    pub events_dropped_write_errors: u64,
    /// Function records that never reached their file: made, but waiting for a write that
    /// failed (see [`ThreadReport::records_not_stored`]).
    #[serde(default)]
    pub records_not_stored: u64,
    /// fdr-profiled's own peak resident memory at the end of the session, in KiB (`VmHWM` of
    /// `/proc/self/status`): what the whole recording cost it at most, ring buffers included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon_peak_rss_kib: Option<u64>,
    /// Exits dropped because their entry was never seen.
    pub dropped_unmatched_exits: u64,
    /// Of those, the exits of calls entered before tracing began (see [`ThreadReport`]).
    pub exits_entered_before_tracing: u64,
    /// Return probes that fired for calls entered before recording began (the kernel hooked
    /// them while the probes were being placed): never events, as their calls are not in
    /// the trace, and counted here.
    pub returns_before_tracing: u64,
    /// Events that could not be given a file.
    pub events_ignored: u64,
    /// Custom events written.
    pub custom_events: u64,
    /// Custom/typed events whose payload was truncated.
    pub custom_events_truncated: u64,
    /// Typed events written.
    pub typed_events: u64,
    /// `--exits repair`: what the repairs did in all threads (each thread's in its report).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repair: Option<RepairStats>,
    /// `--exits repair`: the part of [`SessionReport::repair`] done in threads the session did
    /// not record (those of the processes a traced one forked, or threads with no traced call).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repair_unrecorded_threads: Option<RepairStats>,
    /// `--kernel-stats`: the time the kernel spent in each recording program.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernel_programs: Vec<crate::kernel::bpf::ProgramCost>,
    /// What happened to the traced processes that a reader of the trace must know (a process
    /// let go before it ran a program that raised its privileges), one sentence each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Traced processes.
    pub processes: Vec<ProcessReport>,
    /// Functions by total time, longest first.
    pub functions: Vec<FunctionReport>,
}

impl SessionReport {
    /// Functions ordered by total time, longest first, named.
    pub fn rank_functions(
        totals: &Totals,
        names: &FunctionNames,
        return_probed: &HashSet<u32>,
    ) -> Vec<FunctionReport> {
        let mut out: Vec<FunctionReport> = totals
            .iter()
            .map(|(id, t)| FunctionReport {
                id,
                name: names.name(id),
                calls: t.calls,
                total_ns: t.total_ns,
                exit: if return_probed.contains(&id) {
                    "return"
                } else {
                    "sleds"
                },
            })
            .collect();
        out.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.id.cmp(&b.id)));
        out
    }

    /// The human summary printed at the end of a session.
    pub fn render(&self, out_dir: &std::path::Path, top: usize) -> String {
        let threads: usize = self.processes.iter().map(|p| p.threads.len()).sum();
        let mut s = String::new();
        let _ = writeln!(s, "fdr-profiled: session summary");
        let _ = writeln!(
            s,
            "  processes: {}, threads: {}",
            self.processes.len(),
            threads
        );
        let _ = writeln!(s, "  exits: {} ({})", self.exits, self.exits_reason);
        for note in &self.notes {
            let _ = writeln!(s, "  note: {note}");
        }
        if !self.kernel_programs.is_empty() {
            let costs: Vec<String> = self
                .kernel_programs
                .iter()
                .map(|c| {
                    format!(
                        "{} {} runs, {:.1} ns/run",
                        c.program,
                        c.runs,
                        c.ns_per_run()
                    )
                })
                .collect();
            let _ = writeln!(
                s,
                "  kernel programs (BPF run-time statistics): {}",
                costs.join("; ")
            );
        }
        let m = &self.exit_methods;
        let _ = writeln!(
            s,
            "  exits observed by return probe: {} functions, {} calls; by exit sleds: {} functions, {} calls",
            m.return_probe_functions, m.return_probe_calls, m.exit_sled_functions, m.exit_sled_calls
        );
        let _ = writeln!(
            s,
            "  events: {}, events lost: {}",
            self.events, self.events_lost
        );
        let lossy: Vec<String> = self
            .processes
            .iter()
            .flat_map(|p| &p.threads)
            .filter(|t| t.events_lost > 0)
            .map(|t| format!("tid {}: {}", t.tid, t.events_lost))
            .collect();
        if !lossy.is_empty() {
            let _ = writeln!(
                s,
                "  lost per thread: {}{}",
                lossy.iter().take(8).cloned().collect::<Vec<_>>().join(", "),
                if lossy.len() > 8 { ", ..." } else { "" }
            );
            let _ = writeln!(
                s,
                "  (files stay valid: frames left during a loss are closed at the next event; \
                 exits of lost entries are not written; raise --buffer-size to lose less)"
            );
        }
        if self.events_lost_unattributed > 0 {
            let _ = writeln!(
                s,
                "  lost events of threads without a file: {}",
                self.events_lost_unattributed
            );
        }
        if self.custom_events + self.typed_events > 0 {
            let _ = writeln!(
                s,
                "  custom events: {}, typed events: {}, payloads truncated: {}",
                self.custom_events, self.typed_events, self.custom_events_truncated
            );
        }
        if self.events_dropped_write_errors + self.records_not_stored > 0 {
            let _ = writeln!(
                s,
                "  not stored (write errors, the disk full?): {} events dropped after the error, {} records lost in the failed write",
                self.events_dropped_write_errors, self.records_not_stored
            );
        }
        let threads_iter = || self.processes.iter().flat_map(|p| &p.threads);
        let unwound: u64 = threads_iter().map(|t| t.frames_unwound).sum();
        let by_loss: u64 = threads_iter().map(|t| t.frames_closed_by_loss).sum();
        let beyond: u64 = threads_iter().map(|t| t.frames_beyond_return_limit).sum();
        let lost_entries: u64 = threads_iter().map(|t| t.exits_of_lost_entries).sum();
        let catches: u64 = threads_iter().map(|t| t.catches).sum();
        if unwound + by_loss + beyond > 0 {
            let _ = writeln!(
                s,
                "  frames closed where they were proven gone: {unwound} left by exceptions or longjmp \
                 ({catches} exceptions caught), {by_loss} after lost events, {beyond} beyond the \
                 kernel's return-probe limit"
            );
        }
        // The kernel drops the return-probe instances of frames an exception or longjmp left
        // only when a later call is hooked (and not at its limit of 64) or a traced caller
        // returns: a thread whose outer frames were entered before tracing began (--pid) can
        // stay at the limit, and then its calls have no exit of their own.
        let returned = self.exit_methods.return_probe_calls;
        if beyond > 1000 && beyond.saturating_mul(20) > returned {
            let _ = writeln!(
                s,
                "  warning: {beyond} calls got no return probe (the kernel's limit of 64 pending \
                 per thread was reached: deep recursion, or return probes of frames an exception \
                 or longjmp left that the kernel drops only when a traced caller returns); they \
                 are timed to the next event that proves them gone. --exits sleds or \
                 per-function observe every exit"
            );
        }
        if let Some(repair) = &self.repair {
            let _ = writeln!(s, "  {}", repair.line());
            let mut stopped: Vec<(u32, u64)> = threads_iter()
                .filter_map(|t| Some((t.tid, t.repair?.repair_ns_total)))
                .filter(|&(_, ns)| ns > 0)
                .collect();
            stopped.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            if stopped.len() > 1 {
                let _ = writeln!(
                    s,
                    "  stopped for repairs per thread: {}{}",
                    stopped
                        .iter()
                        .take(8)
                        .map(|(tid, ns)| format!("tid {tid}: {}", human_ns(*ns)))
                        .collect::<Vec<_>>()
                        .join(", "),
                    if stopped.len() > 8 { ", ..." } else { "" }
                );
            }
        }
        let mut fates = ThreadReport::FATES.map(|name| (name, 0u64));
        for t in threads_iter() {
            for (sum, (_, n)) in fates.iter_mut().zip(t.fates()) {
                sum.1 += n;
            }
        }
        let in_files: u64 = threads_iter().map(|t| t.events).sum();
        let accounted: u64 = fates.iter().map(|(_, n)| n).sum();
        let terms: Vec<String> = fates
            .iter()
            .filter(|(name, n)| *n > 0 || *name == "written")
            .map(|(name, n)| format!("{n} {name}"))
            .collect();
        let _ = writeln!(
            s,
            "  events of traced threads: {in_files} = {}{}",
            terms.join(" + "),
            if accounted == in_files {
                String::new()
            } else {
                format!(" (INTERNAL ERROR: {accounted} accounted for)")
            }
        );
        if lost_entries > 0 {
            let _ = writeln!(s, "  exits of lost entries (not written): {lost_entries}");
        }
        if self.exits_entered_before_tracing > 0 || self.returns_before_tracing > 0 {
            let _ = writeln!(
                s,
                "  exits of calls entered before recording began (not written): {} events, {} return probes that made no event",
                self.exits_entered_before_tracing, self.returns_before_tracing
            );
        }
        let unexplained = self
            .dropped_unmatched_exits
            .saturating_sub(self.exits_entered_before_tracing);
        if unexplained > 0 {
            let _ = writeln!(
                s,
                "  exits without a traced entry, of frames left in a way no probe saw (not written): {unexplained}"
            );
        }
        if self.events_ignored > 0 {
            let _ = writeln!(s, "  events ignored: {}", self.events_ignored);
        }
        let _ = writeln!(s, "  files written: {} in {}", threads, out_dir.display());
        if let Some(kib) = self.daemon_peak_rss_kib {
            let _ = writeln!(
                s,
                "  fdr-profiled peak memory: {:.1} MiB (VmHWM)",
                kib as f64 / 1024.0
            );
        }
        if !self.functions.is_empty() {
            let _ = writeln!(s, "  top functions by total time:");
            let _ = writeln!(
                s,
                "  {:>14} {:>10} {:>12}  function",
                "total", "calls", "mean"
            );
            for f in self.functions.iter().take(top) {
                let mean = f.total_ns.checked_div(f.calls).unwrap_or(0);
                let _ = writeln!(
                    s,
                    "  {:>14} {:>10} {:>12}  {}",
                    human_ns(f.total_ns),
                    f.calls,
                    human_ns(mean),
                    f.name
                );
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_times_add_up_per_function() {
        let mut totals = Totals::default();
        let mut t = CallTimes::default();
        t.add(2, 110, 130, &mut totals);
        t.add(1, 100, 200, &mut totals);
        assert_eq!(totals.get(1).unwrap().calls, 1);
        assert_eq!(totals.get(1).unwrap().total_ns, 100);
        assert_eq!(totals.get(2).unwrap().total_ns, 20);
        assert!(totals.get(3).is_none());
        // 65 shares its place in the thread's memory with 1: both add up where they belong,
        // and a second thread adds to the same totals.
        t.add(65, 300, 305, &mut totals);
        t.add(1, 310, 320, &mut totals);
        CallTimes::default().add(65, 330, 340, &mut totals);
        t.add(65, 350, 351, &mut totals);
        assert_eq!(
            (
                totals.get(1).unwrap().calls,
                totals.get(1).unwrap().total_ns
            ),
            (2, 110)
        );
        assert_eq!(
            (
                totals.get(65).unwrap().calls,
                totals.get(65).unwrap().total_ns
            ),
            (3, 16)
        );
        // A clock that went back counts 0, never a huge duration.
        t.add(2, 500, 400, &mut totals);
        assert_eq!(totals.get(2).unwrap().total_ns, 20);
    }
}
