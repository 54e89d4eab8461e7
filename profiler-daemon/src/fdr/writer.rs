//! Streaming writer of one XRay FDR version-1 file per thread.
//!
//! File layout: `Header NewBuffer WallClockTime NewCPUId Body* EndOfBuffer`, one thread buffer,
//! no padding, nothing after EndOfBuffer (llvm-xray parses trailing bytes as records).
//!
//! Validity policy: every file this writer leaves on disk after [`ThreadWriter::flush`] or
//! [`ThreadWriter::finish`] must load in `llvm-xray convert` and pass `llvm-xray account` without
//! `-keep-going` or `-deduce-sibling-calls` (LLVM 14 and 19). `account` replays each thread with a
//! shadow stack and rejects (checked by experiment, both versions):
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
//! - ticks are clamped so they never decrease (a delta is unsigned anyway).
#![warn(missing_docs)]

use std::io::{self, BufWriter, Seek, SeekFrom, Write};

pub use super::records::FunctionAction;
use super::records::{
    self, FileHeader, FUNCTION_RECORD_SIZE, HEADER_SIZE, MAX_FUNCTION_ID, METADATA_RECORD_SIZE,
};

/// Default cap on the shadow stack depth. Deeper recursion is still traced up to this depth; the
/// cap only bounds memory (4 bytes per frame) against runaway or corrupt input.
pub const MAX_STACK_DEPTH: usize = 1 << 16;

/// Wall-clock time written into the buffer's WallClockTime record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WallClock {
    /// Seconds since the Unix epoch.
    pub secs: u64,
    /// Microseconds within the second (the unit llvm-xray prints and compiler-rt writes).
    pub micros: u32,
}

impl WallClock {
    /// The current system time; before-epoch clocks read as the epoch rather than failing,
    /// because the field is informational only.
    pub fn now() -> Self {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        WallClock {
            secs: d.as_secs(),
            micros: d.subsec_micros(),
        }
    }
}

/// What [`ThreadWriter::function`] did with a record.
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
    /// Exits dropped because their function was not on the shadow stack.
    pub dropped_unmatched_exits: u64,
    /// Frames closed by a synthetic Exit because a function deeper in the stack exited.
    pub unwound_frames: u64,
    /// Entries and exits dropped because the shadow stack was at its depth cap.
    pub stack_overflow_drops: u64,
    /// TSCWrap records written (a gap of more than 2^32 - 1 ticks since the previous record).
    pub tsc_wraps: u64,
    /// NewCPUId records written because the thread moved to another CPU (the first NewCPUId of
    /// the file is not a change).
    pub cpu_changes: u64,
    /// Written records whose tick was before the previous record's and was clamped to it.
    pub clamped_tscs: u64,
    /// Deepest shadow stack seen.
    pub max_depth: usize,
    /// Bytes of the file so far (on disk after the next flush), header included.
    pub bytes: u64,
}

/// Writes one thread's FDR version-1 file incrementally.
///
/// Memory is bounded: a `BufWriter` buffer plus the shadow stack, which is capped at
/// [`MAX_STACK_DEPTH`] frames (see [`ThreadWriter::with_max_stack_depth`]).
pub struct ThreadWriter<W: Write> {
    out: BufWriter<W>,
    /// Stream position of the header, so `buffer_size` can be patched in place.
    start: u64,
    /// CPU of the last real NewCPUId; `None` until the first function record.
    cpu: Option<u16>,
    /// Whether any NewCPUId (real or the empty-file placeholder) has been written.
    cpu_record_written: bool,
    /// Delta base: absolute tick of the last function record, NewCPUId or TSCWrap.
    base: u64,
    stack: Vec<u32>,
    max_stack_depth: usize,
    /// Entries dropped at the depth cap that have not been matched by an exit yet.
    overflow_depth: u64,
    /// `buffer_size` value currently in the header on disk.
    patched_size: u64,
    /// Set after an I/O error: the byte stream may then end mid-record, so appending more would
    /// only produce garbage.
    poisoned: bool,
    stats: ThreadStats,
}

fn invalid_input(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e)
}

impl<W: Write + Seek> ThreadWriter<W> {
    /// Writes the header (version 1, type 1, constant_tsc|nonstop_tsc, `cycle_frequency`,
    /// buffer_size patched at every flush), NewBuffer(`tid`, full 32 bits) and WallClockTime.
    ///
    /// NewCPUId is written lazily before the first function record, because it carries that
    /// record's cpu and tick. The header goes at the sink's current position.
    pub fn new(mut out: W, tid: u32, cycle_frequency: u64, wall: WallClock) -> io::Result<Self> {
        let start = out.stream_position()?;
        let preamble = (2 * METADATA_RECORD_SIZE) as u64;
        let mut out = BufWriter::new(out);
        out.write_all(&FileHeader::v1(cycle_frequency, preamble).encode())?;
        out.write_all(&records::new_buffer(tid))?;
        out.write_all(&records::wall_clock_time(wall.secs, wall.micros))?;
        Ok(ThreadWriter {
            out,
            start,
            cpu: None,
            cpu_record_written: false,
            base: 0,
            stack: Vec::new(),
            max_stack_depth: MAX_STACK_DEPTH,
            overflow_depth: 0,
            patched_size: preamble,
            poisoned: false,
            stats: ThreadStats {
                bytes: HEADER_SIZE as u64 + preamble,
                ..ThreadStats::default()
            },
        })
    }

