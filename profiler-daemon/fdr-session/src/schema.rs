//! The types of `session.json`: what a recording wrote, declared once for the recorder that
//! writes them and the readers that read them back.
//!
//! Reading is lenient where that is safe: unknown fields are ignored and a field a manifest
//! lacks takes its default, so manifests of older and newer versions both load. Only what no
//! manifest can lack is required: `processes`, each process's `pid`, each thread's `tid` and
//! `file`, each object's `object_id`. The values are untrusted (anyone may have written the
//! file): the reader (`fdr-analysis`'s `replay::layout`) checks paths and ids before using them.
use serde::{Deserialize, Serialize};

/// One thread's output file.
#[derive(Debug, Serialize, Deserialize)]
pub struct ThreadReport {
    /// Kernel thread id.
    pub tid: u32,
    /// The FDR file, relative to the session directory.
    pub file: String,
    /// Function records written.
    #[serde(default)]
    pub records: u64,
    /// Events received for this thread. Each ends in exactly one of: `events_written`,
    /// `exits_of_lost_entries`, `dropped_unmatched_exits`, `dropped_too_deep`, `events_invalid`,
    /// `unreadable_events`, `catches`, `dropped_write_errors`, `events_unknown`.
    #[serde(default)]
    pub events: u64,
    /// Events written as a record (entries, exits, custom and typed events). `records` is
    /// these function records plus the exits the recorder wrote for frames it closed.
    #[serde(default)]
    pub events_written: u64,
    /// Entries not written: the file's stack of open calls was at its depth cap.
    #[serde(default)]
    pub dropped_too_deep: u64,
    /// Custom or typed events the format cannot hold.
    #[serde(default)]
    pub events_invalid: u64,
    /// Events of a kind this version does not know.
    #[serde(default)]
    pub events_unknown: u64,
    /// Events of this thread the kernel could not queue (buffer full). Exact: the kernel
    /// numbers every event of a thread.
    #[serde(default)]
    pub events_lost: u64,
    /// Frames whose exit was lost: closed in the file at the first event after the loss that
    /// proves them gone.
    #[serde(default)]
    pub frames_closed_by_loss: u64,
    /// Exits not written because their entry was lost.
    #[serde(default)]
    pub exits_of_lost_entries: u64,
    /// Frames an exception or `longjmp` left without an exit of their own: closed in the file
    /// with an `Exit` at the catch, or at the first event that proves them gone (native XRay
    /// writes no exit for them).
    #[serde(default)]
    pub frames_unwound: u64,
    /// Frames entered beyond the kernel's 64 pending return probes per thread (no return probe
    /// reports their exit): closed at the first event that proves them gone.
    #[serde(default)]
    pub frames_beyond_return_limit: u64,
    /// Frames of a function the overhead budget stopped tracing while they were open (their
    /// exit no longer probed): closed at the first event that proves them gone.
    #[serde(default)]
    pub frames_closed_by_budget: u64,
    /// Exceptions caught in this thread (`__cxa_begin_catch` entered).
    #[serde(default)]
    pub catches: u64,
    /// Exits dropped because their entry was never seen (tracing started inside the call).
    #[serde(default)]
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
    #[serde(default)]
    pub dropped_write_errors: u64,
    /// Function records made from this thread's events (counted in `events_written` and the
    /// frames closed) that never reached the file: they waited for a write that failed (the
    /// disk full). The file holds `records`, written before.
    #[serde(default)]
    pub records_not_stored: u64,
    /// Custom events written.
    #[serde(default)]
    pub custom_events: u64,
    /// Custom/typed events whose payload was cut to `--max-event-bytes`.
    #[serde(default)]
    pub custom_events_truncated: u64,
    /// Typed events written.
    #[serde(default)]
    pub typed_events: u64,
    /// Custom/typed events whose payload could not be read from the program (not written).
    #[serde(default)]
    pub unreadable_events: u64,
    /// `--exits repair`: what the repairs did in this thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<RepairStats>,
    /// A flight-recorder snapshot: this thread's events the recorder let go of before the
    /// first one the snapshot holds (aged out of the window, or evicted under the memory cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<ThreadWindow>,
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
///
/// `Objects` is how its `objects` are held: the recorder writes a list of [`ObjectReport`]s; a
/// reader takes the list as it is (`Option<Vec<serde_json::Value>>`: absent in manifests of
/// older versions, one bad entry not spoiling the others) and reads each entry as an
/// [`ObjectReport`] on its own.
#[derive(Debug, Serialize, Deserialize)]
#[serde(bound(deserialize = "Objects: Deserialize<'de> + Default"))]
pub struct ProcessReport<Objects = Vec<ObjectReport>> {
    /// Process id.
    pub pid: u32,
    /// The instrumented binary it ran.
    #[serde(default)]
    pub binary: String,
    /// The binary was deleted or replaced on disk after the process started (the file traced
    /// is the one the process runs, not what `binary` names now).
    #[serde(default)]
    pub binary_deleted: bool,
    /// GNU build-id of the traced file (lowercase hex), read when the session started: lets
    /// `report` and `convert` notice a binary rebuilt or replaced since the recording.
    #[serde(default)]
    pub build_id: Option<String>,
    /// The instrumented objects probed in it, by object id: what the trace's function ids
    /// mean (`id >> 24` is the object, `id & 0xffffff` the function in its map).
    #[serde(default)]
    pub objects: Objects,
    /// Its directory, relative to the session directory.
    #[serde(default)]
    pub dir: String,
    /// Its threads that ran instrumented code.
    #[serde(default)]
    pub threads: Vec<ThreadReport>,
}

/// One instrumented object of a traced process.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ObjectReport {
    /// XRay object id: 0 for the executable, whose function ids are plain; a shared object's
    /// functions appear in the trace as `(object_id << 24) | function_id`.
    pub object_id: u32,
    /// The file as the process maps it.
    #[serde(default)]
    pub path: String,
    /// The file was deleted or replaced on disk after it was mapped.
    #[serde(default)]
    pub deleted: bool,
    /// GNU build-id (lowercase hex), read when it was probed.
    #[serde(default)]
    pub build_id: Option<String>,
    /// Where the process mapped the file's offset 0 (0 when unknown: an object probed before
    /// it was mapped, or by path for every process).
    #[serde(default)]
    pub load_address: u64,
    /// Instrumented functions probed.
    #[serde(default)]
    pub functions: usize,
    /// Of those, the functions whose exits a return probe observes (the others': exit sleds).
    #[serde(default)]
    pub return_probe_functions: usize,
    /// Probes placed.
    #[serde(default)]
    pub probes: usize,
    /// When its probes were all in place (CLOCK_MONOTONIC ns, the clock of the trace): calls
    /// into it before then are not in the trace.
    #[serde(default)]
    pub attached_ns: u64,
}

