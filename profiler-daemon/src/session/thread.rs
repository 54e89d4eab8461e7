//! One thread's trace: its events, in program order, applied to its FDR file.
//!
//! Every event carries the stack pointer, and every entry the address of its frame's
//! return-address slot, which stays the frame's identity while it lives. On one stack a frame
//! whose slot lies below the stack pointer is gone. So each event proves dead the open frames
//! below it (at or below, for an entry or a catch) — frames an exception unwound, a `longjmp`
//! skipped, whose exit was lost, or whose return probe the kernel omitted — and they are closed
//! there, at that event's time, with an `Exit` record: the file stays loadable and their
//! durations end where they ended. A catch (`__cxa_begin_catch`) is such an event, so frames an
//! exception left are closed when it is caught. Exits are matched to frames by slot, never by a
//! count of calls: an exit whose frame is not open (entered before tracing, or lost) is not
//! written, and counted.
//!
//! What this assumes: one stack per thread. A signal handler on an alternate stack, or code
//! that switches stacks (fibers, coroutines with stacks of their own), breaks the comparison;
//! as a guard, a stack pointer more than [`STACK_SPAN`] above a frame never proves it dead.
use crate::kernel::intake::Event;
use crate::session::order::Gap;
use crate::session::summary::{CallTimes, ThreadReport, Totals};
use profiler_common::{event_flags, event_kind, SledKind};
use std::fs::File;
use std::sync::Arc;
use xray_fdr::records::FunctionAction;
use xray_fdr::writer::{Recorded, ThreadWriter};

/// The furthest the stack pointer can move up within one stack and still prove a frame dead.
/// Thread stacks are megabytes; another stack (a signal stack, a fiber's) is usually much
/// further away.
pub const STACK_SPAN: u64 = 256 << 20;

/// Whether the frame whose slot (stack pointer at entry) is `slot` is gone once the stack
/// pointer is `sp`: above it on the same stack, as after an exit of its caller.
#[inline(always)]
pub fn slot_below(slot: u64, sp: u64) -> bool {
    slot < sp && sp - slot <= STACK_SPAN
}

/// [`slot_below`], or at it: the rule for a new frame or a catch, which take the slot of a
/// frame that is gone.
#[inline(always)]
pub fn slot_at_or_below(slot: u64, sp: u64) -> bool {
    slot <= sp && sp - slot <= STACK_SPAN
}

/// Per-thread counters that end up in the session manifest. Every event received ends in
/// exactly one of: written, an exit of a lost entry, an exit without entry, too deep, invalid,
/// unreadable, a catch, a write error, unknown (see `ThreadReport::fates`).
#[derive(Debug, Default, Clone, Copy)]
pub struct ThreadCounts {
    /// Events received.
    pub events: u64,
    /// Events written to the file as a record (entries, exits, custom and typed events).
    pub events_written: u64,
    /// Entries not written because the file's stack of open calls was at its depth cap.
    pub dropped_too_deep: u64,
    /// Custom or typed events the format cannot hold (empty payload, or none delivered).
    pub events_invalid: u64,
    /// Events of a kind this version does not know.
    pub events_unknown: u64,
    /// Events the kernel could not queue (buffer full).
    pub lost: u64,
    /// Frames proven dead by the first event after a loss (their exit was among the lost
    /// events), closed at that event's time.
    pub frames_closed_by_loss: u64,
    /// Exits dropped because their entry was among the lost events.
    pub exits_of_lost_entries: u64,
    /// Frames left without an exit of their own by an exception or `longjmp`, closed at the
    /// catch or at the first event that proves them dead.
    pub frames_unwound: u64,
    /// Frames entered beyond the kernel's limit of pending return probes (they get no return
    /// probe), closed at the first event that proves them dead.
    pub frames_beyond_return_limit: u64,
    /// Exits whose frame was never entered in the trace (tracing began inside the call).
    pub exits_without_entry: u64,
    /// Of `exits_without_entry`: those proven to be of calls entered before tracing began, each
    /// above every frame the trace entered and above the previous such exit (the stack
    /// unwinding through what was open then): at most one per frame open at that moment.
    pub exits_entered_before_tracing: u64,
    /// Events dropped because the file could not be written.
    pub dropped_write_errors: u64,
    /// Custom events written.
    pub custom_events: u64,
    /// Custom/typed events whose payload was cut to `--max-event-bytes`.
    pub custom_events_truncated: u64,
    /// Typed events written.
    pub typed_events: u64,
    /// Custom/typed events whose payload could not be read from the program (not written).
    pub unreadable_events: u64,
    /// Catches seen (exceptions caught in this thread).
    pub catches: u64,
    /// Of `frames_unwound`: those proven gone by an event other than a catch (a `longjmp`, or
    /// a return probe the kernel omitted without the programs knowing it was at its limit).
    pub frames_closed_uncaught: u64,
    /// Frames of a function the budget dropped while they were open (its exit no longer
    /// probed), closed where they were proven gone.
    pub frames_closed_by_budget: u64,
}

