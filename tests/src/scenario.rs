//! The two ways of tracing a fixture end to end, shared by recording's
//! `trace_cpp` and `trace_rust` (`tests/tests/recording/`).
//!
//! - [`trace_attached`]: `fdr-profiled --attach BIN`: one fixture instance is
//!   already running (parked in its `--wait-file` loop, inside `main`) when
//!   the tracer starts; after the tracer's `attached` line a second instance
//!   is started; the wait file is created; both run to completion; then the
//!   tracer gets SIGINT.
//! - [`trace_launched`]: `fdr-profiled --out DIR -- BIN ARGS`.
//!
//! Both trace a private copy of the fixture (a uprobe covers every process
//! running the inode), check the output directory with llvm-xray 14 and 19
//! ([`check_trace_dir`]), compare each process with its `count` lines
//! ([`assert_process_calls`]) and the session totals
//! ([`assert_session_totals`]), and check the daemon's `events lost: 0`
//! summary.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::counts::{expected_calls, parse_count_lines, ExpectedCalls};
use crate::fixtures::{
    cpp_fixture, private_copy, rust_fixture, CPP_FUNCTIONS, CPP_LOGGED, CPP_MAIN, RUST_FUNCTIONS,
    RUST_MAIN,
};
use crate::run::{
    assert_success, interrupt_and_finish, spawn_fixture, start_attach, wait_attached, Finished,
    WAITING_PREFIX,
};
use crate::tools::scratch_dir;
use crate::trace::{
    assert_process_calls, assert_session_totals, check_trace_dir, summary_events_lost, MainCall,
    ProcessExpectation, TraceDir,
};
use crate::xray_yaml::RecordKind;

/// Which fixture, and what the checks need to know about it.
#[derive(Debug, Clone, Copy)]
pub struct FixtureSpec {
    /// Short name for scratch directories and labels.
    pub name: &'static str,
    /// Builds (or reuses) the fixture.
    pub build: fn() -> PathBuf,
    pub known: &'static [&'static str],
    pub main_fn: &'static str,
    /// Only `known` and `main_fn` may appear in traces.
    pub only_known: bool,
}

/// The C++ fixture: every function in its map is known.
pub const CPP: FixtureSpec = FixtureSpec {
    name: "cpp",
    build: cpp_fixture,
    known: CPP_FUNCTIONS,
    main_fn: CPP_MAIN,
    only_known: true,
};

/// The Rust fixture: known `rx_*` functions plus std generics (balanced).
pub const RUST: FixtureSpec = FixtureSpec {
    name: "rust",
    build: rust_fixture,
    known: RUST_FUNCTIONS,
    main_fn: RUST_MAIN,
    only_known: false,
};

/// One traced fixture process.
#[derive(Debug, Clone)]
pub struct TracedProcess {
    pub pid: u32,
    pub calls: ExpectedCalls,
    pub main: MainCall,
    pub output: Finished,
}

/// The result of a scenario, already checked. Keeps the scratch directory
/// alive so callers can look further.
pub struct ScenarioRun {
    pub scratch: tempfile::TempDir,
    pub bin: PathBuf,
    pub trace: TraceDir,
    pub processes: Vec<TracedProcess>,
    pub tracer: Finished,
}