    /// Replaces the shadow stack depth cap (default [`MAX_STACK_DEPTH`]); at least 1.
    pub fn with_max_stack_depth(mut self, depth: usize) -> Self {
        self.max_stack_depth = depth.max(1);
        self
    }

    /// Records one function event at absolute tick `tsc` on `cpu`, applying the validity policy
    /// of this module (see the module docs).
    ///
    /// Writes NewCPUId(cpu, tsc) first when `cpu` differs from the last one (or none yet), and
    /// TSCWrap(tsc) when the delta from the base does not fit in u32. A tick before the base is
    /// clamped to it (delta 0) and counted. A function id over 28 bits is an `InvalidInput`
    /// error and writes nothing.
    pub fn function(
        &mut self,
        action: FunctionAction,
        function_id: u32,
        tsc: u64,
        cpu: u16,
    ) -> io::Result<Recorded> {
        if function_id > MAX_FUNCTION_ID {
            return Err(invalid_input(records::RecordError::FunctionIdTooLarge(
                function_id,
            )));
        }
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
        self.guarded(|w| {
            // Innermost frame first, as real returns would have come; all at the same tick.
            for i in (index + 1..w.stack.len()).rev() {
                let callee = w.stack[i];
                w.emit(FunctionAction::Exit, callee, tsc, cpu)?;
            }
            w.emit(action, function_id, tsc, cpu)
        })?;
        self.stack.truncate(index);
        self.stats.unwound_frames += frames as u64;
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
        if function_id > MAX_FUNCTION_ID {
            return Err(invalid_input(records::RecordError::FunctionIdTooLarge(
                function_id,
            )));
        }
        self.check_poisoned()?;
        self.enter(FunctionAction::EntryArgs, function_id, tsc, cpu, args)
    }

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
        self.guarded(|w| {
            w.emit(action, function_id, tsc, cpu)?;
            for &arg in args {
                w.put(&records::call_argument(arg))?;
                w.stats.call_arguments += 1;
            }
            Ok(())
        })?;
        self.stack.push(function_id);
        self.stats.max_depth = self.stats.max_depth.max(self.stack.len());
        Ok(Recorded::Written)
    }

    /// Pushes buffered bytes to the sink and rewrites the header's buffer_size, so the file is a
    /// complete, loadable trace at every flush.
    ///
    /// llvm-xray rejects a buffer that ends right after WallClockTime ("malformed block"), so if
    /// no function record has been written yet a placeholder NewCPUId(cpu 0, tick 0) is added
    /// first; the next function record still writes its own NewCPUId.
    pub fn flush(&mut self) -> io::Result<()> {
        self.check_poisoned()?;
        self.guarded(|w| {
            w.ensure_cpu_record()?;
            w.sync()
        })
    }

    /// Writes EndOfBuffer, patches buffer_size, flushes, and returns the sink and final stats.
    /// The writer is consumed, so nothing can follow EndOfBuffer.
    pub fn finish(mut self) -> io::Result<(W, ThreadStats)> {
        self.check_poisoned()?;
        self.guarded(|w| {
            // WallClockTime -> EndOfBuffer is an invalid transition for llvm-xray's verifier.
            w.ensure_cpu_record()?;
            w.put(&records::end_of_buffer())?;
            w.sync()
        })?;
        let out = self.out.into_inner().map_err(|e| e.into_error())?;
        Ok((out, self.stats))
    }

    /// Counters so far.
    pub fn stats(&self) -> &ThreadStats {
        &self.stats
    }

    /// Current shadow stack depth (frames written and not yet exited).
    pub fn depth(&self) -> usize {
        self.stack.len()
    }

    fn check_poisoned(&self) -> io::Result<()> {
        if self.poisoned {
            return Err(io::Error::other(
                "FDR writer: an earlier I/O error left the file truncated",
            ));
        }
        Ok(())
    }

    /// Runs `f` and poisons the writer if it fails.
    fn guarded<T>(&mut self, f: impl FnOnce(&mut Self) -> io::Result<T>) -> io::Result<T> {
        let r = f(self);
        if r.is_err() {
            self.poisoned = true;
        }
        r
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.stats.bytes += bytes.len() as u64;
        Ok(())
    }

    fn ensure_cpu_record(&mut self) -> io::Result<()> {
        if !self.cpu_record_written {
            self.put(&records::new_cpu_id(0, 0))?;
            self.cpu_record_written = true;
        }
        Ok(())
    }

    /// Writes one function record with whatever NewCPUId/TSCWrap it needs, advancing the base.
    fn emit(
        &mut self,
        action: FunctionAction,
        function_id: u32,
        tsc: u64,
        cpu: u16,
    ) -> io::Result<()> {
        let tsc = if tsc < self.base {
            self.stats.clamped_tscs += 1;
            self.base
        } else {
            tsc
        };
        if self.cpu != Some(cpu) {
            self.put(&records::new_cpu_id(cpu, tsc))?;
            if self.cpu.is_some() {
                self.stats.cpu_changes += 1;
            }
            self.cpu = Some(cpu);
            self.cpu_record_written = true;
            self.base = tsc;
        } else if tsc - self.base > u64::from(u32::MAX) {
            self.put(&records::tsc_wrap(tsc))?;
            self.stats.tsc_wraps += 1;
            self.base = tsc;
        }
        let delta = (tsc - self.base) as u32;
        let rec: [u8; FUNCTION_RECORD_SIZE] =
            records::function_record(action, function_id, delta).map_err(invalid_input)?;
        self.put(&rec)?;
        self.base = tsc;
        self.stats.records += 1;
        match action {
            FunctionAction::Entry | FunctionAction::EntryArgs => self.stats.entries += 1,
            FunctionAction::Exit => self.stats.exits += 1,
            FunctionAction::TailExit => self.stats.tail_exits += 1,
        }
        Ok(())
    }

    /// Flushes the buffer, patches buffer_size if it changed, and flushes the sink.
    fn sync(&mut self) -> io::Result<()> {
        self.out.flush()?;
        let size = self.stats.bytes - HEADER_SIZE as u64;
        let inner = self.out.get_mut();
        if size != self.patched_size {
            inner.seek(SeekFrom::Start(self.start + FileHeader::BUFFER_SIZE_OFFSET))?;
            inner.write_all(&size.to_le_bytes())?;
            inner.seek(SeekFrom::Start(self.start + self.stats.bytes))?;
            self.patched_size = size;
        }
        inner.flush()
    }
}

