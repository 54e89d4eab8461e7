//! End to end: `--pid PID --exits repair` (and `--attach BIN --exits repair`) on a running C++ server (tests/fixtures/server.cpp).
//!
//! - It keeps serving: its worker threads throw and catch through hooked frames all along the
//!   session, and after it; a long request entered during the session, blocked inside two
//!   hooked frames when the session ends, is made to throw through them afterwards (it would
//!   end in `std::terminate` had the frames been left hooked without a tracer); the server
//!   then stops on SIGTERM through its handler and exits 0 with its totals exact.
//! - Signals sent during the session (SIGUSR1, handled) are delivered, each once.
//! - When the session ends no ptrace relation remains: `TracerPid: 0` in every thread.
//! - The same holds when fdr-profiled is killed with SIGKILL mid-session: its keeper lets the
//!   process go by itself.
//! - A process that another tracer holds is traced all the same, with exits chosen per
//!   function, saying why.
//! - The files are valid for llvm-xray 14 and 19, every event is accounted for, and the
//!   repairs are in the summary and `session.json`.
//! - A thread whose 64 hooked frames an exception left (through a 100-deep recursion, caught
//!   in a frame entered before tracing) is made to pass once through the return trampoline at
//!   the catch, so that the kernel drops their instances: its later calls keep their return
//!   probes, each with its own exit, with no fall-back to exit sleds.
//!
//! - `--attach BIN --exits repair`: a server running before the session and one started during
//!   it are each repaired by a keeper of their own, and let go the same way.
//!
//! Needs root, BPF, clang-19, llvm-xray 14/19 and a built daemon.

use std::process::Command;
use std::time::Duration;

use tests::run::start_pid;
use tests::server::{assert_untraced, server_fixture, total, tracers, wait_untraced, Server};

const TIMEOUT: Duration = Duration::from_secs(120);

/// The repair line of the summary.
fn repair_line(stderr: &str) -> String {
    stderr
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("repair: "))
        .unwrap_or_else(|| panic!("no repair line in the summary:\n{stderr}"))
        .to_owned()
}

/// The server's totals are exact: every request whose number is a multiple of 3 threw and was
/// caught, the long thread's one throw was caught, every SIGUSR1 handled once.
fn assert_server_totals(line: &str, usr1: u64, long_requests: u64) {
    assert!(total(line, "requests") > 0, "{line}");
    assert_eq!(total(line, "caught"), total(line, "third"), "{line}");
    assert_eq!(total(line, "usr1"), usr1, "{line}");
    assert_eq!(total(line, "long"), long_requests, "{line}");
    assert_eq!(total(line, "long_caught"), 1, "{line}");
    assert_eq!(total(line, "deep_caught"), 0, "{line}");
}

