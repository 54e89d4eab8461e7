//! End to end, `--engine inline` (issue 31): a running process's sleds patched from outside to
//! call a handler fdr-profiled puts into it, its hits written into shared memory.
//!
//! - The C++ fixture by pid (four threads, exceptions thrown and caught): the files hold
//!   exactly the calls each thread counted, llvm-xray 14 and 19 load them, and a second
//!   process running the same binary is untouched.
//! - A busy process by pid (100,000 calls a second): after the session its
//!   code is the ELF file's byte for byte (every sled put back), the handler's page and the
//!   shared memory are gone, every traced call has its entry and its exit, nothing is lost,
//!   and the process ends as it would untraced.
//! - The C++ and Rust fixtures launched (`-- CMD`): patched at their entry point, before any
//!   of their own code (`main` included) ran; every call counted, as with probes.
//! - A command that cannot be run: one error line, exit status 1, nothing left running.
//! - `--attach BIN`: a process running it already is patched where it is; each that starts
//!   while attached is held from its exec, patched at its entry point, and counted call for
//!   call, short ones (a few milliseconds) included.
//! - A shared object the process `dlopen`s while traced: patched when found, its calls
//!   counted exactly, and put back with the rest at the end.
use std::time::Duration;

use tests::scenario::{trace_launched_with, trace_pid_as, CPP, RUST};

const TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn cpp_process_by_pid_inline_counts_every_call() {
    let run = trace_pid_as(&CPP, 100, false, &["--engine", "inline"]);
    let stderr = &run.tracer.stderr;
    // The process ended while traced: nothing was left to put back.
    assert!(
        stderr.contains("fdr-profiled: inline engine: ")
            && stderr.contains(" sleds patched in process "),
        "{stderr}"
    );
}

#[test]
fn cpp_command_launched_inline_counts_every_call() {
    let run = trace_launched_with(&CPP, 100, &["--engine", "inline"]);
    let stderr = &run.tracer.stderr;
    assert!(stderr.contains(" sleds patched in process "), "{stderr}");
}

#[test]
fn rust_command_launched_inline_counts_every_call() {
    let run = trace_launched_with(&RUST, 100, &["--engine", "inline"]);
    let stderr = &run.tracer.stderr;
    assert!(stderr.contains(" sleds patched in process "), "{stderr}");
}

/// A command whose exec fails (its dynamic loader is missing) ends the session in one line of
/// ours, after the command's own; nothing is left running.
#[test]
fn a_command_that_cannot_start_is_refused_in_one_line() {
    let scratch = tests::scratch_dir("inline-noexec");
    let mut bytes = std::fs::read(tests::fixtures::workloads::calls_fixture()).unwrap();
    let interp = b"/lib64/ld-linux-x86-64.so.2";
    let at = bytes
        .windows(interp.len())
        .position(|w| w == interp)
        .expect("the fixture names its dynamic loader");
    bytes[at + interp.len() - 1] = b'X';
    let broken = scratch.path().join("no-loader");
    std::fs::write(&broken, &bytes).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).unwrap();
    let done = tests::tools::run_output(
        std::process::Command::new(tests::tools::fdr_profiled())
            .args(["--engine", "inline", "--no-report", "--out"])
            .arg(scratch.path().join("out"))
            .arg("--")
            .arg(&broken),
    );
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(1), "{stderr}");
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("error") && l.contains("--engine inline"))
        .collect();
    assert_eq!(ours.len(), 1, "{stderr}");
    assert!(
        ours[0].contains("the command ended before its entry point (exit status 127)"),
        "{stderr}"
    );
}

