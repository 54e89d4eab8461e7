//! End to end: faults of the traced program, in each mode of `fdr-profiled` (issue 18, item 1).
//!
//! Each test runs one fault in the three modes: a launched command (`-- CMD`), a running
//! process (`--pid`), and every process of a binary (`--attach`):
//! - killed by SIGKILL while it calls;
//! - dying of SIGSEGV (`crash.c`);
//! - calling `exec`, of an instrumented binary (itself: recording goes on in the new image,
//!   in the same thread's file) and of an uninstrumented one (`/bin/true`);
//! - forking (`calls.c --fork`): the child is recorded with `--attach` (it runs the binary),
//!   and with `--pid` and `--` only under `--follow-forks`;
//! - stopped by SIGSTOP for longer than a flush period, then continued.
//!
//! In each run the FDR files are finalized and valid (llvm-xray 14 and 19 convert and account
//! every one, `session.json` lists them), the calls the program counted are in the trace
//! exactly (entries, and exits of the calls that returned), the daemon ends by itself when
//! the process does under `--pid` and `--`, with the command's status under `--`, and keeps
//! recording under `--attach` until SIGINT. Every wait has a time limit.
//!
//! Needs root, BPF, clang-19, llvm-xray 14/19 and a built daemon.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tests::fixtures::workloads::{calls_fixture, crash_fixture};
use tests::run::{launched_child, Running, RECORDING_PREFIX};
use tests::{fdr_profiled, parse_count_lines, private_copy, scratch_dir, TraceDir};

/// Limit of every wait for a daemon or a fixture.
const TIMEOUT: Duration = Duration::from_secs(60);
/// How long `--attach` must go on recording after its last process ended (then SIGINT).
const ATTACH_KEEPS_GOING: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Launch,
    Pid,
    Attach,
}

const MODES: [Mode; 3] = [Mode::Launch, Mode::Pid, Mode::Attach];

/// One traced run: the fixture's stdout, its wait status (as a shell code:
/// 128 + signal), and the checked output directory.
struct Run {
    stdout: String,
    code: i32,
    trace: TraceDir,
}

/// Runs `bin --wait-file F ARGS` traced in `mode` (with `daemon_args` too); `fault(pid)` is
/// called once the program runs traced (its pid).
fn traced(
    mode: Mode,
    label: &str,
    bin: &Path,
    args: &[&str],
    daemon_args: &[&str],
    fault: impl FnOnce(i32),
) -> Run {
    let scratch = scratch_dir(&format!("faults-{label}-{mode:?}"));
    let bin = private_copy(bin, scratch.path());
    let out = scratch.path().join("out");
    let go = scratch.path().join("go");
    let mut cmd = Command::new(fdr_profiled());
    cmd.arg("--out")
        .arg(&out)
        .arg("--no-report")
        .args(daemon_args);
    // The program waits for a file before it calls anything: under --pid so that all its
    // calls are recorded, under `--` so that its pid is found before it may end.
    let mut waiting = vec!["--wait-file", go.to_str().unwrap()];
    waiting.extend_from_slice(args);
    let (daemon, fixture, pid) = match mode {
        Mode::Launch => {
            cmd.arg("--").arg(&bin).args(&waiting);
            let mut daemon = Running::spawn("fdr-profiled", &mut cmd);
            daemon.wait_for_stderr_line(RECORDING_PREFIX, TIMEOUT);
            let pid = launched_child(daemon.pid(), &bin, TIMEOUT);
            (daemon, None, pid)
        }
        Mode::Pid => {
            let mut fixture = Running::spawn(label, Command::new(&bin).args(&waiting));
            fixture.wait_for_stderr_line(tests::WAITING_PREFIX, TIMEOUT);
            cmd.arg("--pid").arg(fixture.pid().to_string());
            let mut daemon = Running::spawn("fdr-profiled", &mut cmd);
            daemon.wait_for_stderr_line(RECORDING_PREFIX, TIMEOUT);
            let pid = fixture.pid() as i32;
            (daemon, Some(fixture), pid)
        }
        Mode::Attach => {
            cmd.arg("--attach").arg(&bin);
            let mut daemon = Running::spawn("fdr-profiled", &mut cmd);
            daemon.wait_for_stderr_line(RECORDING_PREFIX, TIMEOUT);
            let fixture = Running::spawn(label, Command::new(&bin).args(&waiting));
            let pid = fixture.pid() as i32;
            (daemon, Some(fixture), pid)
        }
    };
    std::fs::write(&go, b"").unwrap();
    fault(pid);
    let (daemon, stdout, code) = match fixture {
        None => {
            let done = daemon.finish(TIMEOUT);
            let code = done.status.code().expect("fdr-profiled ended by itself");
            let stdout = done.stdout.clone();
            (done, stdout, code)
        }
        Some(fixture) => {
            let f = fixture.finish(TIMEOUT);
            let code = f.status.code().unwrap_or_else(|| {
                128 + std::os::unix::process::ExitStatusExt::signal(&f.status).unwrap()
            });
            let done = if mode == Mode::Attach {
                // --attach records every process of the binary until it is told to stop.
                std::thread::sleep(ATTACH_KEEPS_GOING);
                assert!(
                    !daemon.has_exited(),
                    "--attach must keep recording after its process ended"
                );
                daemon.signal(libc::SIGINT);
                daemon.finish(TIMEOUT)
            } else {
                daemon.finish(TIMEOUT)
            };
            (done, f.stdout, code)
        }
    };
    let expected_status = if mode == Mode::Launch { code } else { 0 };
    assert_eq!(
        daemon.status.code(),
        Some(expected_status),
        "{label} {mode:?}: fdr-profiled's status\n--- stderr:\n{}",
        daemon.stderr
    );
    assert!(
        daemon.stderr.contains("fdr-profiled: session summary"),
        "{label} {mode:?}: no summary\n{}",
        daemon.stderr
    );
    let trace = tests::check_trace_dir(&out, &bin);
    tests::assert_every_event_accounted(&trace.session);
    // Keep the scratch directory until the checks are done.
    drop(scratch);
    Run {
        stdout,
        code,
        trace,
    }
}

