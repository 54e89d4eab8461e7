//! Streaming writer of one XRay FDR file per thread, version 1 (default) or 5.
//!
//! File layout: version 1 is `Header NewBuffer WallClockTime NewCPUId Body* EndOfBuffer`;
//! version 5 is `Header (BufferExtents NewBuffer WallClockTime Pid NewCPUId Body*)
//! (BufferExtents Body*)*`. Either way there is one NewBuffer: llvm-xray reorders several blocks
//! of one thread unreliably. Records reach the disk in commits (at [`ThreadWriter::flush`], at
//! [`ThreadWriter::finish`], and whenever [`COMMIT_BYTES`] are pending) that keep the file
//! loadable at every instant, even under SIGKILL mid-write: see [`super::commit`]. The commits
//! leave a few no-op `TSCWrap(base)` records (base unchanged) in version 1 files.
//!
//! Validity policy: every file this writer leaves must load in `llvm-xray convert` and pass
//! `llvm-xray account` without `-keep-going` or `-deduce-sibling-calls` (LLVM 14 and 19).
//! `account` replays each thread with a shadow stack and rejects (checked by experiment, both
//! versions):
//! - an Exit/Tail_Exit when the stack is empty ("Error processing record ... (empty stack)");
//! - an Exit/Tail_Exit whose function is not the top of the stack, even when it is deeper in it;
//! - a record whose absolute tsc is smaller than an earlier one's.
//!
//! So the writer keeps its own shadow stack and, since input comes from uprobes and is untrusted:
//! - an exit of a function that is not on the stack at all (tracing started mid-call, or a lost
//!   entry) is dropped and counted;
//! - an exit of a function deeper in the stack (lost exits of its callees, longjmp, exceptions)
//!   first gets synthetic Exit records, at the same tick, for every frame above it, then the real
//!   record is written. Merely popping those frames silently would leave the file unloadable by
//!   `account`; the synthetic exits make it balanced and are counted as `unwound_frames`;
//! - ticks are clamped so they never decrease, events included.
//!
//! Events: custom events carry their payload as is. Version 1 has no typed-event record, so a
//! typed event is written as a custom event whose payload is [`TYPED_EVENT_PREFIX`], the type
//! (u16, little-endian) and the typed payload; it is counted in `typed_as_custom`.
#![warn(missing_docs)]

use std::io;

use super::commit::{Disk, Pending};
use super::records::{self, MAX_FUNCTION_ID, METADATA_RECORD_SIZE};
pub use super::records::{FunctionAction, WallClock};
pub use super::sink::TraceSink;
pub use super::version::FdrVersion;

/// Default cap on the shadow stack depth. Deeper recursion is still traced up to this depth; the
/// cap only bounds memory (4 bytes per frame) against runaway or corrupt input.
pub const MAX_STACK_DEPTH: usize = 1 << 16;

/// Pending bytes that trigger a commit without waiting for a flush: bounds memory per thread.
pub const COMMIT_BYTES: usize = 64 * 1024;

/// Largest event payload accepted (bigger events are dropped and counted): keeps the event and
/// its commit within the `i32` sizes of the format with room to spare.
pub const MAX_EVENT_PAYLOAD: usize = 1 << 30;

/// First bytes of the custom-event payload that stands for a typed event in version 1, followed
/// by the type (u16 LE) and the typed payload.
pub const TYPED_EVENT_PREFIX: [u8; 4] = *b"XRTE";

/// What the writer did with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The record was written.
    Written,
    /// An exit of a function deeper in the shadow stack: `frames` synthetic Exit records (same
    /// tick) closed the frames above it, then the record was written.
    WrittenAfterUnwind {
        /// Number of frames closed by synthetic exits.
        frames: usize,
    },
    /// An exit of a function that is not on the shadow stack; writing it would make the file
    /// fail `llvm-xray account`, so it was dropped.
    DroppedUnmatchedExit,
    /// The shadow stack was at its depth cap: the entry (or the exit assumed to match such a
    /// dropped entry) was not written.
    DroppedStackOverflow,
    /// A typed event in a version 1 file, written as a custom event (see the module docs).
    WrittenAsCustomEvent,
    /// An event with an empty payload (the format cannot express one) or a payload over
    /// [`MAX_EVENT_PAYLOAD`]; nothing was written.
    DroppedInvalidEvent,
}

