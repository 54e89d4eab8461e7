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