/// The fixture's `count` lines, summed per thread and function (a thread that execs itself
/// counts twice, once per image).
fn counted(stdout: &str) -> BTreeMap<u32, BTreeMap<String, u64>> {
    let mut m: BTreeMap<u32, BTreeMap<String, u64>> = BTreeMap::new();
    for l in parse_count_lines(stdout) {
        *m.entry(l.tid).or_default().entry(l.function).or_default() += l.calls;
    }
    m
}

/// Per thread the fixture counted: each counted function's entries in the trace equal its
/// count, and so do its exits, less those in `open` (function -> calls that never returned)
/// and plus those in `extra_exits` (returns of calls entered before the thread's trace
/// began, which the daemon drops); functions it did not count are absent, besides `main`.
fn assert_counts(
    run: &Run,
    what: &str,
    open: &[(&str, u64)],
    not_entered: &[(u32, &str)],
) -> usize {
    let expected = counted(&run.stdout);
    assert!(
        !expected.is_empty(),
        "{what}: no count lines:\n{}",
        run.stdout
    );
    for (tid, fns) in &expected {
        let thread = run
            .trace
            .threads
            .iter()
            .find(|t| t.tid == *tid)
            .unwrap_or_else(|| panic!("{what}: no trace of thread {tid}"));
        let calls = thread.calls();
        for (name, n) in fns {
            let got = calls.get(name).copied().unwrap_or_default();
            let entered = if not_entered.contains(&(*tid, name.as_str())) {
                0
            } else {
                *n
            };
            let returned = entered
                - open
                    .iter()
                    .find(|(f, _)| f == name)
                    .map_or(0, |(_, k)| (*k).min(entered));
            assert_eq!(
                (got.entries(), got.exits()),
                (entered, returned),
                "{what}: thread {tid}, {name}: (entries, exits) in the trace"
            );
        }
        for name in calls.keys() {
            assert!(
                fns.contains_key(name) || name == "main",
                "{what}: thread {tid}: {name} in the trace but not counted"
            );
        }
    }
    expected.len()
}

trait Exited {
    fn has_exited(&self) -> bool;
}

impl Exited for Running {
    fn has_exited(&self) -> bool {
        // SAFETY: waitid with WNOWAIT only peeks at our own child's state.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PID,
                self.pid(),
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            ) == 0
                && info.si_pid() != 0
        }
    }
}

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) of the fixture this test started (directly or through the daemon).
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

/// The traced program killed by SIGKILL while it calls: its thread's file is finalized (its
/// open frames stay open), and the session ends (or, under --attach, goes on) as the mode says.
#[test]
fn sigkill_of_the_traced_program() {
    for mode in MODES {
        let run = traced(
            mode,
            "calls",
            &calls_fixture(),
            // About 100,000 calls a second (--per-second sleeps between blocks of calls): the
            // files stay small enough for llvm-xray to check quickly.
            &["--seconds", "30", "--per-second", "--quiet"],
            &[],
            |pid| {
                std::thread::sleep(Duration::from_millis(500));
                signal(pid, libc::SIGKILL);
            },
        );
        assert_eq!(run.code, 128 + libc::SIGKILL, "{mode:?}");
        let pid = run.trace.pids();
        assert_eq!(pid.len(), 1, "{mode:?}: one process recorded");
        let records: u64 = run.trace.function_records();
        assert!(
            records > 1000,
            "{mode:?}: half a second of calls recorded: {records} records"
        );
        // The loop that was running has its entry and no exit; every cx_tiny that returned
        // has both.
        let calls = run.trace.threads[0].calls();
        assert_eq!(calls["cx_loop"].entries(), 1, "{mode:?}");
        assert_eq!(calls["cx_loop"].exits(), 0, "{mode:?}");
        let tiny = calls["cx_tiny"];
        assert!(
            tiny.entries() - tiny.exits() <= 1,
            "{mode:?}: cx_tiny {tiny:?}"
        );
        assert_eq!(run.trace.session.events_lost, 0, "{mode:?}");
    }
}