/// The functions an overhead budget stopped tracing, each with the times it did (monotonic
/// ns, the events' clock): a frame of one, open at such a time, gets no exit of its own.
#[derive(Debug, Default)]
pub struct Drops {
    any: std::sync::atomic::AtomicBool,
    at: std::sync::RwLock<std::collections::HashMap<u32, Vec<u64>>>,
}

impl Drops {
    /// Function `function_id` (the trace's id) stopped being traced at `at_ns`.
    pub fn add(&self, function_id: u32, at_ns: u64) {
        let mut at = self.at.write().unwrap_or_else(|e| e.into_inner());
        at.entry(function_id).or_default().push(at_ns);
        self.any.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether `function_id` was dropped after `from_ns` and by `to_ns`.
    pub fn between(&self, function_id: u32, from_ns: u64, to_ns: u64) -> bool {
        if !self.any.load(std::sync::atomic::Ordering::Acquire) {
            return false;
        }
        let at = self.at.read().unwrap_or_else(|e| e.into_inner());
        at.get(&function_id)
            .is_some_and(|times| times.iter().any(|&t| t > from_ns && t <= to_ns))
    }
}

/// What became of one event.
enum Fate {
    Written,
    ExitOfLostEntry,
    ExitWithoutEntry,
    TooDeep,
    Invalid,
    Unreadable,
    Catch,
    Unknown,
    /// The thread's end marker: not an event of the program.
    End,
}

impl Fate {
    fn of(r: Recorded) -> Fate {
        match r {
            Recorded::Written
            | Recorded::WrittenAfterUnwind { .. }
            | Recorded::WrittenAsCustomEvent => Fate::Written,
            Recorded::DroppedUnmatchedExit => Fate::ExitWithoutEntry,
            Recorded::DroppedStackOverflow => Fate::TooDeep,
            Recorded::DroppedInvalidEvent => Fate::Invalid,
        }
    }
}

/// A frame open in the file.
#[derive(Debug, Clone, Copy)]
struct Frame {
    function_id: u32,
    /// Address of its return-address slot.
    slot: u64,
    /// Entered beyond the kernel's return-probe limit: no exit will be reported for it.
    no_return: bool,
    /// The thread's count of losses when the frame was entered: a frame closed after a later
    /// loss may have lost its exit, and is counted as closed by loss.
    losses_at_entry: u64,
    /// When it was entered (its duration goes into the session's totals when it closes).
    entered: u64,
}

/// A thread's file and bookkeeping.
pub struct ThreadTrace {
    /// Boxed: [`ThreadTrace::apply`] takes it out and puts it back for every event, and the
    /// writer is a few hundred bytes.
    writer: Option<Box<ThreadWriter<File>>>,
    /// Path relative to the session directory.
    pub file: String,
    /// The frames open in the writer, outermost first.
    frames: Vec<Frame>,
    /// The highest slot any written entry had: an exit above it belongs to a call entered
    /// before tracing began.
    highest_slot: u64,
    /// The slot of the last exit of a call entered before tracing began: each next one is
    /// above it.
    before_tracing_slot: u64,
    /// Gaps of lost events so far.
    losses: u64,
    /// The exits this recorder wrote to close frames proven gone (XRay's runtime writes none):
    /// runs of `[index of the first among the file's function records, count]`.
    closing_exits: Vec<[u64; 2]>,
    /// Adds the calls that end to the session's totals.
    times: CallTimes,
    last_ts: u64,
    /// Counters.
    pub counts: ThreadCounts,
    /// The functions the budget dropped (shared by every thread of the session).
    drops: Arc<Drops>,
    /// Set once the file could not be written (the disk full) and the writer is gone: what
    /// the file holds, and what was made but never stored.
    failed: Option<WriteFailure>,
}

/// A thread's file after a write error: the file is its last commit (see `xray_fdr::commit`).
#[derive(Debug, Clone, Copy)]
struct WriteFailure {
    /// Function records on disk.
    records: u64,
    /// Function records made but not on disk (they were waiting for the failed commit).
    not_stored: u64,
}

impl WriteFailure {
    fn of(writer: &ThreadWriter<File>) -> WriteFailure {
        let s = writer.stats();
        WriteFailure {
            records: s.committed_records,
            not_stored: s.records - s.committed_records,
        }
    }
}

impl ThreadTrace {
    /// Wraps a writer whose preamble is on disk as `file`.
    pub fn new(writer: ThreadWriter<File>, file: String, drops: Arc<Drops>) -> ThreadTrace {
        ThreadTrace {
            drops,
            writer: Some(Box::new(writer)),
            file,
            frames: Vec::new(),
            highest_slot: 0,
            before_tracing_slot: 0,
            losses: 0,
            closing_exits: Vec::new(),
            times: CallTimes::default(),
            last_ts: 0,
            counts: ThreadCounts::default(),
            failed: None,
        }
    }

