//! End to end: logged arguments, custom events, typed events and tail calls of the events
//! fixture (tests/fixtures/events.cpp), checked against what the fixture printed and against
//! compiler-rt's own FDR trace of the same program.
//!
//! - `--args 6`: every `ev_args` entry is an Entry_Args with the 6 values the fixture passed.
//! - Custom events: every payload byte for byte, in order; payloads over `--max-event-bytes`
//!   cut to it and counted (`custom_events`, `custom_events_truncated` in session.json).
//! - Tail calls: `ev_tail_caller` leaves by one Tail_Exit per call, in both exit modes.
//! - The call structure (and event payloads, cut to the cap) equals the native trace's.
//! - `--fdr-version 5`: typed events as TypedEventMarker records with type and payload
//!   (`typed_events`); version 1 carries them as `XRTE` custom events.
//!
//! Needs root, BPF, llvm-xray 14/19, clang-19 and a built daemon.

use std::collections::BTreeMap;
use std::time::Duration;

use tests::fixtures::workloads::{
    events_fixture, events_native_fixture, events_typed_fixture, native_trace,
};
use tests::launched::{function_names, function_names_from_list, launch, Launched};
use tests::structure::{assert_same_structure, per_thread, Payloads};
use tests::tools::scratch_dir;
use tests::{convert, LLVM_XRAY_VERSIONS};
use xray_fdr::reader::{Record, RecordKind};
use xray_fdr::FunctionAction;

const TIMEOUT: Duration = Duration::from_secs(120);
const ROUNDS: &str = "8";
/// Rounds 3 and 7 log a big custom event.
const BIG_EVENTS: u64 = 2;