/// Runs the reference reader (`llvm-xray` of LLVM 14 and 19) on trace files, for tests here and
/// in other modules.
#[cfg(test)]
pub(crate) mod llvm_xray {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// The two reference readers the files must satisfy.
    pub(crate) const VERSIONS: [&str; 2] = [
        "/usr/lib/llvm-14/bin/llvm-xray",
        "/usr/lib/llvm-19/bin/llvm-xray",
    ];

    /// One expanded record as `llvm-xray convert --output-format=yaml` reports it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) struct XrayRecord {
        pub func_id: u32,
        /// `function-enter`, `function-exit`, `function-tail-exit`, `function-enter-arg`.
        pub kind: String,
        pub tsc: u64,
        pub cpu: u16,
        pub thread: u32,
    }

    fn tool(path: &str) -> PathBuf {
        let p = PathBuf::from(path);
        assert!(
            p.exists(),
            "{path} is missing: install the Debian packages `llvm` (LLVM 14) and `llvm-19`"
        );
        p
    }

    pub(crate) fn run(tool_path: &str, args: &[&str]) -> (bool, String) {
        let out = Command::new(tool(tool_path))
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {tool_path}: {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    fn field<'a>(line: &'a str, key: &str) -> &'a str {
        let at = line
            .find(key)
            .unwrap_or_else(|| panic!("no {key} in {line}"))
            + key.len();
        let rest = &line[at..];
        let end = rest.find([',', '}']).unwrap_or(rest.len());
        rest[..end].trim()
    }

    fn parse_yaml(yaml: &str) -> Vec<XrayRecord> {
        yaml.lines()
            .filter(|l| l.trim_start().starts_with("- {"))
            .map(|l| XrayRecord {
                func_id: field(l, " func-id: ").parse().unwrap(),
                kind: field(l, " kind: ").to_string(),
                tsc: field(l, " tsc: ").parse().unwrap(),
                cpu: field(l, " cpu: ").parse().unwrap(),
                thread: field(l, " thread: ").parse().unwrap(),
            })
            .collect()
    }

    /// Loads `path` with `convert --output-format=yaml` in both versions (no instrumentation map
    /// needed when not symbolizing), asserts both succeed and agree, and returns the records.
    pub(crate) fn load_records(path: &Path) -> Vec<XrayRecord> {
        let p = path.to_str().unwrap();
        let mut results = Vec::new();
        for v in VERSIONS {
            let (ok, text) = run(v, &["convert", "--output-format=yaml", p]);
            let (_, dump) = run(v, &["fdr-dump", "-verify", p]);
            assert!(
                ok,
                "{v} convert failed on {p}:\n{text}\nfdr-dump -verify says:\n{dump}"
            );
            results.push(parse_yaml(&text));
        }
        assert_eq!(
            results[0], results[1],
            "llvm-xray 14 and 19 disagree on {p}"
        );
        results.pop().unwrap()
    }

    /// `fdr-dump` output lines (raw records with deltas) of both versions, asserted equal.
    pub(crate) fn dump(path: &Path) -> Vec<String> {
        let p = path.to_str().unwrap();
        let mut results = Vec::new();
        for v in VERSIONS {
            let (ok, text) = run(v, &["fdr-dump", p]);
            assert!(ok, "{v} fdr-dump failed on {p}:\n{text}");
            results.push(text.lines().map(str::to_string).collect::<Vec<_>>());
        }
        assert_eq!(
            results[0], results[1],
            "llvm-xray 14 and 19 dump {p} differently"
        );
        results.pop().unwrap()
    }

    /// Asserts `llvm-xray account` (both versions, no -keep-going) accepts the file; returns the
    /// LLVM 19 report.
    pub(crate) fn account(path: &Path, instr_map: Option<&Path>) -> String {
        let p = path.to_str().unwrap();
        let map_arg = instr_map.map(|m| format!("-instr_map={}", m.display()));
        let mut args = vec!["account", p];
        if let Some(m) = &map_arg {
            args.push(m);
        }
        let mut last = String::new();
        for v in VERSIONS {
            let (ok, text) = run(v, &args);
            assert!(ok, "{v} account rejected {p}:\n{text}");
            last = text;
        }
        last
    }
}

