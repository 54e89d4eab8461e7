use super::*;
use crate::plan::exits::ExitsChoice;
use crate::plan::objects::Executable;
use crate::session::output::OutputDir;
use crate::session::{IntakeLosses, Session};
use profiler_common::SledKind;

const PID: u32 = 100;
/// The stack slot of a frame at depth `d` (the stack grows down).
fn slot(d: u64) -> u64 {
    0x7fff_0000 - 16 * d
}

fn event(tid: u32, ts_ns: u64, kind: u8, function_id: u32, sp: u64) -> Event {
    Event {
        header: EventHeader {
            ts_ns,
            pid: PID,
            tid,
            function_id,
            kind,
            sp,
            ..EventHeader::default()
        },
        args: [0; MAX_ARGS],
        nargs: 0,
        data: None,
    }
}

/// Calls of `f` (depth 1) under `outer` (depth 0, entered once at `start`), one every `step`
/// nanoseconds, `n` of them: entry and exit each.
fn calls(rec: &mut FlightRecorder, tid: u32, start: u64, step: u64, n: u64) -> u64 {
    rec.push(&event(tid, start, SledKind::Entry as u8, 1, slot(0)), None);
    let mut ts = start;
    for _ in 0..n {
        ts += step;
        rec.push(&event(tid, ts, SledKind::Entry as u8, 2, slot(1)), None);
        rec.push(&event(tid, ts + 1, SledKind::Exit as u8, 2, slot(1)), None);
    }
    ts + 1
}

#[test]
fn holds_the_window_and_lets_older_events_expire() {
    let mut rec = FlightRecorder::new(Duration::from_micros(10), u64::MAX);
    // 100 calls, one every microsecond: the last 10 µs hold 10 of them.
    let end = calls(&mut rec, 7, 1_000, 1_000, 100);
    rec.expire();
    let s = rec.stats();
    assert_eq!((s.threads, s.evicted), (1, 0));
    let mut held = Vec::new();
    rec.replay(|e, _| held.push(e.header.ts_ns));
    assert!(held.iter().all(|&ts| ts + 10_000 >= end), "{held:?}");
    // 10 calls, entry and exit, and the exit of the call whose entry is 1 ns too old.
    assert_eq!(held.len(), 21, "{held:?}");
    assert_eq!(s.events, 21);
    assert_eq!(s.expired, 201 - 21);
}

#[test]
fn the_memory_cap_evicts_the_oldest_of_all_threads_and_counts_them() {
    let one = Held::of(&event(1, 0, 0, 1, 0), None).bytes();
    let mut rec = FlightRecorder::new(Duration::from_secs(3600), 100 * one);
    calls(&mut rec, 1, 0, 10, 100); // thread 1: 201 events, older
    calls(&mut rec, 2, 5_000, 10, 30); // thread 2: 61 events, newer
    let s = rec.stats();
    assert!(s.bytes <= 100 * one, "{s:?}");
    assert_eq!(s.events + s.evicted, 201 + 61, "{s:?}");
    assert_eq!(s.expired, 0);
    // Thread 2's events are the newest: all kept.
    let mut kept2 = 0;
    rec.replay(|e, _| kept2 += u64::from(e.header.tid == 2));
    assert_eq!(kept2, 61);
}

#[test]
fn a_snapshot_is_a_session_whose_files_hold_the_window() {
    let mut rec = FlightRecorder::new(Duration::from_micros(10), u64::MAX);
    calls(&mut rec, 7, 1_000, 1_000, 100);
    let end = calls(&mut rec, 8, 95_000, 500, 10);
    // Thread 8 ends (the kernel's end marker carries its final sequence number).
    rec.push(&event(8, end + 1, event_kind::THREAD_EXIT, 0, 0), None);
    assert!(rec.ended(PID, 8));
    rec.expire();

    let dir = tempfile::tempdir().unwrap();
    let out = OutputDir::create_root(&dir.path().join("snap")).unwrap();
    let mut session = Session::new(
        out,
        Executable {
            name: "prog".into(),
            path: "/bin/prog".into(),
            deleted: false,
        },
        xray_fdr::FdrVersion::V1,
        ExitsChoice {
            mode: "return",
            reason: "test".into(),
        },
    );
    rec.replay(|e, g| session.record(e, g));
    let report = session.finish(IntakeLosses::default()).unwrap();
    // The recorder's count of the events it holds is the snapshot's; thread 8's end, held
    // too, is not an event.
    let stats = rec.stats();
    assert_eq!(report.events, stats.events);
    assert_eq!(stats.thread_ends, 1);
    let threads: Vec<_> = report.processes.iter().flat_map(|p| &p.threads).collect();
    assert_eq!(threads.len(), 2);
    for t in threads {
        let bytes = std::fs::read(dir.path().join("snap").join(&t.file)).unwrap();
        let trace = xray_fdr::reader::read(&bytes).expect("a valid FDR file");
        let entries = trace
            .records
            .iter()
            .filter(|r| format!("{r:?}").contains("Entry"))
            .count();
        // Every call in the window has its entry and exit. Thread 7: the outer frame's entry
        // aged out, and so did the entry of one call whose exit is in the window (not written,
        // counted). Thread 8: all its calls fit, the outer frame's entry too.
        let (want_entries, want_unmatched) = match t.tid {
            7 => (10, 1),
            8 => (11, 0),
            other => panic!("thread {other}"),
        };
        assert_eq!(entries, want_entries, "{:?}", trace.records);
        assert_eq!(t.dropped_unmatched_exits, want_unmatched);
    }
}

