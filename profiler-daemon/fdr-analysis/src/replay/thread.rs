//! Replays one thread's FDR file as well-nested calls: every exit a visitor sees closes the
//! innermost open call, so consumers can keep plain stacks.
//!
//! The file is mapped, not read: memory stays bounded whatever its size, since pages already
//! walked are handed back to the kernel as the walk goes. Exits are matched to entries as
//! `llvm-xray account` matches them; where it would give up, this reader keeps going:
//! - an exit whose function is below the top of the stack (frames above it were unwound by an
//!   exception, or lost their exit) closes those frames first, as [`CallEnd::Unwound`];
//! - an exit whose function is not on the stack at all (the entry was before tracing began) is
//!   counted and skipped;
//! - calls still open at the end of the file (or at a corrupt record) end there, as
//!   [`CallEnd::Unfinished`];
//! - calls deeper than [`MAX_DEPTH`] are counted ([`Outcome::too_deep`]), not replayed.
//!
//! The stack grows with the depth, which a trace of XRay's own runtime can make large: it
//! writes no exit for a frame an exception or `longjmp` left, so under a long-lived catcher
//! such frames stay open until the catcher returns (10,200 throws of five frames in one
//! loop: 25,500 levels in one thread). [`MAX_DEPTH`] keeps those exact while bounding the
//! memory a hostile file can ask for.
use std::path::Path;
use xray_fdr::reader::{RawRecord, ReadError, Reader};
use xray_fdr::records::FunctionAction;
use xray_fdr::writer::TYPED_EVENT_PREFIX;

/// How a call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallEnd {
    /// Its exit (or tail exit) record.
    Returned,
    /// A caller's exit came first: unwound by an exception or its exit was not recorded. The
    /// end time is the caller's exit, an upper bound.
    Unwound,
    /// The trace ends (or breaks off) with the call open. The end time is the last record's.
    Unfinished,
}

/// A finished call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// XRay function id.
    pub id: u32,
    /// Entry time, nanoseconds.
    pub start: u64,
    /// Exit time, nanoseconds.
    pub end: u64,
    /// Time spent in calls it made (their inclusive durations), nanoseconds.
    pub children: u64,
    /// Depth on the stack, 0 for outermost calls.
    pub depth: usize,
    /// How it ended.
    pub how: CallEnd,
}

impl Call {
    /// Inclusive duration.
    pub fn duration(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
    /// Exclusive duration: minus the time in calls it made.
    pub fn self_time(&self) -> u64 {
        self.duration().saturating_sub(self.children)
    }
}

/// An event record: a custom event, or a typed one.
#[derive(Clone, Copy, Debug)]
pub struct TraceEvent<'a> {
    /// When, in nanoseconds.
    pub ts: u64,
    /// `None` for a custom event, the type for a typed event (version 1 files carry typed
    /// events as custom events starting with `XRTE`; they are decoded back).
    pub event_type: Option<u16>,
    /// The payload.
    pub data: &'a [u8],
    /// The innermost open call's function id: the function whose event sled fired.
    pub function: Option<u32>,
}

/// What a replay reports, as it goes.
pub trait Visitor {
    /// A call began at `ts` (nanoseconds); `args` are the logged arguments, if any.
    fn enter(&mut self, id: u32, ts: u64, args: &[u64], depth: usize);
    /// The innermost open call ended.
    fn exit(&mut self, call: &Call);
    /// A custom or typed event.
    fn event(&mut self, _event: &TraceEvent<'_>) {}
}

/// What a replay of one file found.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Thread id in the file (the first buffer's).
    pub tid: Option<u32>,
    /// Entry records seen.
    pub entries: u64,
    /// Exits with no open call of their function, skipped.
    pub unmatched_exits: u64,
    /// Calls closed by a caller's exit.
    pub unwound: u64,
    /// Calls open at the end.
    pub unfinished: u64,
    /// Entries deeper than [`MAX_DEPTH`], not replayed (nor their exits).
    pub too_deep: u64,
    /// Custom and typed events.
    pub events: u64,
    /// First and last timestamps (ns).
    pub span: Option<(u64, u64)>,
    /// The violation that ended the file early; what came before it was replayed.
    pub error: Option<ReadError>,
}

