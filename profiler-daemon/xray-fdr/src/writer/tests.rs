//! Tests of the writer: exact bytes, policy, and loading with llvm-xray 14 and 19.
use super::super::records::FileHeader;
use super::*;
use std::fs::File;
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};

use FunctionAction::{Entry, EntryArgs, Exit, TailExit};

const WALL: WallClock = WallClock {
    secs: 1_700_000_000,
    micros: 5,
};

/// One record as `llvm-xray convert --output-format=yaml` reports it, in the shape the tests
/// compare: a projection of the reference crate's [`xray_reference::Record`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct XrayRecord {
    func_id: u32,
    /// `function-enter`, `function-exit`, `function-tail-exit`, `function-enter-arg`, ...
    kind: String,
    tsc: u64,
    cpu: u16,
    thread: u32,
}

impl From<&xray_reference::Record> for XrayRecord {
    fn from(r: &xray_reference::Record) -> Self {
        XrayRecord {
            func_id: u32::try_from(r.func_id).unwrap_or_else(|e| panic!("{r:?}: {e}")),
            kind: r.kind.name().to_string(),
            tsc: r.tsc,
            cpu: r.cpu,
            thread: r.thread,
        }
    }
}

/// llvm-xray 14 and 19 through the reference crate ([`xray_reference::both`]); records
/// projected to [`XrayRecord`].
mod llvm_xray {
    use std::path::Path;
    pub(super) use xray_reference::both::{account, dump};

    /// Loads the file with `convert` in both versions, asserts both succeed and agree.
    pub(super) fn load_records(path: &Path) -> Vec<super::XrayRecord> {
        xray_reference::both::load_records(path)
            .iter()
            .map(super::XrayRecord::from)
            .collect()
    }
}

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
    let mut w = ThreadWriter::new(File::create(&path).unwrap(), tid, 1_000_000_000, WALL).unwrap();
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