#[test]
fn a_running_server_keeps_serving_under_repair_and_is_let_go() {
    let scratch = tests::scratch_dir("repair-pid");
    let mut server = Server::start(scratch.path());
    let out = scratch.path().join("out");
    let mut tracer = start_pid(
        server.pid(),
        &out,
        &["--exits", "repair", "--duration", "4"],
    );
    tracer.wait_for_stderr_line("fdr-profiled: repair:", TIMEOUT);
    assert!(
        tracers(server.pid()).iter().all(|&t| t != 0),
        "every thread is traced by the keeper: {:?}",
        tracers(server.pid())
    );
    // The long request blocked since before the session returns; the next one is entered
    // while return probes are placed: it blocks inside two hooked frames.
    server.command(b'r');
    for _ in 0..3 {
        server.running.signal(libc::SIGUSR1);
        std::thread::sleep(Duration::from_millis(100));
    }
    let done = tracer.finish(TIMEOUT);
    tests::run::assert_success("fdr-profiled --pid --exits repair", &done);
    assert_untraced(server.pid());
    let repair = repair_line(&done.stderr);
    assert!(
        repair.contains(" return addresses put back when the process was let go"),
        "the long request's hooked frames are released: {repair}"
    );
    // Throw through the two released frames: caught, as untraced.
    server.command(b't');
    std::thread::sleep(Duration::from_millis(300));
    let last = server.stop();
    assert_server_totals(&last, 3, 3);

    let trace = tests::trace::check_trace_dir(&out, &server_fixture());
    let session = &trace.session;
    assert_eq!(session.json["exits"], "repair", "{}", session.json);
    assert_eq!(session.events_lost, 0, "{}", session.json);
    tests::assert_every_event_accounted(session);
    let total = &session.json["repair"];
    // The long request's two frames, exactly; a worker may have had a frame hooked too.
    let long_tid = trace
        .threads
        .iter()
        .find(|t| t.calls().contains_key("sv_long_request"))
        .map(|t| t.tid)
        .expect("the long-request thread was recorded");
    let long_thread = session.json["processes"][0]["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tid"] == long_tid)
        .expect("the long-request thread in session.json");
    assert_eq!(
        long_thread["repair"]["frames_released"].as_u64(),
        Some(2),
        "{long_thread}"
    );
    assert!(total["frames_released"].as_u64().unwrap() >= 2, "{total}");
    assert!(
        total["throws"].as_u64().unwrap() > 100,
        "the workers threw through repaired frames: {total}"
    );
    assert_eq!(total["throws"], total["catches"], "{total}");
    // The signals came through the keeper, which passed each on once (the handler counted 3).
    assert_eq!(total["signals_passed_on"].as_u64(), Some(3), "{total}");
    // Every worker call recorded is closed once: by its return, or at the catch.
    let mut sv_requests = 0;
    for t in &trace.threads {
        for (function, c) in t.calls() {
            assert!(
                c.exits() <= c.entries() + 1,
                "{function} in tid {}: {c:?}",
                t.tid
            );
            if function == "sv_request" {
                sv_requests += c.entries();
            }
        }
    }
    assert!(sv_requests > 100, "requests were recorded: {sv_requests}");
}

/// 50 SIGKILLs of fdr-profiled (`--pid` with the defaults: repaired) at spread moments of its
/// session, attach and detach included, on one C++ server whose worker threads throw and catch
/// through traced frames all the time: after each, its keeper lets the server go (no tracer
/// left), a long request entered during that session throws through its frames and is caught,
/// and the server goes on serving; at the end its totals are exact and it exits 0.
#[test]
fn a_running_server_survives_fifty_kills_of_fdr_profiled() {
    let scratch = tests::scratch_dir("repair-pid-kills");
    let mut server = Server::start(scratch.path());
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    const KILLS: u64 = 50;
    for round in 0..KILLS {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let delay = Duration::from_micros((seed >> 33) % 1_500_000);
        let out = scratch.path().join(format!("out-{round}"));
        let tracer = start_pid(server.pid(), &out, &["--no-report"]);
        // A new long request, entered midway (hooked if the probes are in place by then).
        std::thread::sleep(delay / 2);
        server.command(b'r');
        std::thread::sleep(delay / 2);
        tracer.signal(libc::SIGKILL);
        let done = tracer.finish(TIMEOUT);
        assert!(
            done.status.code().is_none() || done.status.success(),
            "kill {round} after {delay:?}: {}",
            done.stderr
        );
        wait_untraced(server.pid(), "fdr-profiled");
        // That long request throws through its frames (the keeper put back the return
        // addresses of those it hooked before it let the server go).
        server.command(b't');
    }
    std::thread::sleep(Duration::from_millis(300));
    let last = server.stop();
    assert!(total(&last, "requests") > 0, "{last}");
    assert_eq!(total(&last, "caught"), total(&last, "third"), "{last}");
    assert_eq!(total(&last, "long_caught"), KILLS, "{last}");
}

