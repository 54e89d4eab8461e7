//! Bad input for the FDR reader: truncated files, flipped bytes, wrong versions, lengths that
//! overflow, huge event sizes. The reader must return an error (or, for a cut that lands on a
//! record boundary, a prefix of the records), never panic, and never allocate more than a small
//! multiple of the input: a counting allocator measures every read of this test binary.
//!
//! No root or external tools needed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Cursor;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use xray_fdr::reader::{read, ReadError, Reader, Trace};
use xray_fdr::records as r;
use xray_fdr::{FdrVersion, FunctionAction, ThreadWriter, WallClock};

/// Counts the bytes this thread has allocated and not freed, and the peak.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LIVE.try_with(|l| {
            l.set(l.get() + layout.size() as isize);
            let _ = PEAK.try_with(|p| p.set(p.get().max(l.get())));
        });
        // SAFETY: forwarding to the system allocator with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = LIVE.try_with(|l| l.set(l.get() - layout.size() as isize));
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Peak bytes allocated by `f` on this thread.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, isize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, PEAK.with(Cell::get) - base)
}

/// Reads `bytes` both ways, asserting the allocation bounds: the collecting `read` keeps a
/// 64-byte `Record` per 8-byte function record (and Vec growth may double that), so at most 24
/// bytes per input byte plus 64 KiB; the streaming `Reader` only keeps per-thread stacks, at most
/// 2 bytes per input byte plus 64 KiB. Nothing is sized by a length field alone.
fn read_bounded(bytes: &[u8]) -> Result<Trace, ReadError> {
    let len = bytes.len() as isize;
    let (result, peak) = peak_of(|| read(bytes));
    assert!(
        peak <= 24 * len + 65536,
        "read: {len} bytes in, {peak} bytes allocated"
    );
    let (stream_error, peak) = peak_of(|| {
        let mut reader = match Reader::new(bytes) {
            Ok(r) => r,
            Err(e) => return Some(e),
        };
        loop {
            match reader.next_step() {
                Ok(Some(_)) => {}
                Ok(None) => return None,
                Err(e) => return Some(e),
            }
        }
    });
    assert!(
        peak <= 2 * len + 65536,
        "Reader: {len} bytes in, {peak} bytes allocated"
    );
    assert_eq!(
        stream_error.as_ref(),
        result.as_ref().err(),
        "the two forms disagree"
    );
    result
}

/// A file with every record kind the writer makes, both versions.
fn sample(version: FdrVersion) -> Vec<u8> {
    let mut w = ThreadWriter::with_version(
        Cursor::new(Vec::new()),
        99,
        5,
        1000,
        WallClock::default(),
        version,
    )
    .unwrap()
    .with_commit_bytes(200);
    for i in 0..12u64 {
        let t = i * 10;
        w.function(FunctionAction::Entry, 1, t, (i % 3) as u16)
            .unwrap();
        w.entry_with_args(2, t + 1, 0, &[i, !i]).unwrap();
        w.custom_event(t + 2, 0, &vec![i as u8; 1 + i as usize % 7])
            .unwrap();
        w.typed_event(t + 3, 1, 4, b"abc").unwrap();
        w.function(FunctionAction::Exit, 2, t + 4, 1).unwrap();
        w.function(FunctionAction::TailExit, 1, t + (i << 30), 1)
            .unwrap();
    }
    w.finish().unwrap().0.into_inner()
}

fn samples() -> Vec<Vec<u8>> {
    vec![sample(FdrVersion::V1), sample(FdrVersion::V5)]
}

#[test]
fn every_truncation_errors_or_reads_a_prefix() {
    for bytes in samples() {
        let full = read_bounded(&bytes).unwrap();
        for len in 0..bytes.len() {
            match read_bounded(&bytes[..len]) {
                Err(e) => assert!(e.offset <= len as u64, "{len}: {e}"),
                Ok(t) => {
                    let n = t.records.len();
                    // The last record may have lost arguments that were cut off.
                    assert!(
                        n <= full.records.len()
                            && (n == 0 || t.records[..n - 1] == full.records[..n - 1]),
                        "cut at {len}: not a prefix"
                    );
                }
            }
        }
    }
}

#[test]
fn every_flipped_byte_is_handled() {
    for bytes in samples() {
        for i in 0..bytes.len() {
            for mask in [0x01u8, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] ^= mask;
                if let Err(e) = read_bounded(&b) {
                    assert!(e.offset <= b.len() as u64, "{e}");
                    assert!(!e.problem.is_empty());
                }
            }
        }
    }
}

