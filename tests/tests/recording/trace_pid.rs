//! End to end, `--pid`: attach to one running process of a binary that another process also
//! runs. Only the target is traced, every thread of it, with exact per-thread counts checked
//! against what the fixture reports and every file loaded by llvm-xray 14 and 19; the daemon
//! ends by itself when the target exits.
use tests::scenario::{assert_cpp_logged_args, trace_pid, trace_pid_with, CPP, RUST};

#[test]
fn cpp_process_by_pid() {
    let run = trace_pid(&CPP, 100);
    assert_cpp_logged_args(&run.trace);
}

#[test]
fn rust_process_by_pid() {
    trace_pid(&RUST, 100);
}

/// The running process's executable was deleted and replaced by a new file (same bytes, new
/// inode) before attaching: probes must land on the inode the process runs — through
/// /proc/PID/exe — or the counts would all be zero; the manifest says the file was replaced.
#[test]
fn process_whose_binary_was_replaced_on_disk() {
    let run = trace_pid_with(&CPP, 50, true);
    let processes = run.trace.session.json["processes"]
        .as_array()
        .expect("session.json has processes");
    assert_eq!(processes.len(), 1);
    assert_eq!(
        processes[0]["binary_deleted"],
        serde_json::Value::Bool(true),
        "session.json should record that the binary was replaced:\n{}",
        run.trace.session.json
    );
}

/// Attaching to and detaching from a busy process: probes are placed and removed one link at a
/// time, but nothing is recorded until all of them are in place, nor after the first is
/// removed. So the only exits without an entry are those of the frames open when recording
/// starts (at most the fixture's stack depth: main, cx_loop, cx_tiny, per thread), however hot
/// the loop, and no frame is left without its exit (the program neither throws nor jumps; a
/// recording still running while the exit probes went first closed hundreds of them).
#[test]
fn busy_process_by_pid_is_recorded_only_while_every_probe_is_in_place() {
    use std::time::Duration;
    use tests::fixtures::workloads::calls_fixture;
    let scratch = tests::scratch_dir("pid-busy");
    let bin = tests::fixtures::private_copy(&calls_fixture(), scratch.path());
    let out = scratch.path().join("out");
    let fixture = tests::run::spawn_fixture(
        "calls",
        &bin,
        &["--threads", "2", "--seconds", "10", "--quiet"],
    );
    std::thread::sleep(Duration::from_millis(500));
    let tracer = tests::run::start_pid(
        fixture.pid(),
        &out,
        &["--exits", "sleds", "--duration", "1.5", "--no-report"],
    );
    let tracer = tracer.finish(Duration::from_secs(120));
    tests::run::assert_success("fdr-profiled --pid on a busy process", &tracer);
    let fixture = fixture.finish(Duration::from_secs(120));
    tests::run::assert_success("calls fixture", &fixture);
    let session = tests::read_session(&out);
    assert_eq!(session.events_lost, 0, "{}", session.json);
    tests::assert_every_event_accounted(&session);
    let mut threads = 0;
    for p in session.json["processes"].as_array().into_iter().flatten() {
        for t in p["threads"].as_array().into_iter().flatten() {
            threads += 1;
            let unmatched = t["dropped_unmatched_exits"].as_u64().expect("integer");
            assert!(
                unmatched <= 3,
                "{unmatched} exits without entry in one thread, more than frames can be open: {t}"
            );
            // The program neither throws nor jumps: every exit without entry is proven to be
            // of a call entered before recording began (each above the last).
            assert_eq!(
                t["exits_entered_before_tracing"].as_u64(),
                Some(unmatched),
                "{t}"
            );
            assert!(
                t["events"].as_u64().unwrap() > 1000,
                "the loop was traced: {t}"
            );
            for closed in [
                "frames_unwound",
                "frames_closed_by_loss",
                "frames_beyond_return_limit",
            ] {
                assert_eq!(t[closed], 0, "{closed}: {t}");
            }
        }
    }
    assert_eq!(threads, 2, "{}", session.json);
}