#[test]
fn a_running_server_is_let_go_when_fdr_profiled_is_killed() {
    let scratch = tests::scratch_dir("repair-pid-kill");
    let mut server = Server::start(scratch.path());
    let out = scratch.path().join("out");
    let mut tracer = start_pid(server.pid(), &out, &["--exits", "repair"]);
    tracer.wait_for_stderr_line("fdr-profiled: repair:", TIMEOUT);
    server.command(b'r');
    std::thread::sleep(Duration::from_millis(500));
    tracer.signal(libc::SIGKILL);
    let _ = tracer.finish(TIMEOUT);
    // The keeper lets the process go by itself.
    wait_untraced(server.pid(), "fdr-profiled");
    server.running.signal(libc::SIGUSR1);
    server.command(b't');
    std::thread::sleep(Duration::from_millis(300));
    let last = server.stop();
    assert_server_totals(&last, 1, 3);
}

#[test]
fn a_process_another_tracer_holds_gets_exits_per_function() {
    let scratch = tests::scratch_dir("repair-pid-traced");
    let mut server = Server::start(scratch.path());
    // A first session's keeper is the process's tracer (as a debugger would be).
    let mut first = start_pid(
        server.pid(),
        &scratch.path().join("first"),
        &["--exits", "repair", "--no-report"],
    );
    first.wait_for_stderr_line("fdr-profiled: repair:", TIMEOUT);
    let second = start_pid(
        server.pid(),
        &scratch.path().join("second"),
        &["--exits", "repair", "--duration", "1", "--no-report"],
    );
    let second = second.finish(TIMEOUT);
    tests::run::assert_success("the second fdr-profiled", &second);
    assert!(
        second.stderr.lines().any(|l| l
            .starts_with("fdr-profiled: warning: --exits repair is not possible here")
            && l.contains("already traced by process")),
        "{}",
        second.stderr
    );
    let session = tests::read_session(&scratch.path().join("second"));
    assert_eq!(session.json["exits"], "per-function", "{}", session.json);
    assert!(
        session.json["exits_reason"]
            .as_str()
            .is_some_and(|r| r.contains("no repair: ")),
        "{}",
        session.json
    );
    let first = tests::run::interrupt_and_finish(first, TIMEOUT);
    tests::run::assert_success("the first fdr-profiled", &first);
    server.command(b'r');
    server.command(b't');
    std::thread::sleep(Duration::from_millis(300));
    let last = server.stop();
    assert_server_totals(&last, 0, 3);
}

/// A thread whose outer frames were entered before tracing throws from 100 frames deep to its
/// own loop: the kernel keeps the 64 hooked frames' instances (it drops them only when a hooked
/// caller returns, and none will), and at its limit it would hook no new frame. The keeper
/// makes the thread pass once through the return trampoline at the catch, and the kernel
/// drops them: the 40,000 calls after it keep their return probes, each with its own exit,
/// and nothing falls back to exit sleds.
#[test]
fn a_thread_whose_outer_frames_predate_tracing_keeps_its_return_probes_after_a_deep_throw() {
    let scratch = tests::scratch_dir("repair-pid-deep");
    let mut server = Server::start(scratch.path());
    let out = scratch.path().join("out");
    let mut tracer = start_pid(server.pid(), &out, &["--exits", "repair", "--no-report"]);
    tracer.wait_for_stderr_line("fdr-profiled: repair:", TIMEOUT);
    server.command(b'r');
    std::thread::sleep(Duration::from_millis(200));
    server.command(b'd');
    std::thread::sleep(Duration::from_millis(200));
    server.command(b'a');
    server.command(b'b');
    std::thread::sleep(Duration::from_millis(1500));
    let done = tests::run::interrupt_and_finish(tracer, TIMEOUT);
    tests::run::assert_success("fdr-profiled --pid --exits repair", &done);
    assert!(
        !done.stderr.contains("instead of return probes"),
        "a fall-back to exit sleds: {}",
        done.stderr
    );
    assert_untraced(server.pid());
    server.command(b't');
    std::thread::sleep(Duration::from_millis(300));
    let last = server.stop();
    assert_eq!(total(&last, "deep_caught"), 1, "{last}");
    assert_eq!(total(&last, "long_caught"), 1, "{last}");

    let trace = tests::trace::check_trace_dir(&out, &server_fixture());
    tests::assert_every_event_accounted(&trace.session);
    let json = &trace.session.json;
    assert!(
        json["repair"]["trampoline_passes"].as_u64() >= Some(1),
        "the deep throw's instances were dropped: {}",
        json["repair"]
    );
    assert_eq!(json["exit_methods"]["exit_sled_calls"], 0, "{json}");
    let long = trace
        .threads
        .iter()
        .find(|t| t.calls().contains_key("sv_leaf_a"))
        .expect("the long-request thread");
    let calls = long.calls();
    for leaf in ["sv_leaf_a", "sv_leaf_b"] {
        assert_eq!(
            (calls[leaf].entries(), calls[leaf].exits()),
            (20_000, 20_000),
            "{leaf}: {calls:?}"
        );
    }
    // Their exits are their return probes' (the recorder closed none of them).
    let dump = tests::tools::run_output(
        Command::new(tests::tools::fdr_profiled())
            .arg("dump")
            .arg(&long.path)
            .arg("--session")
            .arg(&out)
            .arg("--xray-stream"),
    );
    assert!(dump.status.success(), "{dump:?}");
    let dump = String::from_utf8(dump.stdout).unwrap();
    for leaf in ["sv_leaf_a", "sv_leaf_b"] {
        let exits = dump
            .lines()
            .filter(|l| l.contains("<Function Exit") && l.ends_with(&format!(" {leaf}")))
            .count();
        assert_eq!(exits, 20_000, "{leaf}: exits of its own");
    }
}

