use super::*;
use crate::plan::objects::Executable;
use profiler_common::{event_flags, event_kind, EventHeader, SledKind, MAX_ARGS};

fn event(tid: u32, ts_ns: u64, kind: u8) -> Event {
    Event {
        header: EventHeader {
            ts_ns,
            pid: 100,
            tid,
            function_id: 1,
            kind,
            sp: 0x7fff_0000,
            ..EventHeader::default()
        },
        args: [0; MAX_ARGS],
        nargs: 0,
        data: None,
    }
}

/// A session of `/bin/prog` (FDR version 1, return probes) writing under `dir`.
fn prog_session(dir: &std::path::Path) -> Session {
    Session::new(
        OutputDir::create_root(dir).unwrap(),
        Executable {
            name: "prog".into(),
            path: "/bin/prog".into(),
            deleted: false,
        },
        FdrVersion::V1,
        ExitsChoice {
            mode: "return",
            reason: "test".into(),
        },
    )
}

/// A thread whose file cannot be created (its process's directory was deleted under the
/// session) is said once and its events are counted as ignored, not tried again event after
/// event; the threads already writing go on.
#[test]
fn a_thread_whose_file_cannot_be_created_is_counted_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = prog_session(&dir.path().join("s"));
    session.record(&event(1, 1_000, SledKind::Entry as u8), None);
    std::fs::remove_dir_all(dir.path().join("s/prog-100")).unwrap();
    for i in 0..1000 {
        session.record(&event(2, 2_000 + i, SledKind::Entry as u8), None);
    }
    assert_eq!(session.files.unwritable.len(), 1);
    session.record(&event(1, 5_000, SledKind::Exit as u8), None);
    session.record(&event(2, 6_000, event_kind::THREAD_EXIT), None);
    assert!(
        session.files.unwritable.is_empty(),
        "forgotten at the thread's end"
    );
    let report = session.finish(IntakeLosses::default()).unwrap();
    assert_eq!(report.events_ignored, 1000);
    let threads: Vec<_> = report.processes.iter().flat_map(|p| &p.threads).collect();
    assert_eq!(threads.len(), 1, "{threads:?}");
    assert_eq!((threads[0].tid, threads[0].events_written), (1, 2));
}

/// A fixed pseudo-random stream (xorshift64*): the same events on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One simulated thread of the reference stream.
struct SimThread {
    tid: u32,
    seq: u64,
    cpu: u16,
    ts: u64,
    /// Open frames: (function id, slot), outermost first.
    stack: Vec<(u32, u64)>,
    /// The number of drains before it ended, if it did.
    ended: Option<u32>,
}

/// Feeds a fixed stream of every kind of event (entries with and without arguments, exits,
/// tail exits, frames left by unwinding, catches, exits of calls entered before tracing, custom
/// and typed events, losses, time going backwards and jumping past 32 bits, threads migrating
/// between four CPUs so that their events reach the sequencer out of order, threads ending and
/// a tid used again) through the sequencer and a session writing `version` files into `dir`.
/// Wall-clock time is fixed, so the output is the same bytes on every run.
/// A frame of a function the budget dropped while it ran gets no exit: closed where the
/// caller's exit proves it gone, it is counted as the budget's, not as an exception's; a
/// frame of a function not dropped, left the same way, is still an exception's.
#[test]
fn frames_a_drop_left_open_are_counted_as_the_budgets() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = prog_session(&dir.path().join("s"));
    let at = |ts: u64, kind: SledKind, function_id: u32, sp: u64| {
        let mut e = event(1, ts, kind as u8);
        e.header.function_id = function_id;
        e.header.sp = sp;
        e
    };
    // caller 1 at 0x7000; in it, 2 (dropped at 2500) and, later, 3 (never dropped).
    session.record(&at(1_000, SledKind::Entry, 1, 0x7000), None);
    session.record(&at(2_000, SledKind::Entry, 2, 0x6f00), None);
    session.dropped(2, 2_500);
    session.record(&at(3_000, SledKind::Entry, 3, 0x6f00), None);
    session.record(&at(4_000, SledKind::Entry, 3, 0x6e00), None);
    session.record(&at(5_000, SledKind::Exit, 1, 0x7000), None);
    let report = session.finish(IntakeLosses::default()).unwrap();
    let t = &report.processes[0].threads[0];
    // 2's frame closed by 3's entry at its slot; 3's inner frame by 1's exit; 3's outer too.
    assert_eq!(t.frames_closed_by_budget, 1, "{t:?}");
    assert_eq!(t.frames_unwound, 2, "{t:?}");
}

