//! End to end: a C program that longjmps out of traced frames (as an interpreter's error
//! handling does), traced with the defaults (return probes: nothing in it can unwind), launched
//! and by pid, also past the kernel's limit of 64 pending return probes per thread.
//!
//! Per thread and function: entries equal the calls the fixture counted, and every entry has
//! exactly one exit: its return, or the exit the daemon writes where the frame was proven gone.
//! The outer frames (the ones a longjmp lands in, and their callers) keep every exit: after a
//! longjmp the kernel's dead return instances must not hide them (the bug a real interpreter
//! showed: `main` and the drivers had no calls). No exit closes a frame other than its own, so
//! every call's duration lies within its caller's; the frames left without returning are
//! counted (`frames_unwound`, `frames_beyond_return_limit`), no exit is taken for the exit of a
//! lost entry, nothing is lost, and llvm-xray 14 and 19 read every file alike.
//!
//! Needs root, BPF, llvm-xray 14/19, clang-19 and a built daemon.
use std::path::Path;
use std::time::Duration;

use tests::counts::{expected_calls, parse_count_lines, ExpectedCalls};
use tests::fixtures::private_copy;
use tests::fixtures::workloads::{
    longjmp_fixture, parse_returned_lines, LONGJMP_DONE_20, LONGJMP_FUNCTIONS,
};
use tests::launched::launch;
use tests::run::{assert_success, start_pid, Running};
use tests::structure::entries_and_exits;
use tests::trace::{convert, read_session, Session};
use tests::{scratch_dir, LLVM_XRAY_VERSIONS};

const TIMEOUT: Duration = Duration::from_secs(300);

/// What one traced run left: the fixture's stdout, the session, the binary that ran.
struct Outcome<'a> {
    label: &'a str,
    stdout: &'a str,
    session: &'a Session,
    out: &'a Path,
    bin: &'a Path,
    /// Exits of frames entered before tracing allowed per thread (by pid: `main` was running).
    unmatched_allowed: u64,
}

fn check(o: &Outcome) {
    let label = o.label;
    assert_eq!(
        o.stdout.lines().last(),
        Some(LONGJMP_DONE_20),
        "{label}: the traced fixture must end normally:\n{}",
        o.stdout
    );
    let calls: ExpectedCalls = expected_calls(&parse_count_lines(o.stdout));
    let returned = parse_returned_lines(o.stdout);
    assert_eq!(
        o.session.json["exits"], "return",
        "{label}: auto picks return probes"
    );
    assert_eq!(o.session.events_lost, 0, "{label}: {}", o.session.json);
    tests::assert_every_event_accounted(o.session);
    let lost_entries: u64 = o.session.thread_u64("exits_of_lost_entries").values().sum();
    assert_eq!(
        lost_entries, 0,
        "{label}: no exit may pass for one of a lost entry"
    );

    let mut left_total = 0;
    let mut closed_total = 0;
    for p in &o.session.processes {
        for t in &p.threads {
            let file = o.out.join(&t.file);
            // Every call's exit closes its own frame: our reader finds no exit that had to
            // close frames above it.
            let verify = tests::tools::run_output(
                std::process::Command::new(tests::fdr_profiled())
                    .arg("verify")
                    .arg(&file),
            );
            let text = String::from_utf8_lossy(&verify.stdout);
            assert!(verify.status.success(), "{label}: {text}");
            assert!(!text.contains("unwound"), "{label}: {text}");

            let mut per_version = Vec::new();
            for major in LLVM_XRAY_VERSIONS {
                per_version.push(convert(major, o.bin, &file).records);
            }
            let key = |r: &tests::xray_yaml::Record| (r.func_id, r.kind.clone(), r.tsc);
            assert_eq!(
                per_version[0].iter().map(key).collect::<Vec<_>>(),
                per_version[1].iter().map(key).collect::<Vec<_>>(),
                "{label} tid {}: llvm-xray 14 and 19 disagree",
                t.tid
            );
            let records = &per_version[1];
            let want_calls = calls
                .get(&t.tid)
                .unwrap_or_else(|| panic!("{label}: no count lines for tid {}", t.tid));
            for f in LONGJMP_FUNCTIONS {
                let (entries, exits) = entries_and_exits(records.iter(), f);
                let want = want_calls.get(*f).copied().unwrap_or(0);
                assert_eq!(
                    (entries, exits),
                    (want, want),
                    "{label} tid {} {f}: (entries, exits) against the fixture's calls",
                    t.tid
                );
                left_total += want - returned[&t.tid].get(*f).copied().unwrap_or(0);
            }
            closed_total += o.session.thread_u64("frames_unwound")[&t.tid]
                + o.session.thread_u64("frames_beyond_return_limit")[&t.tid];
            let unmatched = o.session.thread_u64("dropped_unmatched_exits")[&t.tid];
            assert!(
                unmatched <= o.unmatched_allowed,
                "{label} tid {}: {unmatched} exits without entry",
                t.tid
            );
        }
    }
    // Each frame a longjmp left is closed and counted; beyond the return-probe limit, frames
    // that returned without a return probe are counted too.
    assert!(left_total > 0);
    assert!(
        closed_total >= left_total,
        "{label}: {closed_total} frames closed without an exit of their own, {left_total} left by longjmp"
    );
}