#[test]
fn a_busy_process_by_pid_is_put_back_byte_for_byte() {
    let scratch = tests::scratch_dir("inline-busy");
    let bin =
        tests::fixtures::private_copy(&tests::fixtures::workloads::calls_fixture(), scratch.path());
    let out = scratch.path().join("out");
    let fixture = tests::run::spawn_fixture(
        "calls",
        &bin,
        &["--threads", "1", "--seconds", "8", "--per-second"],
    );
    std::thread::sleep(Duration::from_millis(500));
    let pid = fixture.pid();
    let tracer = tests::run::start_pid(
        pid,
        &out,
        &["--engine", "inline", "--duration", "2", "--no-report"],
    );
    let tracer = tracer.finish(TIMEOUT);
    tests::run::assert_success("fdr-profiled --pid --engine inline", &tracer);
    let stderr = &tracer.stderr;
    assert!(
        stderr.contains("sleds patched in process") && stderr.contains("sleds put back"),
        "{stderr}"
    );
    // Every sled is back, nothing of the engine is left in the process.
    tests::memory::assert_put_back(pid, &bin, stderr);
    let done = fixture.finish(TIMEOUT);
    tests::run::assert_success("calls fixture", &done);
    assert_eq!(
        tests::expected_calls(&tests::parse_count_lines(&done.stdout)).len(),
        1,
        "{}",
        done.stdout
    );
    // The trace: nothing lost, every event accounted, each traced call entered and left
    // (but the ones open when the sleds were patched and when they were put back).
    let session = tests::read_session(&out);
    assert_eq!(session.events_lost, 0, "{stderr}");
    tests::assert_every_event_accounted(&session);
    let trace = tests::trace::check_trace_dir(&out, &bin);
    assert_eq!(trace.threads.len(), 1);
    for t in &trace.threads {
        let calls = t.calls();
        let tiny = &calls["cx_tiny"];
        assert!(tiny.entries() > 10_000, "thread {}: {tiny:?}", t.tid);
        assert!(
            tiny.entries() - tiny.exits() <= 1,
            "thread {}: {tiny:?}",
            t.tid
        );
    }
    for p in session.json["processes"].as_array().into_iter().flatten() {
        for t in p["threads"].as_array().into_iter().flatten() {
            // At most the frames open when the sleds were patched (main, cx_loop, cx_tiny).
            let unmatched = t["dropped_unmatched_exits"].as_u64().unwrap();
            assert!(
                unmatched <= 3,
                "{unmatched} exits without entry: {}",
                t["tid"]
            );
            for closed in ["frames_unwound", "frames_closed_by_loss"] {
                assert_eq!(t[closed], 0, "{closed}: thread {}", t["tid"]);
            }
        }
    }
}