/// A function's line in the summary.
#[derive(Debug, Serialize, Deserialize)]
pub struct FunctionReport {
    /// XRay function id.
    #[serde(default)]
    pub id: u32,
    /// Demangled name (or `#id`).
    #[serde(default)]
    pub name: String,
    /// Completed calls.
    #[serde(default)]
    pub calls: u64,
    /// Total inclusive time in nanoseconds.
    #[serde(default)]
    pub total_ns: u64,
    /// How its exits were observed: `return` (a return probe) or `sleds`.
    #[serde(default)]
    pub exit: String,
    /// What its probes cost the traced threads, estimated (nanoseconds): its calls times
    /// [`ProbeCosts::per_call_ns`] of its exit method. 0 when the costs were not measured.
    #[serde(default)]
    pub probe_cost_ns: u64,
}

/// How many functions, and how many of their calls, had their exits observed each way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RepairStats {
    /// Throws whose frames were repaired.
    pub throws: u64,
    /// Return addresses put back at throws.
    pub frames_restored: u64,
    /// Catches at which live frames were hooked again.
    pub catches: u64,
    /// Trampolines put back at catches.
    pub frames_hooked_again: u64,
    /// Live frames left unhooked at catches: their functions were dropped by the overhead
    /// budget (their returns are not observed; the session closes them when proven gone).
    pub frames_left_unhooked: u64,
    /// Slots that did not hold what the kernel's books said (left alone).
    pub slots_left_alone: u64,
    /// Signals and stops meant for the program, passed on.
    pub signals_passed_on: u64,
    /// A running process let go (`--pid`): return addresses put back into the frames still
    /// hooked at that moment.
    pub frames_released: u64,
    /// Processes this thread forked, followed by the repairs (their frames are hooked too;
    /// their calls are not recorded).
    pub forks_followed: u64,
    /// Catches after which the thread passed once through the kernel's return trampoline, the
    /// kernel at its limit of pending return probes: it dropped `instances_dropped` instances
    /// of frames the exception left, which it would otherwise have kept, hooking no new frame.
    pub trampoline_passes: u64,
    pub instances_dropped: u64,
    /// Time the program's thread stayed stopped for its repairs, in all and at worst
    /// (nanoseconds, from the kernel's stamp at the throw or catch to the keeper's
    /// `PTRACE_CONT`, and [`RepairStats::resumption_ns`] after it).
    pub repair_ns_total: u64,
    pub repair_ns_max: u64,
    /// What a stop costs its thread after the keeper's `PTRACE_CONT`, until it runs again:
    /// measured once at the start on a stopped process of fdr-profiled's own.
    pub resumption_ns: u64,
}