/// `--attach BIN --exits repair`: a server running before the session and one started during
/// it are each traced by a keeper of their own, serve and throw through hooked frames as
/// untraced, and get their SIGUSR1 once; the one that stops during the session has its probes
/// removed then; the other is let go at the end with no ptrace relation left, and a throw
/// through its frames hooked at that moment is caught. Each process's 20,000 calls of
/// `sv_leaf_a` are recorded exactly, with their exits.
#[test]
fn attach_repairs_every_process_running_the_binary() {
    let scratch = tests::scratch_dir("repair-attach");
    let (dir_a, dir_b) = (scratch.path().join("a"), scratch.path().join("b"));
    std::fs::create_dir_all(&dir_a).unwrap();
    std::fs::create_dir_all(&dir_b).unwrap();
    // A copy of its own: the servers of the tests running beside this one are not traced.
    let bin = tests::fixtures::private_copy(&server_fixture(), scratch.path());
    let mut before = Server::start_copy(&dir_a, &bin);
    let out = scratch.path().join("out");
    let mut tracer = tests::run::start_attach(&bin, &out, &["--exits", "repair", "--no-report"]);
    let traced = |pid: u32| {
        move |l: &str| l.starts_with(&format!("fdr-profiled: repair: process {pid} traced"))
    };
    tracer.wait_for_stderr_match("the running server traced", TIMEOUT, traced(before.pid()));
    assert!(tracers(before.pid()).iter().all(|&t| t != 0));
    let mut during = Server::start_copy(&dir_b, &bin);
    tracer.wait_for_stderr_match("the new server traced", TIMEOUT, traced(during.pid()));
    for server in [&mut before, &mut during] {
        server.command(b'a');
        server.command(b't');
        server.running.signal(libc::SIGUSR1);
    }
    std::thread::sleep(Duration::from_millis(1500));
    let during_pid = during.pid();
    let last = during.stop();
    assert_server_totals(&last, 1, 3);
    tracer.wait_for_stderr_match("the stopped server's probes removed", TIMEOUT, |l| {
        l == format!("fdr-profiled: repair: process {during_pid} exited; its probes are removed")
    });
    let done = tests::run::interrupt_and_finish(tracer, TIMEOUT);
    tests::run::assert_success("fdr-profiled --attach --exits repair", &done);
    assert_untraced(before.pid());
    // The long request entered during the session was hooked and released: throw through it.
    before.command(b't');
    std::thread::sleep(Duration::from_millis(300));
    let last = before.stop();
    assert_eq!(total(&last, "usr1"), 1, "{last}");
    assert_eq!(total(&last, "long_caught"), 2, "{last}");
    assert_eq!(total(&last, "caught"), total(&last, "third"), "{last}");

    let trace = tests::trace::check_trace_dir(&out, &bin);
    let session = &trace.session;
    assert_eq!(session.json["exits"], "repair", "{}", session.json);
    assert!(
        session.json["exits_reason"]
            .as_str()
            .is_some_and(|r| r.contains("2 processes traced")),
        "{}",
        session.json
    );
    assert_eq!(session.events_lost, 0, "{}", session.json);
    tests::assert_every_event_accounted(session);
    let total_repairs = &session.json["repair"];
    assert!(
        total_repairs["throws"].as_u64().unwrap() > 100,
        "{total_repairs}"
    );
    assert_eq!(
        total_repairs["throws"], total_repairs["catches"],
        "{total_repairs}"
    );
    assert_eq!(
        total_repairs["slots_left_alone"].as_u64(),
        Some(0),
        "{total_repairs}"
    );
    // Each server's SIGUSR1, and the SIGTERM that stopped the second during the session.
    assert_eq!(
        total_repairs["signals_passed_on"].as_u64(),
        Some(3),
        "{total_repairs}"
    );
    assert!(
        total_repairs["frames_released"].as_u64().unwrap() >= 2,
        "{total_repairs}"
    );
    let leaf_threads: Vec<_> = trace
        .threads
        .iter()
        .filter(|t| t.calls().contains_key("sv_leaf_a"))
        .collect();
    assert_eq!(leaf_threads.len(), 2, "one long-request thread per server");
    for t in leaf_threads {
        let calls = t.calls();
        assert_eq!(
            calls["sv_leaf_a"].entries(),
            20_000,
            "tid {}: {calls:?}",
            t.tid
        );
        assert_eq!(
            calls["sv_leaf_a"].exits(),
            20_000,
            "tid {}: {calls:?}",
            t.tid
        );
    }
}

