//! Flight-recorder mode: every process that runs the target's binary is traced from its first
//! call; the last `window` of every thread is held in memory; `SIGUSR1` writes it as a session.
//!
//! One process runs, then, after more than the window, a second one with two threads; the
//! snapshot taken then holds exactly the second one: per thread and function, entries and exits
//! equal what it counted, llvm-xray 14 and 19 read every file, and `session.json` says that
//! exactly the first process's events aged out. A longer process's snapshot holds the window's
//! calls exactly.
//!
//! A process that dies of SIGSEGV gets a snapshot of its own, named after the signal and the
//! process, whose trace ends with its last calls: the faulting function's entry. A call slower
//! than `trigger_slower_than` gets one named after its function.

use std::process::Command;
use std::time::Duration;

use tests::fixtures::private_copy;
use tests::fixtures::workloads::{calls_fixture, crash_fixture, slow_fixture};
use tests::run::Running;
use tests::service::ServiceStart;
use tests::tools::run_output;
use tests::trace::check_trace_dir;

use crate::common::{assert_calls_run, one_target, one_target_traced_whole, snapshots, TIMEOUT};

#[test]
fn a_snapshot_holds_the_last_window_of_every_process_of_the_target() {
    let scratch = tests::scratch_dir("service-flight");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let (start, output) = one_target(scratch.path(), "calls", &bin, "2s", "");
    let mut service = start.start();

    // The first process: its events age out of the 2 s window before the snapshot.
    let first = run_output(Command::new(&bin).args(["--iterations", "1000"]));
    assert!(first.status.success());
    std::thread::sleep(Duration::from_millis(2_600));
    // The second: two threads, all within the window.
    let second = Running::spawn(
        "calls",
        Command::new(&bin).args(["--threads", "2", "--iterations", "700"]),
    );
    let second_pid = second.pid();
    let second = second.finish(TIMEOUT);
    assert!(second.status.success(), "{}", second.stderr);
    // Its events are read within a drain period or two.
    std::thread::sleep(Duration::from_millis(300));
    service.signal(libc::SIGUSR1);
    service.wait_for_stderr_line("fdr-profiled: service: target calls: snapshot ", TIMEOUT);
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);

    let dirs = snapshots(&output, "calls");
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let name = dirs[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with("Z-sigusr1"), "{name}");
    let trace = check_trace_dir(&dirs[0], &bin);
    assert_eq!(
        trace.pids().into_iter().collect::<Vec<_>>(),
        vec![second_pid],
        "only the second process is in the window"
    );
    assert_calls_run(&trace, second_pid, &second.stdout);
    tests::assert_every_event_accounted(&trace.session);
    // The first process's events all aged out: main, cx_loop, 1000 calls of cx_tiny and
    // cx_report (entry and exit each), and its thread's end.
    let window = &trace.session.json["window"];
    assert_eq!(window["window_ns"], 2_000_000_000u64, "{window}");
    assert_eq!(window["expired"], 2 * 1003 + 1, "{window}");
    assert_eq!(window["evicted"], 0, "{window}");
    assert!(dirs[0].join("report.txt").is_file());
}

#[test]
fn a_process_dying_of_a_signal_gets_a_snapshot_ending_with_its_last_calls() {
    let scratch = tests::scratch_dir("service-crash");
    let bin = private_copy(&crash_fixture(), scratch.path());
    let (start, output) = one_target(scratch.path(), "crash", &bin, "30s", "");
    let mut service = start.start();
    let crashed = Running::spawn("crash", Command::new(&bin).args(["--iterations", "300"]));
    let pid = crashed.pid();
    let crashed = crashed.finish(TIMEOUT);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&crashed.status),
        Some(libc::SIGSEGV),
        "{:?}",
        crashed.status
    );
    service.wait_for_stderr_line(
        &format!("fdr-profiled: service: target crash: process {pid} died of SIGSEGV"),
        TIMEOUT,
    );
    service.wait_for_stderr_line("fdr-profiled: service: target crash: snapshot ", TIMEOUT);
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);

    let dirs = snapshots(&output, "crash");
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let name = dirs[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with(&format!("Z-sigsegv-{pid}")), "{name}");
    let trace = check_trace_dir(&dirs[0], &bin);
    let thread = trace.thread(pid, pid).expect("the crashed thread's file");
    let calls = thread.calls();
    let work = calls.get("cr_work").copied().unwrap_or_default();
    assert_eq!((work.entries(), work.exits()), (300, 300));
    let fault = calls.get("cr_fault").copied().unwrap_or_default();
    assert_eq!(
        (fault.entries(), fault.exits()),
        (1, 0),
        "it died inside cr_fault"
    );
    let last = thread
        .records
        .iter()
        .rev()
        .find(|r| r.kind.is_function())
        .expect("function records");
    assert_eq!(
        (last.function.as_str(), last.kind.is_entry()),
        ("cr_fault", true),
        "the trace ends with the faulting call"
    );
}