impl RepairStats {
    /// Adds `other`'s counts (the worst of both worst times).
    pub fn add(&mut self, other: &RepairStats) {
        self.throws += other.throws;
        self.frames_restored += other.frames_restored;
        self.catches += other.catches;
        self.frames_hooked_again += other.frames_hooked_again;
        self.frames_left_unhooked += other.frames_left_unhooked;
        self.slots_left_alone += other.slots_left_alone;
        self.signals_passed_on += other.signals_passed_on;
        self.frames_released += other.frames_released;
        self.forks_followed += other.forks_followed;
        self.trampoline_passes += other.trampoline_passes;
        self.instances_dropped += other.instances_dropped;
        self.repair_ns_total += other.repair_ns_total;
        self.repair_ns_max = self.repair_ns_max.max(other.repair_ns_max);
        self.resumption_ns = self.resumption_ns.max(other.resumption_ns);
    }
}

/// Everything a session produced; serialised as `session.json`. `Objects`: see
/// [`ProcessReport`].
#[derive(Debug, Serialize, Deserialize)]
#[serde(bound(deserialize = "Objects: Deserialize<'de> + Default"))]
pub struct SessionReport<Objects = Vec<ObjectReport>> {
    /// FDR version of the trace files (1 or 5).
    #[serde(default)]
    pub fdr_version: u16,
    /// How exits were observed: `sleds` or `return`.
    #[serde(default)]
    pub exits: String,
    /// Why that exit mode.
    #[serde(default)]
    pub exits_reason: String,
    /// Functions and calls by exit method.
    #[serde(default)]
    pub exit_methods: ExitMethods,
    /// A flight-recorder snapshot: the window and what the recorder held and let go of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<FlightStats>,
    /// Events received from the kernel.
    #[serde(default)]
    pub events: u64,
    /// Events the kernel could not deliver (ring buffer full), in total: the threads' counts
    /// plus the unattributed and malformed ones.
    #[serde(default)]
    pub events_lost: u64,
    /// Lost events that belong to no thread with a file (all its events lost, or the
    /// per-thread table was full).
    #[serde(default)]
    pub events_lost_unattributed: u64,
    /// Records that could not be decoded or were numbered inconsistently (never expected).
    #[serde(default)]
    pub events_malformed: u64,
    /// Events that could not be written to a file.
    #[serde(default)]
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
    #[serde(default)]
    pub dropped_unmatched_exits: u64,
    /// Of those, the exits of calls entered before tracing began (see [`ThreadReport`]).
    #[serde(default)]
    pub exits_entered_before_tracing: u64,
    /// Return probes that fired for calls whose entry made no event (entered before
    /// recording began, or while a budget placed or removed their function's probes): never
    /// events, as their calls are not in the trace, and counted here.
    #[serde(default)]
    pub returns_before_tracing: u64,
    /// Events that could not be given a file.
    #[serde(default)]
    pub events_ignored: u64,
    /// Custom events written.
    #[serde(default)]
    pub custom_events: u64,
    /// Custom/typed events whose payload was truncated.
    #[serde(default)]
    pub custom_events_truncated: u64,
    /// Typed events written.
    #[serde(default)]
    pub typed_events: u64,
    /// `--exits repair`: what the repairs did in all threads (each thread's in its report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<RepairStats>,
    /// `--exits repair`: the part of [`SessionReport::repair`] done in threads the session did
    /// not record (those of the processes a traced one forked, or threads with no traced call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair_unrecorded_threads: Option<RepairStats>,
    /// What a probe hit cost on this host, and the session's recording time: what
    /// [`FunctionReport::probe_cost_ns`] is estimated from. `None` when not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_costs: Option<ProbeCosts>,
    /// `--max-overhead`: the budget, and the functions it dropped and re-admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetReport>,
    /// `--kernel-stats`: the time the kernel spent in each recording program.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernel_programs: Vec<ProgramCost>,
    /// What happened to the traced processes that a reader of the trace must know (a process
    /// let go before it ran a program that raised its privileges), one sentence each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Traced processes.
    pub processes: Vec<ProcessReport<Objects>>,
    /// Functions by total time, longest first.
    #[serde(default)]
    pub functions: Vec<FunctionReport>,
}