/// The traced program dies of SIGSEGV in an instrumented function: every call it counted is
/// in its file, the faulting function's entry last, without an exit.
#[test]
fn sigsegv_of_the_traced_program() {
    for mode in MODES {
        let run = traced(
            mode,
            "crash",
            &crash_fixture(),
            &["--iterations", "5000"],
            &[],
            |_| {},
        );
        assert_eq!(run.code, 128 + libc::SIGSEGV, "{mode:?}");
        assert_counts(&run, &format!("SIGSEGV {mode:?}"), &[("cr_fault", 1)], &[]);
        let last = run.trace.threads[0]
            .records
            .iter()
            .rev()
            .find(|r| r.function != "main")
            .expect("records");
        assert_eq!(last.function, "cr_fault", "{mode:?}: {last:?}");
    }
}

/// The traced program execs itself: the new image is the same binary, recorded on in the same
/// thread's file (the old image's frames left open: `cx_exec` never returns).
#[test]
fn exec_of_an_instrumented_binary() {
    for mode in MODES {
        // The new image is the traced binary: the private copy `traced` runs, which
        // /proc/self/exe names.
        let run = traced(
            mode,
            "calls",
            &calls_fixture(),
            &[
                "--iterations",
                "2000",
                "--exec",
                "/proc/self/exe",
                "--iterations",
                "3000",
            ],
            &[],
            |_| {},
        );
        assert_eq!(run.code, 0, "{mode:?}");
        // cx_exec never returns, nor does the old image's main that called it. The new
        // image's stack lies anywhere (ASLR): when its first frame is at or above their slots
        // on what looks like the same stack, the recorder proves them gone there, innermost
        // first, and writes their exits (counted as frames unwound: cx_exec, then main);
        // otherwise they stay open to the end.
        let unwound = run.trace.session.json["processes"][0]["threads"][0]["frames_unwound"]
            .as_u64()
            .expect("frames_unwound");
        assert!(unwound <= 2, "{mode:?}: {unwound} frames unwound");
        let open: &[(&str, u64)] = if unwound >= 1 { &[] } else { &[("cx_exec", 1)] };
        let threads = assert_counts(&run, &format!("exec self {mode:?}"), open, &[]);
        assert_eq!(threads, 1, "{mode:?}");
        assert_eq!(
            run.stdout.matches("calls: done threads=1").count(),
            2,
            "{mode:?}: both images ran:\n{}",
            run.stdout
        );
        assert_eq!(run.trace.session.events_lost, 0, "{mode:?}");
    }
}

/// The traced program execs an uninstrumented binary: its file ends with `cx_exec`'s entry,
/// and the session ends with the process (or, under --attach, goes on).
#[test]
fn exec_of_an_uninstrumented_binary() {
    for mode in MODES {
        let run = traced(
            mode,
            "calls",
            &calls_fixture(),
            &["--iterations", "2000", "--exec", "/bin/true"],
            &[],
            |_| {},
        );
        assert_eq!(run.code, 0, "{mode:?}");
        assert_counts(
            &run,
            &format!("exec /bin/true {mode:?}"),
            &[("cx_exec", 1)],
            &[],
        );
        assert_eq!(run.trace.session.events_lost, 0, "{mode:?}");
    }
}