/// One process runs longer than the window (5 s against 2 s), cutting its loop into spans at
/// each CLOCK_MONOTONIC second and entering `cx_tick` at the start of each. The snapshot taken
/// right after it ends covers at least the window before it, and for every span it holds from
/// start to end, the calls of `cx_tiny` equal what the program counted in that span.
#[test]
fn a_flight_recorder_snapshot_holds_the_windows_calls_exactly() {
    let scratch = tests::scratch_dir("service-window");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let (start, output) = one_target_traced_whole(scratch.path(), "calls", &bin, "2s");
    let mut service = start.start();
    let run = run_output(Command::new(&bin).args(["--seconds", "5", "--per-second"]));
    assert!(run.status.success());
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    // The span counts, in order.
    let spans: Vec<u64> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("span index="))
        .enumerate()
        .map(|(k, rest)| {
            let (index, n) = rest.split_once(" cx_tiny=").expect("a span line");
            assert_eq!(index.parse::<usize>().unwrap(), k);
            n.parse().unwrap()
        })
        .collect();
    assert!(spans.len() >= 5, "{stdout}");
    std::thread::sleep(Duration::from_millis(100));
    service.signal(libc::SIGUSR1);
    service.wait_for_stderr_line("fdr-profiled: service: target calls: snapshot ", TIMEOUT);
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    let dirs = snapshots(&output, "calls");
    let trace = check_trace_dir(&dirs[0], &bin);
    assert_eq!(trace.threads.len(), 1);
    let records = &trace.threads[0].records;
    // Cut the held records at the cx_tick entries; the last piece is the last span.
    let mut pieces: Vec<u64> = vec![0];
    for r in records.iter().filter(|r| r.kind.is_entry()) {
        match r.function.as_str() {
            "cx_tick" => pieces.push(0),
            "cx_tiny" => *pieces.last_mut().unwrap() += 1,
            _ => {}
        }
    }
    // The first piece is the tail of a span that aged out in part: only whole spans compare.
    let whole = &pieces[1..];
    assert!(
        whole.len() >= 2,
        "the 2 s window holds at least one whole span and the last one: {pieces:?}"
    );
    assert_eq!(
        whole,
        &spans[spans.len() - whole.len()..],
        "cx_tiny calls per span: held vs counted by the program ({spans:?})"
    );
    // The window: at least 2 s before the snapshot, which came after the last call.
    let first = records.first().unwrap().tsc;
    let last_tiny = records
        .iter()
        .rev()
        .find(|r| r.function == "cx_tiny")
        .unwrap()
        .tsc;
    assert!(
        last_tiny - first >= 1_900_000_000,
        "held {} ns before the last call",
        last_tiny - first
    );
    let window = &trace.session.json["window"];
    assert!(window["expired"].as_u64().unwrap() > 0, "{window}");
    assert_eq!(window["evicted"], 0, "{window}");
}

/// `trigger_slower_than` on `trigger_functions`: the one call over the threshold writes a
/// snapshot named after its function, holding that call with its duration; the thousands of
/// fast calls of another function trigger nothing.
#[test]
fn a_slow_call_triggers_a_snapshot() {
    let scratch = tests::scratch_dir("service-slow");
    let bin = private_copy(&slow_fixture(), scratch.path());
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"slow\"\nbinary = \"{}\"\n\
             trigger_slower_than = \"50ms\"\ntrigger_functions = [\"sl_*\"]\n",
            output.display(),
            bin.display()
        ),
    )
    .unwrap();
    let mut service = ServiceStart::config(&config)
        .socket(&scratch.path().join("control.sock"))
        .start();
    let run = run_output(Command::new(&bin).args(["--slow-ms", "80"]));
    assert!(run.status.success());
    service.wait_for_stderr_line("fdr-profiled: service: target slow: snapshot ", TIMEOUT);
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    let took: Vec<&str> = done
        .stderr
        .lines()
        .filter(|l| l.contains(" took "))
        .collect();
    assert_eq!(took.len(), 1, "only sl_slow is slow: {took:?}");
    assert!(took[0].contains("target slow: sl_slow took "), "{took:?}");

    let dirs = snapshots(&output, "slow");
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let name = dirs[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with("Z-slow-sl_slow"), "{name}");
    let trace = check_trace_dir(&dirs[0], &bin);
    let thread = &trace.threads[0];
    let calls = thread.calls();
    let slow = calls.get("sl_slow").copied().unwrap_or_default();
    assert_eq!((slow.entries(), slow.exits()), (1, 1));
    let fast = calls.get("sl_fast").copied().unwrap_or_default();
    // The calls before the slow one, and those after it that were read before the snapshot.
    assert!((1000..=2000).contains(&fast.entries()), "{fast:?}");
    let enter = thread
        .records
        .iter()
        .find(|r| r.function == "sl_slow")
        .unwrap();
    let exit = thread
        .records
        .iter()
        .rev()
        .find(|r| r.function == "sl_slow")
        .unwrap();
    assert!(exit.tsc - enter.tsc >= 80_000_000, "{enter:?} {exit:?}");
}
