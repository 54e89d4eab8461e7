//! Property tests of the FDR writer and reader: random valid record streams (every record kind,
//! versions 1 and 5, TSC wraps, CPU changes, any number of arguments, custom and typed events of
//! odd sizes, flushes and small commit sizes) are written, then
//! - our reader must return exactly the records written (2000 streams);
//! - llvm-xray 14 and 19 must load every file of a further 300 and agree with our reader on
//!   every function record (id, kind, absolute tsc, cpu, thread, process, arguments) and on the
//!   number of events.
//!
//! Needs llvm-xray 14 and 19 (`cargo xtask setup` installs them); no root.

// Our reader against llvm-xray, shared with the end-to-end tests (it uses only this crate and
// xray-reference).
#[allow(dead_code)]
#[path = "../../../tests/src/fdr_agree.rs"]
mod fdr_agree;

use std::io::Cursor;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};

use xray_fdr::reader::{read, Record, RecordKind, Trace};
use xray_fdr::writer::{Recorded, TYPED_EVENT_PREFIX};
use xray_fdr::{FdrVersion, FunctionAction, ThreadWriter, WallClock};

/// One writer call of a generated stream. Times are deltas from the previous call.
#[derive(Debug, Clone)]
enum Op {
    Enter {
        fid: u32,
        dt: u64,
    },
    EnterArgs {
        fid: u32,
        dt: u64,
        args: Vec<u64>,
    },
    /// Exits the innermost open function (or does nothing on an empty stack).
    Exit {
        dt: u64,
        tail: bool,
    },
    Custom {
        dt: u64,
        data: Vec<u8>,
    },
    Typed {
        dt: u64,
        event_type: u16,
        data: Vec<u8>,
    },
    /// Moves to another CPU for the following calls.
    Cpu(u16),
    /// A gap that does not fit a 32-bit delta.
    Gap(u64),
    Flush,
}

#[derive(Debug, Clone)]
struct Stream {
    version: FdrVersion,
    tid: u32,
    pid: u32,
    commit_bytes: usize,
    ops: Vec<Op>,
}

fn payload(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => prop::collection::vec(any::<u8>(), 1..40),
        1 => prop::collection::vec(any::<u8>(), 1..max),
    ]
}

fn op(max_payload: usize) -> impl Strategy<Value = Op> {
    let dt = prop_oneof![4 => 0u64..20, 1 => 0u64..100_000];
    let fid = 1u32..(1 << 28);
    prop_oneof![
        6 => (fid.clone(), dt.clone()).prop_map(|(fid, dt)| Op::Enter { fid, dt }),
        2 => (fid, dt.clone(), prop::collection::vec(any::<u64>(), 0..7))
            .prop_map(|(fid, dt, args)| Op::EnterArgs { fid, dt, args }),
        7 => (dt.clone(), prop::bool::weighted(0.2)).prop_map(|(dt, tail)| Op::Exit { dt, tail }),
        2 => (dt.clone(), payload(max_payload)).prop_map(|(dt, data)| Op::Custom { dt, data }),
        2 => (dt, any::<u16>(), payload(max_payload))
            .prop_map(|(dt, event_type, data)| Op::Typed { dt, event_type, data }),
        1 => any::<u16>().prop_map(Op::Cpu),
        1 => ((1u64 << 32)..(1u64 << 40)).prop_map(Op::Gap),
        1 => Just(Op::Flush),
    ]
}

fn stream() -> impl Strategy<Value = Stream> {
    (
        prop_oneof![Just(FdrVersion::V1), Just(FdrVersion::V5)],
        1u32..(1 << 22),
        0u32..(1 << 22),
        prop_oneof![Just(0usize), Just(100), Just(2000), Just(1 << 16)],
    )
        .prop_flat_map(|(version, tid, pid, commit_bytes)| {
            // Version 5 keeps crash safety only for events that fit in a page.
            let max = if version == FdrVersion::V5 {
                4000
            } else {
                9000
            };
            prop::collection::vec(op(max), 0..160).prop_map(move |ops| Stream {
                version,
                tid,
                pid,
                commit_bytes,
                ops,
            })
        })
}

const WALL: WallClock = WallClock {
    secs: 1_712_345_678,
    micros: 999_999,
};