/// What the recorder holds and has let go of. Every event it was given is held, aged out or
/// evicted (`seen = events + expired + evicted`); `lost` counts the events the kernel
/// numbered in these threads but could not deliver, so that `seen + lost` is everything the
/// traced threads did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FlightStats {
    /// The window asked for, in nanoseconds.
    pub window_ns: u64,
    /// Threads with events held.
    pub threads: usize,
    /// Events held, counted as a session counts them: a snapshot of the window has as many
    /// `events`.
    pub events: u64,
    /// Threads' ends held: not events (they close the threads' files in a snapshot), but
    /// numbered by the kernel with them, so `seen`, `expired`, `evicted` and `lost`, which
    /// count what the kernel numbered, count them too: `seen = events + thread_ends +
    /// expired + evicted`.
    pub thread_ends: u64,
    /// Bytes they take (with each held thread's own bookkeeping).
    pub bytes: u64,
    /// Events (and threads' ends) that aged out of the window (the normal course).
    pub expired: u64,
    /// Events (and threads' ends) dropped before they aged out, to stay under the memory cap:
    /// a snapshot covers less than the window while this grows.
    pub evicted: u64,
    /// Events (and threads' ends) given to the recorder since it started.
    pub seen: u64,
    /// Events (and threads' ends) the kernel lost in the threads whose events were given
    /// (their gaps).
    pub lost: u64,
    /// Threads that ended and none of whose events is held any more: the last of them (the
    /// thread's end) aged out ...
    pub threads_expired: u64,
    /// ... or was evicted.
    pub threads_evicted: u64,
}

/// What a thread let go of before the first event a snapshot holds of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ThreadWindow {
    /// Its events (and its end) that aged out of the window.
    pub expired: u64,
    /// Its events (and its end) evicted to stay under the memory cap.
    pub evicted: u64,
}