    /// Frames closed by an event other than a catch so far (see [`ThreadCounts`]).
    pub fn frames_closed_uncaught(&self) -> u64 {
        self.counts.frames_closed_uncaught
    }

    /// Applies the thread's next event. Write errors close the file as it stands (still valid)
    /// with a warning; later events are counted as dropped.
    pub fn apply(&mut self, event: &Event, gap: Option<Gap>, totals: &mut Totals) {
        let h = &event.header;
        let ts = if h.ts_ns == 0 { self.last_ts } else { h.ts_ns };
        if let Some(gap) = gap {
            self.counts.lost += gap.lost;
            self.losses += 1;
        }
        if h.kind != event_kind::THREAD_EXIT {
            self.counts.events += 1;
        }
        let Some(mut writer) = self.writer.take() else {
            if h.kind != event_kind::THREAD_EXIT {
                self.counts.dropped_write_errors += 1;
            }
            return;
        };
        let made_before = writer.stats().records;
        match self.write(&mut writer, event, ts, totals) {
            Ok(fate) => {
                let c = &mut self.counts;
                match fate {
                    Fate::Written => c.events_written += 1,
                    Fate::ExitOfLostEntry => c.exits_of_lost_entries += 1,
                    Fate::ExitWithoutEntry => c.exits_without_entry += 1,
                    Fate::TooDeep => c.dropped_too_deep += 1,
                    Fate::Invalid => c.events_invalid += 1,
                    Fate::Unreadable => c.unreadable_events += 1,
                    Fate::Catch => c.catches += 1,
                    Fate::Unknown => c.events_unknown += 1,
                    Fate::End => {}
                }
                self.writer = Some(writer);
            }
            Err(err) => {
                errln!(
                    "fdr-profiled: warning: writing {}: {err}; later events of thread {} are dropped",
                    self.file, h.tid
                );
                if h.kind != event_kind::THREAD_EXIT {
                    if writer.stats().records > made_before {
                        // Its record was made, and lost with the commit that failed: counted
                        // in `records_not_stored`.
                        self.counts.events_written += 1;
                    } else {
                        self.counts.dropped_write_errors += 1;
                    }
                }
                self.failed = Some(WriteFailure::of(&writer));
            }
        }
        self.last_ts = self.last_ts.max(ts);
    }

    /// Closes, innermost first, the open frames `dead` says are gone. Nearly always none is:
    /// that test is inlined, the closing is not.
    #[inline(always)]
    fn close_dead(
        &mut self,
        writer: &mut ThreadWriter<File>,
        at_catch: bool,
        dead: impl Fn(u64) -> bool,
        ts: u64,
        cpu: u16,
        totals: &mut Totals,
    ) -> std::io::Result<()> {
        match self.frames.last() {
            Some(top) if dead(top.slot) => {
                self.close_dead_frames(writer, at_catch, dead, ts, cpu, totals)
            }
            _ => Ok(()),
        }
    }

