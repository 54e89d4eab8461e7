//! Self-tests of the trace checks on hand-made FDR version 1 files (written
//! here from the format description, not with the daemon's code), so the
//! checking side is known to work before the daemon does. The session around
//! them (layout, `session.json`, function ids) is [`crate::synthetic_session`]'s;
//! only the files' encoding is this module's own ([`Fdr`]).

use std::collections::BTreeMap;
use std::path::Path;

use crate::counts::ExpectedCalls;
use crate::fixtures::{cpp_fixture, CPP_FUNCTIONS, CPP_MAIN};
use crate::synthetic_session::{
    function_ids, write_session_with_counters, Counters, SynthProcess, ThreadFile,
};
use crate::trace::{
    assert_process_calls, assert_session_totals, check_trace_dir, MainCall, ProcessExpectation,
};

/// A minimal FDR v1 writer: one thread per file, ns ticks.
#[derive(Clone)]
struct Fdr {
    body: Vec<u8>,
    last_tsc: u64,
}

#[derive(Clone, Copy)]
enum Action {
    Enter = 0,
    Exit = 1,
    TailExit = 2,
    EnterArgs = 3,
}

impl Fdr {
    fn new(tid: u32, cpu: u16, tsc: u64) -> Fdr {
        let mut f = Fdr {
            body: Vec::new(),
            last_tsc: tsc,
        };
        f.meta(0, &tid.to_le_bytes());
        let mut wall = Vec::new();
        wall.extend_from_slice(&1_700_000_000u64.to_le_bytes());
        wall.extend_from_slice(&0u32.to_le_bytes());
        f.meta(4, &wall);
        let mut cpu_rec = Vec::new();
        cpu_rec.extend_from_slice(&cpu.to_le_bytes());
        cpu_rec.extend_from_slice(&tsc.to_le_bytes());
        f.meta(2, &cpu_rec);
        f
    }
    fn meta(&mut self, kind: u8, payload: &[u8]) {
        let mut rec = [0u8; 16];
        rec[0] = (kind << 1) | 1;
        rec[1..1 + payload.len()].copy_from_slice(payload);
        self.body.extend_from_slice(&rec);
    }
    fn func(&mut self, action: Action, id: u32, tsc: u64) {
        let delta = tsc - self.last_tsc;
        if delta > u64::from(u32::MAX) {
            self.meta(3, &tsc.to_le_bytes()); // TSCWrap
            self.last_tsc = tsc;
        }
        let word0 = (id << 4) | ((action as u32) << 1);
        self.body.extend_from_slice(&word0.to_le_bytes());
        self.body
            .extend_from_slice(&((tsc - self.last_tsc) as u32).to_le_bytes());
        self.last_tsc = tsc;
    }
    fn arg(&mut self, v: u64) {
        self.meta(6, &v.to_le_bytes());
    }
}

/// The file: header, then the records and an EndOfBuffer. (The thread id is the one given to
/// [`Fdr::new`].)
impl ThreadFile for Fdr {
    fn write_fdr(&self, path: &Path, _pid: u32, _tid: u32) {
        let mut f = self.clone();
        f.meta(1, &[]); // EndOfBuffer
        let mut out = Vec::new();
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&1_000_000_000u64.to_le_bytes());
        out.extend_from_slice(&(f.body.len() as u64).to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(&f.body);
        std::fs::write(path, out).unwrap();
    }
}

const PID: u32 = 4242;
const TID2: u32 = 4243;