fn launched(depth: &str) {
    let label = format!("longjmp-depth-{depth}");
    let run = launch(
        &label,
        &longjmp_fixture(),
        &[],
        &["--iterations", "20", "--depth", depth],
        TIMEOUT,
    );
    check(&Outcome {
        label: &label,
        stdout: &run.done.stdout,
        session: &run.session,
        out: &run.out,
        bin: &run.bin,
        unmatched_allowed: 0,
    });
    if depth == "3" {
        // Shallow: exactly the frames the longjmps left, each closed once.
        let unwound: u64 = run.thread_u64("frames_unwound").values().sum();
        let beyond: u64 = run.thread_u64("frames_beyond_return_limit").values().sum();
        assert_eq!((unwound, beyond), (60 * 5, 0));
    } else {
        let beyond: u64 = run.thread_u64("frames_beyond_return_limit").values().sum();
        assert!(beyond > 0, "depth {depth} passes the kernel's limit");
    }
}

#[test]
fn longjmp_launched_with_the_defaults() {
    launched("3");
}

#[test]
fn longjmp_past_the_return_probe_limit() {
    launched("80");
}

#[test]
fn longjmp_by_pid() {
    let scratch = scratch_dir("longjmp-pid");
    let bin = private_copy(&longjmp_fixture(), scratch.path());
    let out = scratch.path().join("out");
    let mut fixture = Running::spawn_piped(
        "longjmp",
        std::process::Command::new(&bin).args(["--iterations", "20", "--wait-stdin"]),
    );
    let mut tracer = start_pid(fixture.pid(), &out, &[]);
    tracer.wait_for_stderr_line(tests::RECORDING_PREFIX, Duration::from_secs(60));
    fixture.send_line("go");
    let fixture = fixture.finish(TIMEOUT);
    assert_success("longjmp fixture", &fixture);
    let tracer = tracer.finish(TIMEOUT);
    assert_success("fdr-profiled --pid", &tracer);
    let session = read_session(&out);
    check(&Outcome {
        label: "longjmp-pid",
        stdout: &fixture.stdout,
        session: &session,
        out: &out,
        bin: &bin,
        unmatched_allowed: 1,
    });
}

/// By pid, the main thread longjmps from 101 frames deep straight back to `main`, entered
/// before tracing: the kernel keeps 64 dead return-probe instances that no traced caller will
/// drop, and hooks no new frame of that thread. The programs see it in the kernel's own count,
/// and the session observes exits by their sleds from then on (no keeper here to make the
/// thread pass through the trampoline, as `--exits repair` does): every call's entry is in the
/// file, the calls after the switch end with their sleds' exits, counted so in the summary.
#[test]
fn longjmp_past_the_limit_to_a_frame_before_tracing_turns_to_exit_sleds() {
    let scratch = scratch_dir("longjmp-escape");
    let bin = private_copy(&longjmp_fixture(), scratch.path());
    let out = scratch.path().join("out");
    let mut fixture = Running::spawn_piped(
        "longjmp",
        std::process::Command::new(&bin).args([
            "--iterations",
            "20000",
            "--wait-stdin",
            "--escape-depth",
            "100",
        ]),
    );
    // Three threads flat out: rings large enough for a debug daemon to lose nothing.
    let mut tracer = start_pid(fixture.pid(), &out, &["--buffer-size", "67108864"]);
    tracer.wait_for_stderr_line(tests::RECORDING_PREFIX, Duration::from_secs(60));
    fixture.send_line("go");
    let fixture = fixture.finish(TIMEOUT);
    assert_success("longjmp fixture", &fixture);
    let tracer = tracer.finish(TIMEOUT);
    assert_success("fdr-profiled --pid", &tracer);
    assert!(
        tracer
            .stderr
            .contains("exit sleds placed instead of return probes"),
        "{}",
        tracer.stderr
    );
    let session = read_session(&out);
    assert_eq!(session.events_lost, 0, "{}", session.json);
    tests::assert_every_event_accounted(&session);
    let methods = &session.json["exit_methods"];
    assert!(methods["exit_sled_calls"].as_u64() > Some(0), "{methods}");
    // Every entry is in the files, as the fixture counted them.
    let calls: ExpectedCalls = expected_calls(&parse_count_lines(&fixture.stdout));
    for p in &session.processes {
        for t in &p.threads {
            let records = convert(19, &bin, &out.join(&t.file)).records;
            let Some(want) = calls.get(&t.tid) else {
                continue;
            };
            for (function, n) in want {
                let entries = records
                    .iter()
                    .filter(|r| &r.function == function && !r.kind.is_exit())
                    .count() as u64;
                assert_eq!(entries, *n, "thread {}: {function}", t.tid);
            }
        }
    }
}