    /// [`ThreadTrace::close_dead`] once the innermost frame is gone.
    #[inline(never)]
    fn close_dead_frames(
        &mut self,
        writer: &mut ThreadWriter<File>,
        at_catch: bool,
        dead: impl Fn(u64) -> bool,
        ts: u64,
        cpu: u16,
        totals: &mut Totals,
    ) -> std::io::Result<()> {
        while let Some(&top) = self.frames.last() {
            if !dead(top.slot) {
                break;
            }
            let index = writer.stats().records;
            writer.function(FunctionAction::Exit, top.function_id, ts, cpu)?;
            match self.closing_exits.last_mut() {
                Some([first, count]) if *first + *count == index => *count += 1,
                _ => self.closing_exits.push([index, 1]),
            }
            self.times.add(top.function_id, top.entered, ts, totals);
            self.frames.pop();
            if top.no_return {
                self.counts.frames_beyond_return_limit += 1;
            } else if self.losses > top.losses_at_entry {
                self.counts.frames_closed_by_loss += 1;
            } else if self.drops.between(top.function_id, top.entered, ts) {
                self.counts.frames_closed_by_budget += 1;
            } else {
                self.counts.frames_unwound += 1;
                if !at_catch {
                    self.counts.frames_closed_uncaught += 1;
                }
            }
        }
        Ok(())
    }

    fn write(
        &mut self,
        writer: &mut ThreadWriter<File>,
        event: &Event,
        ts: u64,
        totals: &mut Totals,
    ) -> std::io::Result<Fate> {
        let h = &event.header;
        let cpu = h.cpu;
        let sp = h.sp;
        let below = |slot: u64| slot_below(slot, sp);
        let at_or_below = |slot: u64| slot_at_or_below(slot, sp);
        if h.kind == event_kind::THREAD_EXIT {
            return Ok(Fate::End);
        }
        if h.kind == event_kind::CATCH {
            self.close_dead(writer, true, at_or_below, ts, cpu, totals)?;
            return Ok(Fate::Catch);
        }
        let fate = match SledKind::from_u8(h.kind) {
            Some(kind @ (SledKind::Entry | SledKind::LogArgsEntry)) => {
                self.close_dead(writer, false, at_or_below, ts, cpu, totals)?;
                let r = if kind == SledKind::LogArgsEntry {
                    writer.entry_with_args(h.function_id, ts, cpu, &event.args[..event.nargs])?
                } else {
                    writer.function(FunctionAction::Entry, h.function_id, ts, cpu)?
                };
                if matches!(r, Recorded::Written) && writer.depth() > self.frames.len() {
                    self.frames.push(Frame {
                        function_id: h.function_id,
                        slot: sp,
                        no_return: h.flags & event_flags::NO_RETURN != 0,
                        losses_at_entry: self.losses,
                        entered: ts,
                    });
                    self.highest_slot = self.highest_slot.max(sp);
                }
                Fate::of(r)
            }
            Some(kind @ (SledKind::Exit | SledKind::Tail)) => {
                self.close_dead(writer, false, below, ts, cpu, totals)?;
                match self.frames.last() {
                    Some(&top) if top.slot == sp && top.function_id == h.function_id => {
                        let action = if kind == SledKind::Tail {
                            FunctionAction::TailExit
                        } else {
                            FunctionAction::Exit
                        };
                        let r = writer.function(action, h.function_id, ts, cpu)?;
                        if matches!(r, Recorded::Written | Recorded::WrittenAfterUnwind { .. }) {
                            self.times.add(top.function_id, top.entered, ts, totals);
                            totals.observed(h.flags & event_flags::BY_RETURN_PROBE != 0);
                        }
                        self.frames.pop();
                        Fate::of(r)
                    }
                    Some(top) if top.slot == sp => {
                        // Another function returns from this frame's slot: the frame is gone
                        // (left in a way no probe saw); the exit has no traced entry.
                        self.close_dead(writer, false, at_or_below, ts, cpu, totals)?;
                        self.unmatched_exit(true)
                    }
                    _ => {
                        if sp > self.highest_slot && sp > self.before_tracing_slot {
                            self.before_tracing_slot = sp;
                            self.counts.exits_entered_before_tracing += 1;
                        }
                        self.unmatched_exit(sp <= self.highest_slot)
                    }
                }
            }
            Some(kind @ (SledKind::CustomEvent | SledKind::TypedEvent)) => {
                self.close_dead(writer, false, below, ts, cpu, totals)?;
                write_event(writer, &mut self.counts, kind, event, ts)?
            }
            None => Fate::Unknown,
        };
        Ok(fate)
    }