/// `fdr-dump` lines without the no-op `TSCWrap(base)` records commits leave (the base is
/// tracked through the dump).
fn strip_commit_noops(lines: &[String]) -> Vec<String> {
    let mut base = 0u64;
    let num = |l: &str, key: &str| -> u64 {
        let at = l.find(key).unwrap() + key.len();
        l[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap()
    };
    let mut out = Vec::new();
    for l in lines {
        if l.starts_with("<CPU:") {
            base = num(l, "tsc = ");
        } else if l.starts_with("<Function") {
            base += num(l, "delta = +");
        } else if l.starts_with("<TSC Wrap") {
            let b = num(l, "base = ");
            if b == base {
                continue;
            }
            base = b;
        }
        out.push(l.clone());
    }
    out
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
    let mut want = FileHeader::v1(1000, 16 * 7 + 8 * 2).encode().to_vec();
    want.extend_from_slice(&records::new_buffer(7));
    want.extend_from_slice(&records::wall_clock_time(WALL.secs, WALL.micros));
    // Placeholder, then the commit's flipped EndOfBuffer and cover: no-op TSCWraps.
    want.extend_from_slice(&records::new_cpu_id(0, 0));
    want.extend_from_slice(&records::tsc_wrap(0));
    want.extend_from_slice(&records::tsc_wrap(0));
    want.extend_from_slice(&records::new_cpu_id(2, 100));
    want.extend_from_slice(&records::function_record(Entry, 5, 0).unwrap());
    want.extend_from_slice(&records::function_record(Exit, 5, 30).unwrap());
    // EndOfBuffer carrying TSCWrap(130)'s payload, ready to be flipped by the next commit.
    let mut eob = records::tsc_wrap(130);
    eob[0] = records::end_of_buffer()[0];
    want.extend_from_slice(&eob);
    assert_eq!(got, want);
}

#[test]
fn exact_file_bytes_v5() {
    let mut w =
        ThreadWriter::with_version(Cursor::new(Vec::new()), 7, 99, 1000, WALL, FdrVersion::V5)
            .unwrap();
    w.function(Entry, 5, 100, 2).unwrap();
    w.custom_event(101, 2, b"abc").unwrap();
    w.typed_event(103, 2, 9, b"xy").unwrap();
    w.function(Exit, 5, 130, 2).unwrap();
    let got = w.finish().unwrap().0.into_inner();
    let mut want = FileHeader::new(5, 1000, 0).encode().to_vec();
    want.extend_from_slice(&records::buffer_extents(64));
    want.extend_from_slice(&records::new_buffer(7));
    want.extend_from_slice(&records::wall_clock_time(WALL.secs, WALL.micros));
    want.extend_from_slice(&records::pid(99));
    want.extend_from_slice(&records::new_cpu_id(0, 0));
    want.extend_from_slice(&records::buffer_extents(16 + 8 + 16 + 3 + 16 + 2 + 8));
    want.extend_from_slice(&records::new_cpu_id(2, 100));
    want.extend_from_slice(&records::function_record(Entry, 5, 0).unwrap());
    want.extend_from_slice(&records::custom_event_marker_v5(3, 1).unwrap());
    want.extend_from_slice(b"abc");
    want.extend_from_slice(&records::typed_event_marker(2, 2, 9).unwrap());
    want.extend_from_slice(b"xy");
    want.extend_from_slice(&records::function_record(Exit, 5, 27).unwrap());
    let size = (want.len() - 32) as u64;
    want[16..24].copy_from_slice(&size.to_le_bytes());
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
    let before = w.stats().clone();
    let e = w.function(Entry, 1 << 28, 10, 0).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert_eq!(w.stats(), &before);
    assert_eq!(w.stats().bytes, 96);
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
impl TraceSink for Failing {
    fn start_offset(&mut self) -> io::Result<u64> {
        self.inner.start_offset()
    }
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        if self.fail {
            return Err(io::Error::other("disk full"));
        }
        self.inner.write_at(offset, bytes)
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        if self.fail {
            return Err(io::Error::other("disk full"));
        }
        self.inner.set_len(len)
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
    w.sink_mut().fail = true;
    assert!(w.flush().is_err());
    w.sink_mut().fail = false;
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
            "<CPU: id = 0, tsc = 0>",
            "<TSC Wrap: base = 0>",
            "<TSC Wrap: base = 0>",
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
    let mut w = ThreadWriter::new(File::create(&path).unwrap(), 9, 1_000_000_000, WALL).unwrap();
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
        strip_commit_noops(&dump)
            .iter()
            .filter(|l| l.starts_with("<TSC Wrap"))
            .count(),
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
    let cpus: Vec<_> = strip_commit_noops(&dump)
        .iter()
        .filter(|l| l.starts_with("<CPU:"))
        .cloned()
        .collect();
    assert_eq!(
        cpus,
        [
            "<CPU: id = 0, tsc = 0>",
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
        2
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
    let dump = strip_commit_noops(&llvm_xray::dump(&path));
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
    for v in xray_reference::LLVM_XRAY_VERSIONS {
        let out = xray_reference::run(v, ["account", path.to_str().unwrap()]);
        assert!(
            !out.status.success(),
            "llvm-xray {v} unexpectedly accepted a mismatched exit: {}",
            xray_reference::output_text(&out)
        );
    }
}

// ---- events, version 5, commits ----

#[test]
fn events_load_in_llvm_xray_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    for version in [FdrVersion::V1, FdrVersion::V5] {
        let path = dir.path().join(format!("events-v{version}.fdr"));
        let mut w = ThreadWriter::with_version(
            File::create(&path).unwrap(),
            31,
            4000,
            1_000_000_000,
            WALL,
            version,
        )
        .unwrap();
        w.function(Entry, 1, 100, 2).unwrap();
        assert_eq!(w.custom_event(105, 2, b"abc").unwrap(), Recorded::Written);
        let typed = w.typed_event(107, 2, 0x4142, b"hello").unwrap();
        // A gap that fits no 32-bit delta, then an event on another CPU.
        w.custom_event(110 + (1 << 33), 3, b"z").unwrap();
        w.function(Exit, 1, 120 + (1 << 33), 3).unwrap();
        let (_, stats) = w.finish().unwrap();
        assert_eq!(stats.custom_events + stats.typed_events, 3);
        let kinds: Vec<(String, u64, u32)> = llvm_xray::load_records(&path)
            .into_iter()
            .map(|r| (r.kind, r.tsc, r.thread))
            .collect();
        let typed_kind = match version {
            FdrVersion::V1 => {
                assert_eq!(typed, Recorded::WrittenAsCustomEvent);
                assert_eq!(stats.typed_as_custom, 1);
                "custom-event"
            }
            FdrVersion::V5 => {
                assert_eq!(typed, Recorded::Written);
                "typed-event"
            }
        };
        let want = [
            ("function-enter", 100),
            ("custom-event", 105),
            (typed_kind, 107),
            ("custom-event", 110 + (1 << 33)),
            ("function-exit", 120 + (1 << 33)),
        ];
        let want: Vec<(String, u64, u32)> =
            want.iter().map(|&(k, t)| (k.to_string(), t, 31)).collect();
        assert_eq!(kinds, want, "version {version}");
        llvm_xray::account(&path, None);
    }
}

#[test]
fn invalid_events_are_dropped_and_counted() {
    let mut w =
        ThreadWriter::with_version(Cursor::new(Vec::new()), 1, 1, 1000, WALL, FdrVersion::V5)
            .unwrap();
    assert_eq!(
        w.custom_event(1, 0, b"").unwrap(),
        Recorded::DroppedInvalidEvent
    );
    assert_eq!(
        w.typed_event(1, 0, 3, b"").unwrap(),
        Recorded::DroppedInvalidEvent
    );
    assert_eq!(w.stats().dropped_events, 2);
    let (c, stats) = w.finish().unwrap();
    assert_eq!(stats.commits, 0);
    assert_eq!(c.into_inner().len(), 112);
}

#[test]
fn many_small_commits_stay_loadable_v5() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("commits.fdr");
    let mut w = ThreadWriter::with_version(
        File::create(&path).unwrap(),
        9,
        10,
        1000,
        WALL,
        FdrVersion::V5,
    )
    .unwrap()
    .with_commit_bytes(0);
    let mut ev = Vec::new();
    for i in 0..600u64 {
        let (a, f) = if i % 2 == 0 {
            (Entry, 1 + (i % 7) as u32)
        } else {
            (Exit, 1 + ((i - 1) % 7) as u32)
        };
        w.function(a, f, 1000 + i, (i / 100) as u16).unwrap();
        ev.push((a, f, 1000 + i, (i / 100) as u16));
    }
    let (_, stats) = w.finish().unwrap();
    assert_eq!(stats.commits, 600);
    assert_buffer_size(&path);
    let want: Vec<XrayRecord> = expected(9, &ev);
    assert_eq!(llvm_xray::load_records(&path), want);
    llvm_xray::account(&path, None);
}

/// A disk that fills up at `limit` bytes: `ftruncate` still grows the file (a sparse file
/// takes no room), a write stores what fits and fails, as `pwrite` does on a full file system.
struct FullDisk {
    inner: Cursor<Vec<u8>>,
    limit: u64,
}
impl TraceSink for FullDisk {
    fn start_offset(&mut self) -> io::Result<u64> {
        self.inner.start_offset()
    }
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let fits = self.limit.saturating_sub(offset).min(bytes.len() as u64) as usize;
        self.inner.write_at(offset, &bytes[..fits])?;
        if fits < bytes.len() {
            // ENOSPC.
            return Err(io::Error::from_raw_os_error(28));
        }
        Ok(())
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

/// A commit that fails on a full disk leaves the file exactly as the last commit left it (no
/// grown tail, no hole), and the stats say which records are on disk.
#[test]
fn a_commit_failing_on_a_full_disk_leaves_the_last_commit() {
    for version in [FdrVersion::V1, FdrVersion::V5] {
        let sink = FullDisk {
            inner: Cursor::new(Vec::new()),
            limit: u64::MAX,
        };
        let mut w = ThreadWriter::with_version(sink, 1, 2, 1000, WALL, version).unwrap();
        for i in 0..100 {
            w.function(Entry, 1, 10 * i, 0).unwrap();
            w.function(Exit, 1, 10 * i + 5, 0).unwrap();
        }
        w.flush().unwrap();
        let committed = w.sink_mut().inner.get_ref().clone();
        assert_eq!(w.stats().committed_records, 200, "{version:?}");
        // Room for a few more bytes only: the next commit fails part way.
        w.sink_mut().limit = committed.len() as u64 + 40;
        for i in 100..1000 {
            w.function(Entry, 1, 10 * i, 0).unwrap();
            w.function(Exit, 1, 10 * i + 5, 0).unwrap();
        }
        assert!(w.flush().is_err(), "{version:?}");
        assert_eq!(w.stats().records, 2000, "{version:?}");
        assert_eq!(w.stats().committed_records, 200, "{version:?}");
        assert_eq!(
            w.sink_mut().inner.get_ref(),
            &committed,
            "{version:?}: the file is the last commit's"
        );
    }
}
