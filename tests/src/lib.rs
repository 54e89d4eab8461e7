//! Test support for the fdr-profiled end-to-end tests.
//!
//! - [`fixtures`]: the XRay fixture programs (C++ and Rust), built from
//!   `tests/fixtures/` at test time into `<target dir>/fixtures/` and reused;
//!   [`private_copy`] for tests that must trace their own inode.
//! - [`tools`]: paths of the daemon under test ([`fdr_profiled`]),
//!   compilers; scratch directories; llvm-xray 14/19 ([`llvm_xray`]) from
//!   the reference crate.
//! - [`xray_reference`] (a crate of its own, shared with `xray-fdr`'s unit
//!   tests, re-exported): llvm-xray 14 and 19 run on files, and
//!   [`xray_yaml`], its reader for llvm-xray's YAML (`convert` records,
//!   `extract` sleds). The reference side of the tests: it never uses the
//!   daemon's own FDR code.
//! - [`trace`]: [`check_trace_dir`] loads a daemon output directory with both
//!   llvm-xray versions; [`assert_process_calls`] compares it with a
//!   fixture's `count` lines.
//! - [`counts`]: the fixtures' `count tid=.. function=.. calls=..` lines.
//! - [`cpu_records`]: one thread's records with their CPUs, and the migration tests' checks
//!   (a NewCPUId at every change of CPU, time never going back).
//! - [`durations`]: every call within its caller, in a session's Chrome timeline and in its
//!   per-thread report.
//! - [`fdr_agree`]: our FDR reader against llvm-xray 14 and 19 on the same file, record for
//!   record or by counts (also `xray-fdr`'s `tests/roundtrip.rs`, which includes it by path).
//! - [`pprof`]: pprof profiles read by `go tool pprof`.
//! - [`receiver`]: a local HTTP receiver standing in for Pyroscope or a Collector.
//! - [`run`]: running the daemon and fixtures as children with timeouts.
//! - [`service`]: [`service::ServiceStart`], the one way the tests start `fdr-profiled
//!   service`, and its status.
//! - [`scenario`]: the `--attach` and `-- CMD` end-to-end runs shared by the
//!   C++ and Rust tests.
//! - [`objects`]: what a traced process's shared objects leave (per-object lines, build-ids,
//!   load addresses, `session.json`'s objects, records resolved per object), for the tests of
//!   the dso fixture.
//! - [`machine`]: the emulated arm64 machine (`cargo xtask vm aarch64`) running a script of
//!   scenarios, its results read back here.
//! - [`launched`]: `-- CMD` runs the exit-mode, loss, migration and event
//!   tests inspect themselves (session fields, our reader, llvm-xray).
//! - [`structure`]: per-thread call structure compared with a native XRay
//!   FDR trace.
//! - [`synthetic_session`]: hand-made session directories (`session.json`,
//!   FDR files written with the daemon's writer or encoded by hand) for the
//!   `report`, `convert` and `viewer` tests and the trace checks' self-test.
//!
//! Nothing here skips a test because a tool is missing: it panics saying
//! what to install.

pub mod counts;
pub mod cpu_records;
pub mod durations;
pub mod fdr_agree;
pub mod fixtures;
pub mod launched;
pub mod machine;
pub mod memory;
pub mod objects;
pub mod pprof;
pub mod receiver;
pub mod run;
pub mod scenario;
pub mod server;
pub mod service;
pub mod structure;
#[cfg(test)]
mod synthetic;
pub mod synthetic_session;
pub mod tmux;
pub mod tools;
pub mod trace;
pub use xray_reference;
pub use xray_reference::yaml as xray_yaml;