const FIXTURE_TIMEOUT: Duration = Duration::from_secs(180);
const TRACER_STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// `--attach`: an already-running instance and one started after attach.
pub fn trace_attached(spec: &FixtureSpec, iterations: u32) -> ScenarioRun {
    let scratch = scratch_dir(&format!("attach-{}", spec.name));
    let bin = private_copy(&(spec.build)(), scratch.path());
    let out = scratch.path().join("out");
    let wait = scratch.path().join("go");
    let iters = iterations.to_string();

    let mut early = spawn_fixture(
        "early fixture",
        &bin,
        &[
            OsString::from("--wait-file"),
            wait.clone().into_os_string(),
            OsString::from("--iterations"),
            OsString::from(&iters),
        ],
    );
    early.wait_for_stderr_line(WAITING_PREFIX, Duration::from_secs(30));
    let early_pid = early.pid();

    // Exits per function: every call of the process started later, whatever the host's load.
    // With the defaults (repair) such a process is held from its exec, and on a loaded host it
    // may run past its entry point first (counted as traced late): repair/pid.rs tests that.
    let mut tracer = start_attach(&bin, &out, &["--exits", "per-function"]);
    wait_attached(&mut tracer);

    let late = spawn_fixture("late fixture", &bin, &["--iterations", &iters]);
    let late_pid = late.pid();
    std::fs::write(&wait, b"go\n").expect("create wait file");

    let early_done = early.finish(FIXTURE_TIMEOUT);
    let late_done = late.finish(FIXTURE_TIMEOUT);
    assert_success("early fixture", &early_done);
    assert_success("late fixture", &late_done);

    let tracer_done = interrupt_and_finish(tracer, TRACER_STOP_TIMEOUT);
    assert_success("fdr-profiled --attach (stopped by SIGINT)", &tracer_done);

    let processes = vec![
        traced(early_pid, MainCall::InProgress, early_done),
        traced(late_pid, MainCall::Traced, late_done),
    ];
    finish_checks(spec, scratch, bin, &out, processes, tracer_done)
}

/// `--pid`: two instances of the same binary are running; only the one named is traced, and the
/// session ends by itself when that process exits.
pub fn trace_pid(spec: &FixtureSpec, iterations: u32) -> ScenarioRun {
    trace_pid_with(spec, iterations, false)
}

/// [`trace_pid`], optionally replacing the binary on disk (deleted, then a copy with the same
/// bytes put at its path: a new inode) after the processes started and before attaching. The
/// daemon must trace the file the process runs, not what the path names now.
pub fn trace_pid_with(spec: &FixtureSpec, iterations: u32, replace_binary: bool) -> ScenarioRun {
    trace_pid_as(spec, iterations, replace_binary, &[])
}

/// [`trace_pid_with`], fdr-profiled given `daemon_args` too (`--engine inline`).
pub fn trace_pid_as(
    spec: &FixtureSpec,
    iterations: u32,
    replace_binary: bool,
    daemon_args: &[&str],
) -> ScenarioRun {
    let scratch = scratch_dir(&format!("pid-{}", spec.name));
    let bin = private_copy(&(spec.build)(), scratch.path());
    let out = scratch.path().join("out");
    let wait = scratch.path().join("go");
    let args = [
        OsString::from("--wait-file"),
        wait.clone().into_os_string(),
        OsString::from("--iterations"),
        OsString::from(iterations.to_string()),
    ];
    let mut target = spawn_fixture("target fixture", &bin, &args);
    let mut bystander = spawn_fixture("bystander fixture", &bin, &args);
    target.wait_for_stderr_line(WAITING_PREFIX, Duration::from_secs(30));
    bystander.wait_for_stderr_line(WAITING_PREFIX, Duration::from_secs(30));
    let target_pid = target.pid();
    if replace_binary {
        let fresh = scratch.path().join("fresh-copy");
        std::fs::copy(&bin, &fresh).expect("copy the fixture");
        std::fs::remove_file(&bin).expect("delete the running fixture's file");
        std::fs::rename(&fresh, &bin).expect("put a new file at its path");
    }

    let mut tracer = crate::run::start_pid(target_pid, &out, daemon_args);
    wait_attached(&mut tracer);
    std::fs::write(&wait, b"go\n").expect("create wait file");

    let target_done = target.finish(FIXTURE_TIMEOUT);
    let bystander_done = bystander.finish(FIXTURE_TIMEOUT);
    assert_success("target fixture", &target_done);
    assert_success("bystander fixture", &bystander_done);
    // No signal: the daemon must notice the target's exit on its own.
    let tracer_done = tracer.finish(TRACER_STOP_TIMEOUT);
    assert_success("fdr-profiled --pid (ends with its target)", &tracer_done);

    let processes = vec![traced(target_pid, MainCall::InProgress, target_done)];
    finish_checks(spec, scratch, bin, &out, processes, tracer_done)
}