/// Writes a two-thread session "traced" from the C++ fixture; `break_it`
/// adds an exit without entry to the second thread.
fn write_session(dir: &Path, bin: &Path, break_it: bool) -> u64 {
    let id = function_ids(bin);
    let f = |n: &str| id[n];
    let base = 1_000_000_000_000u64;
    let mut t = base;
    let mut next = |step: u64| {
        t += step;
        t
    };
    use Action::*;
    let mut main = Fdr::new(PID, 0, base);
    main.func(Enter, f("main"), next(10));
    main.func(Enter, f("fx::work(int, int)"), next(10));
    main.func(Enter, f("fx_tail_caller"), next(10));
    main.func(TailExit, f("fx_tail_caller"), next(10));
    main.func(Enter, f("fx_tail_target"), next(10));
    main.func(Exit, f("fx_tail_target"), next(10));
    main.func(EnterArgs, f("fx_logged"), next(10));
    main.arg(3);
    main.func(Exit, f("fx_logged"), next(10));
    main.func(Enter, f("fx_gap_probe"), next(10));
    main.func(Exit, f("fx_gap_probe"), next(10));
    // 4.5 s later: needs a TSCWrap.
    main.func(Enter, f("fx_gap_probe"), next(4_500_000_000));
    main.func(Exit, f("fx_gap_probe"), next(10));
    main.func(Exit, f("fx::work(int, int)"), next(10));
    main.func(Enter, f("fx_report"), next(10));
    main.func(TailExit, f("fx_report"), next(10));
    main.func(Exit, f("main"), next(10));

    let mut other = Fdr::new(TID2, 1, base + 5);
    if break_it {
        other.func(Exit, f("fx::leaf(int)"), base + 6);
    }
    other.func(Enter, f("fx_thread_main"), base + 20);
    other.func(Enter, f("fx_report"), base + 30);
    other.func(TailExit, f("fx_report"), base + 40);
    other.func(Exit, f("fx_thread_main"), base + 50);

    // The files land in `threads-cpp-<PID>/` (the fixture binary's name).
    let events = 16 + 4 + u64::from(break_it);
    let counters = Counters {
        events,
        events_lost: Some(0),
        records: BTreeMap::from([((PID, PID), 16), ((PID, TID2), 4)]),
    };
    let process = SynthProcess {
        pid: PID,
        binary: bin.to_path_buf(),
        build_id: None,
        threads: vec![(PID, main), (TID2, other)],
    };
    write_session_with_counters(dir, &[process], &counters);
    events
}

fn expected() -> ExpectedCalls {
    let mut e = ExpectedCalls::new();
    let main = e.entry(PID).or_default();
    for (f, n) in [
        ("fx::work(int, int)", 1),
        ("fx_tail_caller", 1),
        ("fx_tail_target", 1),
        ("fx_logged", 1),
        ("fx_gap_probe", 2),
        ("fx_report", 1),
    ] {
        main.insert(f.to_string(), n);
    }
    let t = e.entry(TID2).or_default();
    t.insert("fx_thread_main".to_string(), 1);
    t.insert("fx_report".to_string(), 1);
    e
}

fn expectation(calls: &ExpectedCalls) -> ProcessExpectation<'_> {
    ProcessExpectation {
        pid: PID,
        calls,
        known: CPP_FUNCTIONS,
        main_fn: CPP_MAIN,
        main: MainCall::Traced,
        only_known: true,
    }
}

#[test]
fn hand_made_session_passes_the_checks() {
    let bin = cpp_fixture();
    let dir = crate::tools::scratch_dir("synthetic-ok");
    write_session(dir.path(), &bin, false);
    let trace = check_trace_dir(dir.path(), &bin);
    assert_eq!(trace.threads.len(), 2);
    let calls = expected();
    assert_process_calls(&trace, &expectation(&calls));
    assert_session_totals(&trace);
    crate::scenario::assert_cpp_logged_args(&trace);

    let main = trace.thread(PID, PID).unwrap();
    assert_eq!(main.header.cycle_frequency, 1_000_000_000);
    for major in crate::tools::LLVM_XRAY_VERSIONS {
        assert!(crate::tools::fdr_dump(major, &main.path).contains("<TSC Wrap:"));
    }
    let gap: Vec<u64> = main
        .records_of("fx_gap_probe")
        .filter(|r| r.kind.is_entry())
        .map(|r| r.tsc)
        .collect();
    assert_eq!(gap[1] - gap[0], 4_500_000_010);

    // Wrong expectations are reported.
    let mut wrong = expected();
    *wrong.get_mut(&TID2).unwrap().get_mut("fx_report").unwrap() = 2;
    let err = std::panic::catch_unwind(|| assert_process_calls(&trace, &expectation(&wrong)))
        .expect_err("a count mismatch must fail");
    let msg = panic_text(&err);
    assert!(msg.contains("fx_report: fixture counted 2 calls"), "{msg}");
    let mut missing_thread = expected();
    missing_thread.remove(&TID2);
    assert!(std::panic::catch_unwind(|| {
        assert_process_calls(&trace, &expectation(&missing_thread))
    })
    .is_err());
    let in_progress = ProcessExpectation {
        main: MainCall::InProgress,
        ..expectation(&calls)
    };
    assert_process_calls(&trace, &in_progress);
}

#[test]
fn exit_without_entry_is_rejected_with_fdr_dump() {
    let bin = cpp_fixture();
    let dir = crate::tools::scratch_dir("synthetic-bad");
    write_session(dir.path(), &bin, true);
    let err = std::panic::catch_unwind(|| check_trace_dir(dir.path(), &bin))
        .expect_err("llvm-xray account must reject an exit without entry");
    let msg = panic_text(&err);
    assert!(msg.contains("account rejected"), "{msg}");
    assert!(msg.contains("fdr-dump"), "{msg}");
}

fn panic_text(err: &Box<dyn std::any::Any + Send>) -> String {
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}
