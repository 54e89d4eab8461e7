//! End to end, `--pid`: attach to one running process of a binary that another process also
//! runs. Only the target is traced, every thread of it, with exact per-thread counts checked
//! against what the fixture reports and every file loaded by llvm-xray 14 and 19; the daemon
//! ends by itself when the target exits.
use tests::scenario::{assert_cpp_logged_args, trace_pid, CPP, RUST};

#[test]
fn cpp_process_by_pid() {
    let run = trace_pid(&CPP, 100);
    assert_cpp_logged_args(&run.trace);
}

#[test]
fn rust_process_by_pid() {
    trace_pid(&RUST, 100);
}