/// A SIGINT that comes while the probes are still being placed ends the session as soon as it
/// starts, even when fdr-profiled inherited SIGINT ignored (as a background job of a
/// non-interactive shell does): it is held, not discarded, and not fatal half-attached. The
/// signal is sent once the daemon holds it (SIGINT in its blocked mask, before it has read the
/// process's objects); the traced program goes on.
#[test]
fn sigint_while_attaching_ends_the_session_even_when_inherited_ignored() {
    use std::os::unix::process::CommandExt as _;
    use std::process::Command;
    use std::time::{Duration, Instant};
    use tests::fixtures::workloads::calls_fixture;
    let scratch = tests::scratch_dir("pid-early-sigint");
    let out = scratch.path().join("out");
    let fixture = tests::run::spawn_fixture(
        "calls",
        &calls_fixture(),
        &["--threads", "1", "--seconds", "60", "--quiet"],
    );
    let mut cmd = Command::new(tests::fdr_profiled());
    cmd.args(["--pid", &fixture.pid().to_string(), "--no-report", "--out"])
        .arg(&out);
    // SAFETY: signal(2) is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        });
    }
    let tracer = tests::run::Running::spawn("fdr-profiled", &mut cmd);
    let blocked = |pid: u32| {
        tests::run::signal_mask(pid.into(), "SigBlk")
            .is_some_and(|mask| mask & (1 << (libc::SIGINT - 1)) != 0)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !blocked(tracer.pid()) {
        assert!(Instant::now() < deadline, "fdr-profiled never held SIGINT");
        std::thread::sleep(Duration::from_micros(200));
    }
    let (_, stderr) = tracer.output_so_far();
    assert!(
        !stderr.contains("every probe is in place"),
        "the signal must come before recording starts:\n{stderr}"
    );
    tracer.signal(libc::SIGINT);
    // The program runs for a minute: only the SIGINT can end the session this early.
    let done = tracer.finish(Duration::from_secs(30));
    tests::run::assert_success("fdr-profiled, interrupted while attaching", &done);
    assert!(
        done.stderr
            .contains("fdr-profiled: recording: every probe is in place")
            && done.stderr.contains("fdr-profiled: session summary"),
        "{}",
        done.stderr
    );
    // SAFETY: kill(2) with signal 0 only checks that the fixture still runs.
    assert_eq!(
        unsafe { libc::kill(fixture.pid() as i32, 0) },
        0,
        "the program goes on"
    );
    fixture.signal(libc::SIGKILL);
}

/// `--duration` ends the session on time even when the programs write faster than the daemon
/// reads (two threads calling a traced leaf as fast as they can, on the CPUs the daemon needs
/// too, with buffers too large to fill up in that time): each drain takes a bounded number of
/// events, so the event loop sees its deadline (before, it drained until the process exited).
#[test]
fn duration_ends_the_session_while_events_come_faster_than_they_are_read() {
    use std::time::{Duration, Instant};
    use tests::fixtures::workloads::calls_fixture;
    let scratch = tests::scratch_dir("pid-flood");
    let bin = tests::fixtures::private_copy(&calls_fixture(), scratch.path());
    let out = scratch.path().join("out");
    let fixture = tests::run::spawn_fixture(
        "calls",
        &bin,
        &["--threads", "2", "--seconds", "40", "--quiet"],
    );
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let mut tracer = tests::run::start_pid(
        fixture.pid(),
        &out,
        &[
            "--exits",
            "return",
            "--duration",
            "2",
            "--buffer-size",
            "268435456",
            "--no-report",
        ],
    );
    tests::run::wait_attached(&mut tracer);
    let tracer = tracer.finish(Duration::from_secs(120));
    let took = started.elapsed();
    tests::run::assert_success("fdr-profiled --pid --duration 2", &tracer);
    assert!(
        took < Duration::from_secs(30),
        "the session took {took:?}: it should end 2 s after recording began, not with the program"
    );
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    assert_eq!(
        unsafe { libc::kill(fixture.pid() as i32, 0) },
        0,
        "the program still runs: the deadline ended the session"
    );
    fixture.signal(libc::SIGKILL);
    let session = tests::read_session(&out);
    tests::assert_every_event_accounted(&session);
    assert!(session.events > 100_000, "{}", session.json);
}