/// What one probe hit costs a traced thread on this host with empty programs, by kind of
/// probe, in nanoseconds: the kernel's trap, and the emulated or single-stepped instruction.
/// Measured at the start of a session on a function of the daemon's own shaped like an XRay
/// function's sleds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrapCosts {
    /// A probe on an entry sled (`jmp +9`, emulated).
    pub entry_ns: f64,
    /// A return probe, added to the entry's (the return address hijacked, the trampoline's
    /// trap at the return).
    pub return_probe_ns: f64,
    /// A probe on an exit sled (`ret`, single-stepped out of line), added to the entry's.
    pub exit_sled_ns: f64,
}

/// What the probes of a session cost per call, from which each function's cost is estimated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProbeCosts {
    /// The traps, measured at the start.
    pub traps: TrapCosts,
    /// Mean time of one run of the recording program at a sled, and at a return probe, from
    /// the kernel's BPF run-time statistics over [`ProbeCosts::program_stats_seconds`] at the
    /// start of the recording (0 where they could not be read: the estimate is the traps').
    pub sled_program_ns: f64,
    pub return_program_ns: f64,
    pub program_stats_seconds: f64,
    /// The recording's length (armed to disarmed), over which calls per second are counted.
    pub recorded_ns: u64,
}

impl ProbeCosts {
    /// What the probes cost one call of a function whose exits are observed by `exit`
    /// (`return`: a return probe; otherwise its exit sleds), in nanoseconds.
    pub fn per_call_ns(&self, exit: &str) -> f64 {
        let entry = self.traps.entry_ns + self.sled_program_ns;
        if exit == "return" {
            entry + self.traps.return_probe_ns + self.return_program_ns
        } else {
            entry + self.traps.exit_sled_ns + self.sled_program_ns
        }
    }
}

/// What the overhead budget did in a session: a function is traced over intervals, from the
/// start (or a re-admission) to a drop (or the end); every call inside one is in the trace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BudgetReport {
    /// The limit: the overhead the probes may add to the program's threads, in percent (see
    /// the README, "An overhead budget").
    pub max_overhead_percent: f64,
    /// Functions under the budget (their calls counted, each removable on its own).
    pub functions: usize,
    /// Functions traced without it: beyond the kernel's counters, or in objects the budget
    /// does not cover.
    pub functions_unbudgeted: usize,
    /// Each drop and re-admission, in order.
    pub changes: Vec<BudgetChange>,
    /// The functions not traced at the end, by name.
    pub dropped_at_end: Vec<String>,
    /// The highest overhead estimated over one second of the functions traced, in percent,
    /// and the last.
    pub peak_overhead_percent: f64,
    pub last_overhead_percent: f64,
}

/// One function dropped or re-admitted by the budget.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BudgetChange {
    /// When, in seconds since the budget started (the recording's start; for the service,
    /// the binary's attach), and on the events' clock (`CLOCK_MONOTONIC`, ns).
    pub at_seconds: f64,
    pub at_ns: u64,
    /// Its trace function id, and its name.
    pub function_id: u32,
    pub function: String,
    /// `dropped` or `readmitted`.
    pub action: String,
    /// Its calls a second: measured when dropped, predicted when re-admitted.
    pub calls_per_second: f64,
    /// The overhead its probes alone add (or would add), in percent.
    pub overhead_percent: f64,
}

impl BudgetChange {
    /// The change as a person reads it: `dropped ds_leaf: 2.1M calls/s would cost 210%`.
    pub fn describe(&self) -> String {
        let verb = if self.action == "dropped" {
            "would cost"
        } else {
            "should cost"
        };
        format!(
            "{} {}: {} calls/s {verb} {:.1}% (at {:.1} s)",
            self.action,
            self.function,
            crate::units::human_count(self.calls_per_second),
            self.overhead_percent,
            self.at_seconds
        )
    }
}