    /// What an exit whose frame is not open is: the exit of a lost entry when events were
    /// lost and its frame lay within what was traced (`within`: not above every frame entered
    /// in the trace), else the exit of a call entered before tracing began.
    fn unmatched_exit(&self, within: bool) -> Fate {
        if self.losses > 0 && within {
            Fate::ExitOfLostEntry
        } else {
            Fate::ExitWithoutEntry
        }
    }

    /// Makes the file on disk a complete trace of what was recorded so far.
    /// After a write error the file stays as its last commit left it and later events are
    /// dropped (counted), as in [`ThreadTrace::apply`].
    pub fn flush(&mut self) {
        let Some(writer) = self.writer.as_mut() else {
            return;
        };
        if let Err(err) = writer.flush() {
            errln!(
                "fdr-profiled: warning: writing {}: {err}; later events of this thread are dropped",
                self.file
            );
            self.failed = Some(WriteFailure::of(writer));
            self.writer = None;
        }
    }

    /// Finalizes the file (closing it) and returns the thread's line of the manifest.
    pub fn finish(self, tid: u32) -> ThreadReport {
        let mut failed = self.failed;
        let mut records = failed.map_or(0, |f| f.records);
        let dropped_write_errors = self.counts.dropped_write_errors;
        if let Some(writer) = self.writer {
            let before = WriteFailure::of(&writer);
            match (*writer).finish() {
                Ok((_, stats)) => {
                    records = stats.records;
                }
                Err(err) => {
                    errln!("fdr-profiled: warning: finishing {}: {err}", self.file);
                    records = before.records;
                    failed = Some(before);
                }
            }
        }
        let c = self.counts;
        ThreadReport {
            tid,
            file: self.file,
            records,
            events: c.events,
            events_lost: c.lost,
            frames_closed_by_loss: c.frames_closed_by_loss,
            exits_of_lost_entries: c.exits_of_lost_entries,
            frames_unwound: c.frames_unwound,
            frames_beyond_return_limit: c.frames_beyond_return_limit,
            frames_closed_by_budget: c.frames_closed_by_budget,
            catches: c.catches,
            dropped_unmatched_exits: c.exits_without_entry,
            exits_entered_before_tracing: c.exits_entered_before_tracing,
            closing_exits: self.closing_exits,
            dropped_write_errors,
            records_not_stored: failed.map_or(0, |f| f.not_stored),
            events_written: c.events_written,
            dropped_too_deep: c.dropped_too_deep,
            events_invalid: c.events_invalid,
            events_unknown: c.events_unknown,
            custom_events: c.custom_events,
            custom_events_truncated: c.custom_events_truncated,
            typed_events: c.typed_events,
            unreadable_events: c.unreadable_events,
            repair: None,
            window: None,
        }
    }
}

/// Writes a custom or typed event.
fn write_event(
    writer: &mut ThreadWriter<File>,
    counts: &mut ThreadCounts,
    kind: SledKind,
    event: &Event,
    ts: u64,
) -> std::io::Result<Fate> {
    let Some(data) = event.data.as_deref() else {
        return Ok(Fate::Invalid);
    };
    if event.header.flags & event_flags::UNREADABLE != 0 {
        return Ok(Fate::Unreadable);
    }
    if (data.bytes.len() as u64) < data.size {
        counts.custom_events_truncated += 1;
    }
    let cpu = event.header.cpu;
    let r = if kind == SledKind::TypedEvent {
        writer.typed_event(ts, cpu, data.event_type as u16, &data.bytes)?
    } else {
        writer.custom_event(ts, cpu, &data.bytes)?
    };
    if matches!(r, Recorded::Written | Recorded::WrittenAsCustomEvent) {
        if kind == SledKind::TypedEvent {
            counts.typed_events += 1;
        } else {
            counts.custom_events += 1;
        }
    }
    Ok(Fate::of(r))
}
