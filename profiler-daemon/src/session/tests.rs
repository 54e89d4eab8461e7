use super::*;
use profiler_common::{EventHeader, SledKind, MAX_ARGS};

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

/// A thread whose file cannot be created (its process's directory was deleted under the
/// session) is said once and its events are counted as ignored, not tried again event after
/// event; the threads already writing go on.
#[test]
fn a_thread_whose_file_cannot_be_created_is_counted_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let out = OutputDir::create_root(&dir.path().join("s")).unwrap();
    let mut session = Session::new(
        out,
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
    );
    session.record(&event(1, 1_000, SledKind::Entry as u8), None);
    std::fs::remove_dir_all(dir.path().join("s/prog-100")).unwrap();
    for i in 0..1000 {
        session.record(&event(2, 2_000 + i, SledKind::Entry as u8), None);
    }
    assert_eq!(session.unwritable.len(), 1);
    session.record(&event(1, 5_000, SledKind::Exit as u8), None);
    session.record(&event(2, 6_000, event_kind::THREAD_EXIT), None);
    assert!(
        session.unwritable.is_empty(),
        "forgotten at the thread's end"
    );
    let report = session.finish(IntakeLosses::default()).unwrap();
    assert_eq!(report.events_ignored, 1000);
    let threads: Vec<_> = report.processes.iter().flat_map(|p| &p.threads).collect();
    assert_eq!(threads.len(), 1, "{threads:?}");
    assert_eq!((threads[0].tid, threads[0].events_written), (1, 2));
}