/// Counters for one thread's file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadStats {
    /// Function records written, synthetic exits included (= entries + exits + tail_exits).
    pub records: u64,
    /// Entry and EntryArgs records written.
    pub entries: u64,
    /// Exit records written, synthetic ones included.
    pub exits: u64,
    /// Tail_Exit records written.
    pub tail_exits: u64,
    /// CallArgument records written.
    pub call_arguments: u64,
    /// Custom events written (typed events written as custom events included).
    pub custom_events: u64,
    /// Typed events written as TypedEventMarker records (version 5).
    pub typed_events: u64,
    /// Typed events written as custom events because the version has no record for them.
    pub typed_as_custom: u64,
    /// Events dropped because of their payload size.
    pub dropped_events: u64,
    /// Exits dropped because their function was not on the shadow stack.
    pub dropped_unmatched_exits: u64,
    /// Frames closed by a synthetic Exit because a function deeper in the stack exited.
    pub unwound_frames: u64,
    /// Entries and exits dropped because the shadow stack was at its depth cap.
    pub stack_overflow_drops: u64,
    /// TSCWrap records written because a delta did not fit (no-op TSCWraps left by commits are
    /// not counted).
    pub tsc_wraps: u64,
    /// NewCPUId records written because the thread moved to another CPU (the first NewCPUId of
    /// the file is not a change).
    pub cpu_changes: u64,
    /// Records whose tick was before an earlier record's and was clamped to it.
    pub clamped_tscs: u64,
    /// Deepest shadow stack seen.
    pub max_depth: usize,
    /// Commits that put records on disk.
    pub commits: u64,
    /// Bytes of the file on disk after the last commit, header included.
    pub bytes: u64,
    /// Of `records`: those on disk (committed). After an I/O error the rest never will be.
    pub committed_records: u64,
}

/// Writes one thread's FDR file incrementally.
///
/// Memory is bounded: at most [`COMMIT_BYTES`] of pending records (plus one event payload) and
/// the shadow stack, capped at [`MAX_STACK_DEPTH`] frames (see
/// [`ThreadWriter::with_max_stack_depth`]).
pub struct ThreadWriter<W: TraceSink> {
    out: W,
    version: FdrVersion,
    disk: Disk,
    pending: Pending,
    scratch: Vec<u8>,
    commit_bytes: usize,
    /// CPU of the last real NewCPUId; `None` until the first record.
    cpu: Option<u16>,
    /// Delta base: absolute tick of the last record that set or advanced it.
    base: u64,
    /// Latest tick written; records are clamped to it so time never goes backwards.
    floor: u64,
    stack: Vec<u32>,
    max_stack_depth: usize,
    /// Entries dropped at the depth cap that have not been matched by an exit yet.
    overflow_depth: u64,
    /// Set after an I/O error: the file is still valid (commits are atomic in effect), but its
    /// state is unknown, so nothing more is written.
    poisoned: bool,
    stats: ThreadStats,
}

fn invalid_input(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e)
}

impl<W: TraceSink> ThreadWriter<W> {
    /// A version 1 writer: same as [`ThreadWriter::with_version`] with pid 0 (version 1 files
    /// have no Pid record).
    pub fn new(out: W, tid: u32, cycle_frequency: u64, wall: WallClock) -> io::Result<Self> {
        Self::with_version(out, tid, 0, cycle_frequency, wall, FdrVersion::V1)
    }