fn reference_session(dir: &std::path::Path, version: FdrVersion) -> SessionReport {
    use crate::session::order::Sequencer;
    let out = OutputDir::create_root(dir).unwrap();
    let session = Session::new(
        out,
        Executable {
            name: "prog".into(),
            path: "/bin/prog".into(),
            deleted: false,
        },
        version,
        ExitsChoice {
            mode: "return",
            reason: "test".into(),
        },
    );
    let mut session = session.at_epoch();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut order = Sequencer::default();
    let mut rings: Vec<Vec<Event>> = vec![Vec::new(); 4];
    let mut threads: Vec<SimThread> = (0..6)
        .map(|i| SimThread {
            tid: 1000 + i,
            seq: 0,
            cpu: (i % 4) as u16,
            ts: 1_000_000 + u64::from(i),
            stack: Vec::new(),
            ended: None,
        })
        .collect();
    let mut drains = 0;
    let stack_top = |tid: u32| 0x7f00_0000_0000u64 + (u64::from(tid) << 24);
    for step in 0..200_000u32 {
        if step % 997 == 0 {
            // A drain: ring after ring, so a thread that moved arrives out of order.
            drains += 1;
            if drains % 50 == 0 {
                // As the daemon does every second: every file complete on disk.
                session.flush();
            }
            for ring in &mut rings {
                for mut e in ring.drain(..) {
                    order.push(&mut e, &mut |e, g| session.record(e, g));
                }
            }
        }
        let t = &mut threads[rng.below(6) as usize];
        if let Some(at) = t.ended {
            if at == drains {
                // Not before its end was drained: the sequencer knows a thread by its tid.
                continue;
            }
            // The tid comes back as a new thread (a second file).
            *t = SimThread {
                tid: t.tid,
                seq: 0,
                cpu: t.cpu,
                ts: t.ts,
                stack: Vec::new(),
                ended: None,
            };
        }
        if rng.below(50) == 0 {
            t.cpu = rng.below(4) as u16;
        }
        t.ts = match rng.below(1000) {
            0 => t.ts + (1 << 33),
            1 => t.ts.saturating_sub(500),
            _ => t.ts + 1 + rng.below(300),
        };
        let top = stack_top(t.tid);
        let sp_now = t.stack.last().map_or(top, |&(_, slot)| slot);
        let mut h = EventHeader {
            ts_ns: t.ts,
            seq: t.seq,
            pid: 100,
            tid: t.tid,
            cpu: t.cpu,
            ..EventHeader::default()
        };
        let mut args = [0; MAX_ARGS];
        let mut nargs = 0;
        let mut data = None;
        let roll = rng.below(1000);
        match roll {
            0..=469 if t.stack.len() < 40 => {
                let slot = sp_now - 0x40 - 8 * rng.below(4);
                h.function_id = 1 + rng.below(60) as u32;
                h.sp = slot;
                h.kind = SledKind::Entry as u8;
                if rng.below(10) == 0 {
                    h.kind = SledKind::LogArgsEntry as u8;
                    nargs = 1 + rng.below(MAX_ARGS as u64) as usize;
                    for a in &mut args[..nargs] {
                        *a = rng.next();
                    }
                }
                if rng.below(200) == 0 {
                    h.flags = event_flags::NO_RETURN;
                }
                t.stack.push((h.function_id, slot));
            }
            0..=939 => {
                let Some((id, slot)) = t.stack.pop() else {
                    continue;
                };
                h.function_id = id;
                h.sp = slot;
                h.kind = match rng.below(10) {
                    0 => SledKind::Tail as u8,
                    _ => SledKind::Exit as u8,
                };
            }
            940..=959 => {
                // Frames left without an exit (an exception), then caught or noticed later.
                let n = (1 + rng.below(4) as usize).min(t.stack.len());
                t.stack.truncate(t.stack.len() - n);
                if rng.below(2) == 0 {
                    h.kind = event_kind::CATCH;
                    h.sp = t.stack.last().map_or(top, |&(_, slot)| slot) - 0x20;
                } else {
                    continue;
                }
            }
            960..=961 => {
                // The exit of a call entered before tracing began: every frame traced is gone.
                h.function_id = 70 + rng.below(5) as u32;
                h.sp = top + 0x40 * (1 + rng.below(8));
                h.kind = SledKind::Exit as u8;
                t.stack.clear();
            }
            962..=969 => continue,
            970..=989 => {
                let len = rng.below(40) as usize;
                let size = len as u64 + rng.below(3);
                let typed = rng.below(2) == 0;
                h.kind = if typed {
                    SledKind::TypedEvent
                } else {
                    SledKind::CustomEvent
                } as u8;
                h.sp = sp_now - 0x100;
                data = Some(Box::new(crate::kernel::intake::EventData {
                    size,
                    event_type: if typed { 1 + rng.below(9) } else { 0 },
                    bytes: (0..len).map(|_| rng.next() as u8).collect(),
                }));
            }
            990..=996 => {
                // Events lost before this one: their numbers are skipped.
                let lost = 1 + rng.below(5);
                t.seq += lost;
                h.seq = t.seq;
                h.gap_lost = lost as u32;
                h.function_id = 1 + rng.below(60) as u32;
                h.sp = sp_now - 0x40;
                h.kind = SledKind::Entry as u8;
                t.stack.push((h.function_id, h.sp));
            }
            _ if rng.below(40) != 0 => continue,
            _ => {
                h.kind = event_kind::THREAD_EXIT;
                h.pid = 0;
                t.ended = Some(drains);
            }
        }
        t.seq += 1;
        rings[usize::from(h.cpu)].push(Event {
            header: h,
            args,
            nargs,
            data,
        });
    }
    for ring in &mut rings {
        for mut e in ring.drain(..) {
            order.push(&mut e, &mut |e, g| session.record(e, g));
        }
    }
    order.finish(&[], &mut |e, g| session.record(e, g));
    session.finish(IntakeLosses::default()).unwrap()
}

