//! End to end: trace the Rust fixture (main + 3 std threads, built with
//! `-Zinstrument-xray=always`) with fdr-profiled, in `--attach` mode and in
//! `-- CMD` mode, and check the FDR files with llvm-xray 14 and 19. The
//! `#[no_mangle]` `rx_*` functions must match the fixture's counts exactly;
//! every other instrumented function (std generics compiled into the crate)
//! must have as many entries as exits on each thread.
//!
//! Needs root, BPF, llvm-xray 14/19, nightly rustc, and a built daemon
//! (`cargo build -p profiler-daemon`; `cargo xtask test` does it).

use tests::scenario::{trace_attached, trace_launched, RUST};

const ITERATIONS: u32 = 100;

/// One instance already running when the tracer attaches, one started after.
#[test]
fn attach_running_and_later_processes() {
    trace_attached(&RUST, ITERATIONS);
}

/// `fdr-profiled -- fixture`.
#[test]
fn launch_command() {
    trace_launched(&RUST, ITERATIONS);
}

/// `fdr-profiled --fdr-version 5 -- fixture`: the same exact counts from version-5 files
/// (BufferExtents, Pid), loaded by llvm-xray 14 and 19.
#[test]
fn launch_command_fdr_version_5() {
    tests::scenario::trace_launched_with(&RUST, ITERATIONS, &["--fdr-version", "5"]);
}