/// What the fixture printed.
struct Printed {
    /// Per round: the 6 arguments of `ev_args`.
    args: Vec<[u64; 6]>,
    /// Every custom event's payload, in order.
    custom: Vec<Vec<u8>>,
    /// Every typed event: type and payload, in order.
    typed: Vec<(u16, Vec<u8>)>,
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

fn num(line: &str, key: &str) -> u64 {
    field(line, key)
        .parse()
        .unwrap_or_else(|e| panic!("{key} in {line:?}: {e}"))
}

fn printed(stdout: &str) -> Printed {
    let mut p = Printed {
        args: Vec::new(),
        custom: Vec::new(),
        typed: Vec::new(),
    };
    for line in stdout.lines() {
        if line.starts_with("args ") {
            assert_eq!(num(line, "round"), p.args.len() as u64);
            let mut a = [0u64; 6];
            for (k, v) in a.iter_mut().enumerate() {
                *v = num(line, &format!("a{k}"));
            }
            p.args.push(a);
        } else if line.starts_with("custom ") {
            let (round, bytes) = (num(line, "round"), num(line, "bytes") as usize);
            let small = format!("custom round={round}");
            p.custom.push(if bytes == small.len() {
                small.into_bytes()
            } else {
                (0..bytes)
                    .map(|i| b'A' + ((i as u64 + round) % 26) as u8)
                    .collect()
            });
        } else if line.starts_with("typed ") {
            let round = num(line, "round");
            let payload = format!("typed round={round}").into_bytes();
            assert_eq!(num(line, "bytes") as usize, payload.len());
            p.typed.push((num(line, "type") as u16, payload));
        }
    }
    assert_eq!(p.args.len(), 8, "{stdout}");
    assert_eq!(p.custom.len() as u64, 8 + BIG_EVENTS, "{stdout}");
    p
}

/// The main thread's records, read by our reader (the fixture has one thread).
fn records(run: &Launched) -> Vec<Record> {
    let files = run.files();
    assert_eq!(files.len(), 1, "one thread");
    files.into_iter().next().unwrap().trace.records
}

/// Checks arguments, custom payloads (cut to `cap`), counters, tail calls; returns the run's
/// records.
fn check_run(
    run: &Launched,
    names: &BTreeMap<u32, String>,
    nargs: usize,
    cap: usize,
) -> Vec<Record> {
    let p = printed(&run.done.stdout);
    let recs = records(run);
    let name = |id: &u32| names[id].as_str();

    let logged: Vec<&Vec<u64>> = recs
        .iter()
        .filter_map(|r| match &r.kind {
            RecordKind::Function {
                action: FunctionAction::EntryArgs,
                function_id,
                args,
            } => {
                assert_eq!(name(function_id), "ev_args");
                Some(args)
            }
            _ => None,
        })
        .collect();
    let want: Vec<Vec<u64>> = p.args.iter().map(|a| a[..nargs].to_vec()).collect();
    assert_eq!(
        logged.into_iter().cloned().collect::<Vec<_>>(),
        want,
        "--args {nargs}"
    );

    let custom: Vec<&Vec<u8>> = recs
        .iter()
        .filter_map(|r| match &r.kind {
            RecordKind::CustomEvent { data } if !data.starts_with(b"XRTE") => Some(data),
            _ => None,
        })
        .collect();
    assert_eq!(custom.len(), p.custom.len(), "custom events");
    for (i, (got, sent)) in custom.iter().zip(&p.custom).enumerate() {
        let want = &sent[..sent.len().min(cap)];
        assert!(
            got.as_slice() == want,
            "custom event {i}: {} bytes {:?}..., want {} bytes {:?}...",
            got.len(),
            String::from_utf8_lossy(&got[..got.len().min(20)]),
            want.len(),
            String::from_utf8_lossy(&want[..want.len().min(20)])
        );
    }
    let truncated = p.custom.iter().filter(|c| c.len() > cap).count() as u64;
    assert_eq!(run.session_u64("custom_events"), p.custom.len() as u64);
    assert_eq!(run.session_u64("custom_events_truncated"), truncated);
    let pid = run.pid();
    assert_eq!(run.thread_u64("custom_events")[&pid], p.custom.len() as u64);
    assert_eq!(run.thread_u64("custom_events_truncated")[&pid], truncated);

    // One Tail_Exit per ev_tail_caller call, no Exit.
    let of = |f: &str, a: FunctionAction| {
        recs.iter()
            .filter(|r| matches!(&r.kind, RecordKind::Function { action, function_id, .. } if *action == a && name(function_id) == f))
            .count()
    };
    assert_eq!(of("ev_tail_caller", FunctionAction::Entry), 8);
    assert_eq!(of("ev_tail_caller", FunctionAction::TailExit), 8);
    assert_eq!(of("ev_tail_caller", FunctionAction::Exit), 0);
    assert_eq!(of("ev_tail_target", FunctionAction::Exit), 8);
    assert_eq!(run.session.events_lost, 0);
    recs
}

/// `--args 6`, default cap (4096), both exit modes: values as printed, payloads cut to the cap,
/// and the structure of compiler-rt's own trace of the same program.
#[test]
fn arguments_events_and_tail_calls_match_the_fixture_and_native_trace() {
    let native_dir = scratch_dir("events-native");
    let native_bin = events_native_fixture();
    let (native_file, native_stdout) =
        native_trace(&native_bin, native_dir.path(), &["--iterations", ROUNDS]);
    assert!(native_stdout.ends_with("events: done rounds=8\n"));
    let native = per_thread(&convert(19, &native_bin, &native_file).records);
    for mode in ["sleds", "return"] {
        let run = launch(
            &format!("events-{mode}"),
            &events_fixture(),
            &["--exits", mode, "--args", "6"],
            &["--iterations", ROUNDS],
            TIMEOUT,
        );
        check_run(&run, &function_names(&run.bin), 6, 4096);
        for major in LLVM_XRAY_VERSIONS {
            let ours = per_thread(run.converted(major).values().flat_map(|c| c.records.iter()));
            assert_same_structure(
                &format!("events.cpp, --exits {mode}, llvm-xray {major}"),
                &ours,
                &native,
                Payloads { max_bytes: 4096 },
            );
        }
    }
}

/// Default `--args` (1) and `--max-event-bytes 100`: one argument; big payloads cut to 100
/// bytes and counted, small ones whole.
#[test]
fn default_args_and_small_event_cap() {
    let run = launch(
        "events-cap",
        &events_fixture(),
        &["--max-event-bytes", "100"],
        &["--iterations", ROUNDS],
        TIMEOUT,
    );
    check_run(&run, &function_names(&run.bin), 1, 100);
    assert_eq!(run.session_u64("custom_events_truncated"), BIG_EVENTS);
}

/// Typed events: TypedEventMarker records in version 5 (type and payload as sent), `XRTE`
/// custom events in version 1; counted as `typed_events`. llvm-xray cannot load this binary's
/// map (typed-event sleds), so its `fdr-dump` (no map needed) checks the files.
#[test]
fn typed_events_in_both_versions() {
    for version in ["5", "1"] {
        let run = launch(
            &format!("events-typed-v{version}"),
            &events_typed_fixture(),
            &["--fdr-version", version],
            &["--iterations", ROUNDS],
            TIMEOUT,
        );
        let p = printed(&run.done.stdout);
        assert_eq!(p.typed.len(), 8);
        let recs = check_run(&run, &function_names_from_list(&run.bin), 1, 4096);
        let typed: Vec<(u16, Vec<u8>)> = recs
            .iter()
            .filter_map(|r| match &r.kind {
                RecordKind::TypedEvent { event_type, data } => Some((*event_type, data.clone())),
                RecordKind::CustomEvent { data } if data.starts_with(b"XRTE") => {
                    assert_eq!(version, "1", "XRTE custom events only in version 1");
                    Some((u16::from_le_bytes([data[4], data[5]]), data[6..].to_vec()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(typed, p.typed, "--fdr-version {version}: typed events");
        if version == "5" {
            assert!(recs
                .iter()
                .any(|r| matches!(r.kind, RecordKind::TypedEvent { .. })));
        }
        assert_eq!(run.session_u64("typed_events"), 8);
        assert_eq!(run.thread_u64("typed_events")[&run.pid()], 8);
        for f in run.files() {
            for major in LLVM_XRAY_VERSIONS {
                let out =
                    tests::xray_reference::run(major, ["fdr-dump".as_ref(), f.path.as_os_str()]);
                assert!(
                    out.status.success(),
                    "llvm-xray {major} fdr-dump rejects {}: {}",
                    f.path.display(),
                    tests::tools::tail_lines(&String::from_utf8_lossy(&out.stderr), 5)
                );
            }
        }
    }
}

/// A custom event whose payload cannot be read (its pointer names no mapped memory): written
/// without payload and counted as unreadable, and with `-v` the kernel program's report of it
/// (aya-log) is shown, once per event, naming the thread, the size and the address; without
/// `-v` nothing is shown and the count is the same.
#[test]
fn unreadable_payloads_are_counted_and_reported_with_verbose() {
    const UNREADABLE: u64 = 3;
    let n = UNREADABLE.to_string();
    for verbose in [true, false] {
        let daemon_args: &[&str] = if verbose { &["-v"] } else { &[] };
        let run = launch(
            &format!("events-unreadable-{verbose}"),
            &events_fixture(),
            daemon_args,
            &["--iterations", "2", "--unreadable", &n],
            TIMEOUT,
        );
        assert!(run
            .done
            .stdout
            .lines()
            .any(|l| l == format!("unreadable events={UNREADABLE}")));
        let pid = run.pid();
        assert_eq!(run.thread_u64("unreadable_events")[&pid], UNREADABLE);
        assert_eq!(run.session_u64("events_lost"), 0);
        // llvm-xray 14 and 19 load the file; ev_unreadable's one call is in it.
        let trace = tests::trace::check_trace_dir(&run.out, &run.bin);
        let calls = trace.threads[0].calls();
        assert_eq!(calls["ev_unreadable"].entries(), 1, "{calls:?}");
        assert_eq!(calls["ev_unreadable"].exits(), 1, "{calls:?}");
        let want = format!(
            "fdr-profiled: kernel: warn: thread {pid}: the payload of a custom event (16 bytes at 10) could not be read: written without it"
        );
        let shown = run.done.stderr.lines().filter(|l| *l == want).count() as u64;
        assert_eq!(
            shown,
            if verbose { UNREADABLE } else { 0 },
            "-v {verbose}: {want:?} in:\n{}",
            run.done.stderr
        );
    }
}