#[test]
fn every_event_is_held_aged_out_or_evicted_whole_threads_included() {
    // 30,000 short threads one after another (each 51 calls and its end) under a cap that
    // holds a few hundred of them: every event given is accounted for, per thread and in all.
    let one = Held::of(&event(1, 0, 0, 1, 0), None).bytes();
    let mut rec = FlightRecorder::new(Duration::from_millis(50), 40_000 * one);
    let mut ts = 0;
    let mut given = 0;
    for tid in 1..=30_000u32 {
        ts = calls(&mut rec, tid, ts + 1_000, 10, 50);
        rec.push(&event(tid, ts + 1, event_kind::THREAD_EXIT, 0, 0), None);
        given += 1 + 2 * 50 + 1;
        if tid % 1_000 == 0 {
            rec.expire();
        }
        // One lost event before the end of every 100th thread.
        if tid % 100 == 0 {
            rec.push(
                &event(tid, ts + 2, event_kind::THREAD_EXIT, 0, 0),
                Some(Gap { lost: 3 }),
            );
            given += 1;
        }
    }
    let s = rec.stats();
    assert_eq!(s.seen, given);
    assert_eq!(
        s.events + s.thread_ends + s.expired + s.evicted,
        s.seen,
        "{s:?}"
    );
    assert_eq!(s.lost, 300 * 3);
    assert!(s.evicted > 0 && s.threads_evicted > 0, "{s:?}");
    assert!(s.bytes <= 40_000 * one, "{s:?}");
    // Threads let go whole, and threads still held: all 30,000.
    assert_eq!(
        s.threads as u64 + s.threads_evicted + s.threads_expired,
        30_000,
        "{s:?}"
    );
    // Per held thread: what it let go of before its first held event, and what it holds,
    // add up to what it was given.
    let windows = rec.thread_windows();
    let mut held_by_thread = std::collections::BTreeMap::<u32, u64>::new();
    rec.replay(|e, _| *held_by_thread.entry(e.header.tid).or_default() += 1);
    for (tid, held) in held_by_thread {
        let w = windows[&tid];
        let given = 102 + u64::from(tid % 100 == 0);
        assert_eq!(held + w.expired + w.evicted, given, "thread {tid}: {w:?}");
    }
}

#[test]
fn expiry_takes_the_oldest_threads_first_and_forgets_the_ended_ones() {
    let mut rec = FlightRecorder::new(Duration::from_micros(100), u64::MAX);
    let end = calls(&mut rec, 1, 0, 10, 5);
    rec.push(&event(1, end + 1, event_kind::THREAD_EXIT, 0, 0), None);
    calls(&mut rec, 2, 50_000, 10, 5);
    calls(&mut rec, 3, 1_000_000, 10, 5);
    rec.expire();
    let s = rec.stats();
    // Thread 1 ended: forgotten. Thread 2 runs on, holding nothing: its counts are kept.
    assert_eq!((s.threads, s.threads_expired), (1, 1), "{s:?}");
    assert_eq!(s.expired, 23);
    assert_eq!(s.events, 11);
    calls(&mut rec, 2, 1_000_050, 10, 1);
    let w = rec.thread_windows();
    assert_eq!(
        w[&2],
        ThreadWindow {
            expired: 11,
            evicted: 0
        }
    );
    assert!(!w.contains_key(&1));
}