    /// Writes the header (`version`, type 1, constant_tsc|nonstop_tsc, `cycle_frequency`,
    /// `buffer_size` = data length, updated at every commit) and the buffer preamble
    /// (NewBuffer(`tid`, full 32 bits), WallClockTime, Pid(`pid`) in version 5, and a placeholder
    /// NewCPUId(0, 0) so the file is valid before any record) at the sink's current position,
    /// in one write. The file is complete from then on.
    pub fn with_version(
        mut out: W,
        tid: u32,
        pid: u32,
        cycle_frequency: u64,
        wall: WallClock,
        version: FdrVersion,
    ) -> io::Result<Self> {
        let disk = Disk::create(&mut out, version, (tid, pid), cycle_frequency, wall)?;
        let stats = ThreadStats {
            bytes: disk.len(),
            ..ThreadStats::default()
        };
        Ok(ThreadWriter {
            out,
            version,
            disk,
            pending: Pending::new(version == FdrVersion::V5),
            scratch: Vec::new(),
            commit_bytes: COMMIT_BYTES,
            cpu: None,
            base: 0,
            floor: 0,
            stack: Vec::new(),
            max_stack_depth: MAX_STACK_DEPTH,
            overflow_depth: 0,
            poisoned: false,
            stats,
        })
    }

    /// Replaces the shadow stack depth cap (default [`MAX_STACK_DEPTH`]); at least 1.
    pub fn with_max_stack_depth(mut self, depth: usize) -> Self {
        self.max_stack_depth = depth.max(1);
        self
    }

    /// Replaces the pending size that triggers a commit (default [`COMMIT_BYTES`]); tests use
    /// small values to get many commits. 0 commits after every record.
    pub fn with_commit_bytes(mut self, bytes: usize) -> Self {
        self.commit_bytes = bytes;
        self
    }

    /// The layout this writer produces.
    pub fn version(&self) -> FdrVersion {
        self.version
    }

    /// Records one function event at absolute tick `tsc` on `cpu`, applying the validity policy
    /// of this module (see the module docs).
    ///
    /// Writes NewCPUId(cpu, tsc) first when `cpu` differs from the last one (or none yet), and
    /// TSCWrap(tsc) when the delta from the base does not fit in u32. A tick before an earlier
    /// record's is clamped to it (delta 0) and counted. A function id over 28 bits is an
    /// `InvalidInput` error and writes nothing.
    #[inline(always)]
    pub fn function(
        &mut self,
        action: FunctionAction,
        function_id: u32,
        tsc: u64,
        cpu: u16,
    ) -> io::Result<Recorded> {
        check_function_id(function_id)?;
        self.check_poisoned()?;
        if action.is_entry() {
            return self.enter(action, function_id, tsc, cpu, &[]);
        }
        // Exits while dropped entries are outstanding belong to those entries (the only way to
        // get there is recursion deeper than the cap), so they are dropped with them.
        if self.overflow_depth > 0 {
            self.overflow_depth -= 1;
            self.stats.stack_overflow_drops += 1;
            return Ok(Recorded::DroppedStackOverflow);
        }
        let Some(index) = self.stack.iter().rposition(|&f| f == function_id) else {
            self.stats.dropped_unmatched_exits += 1;
            return Ok(Recorded::DroppedUnmatchedExit);
        };
        let frames = self.stack.len() - 1 - index;
        // Innermost frame first, as real returns would have come; all at the same tick.
        for i in (index + 1..self.stack.len()).rev() {
            let callee = self.stack[i];
            self.emit(FunctionAction::Exit, callee, tsc, cpu)?;
        }
        self.emit(action, function_id, tsc, cpu)?;
        self.stack.truncate(index);
        self.stats.unwound_frames += frames as u64;
        self.maybe_commit()?;
        Ok(if frames == 0 {
            Recorded::Written
        } else {
            Recorded::WrittenAfterUnwind { frames }
        })
    }

    /// An Entry_Args record for `function_id` followed by one CallArgument record per value of
    /// `args`, in order (the grammar's `Entry_Args CallArgument*`). Same NewCPUId/TSCWrap and
    /// validity rules as [`ThreadWriter::function`].
    pub fn entry_with_args(
        &mut self,
        function_id: u32,
        tsc: u64,
        cpu: u16,
        args: &[u64],
    ) -> io::Result<Recorded> {
        check_function_id(function_id)?;
        self.check_poisoned()?;
        self.enter(FunctionAction::EntryArgs, function_id, tsc, cpu, args)
    }