/// `-- CMD`: the daemon launches the fixture.
pub fn trace_launched(spec: &FixtureSpec, iterations: u32) -> ScenarioRun {
    trace_launched_with(spec, iterations, &[])
}

/// [`trace_launched`] with extra daemon options (e.g. `--fdr-version 5`).
pub fn trace_launched_with(
    spec: &FixtureSpec,
    iterations: u32,
    daemon_args: &[&str],
) -> ScenarioRun {
    let scratch = scratch_dir(&format!("launch-{}", spec.name));
    let bin = private_copy(&(spec.build)(), scratch.path());
    let out = scratch.path().join("out");
    let done = crate::run::run_launch_with(
        &out,
        daemon_args,
        &bin,
        &["--iterations", &iterations.to_string()],
        FIXTURE_TIMEOUT,
    );
    assert_success("fdr-profiled -- fixture", &done);
    let session = crate::trace::read_session(&out);
    assert_eq!(
        session.processes.len(),
        1,
        "one process traced: {}",
        session.json
    );
    let pid = session.processes[0].pid;
    let process = traced(pid, MainCall::Traced, done.clone());
    finish_checks(spec, scratch, bin, &out, vec![process], done)
}

fn traced(pid: u32, main: MainCall, output: Finished) -> TracedProcess {
    let calls = expected_calls(&parse_count_lines(&output.stdout));
    TracedProcess {
        pid,
        calls,
        main,
        output,
    }
}

fn finish_checks(
    spec: &FixtureSpec,
    scratch: tempfile::TempDir,
    bin: PathBuf,
    out: &std::path::Path,
    processes: Vec<TracedProcess>,
    tracer: Finished,
) -> ScenarioRun {
    assert_eq!(
        summary_events_lost(&tracer.stderr),
        Some(0),
        "the daemon's summary must say `events lost: 0`:\n{}",
        tracer.stderr
    );
    let trace = check_trace_dir(out, &bin);
    let want: BTreeSet<u32> = processes.iter().map(|p| p.pid).collect();
    let session_pids: BTreeSet<u32> = trace.session.processes.iter().map(|p| p.pid).collect();
    assert_eq!(session_pids, want, "processes in session.json");
    assert_eq!(
        trace.pids(),
        want,
        "process directories in {}",
        out.display()
    );
    for p in &processes {
        assert!(
            !p.calls.is_empty(),
            "fixture {} printed no count lines:\n{}",
            p.pid,
            p.output.stdout
        );
        assert_process_calls(
            &trace,
            &ProcessExpectation {
                pid: p.pid,
                calls: &p.calls,
                known: spec.known,
                main_fn: spec.main_fn,
                main: p.main,
                only_known: spec.only_known,
            },
        );
    }
    assert_session_totals(&trace);
    ScenarioRun {
        scratch,
        bin,
        trace,
        processes,
        tracer,
    }
}

/// The C++ fixture's `fx_logged` has a LOG_ARGS_ENTRY sled and is only
/// called with multiples of 3: every entry must be `function-enter-arg`
/// carrying exactly that one argument.
pub fn assert_cpp_logged_args(trace: &TraceDir) {
    let mut seen = 0;
    for t in &trace.threads {
        for r in t.records_of(CPP_LOGGED) {
            match r.kind {
                RecordKind::EnterArg => {
                    assert_eq!(r.args.len(), 1, "{}: {r:?}", t.path.display());
                    assert_eq!(
                        r.args[0] % 3,
                        0,
                        "{}: {CPP_LOGGED} is only called with multiples of 3: {r:?}",
                        t.path.display()
                    );
                    seen += 1;
                }
                RecordKind::Enter => panic!(
                    "{}: {CPP_LOGGED} has a LOG_ARGS_ENTRY sled; its entries must be function-enter-arg: {r:?}",
                    t.path.display()
                ),
                _ => {}
            }
        }
    }
    assert!(seen > 0, "no {CPP_LOGGED} entries at all");
}