#[test]
fn random_mutations_never_panic() {
    let files = samples();
    let mut runner = TestRunner::new(Config {
        cases: 2000,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        0..files.len(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..12),
        any::<prop::sample::Index>(),
        any::<bool>(),
    );
    runner
        .run(&strategy, |(which, edits, cut, do_cut)| {
            let mut b = files[which].clone();
            for (at, v) in edits {
                let i = at.index(b.len());
                b[i] = v;
            }
            if do_cut {
                b.truncate(cut.index(b.len() + 1));
            }
            let _ = read_bounded(&b);
            Ok(())
        })
        .unwrap();
}

fn header(version: u16) -> Vec<u8> {
    r::FileHeader::new(version, 1000, 0).encode().to_vec()
}

fn preamble_v1() -> Vec<u8> {
    [
        &header(1)[..],
        &r::new_buffer(1),
        &r::wall_clock_time(0, 0),
        &r::new_cpu_id(0, 0),
    ]
    .concat()
}

#[test]
fn wrong_versions_and_types() {
    let body = &preamble_v1()[32..];
    for version in [0u16, 6, 0x100, u16::MAX] {
        let e = read_bounded(&[&header(version)[..], body].concat()).unwrap_err();
        assert_eq!((e.offset, e.record), (0, "FileHeader"), "{e}");
        assert!(e.problem.contains("version"), "{e}");
    }
    let mut basic = preamble_v1();
    basic[2] = 0; // basic-mode log type
    assert_eq!(read_bounded(&basic).unwrap_err().offset, 2);
    // A version 1 body under a version 5 header: no BufferExtents where one must be.
    let e = read_bounded(&[&header(5)[..], body].concat()).unwrap_err();
    assert_eq!((e.offset, e.record), (32, "BufferExtents"), "{e}");
    // And a version 5 body under a version 1 header.
    let v5 = sample(FdrVersion::V5);
    let e = read_bounded(&[&header(1)[..], &v5[32..]].concat()).unwrap_err();
    assert_eq!((e.offset, e.record), (32, "BufferExtents"), "{e}");
}

#[test]
fn lengths_that_overflow_or_lie() {
    let pre = preamble_v1();
    let marker = |size: i32| {
        let mut m = r::custom_event_marker_v1(1, 0).unwrap();
        m[1..5].copy_from_slice(&size.to_le_bytes());
        m
    };
    for size in [i32::MAX, i32::MIN, -1, 0, 1 << 30] {
        let e = read_bounded(&[&pre[..], &marker(size), b"xy"].concat()).unwrap_err();
        assert_eq!((e.offset, e.record), (80, "CustomEventMarker"), "{e}");
    }
    // Huge extents in version 5: the file simply ends inside the segment, no allocation.
    let v5 = [
        &header(5)[..],
        &r::buffer_extents(u64::MAX),
        &r::new_buffer(1),
        &r::wall_clock_time(0, 0),
        &r::pid(1),
        &r::new_cpu_id(0, 0),
        &r::function_record(FunctionAction::Entry, 1, 0).unwrap(),
    ]
    .concat();
    assert_eq!(read_bounded(&v5).unwrap().records.len(), 1);
    // A typed event whose size is past the end of the segment and of the file.
    let mut typed = r::typed_event_marker(1, 0, 1).unwrap();
    typed[1..5].copy_from_slice(&i32::MAX.to_le_bytes());
    let bad = [&v5[..v5.len() - 8], &typed, b"z"].concat();
    let e = read_bounded(&bad).unwrap_err();
    assert_eq!(e.record, "TypedEventMarker", "{e}");
    // Deltas and bases at the end of the 64-bit range.
    let wrap = [
        &pre[..],
        &r::tsc_wrap(u64::MAX - 1),
        &r::function_record(FunctionAction::Entry, 1, 5).unwrap(),
    ]
    .concat();
    assert!(read_bounded(&wrap)
        .unwrap_err()
        .problem
        .contains("overflows"));
    // Thousands of nested entries: the per-thread stack grows with the input only.
    let deep: Vec<u8> = std::iter::repeat_n(
        r::function_record(FunctionAction::Entry, 3, 0).unwrap(),
        100_000,
    )
    .flatten()
    .collect();
    assert_eq!(
        read_bounded(&[&pre[..], &deep].concat())
            .unwrap()
            .records
            .len(),
        100_000
    );
}