/// Writes `s` and returns the file and the records a reader must return.
fn write(s: &Stream) -> (Vec<u8>, Vec<Record>) {
    let mut w = ThreadWriter::with_version(
        Cursor::new(Vec::new()),
        s.tid,
        s.pid,
        1_000_000_000,
        WALL,
        s.version,
    )
    .unwrap()
    .with_commit_bytes(s.commit_bytes);
    let pid = if s.version == FdrVersion::V1 {
        0
    } else {
        s.pid
    };
    let mut want = Vec::new();
    let mut push = |tsc: u64, cpu: u16, kind: RecordKind| {
        want.push(Record {
            offset: 0,
            tid: s.tid,
            pid,
            cpu,
            tsc,
            kind,
        })
    };
    let (mut tsc, mut cpu) = (1_000_000u64, 0u16);
    let mut stack = Vec::new();
    for op in &s.ops {
        let fun = |action, function_id, args| RecordKind::Function {
            action,
            function_id,
            args,
        };
        match op {
            Op::Enter { fid, dt } => {
                tsc += dt;
                assert_eq!(
                    w.function(FunctionAction::Entry, *fid, tsc, cpu).unwrap(),
                    Recorded::Written
                );
                stack.push(*fid);
                push(tsc, cpu, fun(FunctionAction::Entry, *fid, vec![]));
            }
            Op::EnterArgs { fid, dt, args } => {
                tsc += dt;
                w.entry_with_args(*fid, tsc, cpu, args).unwrap();
                stack.push(*fid);
                push(tsc, cpu, fun(FunctionAction::EntryArgs, *fid, args.clone()));
            }
            Op::Exit { dt, tail } => {
                let Some(fid) = stack.pop() else { continue };
                tsc += dt;
                let action = if *tail {
                    FunctionAction::TailExit
                } else {
                    FunctionAction::Exit
                };
                assert_eq!(
                    w.function(action, fid, tsc, cpu).unwrap(),
                    Recorded::Written
                );
                push(tsc, cpu, fun(action, fid, vec![]));
            }
            Op::Custom { dt, data } => {
                tsc += dt;
                w.custom_event(tsc, cpu, data).unwrap();
                push(tsc, cpu, RecordKind::CustomEvent { data: data.clone() });
            }
            Op::Typed {
                dt,
                event_type,
                data,
            } => {
                tsc += dt;
                w.typed_event(tsc, cpu, *event_type, data).unwrap();
                let kind = match s.version {
                    FdrVersion::V5 => RecordKind::TypedEvent {
                        event_type: *event_type,
                        data: data.clone(),
                    },
                    FdrVersion::V1 => RecordKind::CustomEvent {
                        data: [&TYPED_EVENT_PREFIX[..], &event_type.to_le_bytes(), data].concat(),
                    },
                };
                push(tsc, cpu, kind);
            }
            Op::Cpu(c) => cpu = *c,
            Op::Gap(g) => tsc += g,
            Op::Flush => w.flush().unwrap(),
        }
    }
    let (out, stats) = w.finish().unwrap();
    let bytes = out.into_inner();
    assert_eq!(stats.bytes, bytes.len() as u64);
    assert_eq!(stats.clamped_tscs, 0);
    (bytes, want)
}

/// Our reader on `bytes`, compared with `want` (offsets aside) and the header facts.
fn check_ours(s: &Stream, bytes: &[u8], want: &[Record]) -> Result<Trace, TestCaseError> {
    let t = read(bytes).map_err(|e| TestCaseError::fail(format!("unreadable: {e}")))?;
    prop_assert_eq!(t.header.version, s.version.number());
    prop_assert_eq!(t.header.buffer_size, bytes.len() as u64 - 32);
    prop_assert_eq!(t.blocks.len(), 1);
    prop_assert_eq!(t.blocks[0].wall, WALL);
    let got: Vec<Record> = t
        .records
        .iter()
        .map(|r| Record {
            offset: 0,
            ..r.clone()
        })
        .collect();
    prop_assert_eq!(&got[..], want);
    Ok(t)
}

#[test]
fn reader_returns_exactly_what_was_written() {
    let mut runner = TestRunner::new(Config {
        cases: 2000,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&stream(), |s| {
            let (bytes, want) = write(&s);
            check_ours(&s, &bytes, &want).map(|_| ())
        })
        .unwrap();
}

#[test]
fn llvm_xray_agrees_on_every_file() {
    const FILES: usize = 300;
    let dir = tempfile::Builder::new()
        .prefix("fdr-roundtrip-")
        .tempdir()
        .unwrap();
    let mut runner = TestRunner::deterministic();
    let strategy = stream();
    let mut files = Vec::new();
    for i in 0..FILES {
        let s = strategy.new_tree(&mut runner).unwrap().current();
        let (bytes, want) = write(&s);
        let trace = check_ours(&s, &bytes, &want).unwrap();
        let path = dir.path().join(format!("case-{i}-v{}.fdr", s.version));
        std::fs::write(&path, &bytes).unwrap();
        files.push((path, trace));
    }
    let failures = fdr_agree::parallel(&files, 2, |(path, trace)| fdr_agree::agree(path, trace));
    assert!(
        failures.is_empty(),
        "{} of {FILES} files:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