    /// A custom event at `tsc` on `cpu` with `payload` (1 to [`MAX_EVENT_PAYLOAD`] bytes; others
    /// are dropped and counted). Version 1 writes the absolute tick (the delta base stays);
    /// version 5 a delta from the base (the base moves to the event, as llvm-xray reads it).
    pub fn custom_event(&mut self, tsc: u64, cpu: u16, payload: &[u8]) -> io::Result<Recorded> {
        self.check_poisoned()?;
        if payload.is_empty() || payload.len() > MAX_EVENT_PAYLOAD {
            self.stats.dropped_events += 1;
            return Ok(Recorded::DroppedInvalidEvent);
        }
        self.event(tsc, cpu, None, payload)?;
        self.stats.custom_events += 1;
        self.maybe_commit()?;
        Ok(Recorded::Written)
    }

    /// A typed event of type `event_type` at `tsc` on `cpu` with `payload`. Version 5 writes a
    /// TypedEventMarker; version 1 has none, so it writes a custom event whose payload is
    /// [`TYPED_EVENT_PREFIX`], the type (u16 LE), then `payload` (see the module docs).
    pub fn typed_event(
        &mut self,
        tsc: u64,
        cpu: u16,
        event_type: u16,
        payload: &[u8],
    ) -> io::Result<Recorded> {
        self.check_poisoned()?;
        let as_custom = !self.version.has_typed_events();
        let extra = if as_custom { 6 } else { 0 };
        if payload.is_empty() || payload.len() + extra > MAX_EVENT_PAYLOAD {
            self.stats.dropped_events += 1;
            return Ok(Recorded::DroppedInvalidEvent);
        }
        if as_custom {
            let mut wrapped = Vec::with_capacity(payload.len() + extra);
            wrapped.extend_from_slice(&TYPED_EVENT_PREFIX);
            wrapped.extend_from_slice(&event_type.to_le_bytes());
            wrapped.extend_from_slice(payload);
            self.event(tsc, cpu, None, &wrapped)?;
            self.stats.custom_events += 1;
            self.stats.typed_as_custom += 1;
        } else {
            self.event(tsc, cpu, Some(event_type), payload)?;
            self.stats.typed_events += 1;
        }
        self.maybe_commit()?;
        Ok(if as_custom {
            Recorded::WrittenAsCustomEvent
        } else {
            Recorded::Written
        })
    }

    /// Commits every pending record, so the file on disk is a complete, loadable trace of
    /// everything recorded so far with `buffer_size` matching its data. Cheap when nothing is
    /// pending.
    pub fn flush(&mut self) -> io::Result<()> {
        self.check_poisoned()?;
        self.commit()
    }

    /// Commits what is pending and returns the sink and final stats. Version 1 files end with
    /// EndOfBuffer.
    pub fn finish(mut self) -> io::Result<(W, ThreadStats)> {
        self.flush()?;
        Ok((self.out, self.stats))
    }

    /// Counters so far.
    pub fn stats(&self) -> &ThreadStats {
        &self.stats
    }

    /// Current shadow stack depth (frames written and not yet exited).
    pub fn depth(&self) -> usize {
        self.stack.len()
    }

    /// The innermost frame written and not yet exited.
    pub fn top(&self) -> Option<u32> {
        self.stack.last().copied()
    }

    /// The latest tick written (later records are clamped to it).
    pub fn last_tsc(&self) -> u64 {
        self.floor
    }

    /// The sink, for tests that inspect or sabotage it.
    #[cfg(test)]
    pub(crate) fn sink_mut(&mut self) -> &mut W {
        &mut self.out
    }

    #[inline(always)]
    fn check_poisoned(&self) -> io::Result<()> {
        if self.poisoned {
            return Err(io::Error::other(
                "FDR writer: an earlier I/O error stopped this file (it holds what was committed)",
            ));
        }
        Ok(())
    }

    #[inline(always)]
    fn enter(
        &mut self,
        action: FunctionAction,
        function_id: u32,
        tsc: u64,
        cpu: u16,
        args: &[u64],
    ) -> io::Result<Recorded> {
        // Once an entry has been dropped at the cap, every deeper entry must be dropped too,
        // or the stack would hold a frame whose caller was never written.
        if self.overflow_depth > 0 || self.stack.len() >= self.max_stack_depth {
            self.overflow_depth += 1;
            self.stats.stack_overflow_drops += 1;
            return Ok(Recorded::DroppedStackOverflow);
        }
        self.emit(action, function_id, tsc, cpu)?;
        for &arg in args {
            // One unit with the Entry_Args record: a cut file never shows it without them.
            self.pending.extend_last(&records::call_argument(arg));
            self.stats.call_arguments += 1;
        }
        self.stack.push(function_id);
        self.stats.max_depth = self.stats.max_depth.max(self.stack.len());
        self.maybe_commit()?;
        Ok(Recorded::Written)
    }