/// The time the kernel spent running one program (`--kernel-stats`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ProgramCost {
    /// The program's name in the eBPF object.
    pub program: String,
    /// Its runs.
    pub runs: u64,
    /// Nanoseconds they took in all.
    pub run_ns: u64,
}

impl ProgramCost {
    /// Nanoseconds per run.
    pub fn ns_per_run(&self) -> f64 {
        self.run_ns as f64 / self.runs.max(1) as f64
    }
}

/// What `--exits repair` did, by thread id.
pub type RepairsByThread = std::collections::BTreeMap<u32, RepairStats>;

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(tid: u32) -> ThreadReport {
        let mut t: ThreadReport =
            serde_json::from_str(&format!(r#"{{"tid": {tid}, "file": "a-1/tid-{tid}.fdr"}}"#))
                .unwrap();
        t.events = 7;
        t.events_written = 6;
        t.catches = 1;
        t.closing_exits = vec![[2, 1]];
        t.repair = Some(RepairStats {
            throws: 1,
            ..RepairStats::default()
        });
        t.window = Some(ThreadWindow {
            expired: 3,
            evicted: 4,
        });
        t
    }

    /// What the recorder writes, a reader reads back whole: every field written is a field
    /// read, with the same meaning (written again, the same bytes).
    #[test]
    fn what_is_written_reads_back_the_same() {
        let mut report: SessionReport = serde_json::from_str(r#"{"processes": []}"#).unwrap();
        report.fdr_version = 5;
        report.exits = "return".into();
        report.events = 7;
        report.window = Some(FlightStats {
            window_ns: 10,
            seen: 9,
            ..FlightStats::default()
        });
        report.kernel_programs = vec![ProgramCost {
            program: "entry".into(),
            runs: 2,
            run_ns: 300,
        }];
        report.processes.push(ProcessReport {
            pid: 1,
            binary: "/bin/a".into(),
            binary_deleted: false,
            build_id: Some("ab".into()),
            objects: vec![ObjectReport {
                object_id: 0,
                path: "/bin/a".into(),
                deleted: false,
                build_id: Some("ab".into()),
                load_address: 0x1000,
                functions: 3,
                return_probe_functions: 2,
                probes: 5,
                attached_ns: 11,
            }],
            dir: "a-1".into(),
            threads: vec![thread(1), thread(2)],
        });
        let written = serde_json::to_string(&report).unwrap();
        let read: SessionReport = serde_json::from_str(&written).unwrap();
        assert_eq!(serde_json::to_string(&read).unwrap(), written);
        // As a reader takes it, objects raw: the same object, read on its own.
        let raw: SessionReport<Option<Vec<serde_json::Value>>> =
            serde_json::from_str(&written).unwrap();
        let objects = raw.processes[0].objects.clone().unwrap();
        let object: ObjectReport = serde_json::from_value(objects[0].clone()).unwrap();
        assert_eq!(object.load_address, 0x1000);
        assert_eq!(raw.processes[0].threads[1].window, thread(2).window);
    }

    /// A manifest of an older version, with only what every manifest has, loads with defaults;
    /// one without what every manifest has does not.
    #[test]
    fn only_what_every_manifest_has_is_required() {
        let old: SessionReport<Option<Vec<serde_json::Value>>> = serde_json::from_str(
            r#"{"processes": [{"pid": 4, "threads": [{"tid": 4, "file": "x-4/tid-4.fdr"}]}]}"#,
        )
        .unwrap();
        assert!(old.processes[0].objects.is_none());
        assert_eq!(old.processes[0].threads[0].events, 0);
        assert!(old.window.is_none());
        for bad in [
            r#"{}"#,
            r#"{"processes": [{"binary": "/bin/a"}]}"#,
            r#"{"processes": [{"pid": 4, "threads": [{"tid": 4}]}]}"#,
        ] {
            assert!(serde_json::from_str::<SessionReport>(bad).is_err(), "{bad}");
        }
    }
}