/// The traced program forks; the child runs the same loops. Under --attach the child is
/// recorded (it runs the binary); under --pid and `--` only with --follow-forks, and then from
/// its first instruction: its calls exactly, `cx_fork`'s return (whose entry the parent made)
/// dropped.
#[test]
fn fork_of_the_traced_program() {
    let args = ["--iterations", "3000", "--fork"];
    for mode in MODES {
        for follow in [false, true] {
            if mode == Mode::Attach && follow {
                continue;
            }
            let daemon_args: &[&str] = if follow { &["--follow-forks"] } else { &[] };
            let run = traced(mode, "calls", &calls_fixture(), &args, daemon_args, |_| {});
            let what = format!("fork {mode:?} follow={follow}");
            assert_eq!(run.code, 0, "{what}");
            assert!(
                run.stdout.contains("calls: child status=0"),
                "{what}:\n{}",
                run.stdout
            );
            let counts = counted(&run.stdout);
            assert_eq!(counts.len(), 2, "{what}: parent and child counted");
            let parent = counts
                .iter()
                .find(|(_, f)| f.contains_key("cx_fork"))
                .map(|(tid, _)| *tid)
                .unwrap();
            let child = *counts.keys().find(|t| **t != parent).unwrap();
            let recorded = run.trace.pids();
            if mode == Mode::Attach || follow {
                assert_eq!(
                    recorded,
                    [parent, child].into_iter().collect(),
                    "{what}: both processes recorded"
                );
                assert_counts(&run, &what, &[], &[]);
                // The child's trace holds cx_fork's return only, dropped as an exit without
                // its entry.
                let calls = run.trace.thread(child, child).unwrap().calls();
                assert!(!calls.contains_key("cx_fork"), "{what}: {calls:?}");
            } else {
                assert_eq!(
                    recorded,
                    [parent].into_iter().collect(),
                    "{what}: only the traced process recorded"
                );
                let calls = run.trace.thread(parent, parent).unwrap().calls();
                for (name, n) in &counts[&parent] {
                    assert_eq!(calls[name].entries(), *n, "{what}: {name}");
                    assert_eq!(calls[name].exits(), *n, "{what}: {name}");
                }
            }
            assert_eq!(run.trace.session.events_lost, 0, "{what}");
        }
    }
}

/// The traced program stopped by SIGSTOP for longer than the daemon's flush period, then
/// continued: nothing is lost or cut, the session goes on and ends as the mode says.
#[test]
fn sigstop_longer_than_a_flush_period() {
    for mode in MODES {
        let stopped_at = std::cell::Cell::new(None);
        let run = traced(
            mode,
            "calls",
            &calls_fixture(),
            // About 100,000 calls a second, as above.
            &["--seconds", "1.5", "--per-second"],
            &[],
            |pid| {
                std::thread::sleep(Duration::from_millis(300));
                signal(pid, libc::SIGSTOP);
                stopped_at.set(Some(Instant::now()));
                std::thread::sleep(Duration::from_millis(1500));
                signal(pid, libc::SIGCONT);
            },
        );
        assert!(stopped_at.get().is_some());
        assert_eq!(run.code, 0, "{mode:?}");
        assert_counts(&run, &format!("SIGSTOP {mode:?}"), &[], &[]);
        assert_eq!(run.trace.session.events_lost, 0, "{mode:?}");
    }
}

/// `--follow-forks` follows the children of followed processes too (a grandchild), through a
/// C++ program whose processes throw (`forks.cpp`; `auto` exits are `per-function` with
/// `--follow-forks`): the parent, child A and grandchild G are recorded, each with its own
/// calls of `fk_catcher` exactly; child B, which execs `/bin/echo` before any instrumented
/// call, leaves no file.
#[test]
fn follow_forks_follows_grandchildren() {
    let scratch = scratch_dir("faults-follow-grandchildren");
    let bin = private_copy(&tests::fixtures::workloads::forks_fixture(), scratch.path());
    let out = scratch.path().join("out");
    let done = Running::spawn(
        "fdr-profiled",
        Command::new(fdr_profiled())
            .args(["--no-report", "--follow-forks", "--out"])
            .arg(&out)
            .arg("--")
            .arg(&bin),
    )
    .finish(TIMEOUT);
    tests::run::assert_success("fdr-profiled --follow-forks -- forks", &done);
    assert_eq!(
        done.stdout.lines().last(),
        Some("forks: done a=0 b=0"),
        "{}",
        done.stdout
    );
    assert!(
        done.stderr.contains("fdr-profiled: exits: per function: "),
        "{}",
        done.stderr
    );
    let trace = tests::check_trace_dir(&out, &bin);
    tests::assert_every_event_accounted(&trace.session);
    assert_eq!(trace.session.events_lost, 0);
    // One thread per process; their fk_catcher calls, as each process counted them.
    let mut got: Vec<(u64, u64)> = trace
        .threads
        .iter()
        .map(|t| {
            let c = t.calls().get("fk_catcher").copied().unwrap_or_default();
            (c.entries(), c.exits())
        })
        .collect();
    got.sort_unstable();
    assert_eq!(trace.pids().len(), 3, "parent, child A and grandchild G");
    let mut counted: Vec<u64> = done
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("count process=")?.split_once(" fk_catcher="))
        .map(|(_, n)| n.parse().unwrap())
        .collect();
    counted.sort_unstable();
    assert_eq!(counted.len(), 3, "{}", done.stdout);
    let expected: Vec<(u64, u64)> = counted.iter().map(|n| (*n, *n)).collect();
    assert_eq!(got, expected, "(entries, exits) of fk_catcher per process");
}