pub use counts::{expected_calls, parse_count_lines, parse_gap_ns, CountLine, ExpectedCalls};
pub use fixtures::{
    cpp_fixture, extract_sleds, native_fdr_fixture, native_fdr_trace, plain_c_fixture,
    private_copy, rust_fixture, CPP_FUNCTIONS, CPP_GAP_PROBE, CPP_LOGGED, CPP_MAIN, RUST_FUNCTIONS,
    RUST_MAIN,
};
pub use run::{
    assert_success, interrupt_and_finish, run_launch, spawn_fixture, start_attach, wait_attached,
    Finished, Running, ATTACHED_PREFIX, RECORDING_PREFIX, WAITING_PREFIX,
};
pub use tools::{
    fdr_dump, fdr_profiled, llvm_xray, profile_dir, scratch_dir, target_dir, LLVM_XRAY_VERSIONS,
};
pub use trace::{
    account, assert_every_event_accounted, assert_process_calls, assert_session_totals,
    check_trace_dir, convert, read_session, summary_events_lost, CallCounts, MainCall,
    ProcessExpectation, Session, ThreadTrace, TraceDir,
};
pub use xray_yaml::{parse_convert_yaml, parse_extract_yaml, Record, RecordKind, Sled, SledKind};

#[cfg(test)]
mod native_reference {
    //! The YAML reader and the counting, checked against a trace compiler-rt
    //! wrote itself (FDR version 5, all threads in one file).
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn native_fdr_trace_matches_fixture_counts() {
        let dir = scratch_dir("native");
        let (file, stdout) = native_fdr_trace(dir.path(), &["--iterations", "5"]);
        let expected = expected_calls(&parse_count_lines(&stdout));
        assert_eq!(expected.len(), 4, "4 threads report counts:\n{stdout}");
        let bin = native_fdr_fixture();
        let mut by_version = Vec::new();
        for major in LLVM_XRAY_VERSIONS {
            let c = convert(major, &bin, &file);
            assert_eq!(c.header.version, 5);
            assert_eq!(c.header.file_type, 1);
            // Per thread, per function: entries and exits.
            let mut got: BTreeMap<u32, BTreeMap<String, CallCounts>> = BTreeMap::new();
            for r in &c.records {
                let e = got
                    .entry(r.thread)
                    .or_default()
                    .entry(r.function.clone())
                    .or_default();
                match r.kind {
                    RecordKind::Enter => e.enter += 1,
                    RecordKind::EnterArg => {
                        e.enter_arg += 1;
                        assert_eq!(r.function, CPP_LOGGED);
                        assert_eq!(r.args.len(), 1, "{r:?}");
                        assert_eq!(r.args[0] % 3, 0, "fx_logged gets multiples of 3: {r:?}");
                    }
                    RecordKind::Exit => e.exit += 1,
                    RecordKind::TailExit => e.tail_exit += 1,
                    ref k => panic!("unexpected record kind {k:?}"),
                }
            }
            assert_eq!(
                got.keys().collect::<Vec<_>>(),
                expected.keys().collect::<Vec<_>>()
            );
            for (tid, fns) in &expected {
                for (name, n) in fns {
                    let c = got[tid].get(name).copied().unwrap_or_default();
                    assert_eq!(c.entries(), *n, "tid {tid} {name}: {c:?}");
                    assert_eq!(c.exits(), *n, "tid {tid} {name}: {c:?}");
                }
                for name in got[tid].keys() {
                    assert!(
                        fns.contains_key(name),
                        "tid {tid}: {name} in the trace but not counted"
                    );
                }
                assert_eq!(got[tid]["fx_logged"].enter, 0);
                assert!(got[tid]["fx_tail_caller"].tail_exit > 0);
                assert_eq!(got[tid]["fx_tail_caller"].exit, 0);
            }
            by_version.push(c);
        }
        // Both versions read the same records. They may order the buffers of
        // different threads differently (seen under load), so compare each
        // thread's records in order.
        assert_eq!(by_version[0].header, by_version[1].header);
        let per_thread = |c: &xray_yaml::Converted| {
            let mut m: BTreeMap<u32, Vec<Record>> = BTreeMap::new();
            for r in &c.records {
                m.entry(r.thread).or_default().push(r.clone());
            }
            m
        };
        let (a, b) = (per_thread(&by_version[0]), per_thread(&by_version[1]));
        assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
        for (tid, ra) in &a {
            let rb = &b[tid];
            assert_eq!(
                ra.len(),
                rb.len(),
                "tid {tid}: record counts of llvm-xray 14 and 19"
            );
            for (i, (x, y)) in ra.iter().zip(rb).enumerate() {
                assert_eq!(
                    x, y,
                    "tid {tid}: llvm-xray 14 and 19 disagree on record {i}"
                );
            }
        }
    }
}