/// A process forked while traced runs the patched code and writes into the same memory: its
/// calls are recorded as its own process's, and at the end its sleds are put back too.
#[test]
fn a_process_forked_while_traced_is_recorded_and_put_back() {
    let scratch = tests::scratch_dir("inline-fork");
    let bin =
        tests::fixtures::private_copy(&tests::fixtures::workloads::calls_fixture(), scratch.path());
    let out = scratch.path().join("out");
    let go = scratch.path().join("go");
    let mut fixture = tests::run::spawn_fixture(
        "calls",
        &bin,
        &[
            "--fork",
            "--seconds",
            "6",
            "--per-second",
            "--wait-file",
            go.to_str().unwrap(),
        ],
    );
    fixture.wait_for_stderr_line("fixture: waiting for", TIMEOUT);
    let pid = fixture.pid();
    let mut tracer = tests::run::start_pid(
        pid,
        &out,
        &["--engine", "inline", "--duration", "3", "--no-report"],
    );
    tests::run::wait_attached(&mut tracer);
    std::fs::write(&go, b"go\n").unwrap();
    // The child, forked once the sleds were patched.
    let deadline = std::time::Instant::now() + TIMEOUT;
    let child = loop {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(child) = children.split_whitespace().next() {
            break child.parse::<u32>().unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the fixture did not fork"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let tracer = tracer.finish(TIMEOUT);
    tests::run::assert_success("fdr-profiled --pid --engine inline", &tracer);
    let stderr = &tracer.stderr;
    assert!(
        stderr.contains("(and in 1 of 1 processes it forked)"),
        "{stderr}"
    );
    for process in [pid, child] {
        tests::memory::assert_put_back(process, &bin, stderr);
    }
    let done = fixture.finish(TIMEOUT);
    tests::run::assert_success("calls fixture", &done);
    let session = tests::read_session(&out);
    assert_eq!(session.events_lost, 0, "{stderr}");
    tests::assert_every_event_accounted(&session);
    let trace = tests::trace::check_trace_dir(&out, &bin);
    let pids: Vec<u32> = trace.session.processes.iter().map(|p| p.pid).collect();
    assert!(pids.contains(&pid) && pids.contains(&child), "{pids:?}");
    for t in &trace.threads {
        let calls = t.calls();
        assert!(calls["cx_tiny"].entries() > 1000, "thread {}", t.tid);
    }
}

/// A process another tracer holds (a debugger) is refused in one line, and left as it was.
#[test]
fn a_process_another_tracer_holds_is_refused() {
    let scratch = tests::scratch_dir("inline-traced");
    let out = scratch.path().join("out");
    let fixture = tests::run::spawn_fixture(
        "calls",
        &tests::fixtures::workloads::calls_fixture(),
        &["--seconds", "20", "--per-second", "--quiet"],
    );
    let pid = fixture.pid();
    // This test process is the other tracer.
    // SAFETY: plain system call on a child of ours.
    let seized = unsafe {
        libc::ptrace(
            libc::PTRACE_SEIZE,
            pid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    assert_eq!(
        seized,
        0,
        "PTRACE_SEIZE: {}",
        std::io::Error::last_os_error()
    );
    let done = tests::tools::run_output(
        std::process::Command::new(tests::tools::fdr_profiled())
            .args([
                "--pid",
                &pid.to_string(),
                "--engine",
                "inline",
                "--no-report",
                "--out",
            ])
            .arg(&out),
    );
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(1), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("--engine inline") && errors[0].contains("already traced by process"),
        "{stderr}"
    );
    // Traced by this process, it would stop at a SIGTERM: SIGKILL ends it.
    fixture.signal(libc::SIGKILL);
    let _ = fixture.finish(TIMEOUT);
}

/// The DSO fixture by pid: its executable and linked library patched at the start,
/// `libfxloaded.so` once the process `dlopen`s it; a round of work on every thread then is in
/// the trace call for call (per thread, as the fixture counts), and every object's code is
/// its file's again after the session.
#[test]
fn an_object_dlopened_while_traced_is_patched_and_put_back() {
    use tests::fixtures::dso::{dso_fixture, private_dso_copy, run_section, DsoProcess};
    let scratch = tests::scratch_dir("inline-dlopen");
    let copy = private_dso_copy(dso_fixture(), scratch.path(), true);
    let out = scratch.path().join("out");
    let mut target = DsoProcess::start("target", &copy.exe);
    let pid = target.pid();
    let mut tracer = tests::run::start_pid(pid, &out, &["--engine", "inline", "--no-report"]);
    tests::run::wait_attached(&mut tracer);
    target.dlopen();
    tracer.wait_for_stderr_match("the loaded object patched", TIMEOUT, |l| {
        l.contains("sleds patched in") && l.contains("libfxloaded.so")
    });
    target.run(50);
    let tracer = tests::run::interrupt_and_finish(tracer, TIMEOUT);
    tests::run::assert_success("fdr-profiled --pid --engine inline", &tracer);
    for object in [&copy.exe, &copy.linked, &copy.loaded] {
        tests::memory::assert_put_back(pid, object, &tracer.stderr);
    }
    target.run(1);
    let done = target.quit("target fixture");

    let session = tests::read_session(&out);
    assert_eq!(session.events_lost, 0, "{}", tracer.stderr);
    let (report, _) = tests::synthetic_session::report_json(&out, &["--per-thread"]);
    let mut checked = 0;
    for line in run_section(&done.stdout, 1).lines() {
        let Some(rest) = line.strip_prefix("count tid=") else {
            continue;
        };
        let (tid, rest) = rest.split_once(" function=").unwrap();
        let (function, calls) = rest.rsplit_once(" calls=").unwrap();
        let (tid, calls): (u64, u64) = (tid.parse().unwrap(), calls.parse().unwrap());
        let traced: u64 = report["functions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["tid"] == tid && f["name"] == function)
            .map(|f| f["calls"].as_u64().unwrap())
            .sum();
        assert_eq!(traced, calls, "thread {tid}: {function}");
        checked += 1;
    }
    assert!(checked > 0, "no count lines:\n{}", done.stdout);
    for function in tests::fixtures::dso::LOADED_FUNCTIONS {
        assert!(
            report["functions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["name"] == *function && f["calls"].as_u64().unwrap() > 0),
            "{function} not in the report"
        );
    }
}

#[test]
fn every_process_that_runs_an_attached_binary_is_patched_at_its_entry() {
    let scratch = tests::scratch_dir("inline-attach");
    let bin =
        tests::fixtures::private_copy(&tests::fixtures::workloads::calls_fixture(), scratch.path());
    let out = scratch.path().join("out");
    // Running until killed below: it must be there when the session starts, however long
    // that takes on a loaded host.
    let running = tests::run::spawn_fixture(
        "calls already running",
        &bin,
        &["--seconds", "120", "--per-second", "--quiet"],
    );
    let running_pid = running.pid();
    std::thread::sleep(Duration::from_millis(300));
    let mut cmd = std::process::Command::new(tests::tools::fdr_profiled());
    cmd.args(["--engine", "inline", "--no-report", "--attach"])
        .arg(&bin)
        .arg("--out")
        .arg(&out);
    let mut tracer = tests::run::Running::spawn("fdr-profiled --attach --engine inline", &mut cmd);
    tests::run::wait_attached(&mut tracer);
    let mut started = Vec::new();
    for (label, args) in [
        (
            "two threads",
            &["--threads", "2", "--iterations", "20000"][..],
        ),
        ("short", &["--iterations", "100"][..]),
        ("one thread", &["--iterations", "50000"][..]),
    ] {
        let done = tests::run::spawn_fixture(label, &bin, args).finish(TIMEOUT);
        tests::run::assert_success(label, &done);
        started.push(done);
    }
    let tracer = tests::run::interrupt_and_finish(tracer, TIMEOUT);
    tests::run::assert_success("fdr-profiled --attach --engine inline", &tracer);
    let stderr = &tracer.stderr;
    // The one running before is put back as it was, and goes on.
    tests::memory::assert_put_back(running_pid, &bin, stderr);
    running.signal(libc::SIGKILL);
    let _ = running.finish(TIMEOUT);
    assert_eq!(
        stderr.matches(" sleds patched in process ").count(),
        4,
        "{stderr}"
    );
    assert!(!stderr.contains("not traced"), "{stderr}");

    let session = tests::read_session(&out);
    assert_eq!(session.events_lost, 0, "{stderr}");
    tests::assert_every_event_accounted(&session);
    let trace = tests::trace::check_trace_dir(&out, &bin);
    let mut whole = 0;
    for done in &started {
        let want = tests::expected_calls(&tests::parse_count_lines(&done.stdout));
        assert!(!want.is_empty(), "{}", done.stdout);
        let main_tid = *want.keys().min().unwrap();
        // On a loaded host a process can run on between its exec holder and its keeper, and
        // is then patched past its entry point: said, and its first calls not recorded.
        let late = tests::memory::taken_late(stderr, main_tid);
        for (tid, functions) in &want {
            let calls = trace
                .threads
                .iter()
                .find(|t| t.tid == *tid)
                .map(|t| t.calls())
                .unwrap_or_default();
            for (function, count) in functions {
                let traced = calls.get(function).map_or(0, |c| c.entries());
                match late {
                    false => assert_eq!(traced, *count, "thread {tid}: {function}"),
                    true => assert!(traced <= *count, "thread {tid}: {function}"),
                }
            }
        }
        if late {
            continue;
        }
        whole += 1;
        // Patched before `main`: it is entered too, on the main thread.
        let main_thread = trace.threads.iter().find(|t| t.tid == main_tid).unwrap();
        assert_eq!(
            main_thread.calls()["main"].entries(),
            1,
            "main of {main_tid}"
        );
    }
    assert!(whole >= 1, "every started process was taken late: {stderr}");
    // The one running before: traced from where it was found.
    assert!(
        trace.threads.iter().any(|t| t.pid == running_pid),
        "the process running before is not in the trace"
    );
}
