//! End to end: trace the C++ fixture (main + 3 pthreads; nested calls,
//! recursion, tail calls, a LOG_ARGS_ENTRY function) with fdr-profiled, in
//! `--attach` mode and in `-- CMD` mode, and check the FDR files with
//! llvm-xray 14 and 19 against the counts the fixture printed.
//!
//! Needs root, BPF, llvm-xray 14/19, clang-19, and a built daemon
//! (`cargo build -p profiler-daemon`; `cargo xtask test` does it).

use tests::scenario::{assert_cpp_logged_args, trace_attached, trace_launched, CPP};

const ITERATIONS: u32 = 100;

/// One instance already running when the tracer attaches, one started after:
/// one FDR file per thread of each, exact per-thread call counts, `main`
/// balanced (not traced, or traced whole, in the already-running one), no
/// lost events, `events` == function records.
#[test]
fn attach_running_and_later_processes() {
    let run = trace_attached(&CPP, ITERATIONS);
    assert_cpp_logged_args(&run.trace);
}

/// `fdr-profiled -- fixture`: probes before the first instruction, so `main`
/// has its entry and exit; exact per-thread call counts; no lost events.
#[test]
fn launch_command() {
    let run = trace_launched(&CPP, ITERATIONS);
    assert_cpp_logged_args(&run.trace);
}

/// `fdr-profiled --fdr-version 5 -- fixture`: the same exact counts and logged arguments from
/// version-5 files (BufferExtents, Pid), loaded by llvm-xray 14 and 19.
#[test]
fn launch_command_fdr_version_5() {
    let run = tests::scenario::trace_launched_with(&CPP, ITERATIONS, &["--fdr-version", "5"]);
    assert_cpp_logged_args(&run.trace);
}