    /// Clamps `tsc`, and queues the NewCPUId (cpu changed) or TSCWrap (delta over `max_delta`)
    /// the next record needs. Returns the clamped tick.
    #[inline(always)]
    fn prepare(&mut self, tsc: u64, cpu: u16, max_delta: u64) -> u64 {
        let tsc = if tsc < self.floor {
            self.stats.clamped_tscs += 1;
            self.floor
        } else {
            tsc
        };
        if self.cpu != Some(cpu) {
            self.pending.push_record(&records::new_cpu_id(cpu, tsc));
            if self.cpu.is_some() {
                self.stats.cpu_changes += 1;
            }
            self.cpu = Some(cpu);
            self.base = tsc;
        } else if tsc - self.base > max_delta {
            self.pending.push_record(&records::tsc_wrap(tsc));
            self.stats.tsc_wraps += 1;
            self.base = tsc;
        }
        self.floor = tsc;
        tsc
    }

    /// Queues one function record with whatever NewCPUId/TSCWrap it needs, advancing the base.
    #[inline(always)]
    fn emit(
        &mut self,
        action: FunctionAction,
        function_id: u32,
        tsc: u64,
        cpu: u16,
    ) -> io::Result<()> {
        let tsc = self.prepare(tsc, cpu, u64::from(u32::MAX));
        let delta = (tsc - self.base) as u32;
        let rec = records::function_record(action, function_id, delta).map_err(invalid_input)?;
        self.pending.push_record(&rec);
        self.base = tsc;
        self.stats.records += 1;
        match action {
            FunctionAction::Entry | FunctionAction::EntryArgs => self.stats.entries += 1,
            FunctionAction::Exit => self.stats.exits += 1,
            FunctionAction::TailExit => self.stats.tail_exits += 1,
        }
        Ok(())
    }

    /// Queues an event marker and its payload as one record. `event_type` is `Some` only for
    /// version 5 typed events.
    fn event(
        &mut self,
        tsc: u64,
        cpu: u16,
        event_type: Option<u16>,
        payload: &[u8],
    ) -> io::Result<()> {
        let size = payload.len() as u32;
        let marker: [u8; METADATA_RECORD_SIZE] = match self.version {
            FdrVersion::V1 => {
                let tsc = self.prepare(tsc, cpu, u64::MAX);
                records::custom_event_marker_v1(size, tsc)
            }
            FdrVersion::V5 => {
                let tsc = self.prepare(tsc, cpu, i32::MAX as u64);
                let delta = (tsc - self.base) as i32;
                self.base = tsc;
                match event_type {
                    Some(t) => records::typed_event_marker(size, delta, t),
                    None => records::custom_event_marker_v5(size, delta),
                }
            }
        }
        .map_err(invalid_input)?;
        self.pending.push(&[&marker, payload]);
        Ok(())
    }

    #[inline]
    fn maybe_commit(&mut self) -> io::Result<()> {
        if self.pending.len() >= self.commit_bytes {
            self.commit()?;
        }
        Ok(())
    }

    fn commit(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let result = self
            .disk
            .commit(&mut self.out, &self.pending, self.base, &mut self.scratch);
        if let Err(err) = result {
            self.poisoned = true;
            return Err(err);
        }
        self.pending.clear(self.commit_bytes.max(4096));
        self.stats.commits += 1;
        self.stats.bytes = self.disk.len();
        self.stats.committed_records = self.stats.records;
        Ok(())
    }
}

#[inline]
fn check_function_id(function_id: u32) -> io::Result<()> {
    if function_id > MAX_FUNCTION_ID {
        return Err(invalid_input(records::RecordError::FunctionIdTooLarge(
            function_id,
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