/// Deepest stack tracked; deeper calls are counted, not reported (bounded memory on hostile
/// input: 24 bytes a level, 24 MiB at most, and as much again for a visitor's own stack).
pub const MAX_DEPTH: usize = 1 << 20;
/// How much of the mapping is walked before the pages behind are given back.
const RELEASE_STEP: usize = 16 << 20;

struct Open {
    id: u32,
    start: u64,
    children: u64,
}

/// Opens `path` for reading without blocking: the layout checked that it is a regular file,
/// but a FIFO put in its place since then would block a plain open forever; the type is then
/// checked again on the descriptor.
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
}

/// Replays the file at `path` into `visitor`: the whole file, which must hold one thread, or
/// with `only` the buffers of that thread alone (a file of XRay's own runtime holds them all).
pub fn replay(
    path: &Path,
    only: Option<u32>,
    visitor: &mut impl Visitor,
) -> std::io::Result<Outcome> {
    let file = open_nonblocking(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    // SAFETY: a read-only private mapping. The daemon only ever appends to a trace file (and
    // rewrites one byte of its last record), so the bytes read stay what they were; a file
    // truncated by someone else while it is read would fault, as reading any mapped file does.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    let mut outcome = Outcome::default();
    let mut state = State {
        stack: Vec::new(),
        too_deep: 0,
        last: 0,
        freq: 0,
        pending: None,
        args: Vec::new(),
    };
    match walk(&map, only, &mut state, &mut outcome, visitor) {
        Ok(()) => {}
        Err(e) => outcome.error = Some(e),
    }
    state.flush_pending(&mut outcome, visitor);
    while let Some(open) = state.stack.pop() {
        outcome.unfinished += 1;
        state.close(open, state.last, CallEnd::Unfinished, visitor);
    }
    Ok(outcome)
}

struct State {
    stack: Vec<Open>,
    too_deep: usize,
    last: u64,
    /// Ticks per second (0: ticks are taken as nanoseconds).
    freq: u64,
    /// An Entry_Args record whose CallArgument records are still being read.
    pending: Option<(u32, u64)>,
    args: Vec<u64>,
}

impl State {
    fn ns(&self, tsc: u64) -> u64 {
        if self.freq == 0 || self.freq == 1_000_000_000 {
            tsc
        } else {
            (u128::from(tsc) * 1_000_000_000 / u128::from(self.freq)) as u64
        }
    }

    fn enter(&mut self, id: u32, ts: u64, outcome: &mut Outcome, v: &mut impl Visitor) {
        outcome.entries += 1;
        if self.stack.len() >= MAX_DEPTH {
            self.too_deep += 1;
            outcome.too_deep += 1;
            return;
        }
        v.enter(id, ts, &self.args, self.stack.len());
        self.stack.push(Open {
            id,
            start: ts,
            children: 0,
        });
    }

    fn flush_pending(&mut self, outcome: &mut Outcome, v: &mut impl Visitor) {
        if let Some((id, ts)) = self.pending.take() {
            self.enter(id, ts, outcome, v);
            self.args.clear();
        }
    }

    fn exit(&mut self, id: u32, ts: u64, outcome: &mut Outcome, v: &mut impl Visitor) {
        if self.too_deep > 0 {
            self.too_deep -= 1;
            return;
        }
        let Some(pos) = self.stack.iter().rposition(|o| o.id == id) else {
            outcome.unmatched_exits += 1;
            return;
        };
        while self.stack.len() > pos + 1 {
            let open = self.stack.pop().expect("len > pos + 1");
            outcome.unwound += 1;
            self.close(open, ts, CallEnd::Unwound, v);
        }
        let open = self.stack.pop().expect("pos < len");
        self.close(open, ts, CallEnd::Returned, v);
    }

    fn close(&mut self, open: Open, end: u64, how: CallEnd, v: &mut impl Visitor) {
        let end = end.max(open.start);
        let call = Call {
            id: open.id,
            start: open.start,
            end,
            children: open.children,
            depth: self.stack.len(),
            how,
        };
        if let Some(parent) = self.stack.last_mut() {
            parent.children = parent.children.saturating_add(call.duration());
        }
        v.exit(&call);
    }
}

fn walk(
    bytes: &[u8],
    only: Option<u32>,
    state: &mut State,
    outcome: &mut Outcome,
    v: &mut impl Visitor,
) -> Result<(), ReadError> {
    let mut reader = Reader::new(bytes)?;
    state.freq = reader.header().cycle_frequency;
    let mut released = 0usize;
    while let Some(step) = reader.next_step()? {
        if step.ignored {
            continue;
        }
        let offset = step.offset as usize;
        if offset >= released + RELEASE_STEP {
            released = release(bytes, released, offset);
        }
        if !matches!(step.record, RawRecord::CallArgument { .. }) {
            state.flush_pending(outcome, v);
        }
        let tid = step.context.tid;
        if only.is_some_and(|only| only != tid) {
            continue;
        }
        match step.record {
            RawRecord::NewBuffer { .. } => match outcome.tid {
                None => outcome.tid = Some(tid),
                Some(first) if first != tid => {
                    return Err(ReadError::new(
                        step.offset,
                        "NewBuffer",
                        format!("a second thread ({tid} after {first}): only files of one thread each, as fdr-profiled writes them, are read"),
                    ))
                }
                Some(_) => {}
            },
            RawRecord::Function {
                action,
                function_id,
                ..
            } => {
                let ts = state.ns(step.tsc.unwrap_or(step.context.base));
                note_time(state, outcome, ts);
                match action {
                    FunctionAction::Entry => state.enter(function_id, ts, outcome, v),
                    FunctionAction::EntryArgs => state.pending = Some((function_id, ts)),
                    FunctionAction::Exit | FunctionAction::TailExit => {
                        state.exit(function_id, ts, outcome, v)
                    }
                }
            }
            RawRecord::CallArgument { value }
                if state.pending.is_some() && state.args.len() < 64 =>
            {
                state.args.push(value);
            }
            RawRecord::CustomEvent { data, .. } => {
                let ts = state.ns(step.tsc.unwrap_or(step.context.base));
                note_time(state, outcome, ts);
                let (event_type, data) = match data.strip_prefix(&TYPED_EVENT_PREFIX[..]) {
                    Some([a, b, rest @ ..]) => (Some(u16::from_le_bytes([*a, *b])), rest),
                    _ => (None, data),
                };
                event(state, outcome, v, ts, event_type, data);
            }
            RawRecord::TypedEvent {
                event_type, data, ..
            } => {
                let ts = state.ns(step.tsc.unwrap_or(step.context.base));
                note_time(state, outcome, ts);
                event(state, outcome, v, ts, Some(event_type), data);
            }
            _ => {}
        }
    }
    Ok(())
}

fn note_time(state: &mut State, outcome: &mut Outcome, ts: u64) {
    state.last = ts;
    outcome.span = Some(match outcome.span {
        None => (ts, ts),
        Some((first, _)) => (first, ts),
    });
}

fn event(
    state: &mut State,
    outcome: &mut Outcome,
    v: &mut impl Visitor,
    ts: u64,
    event_type: Option<u16>,
    data: &[u8],
) {
    outcome.events += 1;
    v.event(&TraceEvent {
        ts,
        event_type,
        data,
        function: state.stack.last().map(|o| o.id),
    });
}

/// Gives the pages of `bytes[from..to]` (whole pages only) back to the kernel; returns the new
/// release mark.
fn release(bytes: &[u8], from: usize, to: usize) -> usize {
    const PAGE: usize = 4096;
    let start = bytes.as_ptr() as usize + from;
    let end = (bytes.as_ptr() as usize + to) & !(PAGE - 1);
    if end > start && start.is_multiple_of(PAGE) {
        // SAFETY: the range lies inside the private read-only file mapping `bytes` borrows;
        // MADV_DONTNEED on such a mapping only drops page-table entries, and a later access
        // would fault the same file contents back in. Nothing is read there again anyway.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        return end - bytes.as_ptr() as usize;
    }
    from
}

/// The first timestamp of the file at `path` (ns), and the wall-clock time of its first buffer
/// (ns since the Unix epoch, microsecond precision; `None` when it says 0). The recorder writes a
/// thread's first buffer with the wall-clock time of that thread's first event, so the two
/// together place the trace's clock on the calendar.
pub fn first_timestamp(path: &Path) -> Option<(u64, Option<u64>)> {
    let file = open_nonblocking(path).ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    // SAFETY: as in `replay`.
    let map = unsafe { memmap2::Mmap::map(&file).ok()? };
    let mut reader = Reader::new(&map).ok()?;
    let state = State {
        stack: Vec::new(),
        too_deep: 0,
        last: 0,
        freq: reader.header().cycle_frequency,
        pending: None,
        args: Vec::new(),
    };
    let mut wall = None;
    while let Ok(Some(step)) = reader.next_step() {
        if step.ignored {
            continue;
        }
        if let RawRecord::WallClock { secs, micros } = step.record {
            if wall.is_none() && (secs, micros) != (0, 0) {
                wall = secs
                    .checked_mul(1_000_000_000)
                    .and_then(|ns| ns.checked_add(u64::from(micros).saturating_mul(1_000)));
            }
        }
        if let Some(tsc) = step.tsc {
            return Some((state.ns(tsc), wall));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version-1 file of one thread: `records` as (function id, entry?) with one tick each.
    fn file(records: impl IntoIterator<Item = (u32, bool)>) -> tempfile::NamedTempFile {
        let meta = |kind: u8, payload: &[u8]| {
            let mut r = [0u8; 16];
            r[0] = (kind << 1) | 1;
            r[1..1 + payload.len()].copy_from_slice(payload);
            r
        };
        let mut body = Vec::new();
        body.extend_from_slice(&meta(0, &7u32.to_le_bytes()));
        body.extend_from_slice(&meta(4, &[0; 12]));
        let mut cpu = vec![0u8, 0];
        cpu.extend_from_slice(&1000u64.to_le_bytes());
        body.extend_from_slice(&meta(2, &cpu));
        for (id, entry) in records {
            let action: u32 = if entry { 0 } else { 1 };
            body.extend_from_slice(&((id << 4) | (action << 1)).to_le_bytes());
            body.extend_from_slice(&1u32.to_le_bytes());
        }
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&1u16.to_le_bytes());
        bytes.extend_from_slice(&1u16.to_le_bytes());
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&1_000_000_000u64.to_le_bytes());
        bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&[0; 8]);
        bytes.extend_from_slice(&body);
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), bytes).unwrap();
        f
    }

    #[derive(Default)]
    struct Ends {
        returned: u64,
        unwound: u64,
        deepest: usize,
    }

    impl Visitor for Ends {
        fn enter(&mut self, _: u32, _: u64, _: &[u64], depth: usize) {
            self.deepest = self.deepest.max(depth);
        }
        fn exit(&mut self, call: &Call) {
            match call.how {
                CallEnd::Returned => self.returned += 1,
                CallEnd::Unwound => self.unwound += 1,
                CallEnd::Unfinished => {}
            }
        }
    }

    /// XRay's own runtime under a long-lived catcher: 70,000 frames left open (deeper than the
    /// former limit of 65,536), closed by the catcher's exit; every call counted.
    #[test]
    fn a_pile_of_unwound_frames_deeper_than_65536_is_replayed_exactly() {
        let n = 70_000;
        let f = file(
            std::iter::once((1, true))
                .chain((0..n).map(|i| (2 + i % 2, true)))
                .chain(std::iter::once((1, false))),
        );
        let mut ends = Ends::default();
        let o = replay(f.path(), None, &mut ends).unwrap();
        assert!(o.error.is_none(), "{:?}", o.error);
        assert_eq!(
            (o.entries, o.too_deep, o.unwound),
            (n as u64 + 1, 0, n as u64)
        );
        assert_eq!(
            (ends.returned, ends.unwound, ends.deepest),
            (1, n as u64, n as usize)
        );
    }

    /// Past [`MAX_DEPTH`], entries are counted as too deep, and the rest stays exact.
    #[test]
    fn calls_deeper_than_the_limit_are_counted() {
        let n = MAX_DEPTH as u32 + 2;
        let f = file((0..n).map(|_| (5, true)).chain((0..n).map(|_| (5, false))));
        let mut ends = Ends::default();
        let o = replay(f.path(), None, &mut ends).unwrap();
        assert!(o.error.is_none(), "{:?}", o.error);
        assert_eq!((o.entries, o.too_deep, o.unfinished), (u64::from(n), 2, 0));
        assert_eq!((ends.returned, ends.unwound), (MAX_DEPTH as u64, 0));
    }
}