#[cfg(test)]
mod tests {
    use super::llvm_xray::{self, XrayRecord};
    use super::*;
    use std::fs::File;
    use std::io::Cursor;
    use std::path::{Path, PathBuf};

    use FunctionAction::{Entry, EntryArgs, Exit, TailExit};

    const WALL: WallClock = WallClock {
        secs: 1_700_000_000,
        micros: 5,
    };

    fn rec(func_id: u32, kind: &str, tsc: u64, cpu: u16, thread: u32) -> XrayRecord {
        XrayRecord {
            func_id,
            kind: kind.to_string(),
            tsc,
            cpu,
            thread,
        }
    }

    fn kind(a: FunctionAction) -> &'static str {
        match a {
            Entry => "function-enter",
            Exit => "function-exit",
            TailExit => "function-tail-exit",
            EntryArgs => "function-enter-arg",
        }
    }

    /// Writes `events` (action, fid, tsc, cpu) for thread `tid` into `dir/name`.
    fn write_trace(
        dir: &Path,
        name: &str,
        tid: u32,
        events: &[(FunctionAction, u32, u64, u16)],
    ) -> (PathBuf, ThreadStats, Vec<Recorded>) {
        let path = dir.join(name);
        let mut w =
            ThreadWriter::new(File::create(&path).unwrap(), tid, 1_000_000_000, WALL).unwrap();
        let results = events
            .iter()
            .map(|&(a, f, t, c)| w.function(a, f, t, c).unwrap())
            .collect();
        let (_, stats) = w.finish().unwrap();
        (path, stats, results)
    }

    fn expected(tid: u32, events: &[(FunctionAction, u32, u64, u16)]) -> Vec<XrayRecord> {
        events
            .iter()
            .map(|&(a, f, t, c)| rec(f, kind(a), t, c, tid))
            .collect()
    }

    fn assert_buffer_size(path: &Path) {
        let bytes = std::fs::read(path).unwrap();
        let size = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
        assert_eq!(
            size,
            bytes.len() as u64 - 32,
            "buffer_size of {}",
            path.display()
        );
    }

    fn bytes_of(events: &[(FunctionAction, u32, u64, u16)]) -> Vec<u8> {
        let mut w = ThreadWriter::new(Cursor::new(Vec::new()), 7, 1000, WALL).unwrap();
        for &(a, f, t, c) in events {
            w.function(a, f, t, c).unwrap();
        }
        w.finish().unwrap().0.into_inner()
    }

    // ---- exact bytes, no external tools ----

    #[test]
    fn exact_file_bytes() {
        let got = bytes_of(&[(Entry, 5, 100, 2), (Exit, 5, 130, 2)]);
        let mut want = FileHeader::v1(1000, 16 * 4 + 8 * 2).encode().to_vec();
        want.extend_from_slice(&records::new_buffer(7));
        want.extend_from_slice(&records::wall_clock_time(WALL.secs, WALL.micros));
        want.extend_from_slice(&records::new_cpu_id(2, 100));
        want.extend_from_slice(&records::function_record(Entry, 5, 0).unwrap());
        want.extend_from_slice(&records::function_record(Exit, 5, 30).unwrap());
        want.extend_from_slice(&records::end_of_buffer());
        assert_eq!(got, want);
    }

    #[test]
    fn header_goes_at_current_position() {
        let mut c = Cursor::new(Vec::new());
        c.write_all(b"prefix").unwrap();
        let mut w = ThreadWriter::new(c, 1, 1000, WALL).unwrap();
        w.function(Entry, 1, 10, 0).unwrap();
        let (c, stats) = w.finish().unwrap();
        let v = c.into_inner();
        assert_eq!(&v[..6], b"prefix");
        assert_eq!(v.len() as u64, 6 + stats.bytes);
        assert_eq!(
            u64::from_le_bytes(v[6 + 16..6 + 24].try_into().unwrap()),
            stats.bytes - 32
        );
    }

    #[test]
    fn function_id_over_28_bits_is_rejected_and_writes_nothing() {
        let mut w = ThreadWriter::new(Cursor::new(Vec::new()), 1, 1000, WALL).unwrap();
        let e = w.function(Entry, 1 << 28, 10, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(w.stats().bytes, 64);
        assert_eq!(
            w.function(Entry, MAX_FUNCTION_ID, 10, 0).unwrap(),
            Recorded::Written
        );
    }

    #[test]
    fn policy_results_and_stats() {
        let mut w = ThreadWriter::new(Cursor::new(Vec::new()), 1, 1000, WALL).unwrap();
        assert_eq!(
            w.function(Exit, 9, 5, 0).unwrap(),
            Recorded::DroppedUnmatchedExit
        );
        assert_eq!(w.function(Entry, 1, 10, 0).unwrap(), Recorded::Written);
        assert_eq!(w.function(Entry, 2, 11, 0).unwrap(), Recorded::Written);
        assert_eq!(w.function(Entry, 3, 12, 0).unwrap(), Recorded::Written);
        assert_eq!(
            w.function(TailExit, 9, 13, 0).unwrap(),
            Recorded::DroppedUnmatchedExit
        );
        assert_eq!(
            w.function(Exit, 1, 14, 0).unwrap(),
            Recorded::WrittenAfterUnwind { frames: 2 }
        );
        assert_eq!(w.depth(), 0);
        let s = w.stats().clone();
        assert_eq!(s.records, 6);
        assert_eq!(s.entries, 3);
        assert_eq!(s.exits, 3);
        assert_eq!(s.dropped_unmatched_exits, 2);
        assert_eq!(s.unwound_frames, 2);
        assert_eq!(s.max_depth, 3);
        assert_eq!(s.cpu_changes, 0);
    }

    #[test]
    fn stack_cap_drops_deeper_frames_in_pairs() {
        let mut w = ThreadWriter::new(Cursor::new(Vec::new()), 1, 1000, WALL)
            .unwrap()
            .with_max_stack_depth(2);
        assert_eq!(w.function(Entry, 1, 1, 0).unwrap(), Recorded::Written);
        assert_eq!(w.function(Entry, 1, 2, 0).unwrap(), Recorded::Written);
        assert_eq!(
            w.function(Entry, 1, 3, 0).unwrap(),
            Recorded::DroppedStackOverflow
        );
        assert_eq!(
            w.function(Entry, 1, 4, 0).unwrap(),
            Recorded::DroppedStackOverflow
        );
        assert_eq!(
            w.function(Exit, 1, 5, 0).unwrap(),
            Recorded::DroppedStackOverflow
        );
        assert_eq!(
            w.function(Exit, 1, 6, 0).unwrap(),
            Recorded::DroppedStackOverflow
        );
        assert_eq!(w.function(Exit, 1, 7, 0).unwrap(), Recorded::Written);
        assert_eq!(w.function(Exit, 1, 8, 0).unwrap(), Recorded::Written);
        assert_eq!(w.stats().stack_overflow_drops, 4);
        assert_eq!(w.stats().max_depth, 2);
    }

    /// A sink that fails on demand, to check that an I/O error poisons the writer.
    struct Failing {
        inner: Cursor<Vec<u8>>,
        fail: bool,
    }
    impl Write for Failing {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            if self.fail {
                return Err(io::Error::other("disk full"));
            }
            self.inner.write(b)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    impl Seek for Failing {
        fn seek(&mut self, p: SeekFrom) -> io::Result<u64> {
            self.inner.seek(p)
        }
    }

    #[test]
    fn io_error_poisons_writer() {
        let sink = Failing {
            inner: Cursor::new(Vec::new()),
            fail: false,
        };
        let mut w = ThreadWriter::new(sink, 1, 1000, WALL).unwrap();
        w.function(Entry, 1, 1, 0).unwrap();
        w.out.get_mut().fail = true;
        assert!(w.flush().is_err());
        w.out.get_mut().fail = false;
        assert!(w.function(Exit, 1, 2, 0).is_err());
        assert!(w.flush().is_err());
        assert!(w.finish().is_err());
    }

    // ---- reference reader tests: llvm-xray 14 and 19 ----

    #[test]
    fn basic_trace_loads_and_matches() {
        let dir = tempfile::tempdir().unwrap();
        let ev = [
            (Entry, 1, 1000, 0),
            (EntryArgs, 2, 1010, 0),
            (Exit, 2, 1020, 0),
            (Exit, 1, 1025, 0),
        ];
        let (p, stats, _) = write_trace(dir.path(), "basic.fdr", 4242, &ev);
        assert_eq!(llvm_xray::load_records(&p), expected(4242, &ev));
        assert_buffer_size(&p);
        assert_eq!(stats.bytes, std::fs::metadata(&p).unwrap().len());
        assert_eq!(
            llvm_xray::dump(&p),
            [
                "<Thread ID: 4242>",
                "<Wall Time: seconds = 1700000000.000005>",
                "<CPU: id = 0, tsc = 1000>",
                "<Function Enter: #1 delta = +0>",
                "<Function Enter With Arg: #2 delta = +10>",
                "<Function Exit: #2 delta = +10>",
                "<Function Exit: #1 delta = +5>",
                "<End of Buffer>",
            ]
        );
        llvm_xray::account(&p, None);
    }

    #[test]
    fn entry_with_arguments_loads_with_its_arguments() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("args.fdr");
        let mut w =
            ThreadWriter::new(File::create(&path).unwrap(), 9, 1_000_000_000, WALL).unwrap();
        w.function(Entry, 1, 100, 0).unwrap();
        w.entry_with_args(2, 110, 0, &[u64::MAX, 7]).unwrap();
        w.function(Exit, 2, 120, 0).unwrap();
        w.entry_with_args(2, 130, 1, &[]).unwrap();
        w.function(Exit, 2, 140, 1).unwrap();
        w.function(Exit, 1, 150, 1).unwrap();
        let (_, stats) = w.finish().unwrap();
        assert_eq!(stats.call_arguments, 2);
        assert_eq!(stats.entries, 3);
        assert_buffer_size(&path);
        assert_eq!(
            llvm_xray::load_records(&path),
            vec![
                rec(1, "function-enter", 100, 0, 9),
                rec(2, "function-enter-arg", 110, 0, 9),
                rec(2, "function-exit", 120, 0, 9),
                rec(2, "function-enter-arg", 130, 1, 9),
                rec(2, "function-exit", 140, 1, 9),
                rec(1, "function-exit", 150, 1, 9),
            ]
        );
        let dump = llvm_xray::dump(&path);
        let args: Vec<&String> = dump
            .iter()
            .filter(|l| l.starts_with("<Call Argument"))
            .collect();
        assert_eq!(args.len(), 2, "{dump:?}");
        assert!(args[0].contains(&u64::MAX.to_string()), "{dump:?}");
        assert!(args[1].contains("= 7"), "{dump:?}");
        llvm_xray::account(&path, None);
    }

    #[test]
    fn tsc_wrap_gap_over_u32() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = 5_000_000u64;
        let ev = [
            (Entry, 1, t0, 0),
            (Entry, 2, t0 + u64::from(u32::MAX), 0), // exactly fits: no wrap
            (Exit, 2, t0 + u64::from(u32::MAX) + (1 << 32), 0), // one past: wrap
            (Exit, 1, t0 + (10 << 32) + 17, 0),
        ];
        let (p, stats, _) = write_trace(dir.path(), "wrap.fdr", 1, &ev);
        assert_eq!(stats.tsc_wraps, 2);
        assert_eq!(llvm_xray::load_records(&p), expected(1, &ev));
        let dump = llvm_xray::dump(&p);
        assert_eq!(
            dump.iter().filter(|l| l.starts_with("<TSC Wrap")).count(),
            2,
            "{dump:?}"
        );
        assert!(dump.contains(&format!("<TSC Wrap: base = {}>", t0 + (10 << 32) + 17)));
        llvm_xray::account(&p, None);
    }

    #[test]
    fn cpu_changes_reset_base() {
        let dir = tempfile::tempdir().unwrap();
        let ev = [
            (Entry, 1, 100, 3),
            (Entry, 2, 150, 7),
            (Exit, 2, 160, 7),
            (Exit, 1, 170, 3),
            (Entry, 1, 200, 65535),
            (Exit, 1, 201, 65535),
        ];
        let (p, stats, _) = write_trace(dir.path(), "cpu.fdr", 9, &ev);
        assert_eq!(stats.cpu_changes, 3);
        assert_eq!(llvm_xray::load_records(&p), expected(9, &ev));
        let dump = llvm_xray::dump(&p);
        let cpus: Vec<_> = dump
            .iter()
            .filter(|l| l.starts_with("<CPU:"))
            .cloned()
            .collect();
        assert_eq!(
            cpus,
            [
                "<CPU: id = 3, tsc = 100>",
                "<CPU: id = 7, tsc = 150>",
                "<CPU: id = 3, tsc = 170>",
                "<CPU: id = 65535, tsc = 200>",
            ]
        );
        llvm_xray::account(&p, None);
    }

    #[test]
    fn tail_exits() {
        let dir = tempfile::tempdir().unwrap();
        // f tail-calls g, g returns straight to f's caller.
        let ev = [
            (Entry, 1, 10, 0),
            (Entry, 2, 20, 0),
            (TailExit, 2, 30, 0),
            (Entry, 3, 31, 0),
            (Exit, 3, 40, 0),
            (TailExit, 1, 50, 1),
        ];
        let (p, stats, res) = write_trace(dir.path(), "tail.fdr", 3, &ev);
        assert!(res.iter().all(|r| *r == Recorded::Written));
        assert_eq!(stats.tail_exits, 2);
        assert_eq!(llvm_xray::load_records(&p), expected(3, &ev));
        llvm_xray::account(&p, None);
    }

    #[test]
    fn deep_recursion() {
        let dir = tempfile::tempdir().unwrap();
        let depth = 20_000u64;
        let mut ev = Vec::new();
        for i in 0..depth {
            ev.push((Entry, 42, 1000 + i, (i % 4) as u16));
        }
        for i in 0..depth {
            ev.push((Exit, 42, 1000 + depth + i * 3, 1));
        }
        let (p, stats, _) = write_trace(dir.path(), "deep.fdr", 11, &ev);
        assert_eq!(stats.max_depth, depth as usize);
        assert_eq!(stats.records, 2 * depth);
        assert_eq!(llvm_xray::load_records(&p), expected(11, &ev));
        assert_buffer_size(&p);
        llvm_xray::account(&p, None);
    }

    #[test]
    fn recursion_beyond_cap_stays_loadable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cap.fdr");
        let mut w = ThreadWriter::new(File::create(&path).unwrap(), 5, 1000, WALL)
            .unwrap()
            .with_max_stack_depth(100);
        for i in 0..150 {
            w.function(Entry, 8, 10 + i, 0).unwrap();
        }
        for i in 0..150 {
            w.function(Exit, 8, 500 + i, 0).unwrap();
        }
        let (_, stats) = w.finish().unwrap();
        assert_eq!(stats.stack_overflow_drops, 100);
        let got = llvm_xray::load_records(&path);
        assert_eq!(got.len(), 200);
        // The outer 100 frames keep their own entries; their exits are the last 100 seen.
        assert_eq!(got[99], rec(8, "function-enter", 109, 0, 5));
        assert_eq!(got[100], rec(8, "function-exit", 550, 0, 5));
        llvm_xray::account(&path, None);
    }

    #[test]
    fn large_thread_ids() {
        let dir = tempfile::tempdir().unwrap();
        // 70000 needs more than the spec's 16 bits; 4194304 is Linux's PID_MAX_LIMIT.
        for tid in [70_000u32, 4_194_304, 65_536] {
            let ev = [(Entry, 1, 10, 0), (Exit, 1, 20, 0)];
            let (p, _, _) = write_trace(dir.path(), &format!("tid{tid}.fdr"), tid, &ev);
            assert_eq!(llvm_xray::load_records(&p), expected(tid, &ev));
            assert_eq!(llvm_xray::dump(&p)[0], format!("<Thread ID: {tid}>"));
        }
    }

    #[test]
    fn max_function_id_roundtrips() {
        let dir = tempfile::tempdir().unwrap();
        let ev = [
            (Entry, MAX_FUNCTION_ID, 10, 0),
            (Exit, MAX_FUNCTION_ID, 20, 0),
        ];
        let (p, _, _) = write_trace(dir.path(), "maxid.fdr", 1, &ev);
        assert_eq!(llvm_xray::load_records(&p), expected(1, &ev));
    }

    #[test]
    fn dropped_unmatched_exits() {
        let dir = tempfile::tempdir().unwrap();
        let ev = [
            (Exit, 7, 5, 0),     // tracing started inside 7
            (TailExit, 6, 6, 2), // and inside 6; also must not emit a NewCPUId
            (Entry, 1, 10, 0),
            (Exit, 9, 15, 0), // never entered
            (Exit, 1, 20, 0),
            (Exit, 1, 25, 0), // stack empty again
        ];
        let (p, stats, res) = write_trace(dir.path(), "unmatched.fdr", 2, &ev);
        assert_eq!(stats.dropped_unmatched_exits, 4);
        assert_eq!(stats.records, 2);
        assert_eq!(
            res.iter()
                .filter(|r| **r == Recorded::DroppedUnmatchedExit)
                .count(),
            4
        );
        assert_eq!(llvm_xray::load_records(&p), expected(2, &[ev[2], ev[4]]));
        assert_eq!(
            llvm_xray::dump(&p)
                .iter()
                .filter(|l| l.starts_with("<CPU:"))
                .count(),
            1
        );
        llvm_xray::account(&p, None);
    }

    #[test]
    fn backwards_tsc_is_clamped() {
        let dir = tempfile::tempdir().unwrap();
        let ev = [
            (Entry, 1, 1000, 0),
            (Entry, 2, 900, 1),
            (Exit, 2, 950, 1),
            (Exit, 1, 1100, 0),
        ];
        let (p, stats, _) = write_trace(dir.path(), "back.fdr", 2, &ev);
        assert_eq!(stats.clamped_tscs, 2);
        let want = vec![
            rec(1, "function-enter", 1000, 0, 2),
            rec(2, "function-enter", 1000, 1, 2),
            rec(2, "function-exit", 1000, 1, 2),
            rec(1, "function-exit", 1100, 0, 2),
        ];
        assert_eq!(llvm_xray::load_records(&p), want);
        llvm_xray::account(&p, None);
    }

    #[test]
    fn flushed_but_unfinished_file_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crash.fdr");
        let mut w = ThreadWriter::new(File::create(&path).unwrap(), 77_777, 1000, WALL).unwrap();

        // Flushed before any record: placeholder NewCPUId keeps the empty buffer valid.
        w.flush().unwrap();
        assert_buffer_size(&path);
        assert_eq!(llvm_xray::load_records(&path), vec![]);
        llvm_xray::account(&path, None);

        w.function(Entry, 1, 100, 2).unwrap();
        w.function(Entry, 2, 110, 2).unwrap();
        w.flush().unwrap();
        assert_buffer_size(&path);
        // Open frames are fine: the process may still be running (or have crashed).
        assert_eq!(
            llvm_xray::load_records(&path),
            vec![
                rec(1, "function-enter", 100, 2, 77_777),
                rec(2, "function-enter", 110, 2, 77_777)
            ]
        );
        llvm_xray::account(&path, None);

        w.function(Exit, 2, 120, 2).unwrap();
        w.flush().unwrap();
        assert_buffer_size(&path);
        assert_eq!(llvm_xray::load_records(&path).len(), 3);
        llvm_xray::account(&path, None);

        w.function(Exit, 1, 130, 2).unwrap();
        let (_, stats) = w.finish().unwrap();
        assert_buffer_size(&path);
        assert_eq!(stats.bytes, std::fs::metadata(&path).unwrap().len());
        assert_eq!(llvm_xray::load_records(&path).len(), 4);
        let dump = llvm_xray::dump(&path);
        assert_eq!(dump[2], "<CPU: id = 0, tsc = 0>");
        assert_eq!(dump[3], "<CPU: id = 2, tsc = 100>");
        assert_eq!(dump.last().unwrap(), "<End of Buffer>");
    }

    #[test]
    fn empty_thread_finishes_loadable() {
        let dir = tempfile::tempdir().unwrap();
        let (p, stats, _) = write_trace(dir.path(), "empty.fdr", 3, &[]);
        assert_eq!(stats.records, 0);
        assert_eq!(llvm_xray::load_records(&p), vec![]);
        llvm_xray::account(&p, None);
    }

    /// Builds a tiny XRay-instrumented program so `account` can symbolize with a real map.
    fn build_instrumented(dir: &Path) -> PathBuf {
        let clang = ["/usr/bin/clang-19", "/usr/lib/llvm-19/bin/clang"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .expect("clang-19 is missing: install the Debian package `clang-19`");
        let src = dir.join("prog.c");
        std::fs::write(
            &src,
            "int leaf(int x) { return x * 3 + 1; }\n\
             int mid(int x) { return leaf(x) + leaf(x + 1); }\n\
             int top(int x) { return mid(x) * 2; }\n\
             int main(int argc, char **argv) { (void)argv; return top(argc) & 1; }\n",
        )
        .unwrap();
        let bin = dir.join("prog");
        let out = std::process::Command::new(clang)
            .args([
                "-O0",
                "-fxray-instrument",
                "-fxray-instruction-threshold=1",
                "-o",
            ])
            .arg(&bin)
            .arg(&src)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "clang-19 failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        bin
    }

    #[test]
    fn deeper_exit_unwinds_and_account_accepts() {
        let dir = tempfile::tempdir().unwrap();
        let bin = build_instrumented(dir.path());
        // Ids follow definition order: leaf 1, mid 2, top 3, main 4.
        let (leaf, mid, top, main) = (1, 2, 3, 4);
        let ev = [
            (Entry, main, 1000, 0),
            (Entry, top, 1010, 0),
            (Entry, mid, 1020, 0),
            (Entry, leaf, 1030, 0),
            // leaf's and mid's exits were lost; top returns.
            (Exit, top, 1040, 1),
            (Exit, main, 1050, 1),
        ];
        let (p, stats, res) = write_trace(dir.path(), "deeper.fdr", 70_000, &ev);
        assert_eq!(res[4], Recorded::WrittenAfterUnwind { frames: 2 });
        assert_eq!(stats.unwound_frames, 2);
        assert_eq!(stats.exits, 4);
        let mut want = expected(70_000, &ev[..4]);
        want.push(rec(leaf, "function-exit", 1040, 1, 70_000));
        want.push(rec(mid, "function-exit", 1040, 1, 70_000));
        want.extend(expected(70_000, &ev[4..]));
        assert_eq!(llvm_xray::load_records(&p), want);
        let report = llvm_xray::account(&p, Some(&bin));
        assert!(report.contains("Functions with latencies: 4"), "{report}");
        for name in ["leaf", "mid", "top", "main"] {
            assert!(report.contains(name), "{name} missing in {report}");
        }
        llvm_xray::account(&p, None);
    }

    #[test]
    fn deeper_exit_without_synthetic_exits_is_rejected_by_account() {
        // Documents why the writer writes synthetic exits: the same trace with the lost exits
        // simply left out fails `account` in both versions.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raw.fdr");
        let mut b = FileHeader::v1(1000, 0).encode().to_vec();
        b.extend_from_slice(&records::new_buffer(1));
        b.extend_from_slice(&records::wall_clock_time(1, 0));
        b.extend_from_slice(&records::new_cpu_id(0, 100));
        b.extend_from_slice(&records::function_record(Entry, 1, 0).unwrap());
        b.extend_from_slice(&records::function_record(Entry, 2, 1).unwrap());
        b.extend_from_slice(&records::function_record(Exit, 1, 1).unwrap());
        b.extend_from_slice(&records::end_of_buffer());
        std::fs::write(&path, b).unwrap();
        assert_eq!(llvm_xray::load_records(&path).len(), 3);
        for v in llvm_xray::VERSIONS {
            let (ok, text) = llvm_xray::run(v, &["account", path.to_str().unwrap()]);
            assert!(!ok, "{v} unexpectedly accepted a mismatched exit: {text}");
        }
    }
}