/// The reference stream in both versions: every file loads in the reader, every event has
/// exactly one fate, and the totals agree with what was fed. With `FDR_SESSION_REFERENCE=DIR`
/// the files are left in `DIR/v1` and `DIR/v5`, to compare the bytes two builds write
/// (`diff -r`): changes meant to make the daemon cheaper must leave them identical.
#[test]
fn reference_stream_is_written_loadably_and_accounted() {
    let keep = std::env::var_os("FDR_SESSION_REFERENCE").map(std::path::PathBuf::from);
    let tmp = tempfile::tempdir().unwrap();
    for (name, version) in [("v1", FdrVersion::V1), ("v5", FdrVersion::V5)] {
        let dir = keep.as_deref().unwrap_or(tmp.path()).join(name);
        let _ = std::fs::remove_dir_all(&dir);
        let report = reference_session(&dir, version);
        let threads: Vec<_> = report.processes.iter().flat_map(|p| &p.threads).collect();
        assert!(threads.len() > 6, "tids used again get files of their own");
        let mut records = 0;
        for t in &threads {
            let bytes = std::fs::read(dir.join(&t.file)).unwrap();
            let trace = xray_fdr::reader::read(&bytes)
                .unwrap_or_else(|e| panic!("{} ({name}) does not load: {e}", t.file));
            let functions = trace
                .records
                .iter()
                .filter(|r| matches!(r.kind, xray_fdr::reader::RecordKind::Function { .. }))
                .count() as u64;
            assert_eq!(functions, t.records, "{}: function records", t.file);
            let accounted: u64 = t.fates().iter().map(|(_, n)| n).sum();
            assert_eq!(accounted, t.events, "{}: every event has one fate", t.file);
            records += t.records;
        }
        assert!(records > 100_000, "{records} records: {report:?}");
        assert!(report.events_lost > 0 && report.dropped_unmatched_exits > 0);
        assert!(report.custom_events > 0 && report.typed_events > 0);
    }
}