/// `--pid` with the defaults on a C++ process: `auto` repairs its stack (return probes at
/// their cost), keeps them after a deep throw caught in a frame entered before tracing, and
/// lets the process go untraced at the end.
#[test]
fn pid_with_the_defaults_repairs_a_cpp_process() {
    let scratch = tests::scratch_dir("repair-pid-defaults");
    let mut server = Server::start(scratch.path());
    let out = scratch.path().join("out");
    let mut tracer = start_pid(server.pid(), &out, &["--no-report"]);
    tracer.wait_for_stderr_line("fdr-profiled: repair:", TIMEOUT);
    server.command(b'd');
    server.command(b'a');
    std::thread::sleep(Duration::from_millis(1000));
    let done = tests::run::interrupt_and_finish(tracer, TIMEOUT);
    tests::run::assert_success("fdr-profiled --pid", &done);
    assert_untraced(server.pid());
    let last = server.stop();
    assert_eq!(total(&last, "deep_caught"), 1, "{last}");
    let trace = tests::trace::check_trace_dir(&out, &server_fixture());
    tests::assert_every_event_accounted(&trace.session);
    let json = &trace.session.json;
    assert_eq!(json["exits"], "repair", "{json}");
    assert!(
        json["exits_reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("auto: ") && r.contains("__gxx_personality_v0")),
        "{json}"
    );
    assert_eq!(json["exit_methods"]["exit_sled_calls"], 0, "{json}");
    let long = trace
        .threads
        .iter()
        .find(|t| t.calls().contains_key("sv_leaf_a"))
        .expect("the long-request thread");
    let a = long.calls()["sv_leaf_a"];
    assert_eq!((a.entries(), a.exits()), (20_000, 20_000));
}

/// `--attach BIN` with the defaults on a C++ program that throws: `auto` repairs the stack, and
/// each process that starts during the session is held from its exec until its keeper has it
/// and its probes are in place, so a process of a few milliseconds is recorded whole: per
/// thread and function, entries equal the calls the program counted itself, and every entry
/// has its one exit (its return, or the exit written where an exception left its frame).
/// A process the host ran past its entry point before its keeper could stop it is counted
/// apart, never as traced from its exec.
#[test]
fn attach_with_the_defaults_records_each_new_cpp_process_from_its_exec() {
    const LAUNCHES: usize = 8;
    let scratch = tests::scratch_dir("repair-attach-exec");
    // A copy of its own: the runs of the tests beside this one are not traced.
    let bin = tests::fixtures::private_copy(
        &tests::fixtures::workloads::exceptions_fixture(),
        scratch.path(),
    );
    let out = scratch.path().join("out");
    let mut tracer = tests::run::start_attach(&bin, &out, &["--no-report"]);
    tests::run::wait_attached(&mut tracer);
    let mut expected = Vec::new();
    for _ in 0..LAUNCHES {
        let run = tests::tools::run_output(Command::new(&bin).args(["--iterations", "5"]));
        assert!(run.status.success(), "{run:?}");
        let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
        expected.push(tests::counts::expected_calls(
            &tests::counts::parse_count_lines(&stdout),
        ));
    }
    std::thread::sleep(Duration::from_millis(500));
    let done = tests::run::interrupt_and_finish(tracer, TIMEOUT);
    tests::run::assert_success("fdr-profiled --attach", &done);
    // `fdr-profiled: repair: process PID traced from ...`
    let traced = |how: &'static str| {
        move |l: &str| -> Option<u32> {
            let rest = l.strip_prefix("fdr-profiled: repair: process ")?;
            rest.split_once(how)?.0.parse().ok()
        }
    };
    let from_exec: Vec<u32> = done
        .stderr
        .lines()
        .filter_map(traced(" traced from its exec"))
        .collect();
    let late = done
        .stderr
        .lines()
        .filter_map(traced(" traced from after its entry point"))
        .count();
    assert_eq!(
        from_exec.len() + late,
        LAUNCHES,
        "every process traced, from its exec or counted late:\n{}",
        done.stderr
    );
    assert!(!from_exec.is_empty(), "{}", done.stderr);

    let trace = tests::trace::check_trace_dir(&out, &bin);
    let json = &trace.session.json;
    assert_eq!(json["exits"], "repair", "{json}");
    assert!(
        json["exits_reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("auto: ")
                && r.contains(&format!(
                    "{LAUNCHES} processes traced ({} from their exec, {late} only once past",
                    from_exec.len()
                ))),
        "{json}"
    );
    assert_eq!(json["exit_methods"]["exit_sled_calls"], 0, "{json}");
    assert_eq!(trace.session.events_lost, 0, "{json}");
    tests::assert_every_event_accounted(&trace.session);
    // Each process traced from its exec, whole: its threads are one launch's threads.
    for pid in &from_exec {
        let threads: Vec<_> = trace.threads.iter().filter(|t| t.pid == *pid).collect();
        let got: std::collections::BTreeMap<u32, std::collections::BTreeMap<String, u64>> = threads
            .iter()
            .map(|t| {
                let calls = t.calls();
                for (f, c) in &calls {
                    assert_eq!(c.entries(), c.exits(), "process {pid} tid {} {f}", t.tid);
                }
                (
                    t.tid,
                    calls.into_iter().map(|(f, c)| (f, c.entries())).collect(),
                )
            })
            .collect();
        // The program's own counts name its threads by tid: the launch whose tids these are.
        let want = expected
            .iter()
            .find(|e| e.keys().next().is_some_and(|tid| got.contains_key(tid)))
            .unwrap_or_else(|| panic!("process {pid}: no launch with its threads {got:?}"));
        for (tid, functions) in want {
            let recorded = got
                .get(tid)
                .unwrap_or_else(|| panic!("process {pid}: thread {tid} not recorded"));
            for (f, calls) in functions {
                assert_eq!(
                    recorded.get(f).copied().unwrap_or(0),
                    *calls,
                    "process {pid} tid {tid} {f}: entries recorded vs calls counted"
                );
            }
        }
    }
}
