//! The live view of the service: `fdr-profiled top` alone, in a terminal (tmux), asks the
//! running service over its control socket. The service matches calls only while someone
//! asks; the screen shows the target's hot function on top, sorted by calls, at the rate the
//! program reports (within 10%), and `q` quits it while the service runs on.

use std::process::Command;
use std::time::Duration;

use tests::fixtures::private_copy;
use tests::fixtures::workloads::paced_fixture;
use tests::run::Running;
use tests::tmux::{hot_function_on_top, quit_top, Terminal};

use crate::common::one_target_traced_whole;

#[test]
fn top_shows_the_service_s_hot_function_at_the_program_s_rate() {
    let scratch = tests::scratch_dir("service-top");
    let bin = private_copy(&paced_fixture(), scratch.path());
    let (start, _output) = one_target_traced_whole(scratch.path(), "paced", &bin, "30s");
    let service = start.start();
    let report = scratch.path().join("rates.txt");
    let program = Running::spawn(
        "paced",
        Command::new(&bin)
            .args(["--rate", "20000", "--seconds", "60", "--report"])
            .arg(&report),
    );
    let command = format!(
        "{} top --socket {}; echo top-exit=$?; sleep 120",
        tests::fdr_profiled().display(),
        start.socket_path().display(),
    );
    let terminal = Terminal::start("service-top", 160, 40, &command);
    hot_function_on_top(&terminal, &report, "[paced] pc_hot");
    let end = quit_top(&terminal, Duration::from_secs(30));
    assert!(end.contains("top-exit=0"), "{end}");
    // The service goes on: its status still answers, and counts the program's events.
    let status = tests::service::service_status(start.socket_path());
    assert!(status["events"].as_u64().unwrap_or(0) > 0, "{status}");
    program.signal(libc::SIGKILL);
    drop(service);
}

/// Without a service, `top` says so in one line and fails, before taking the terminal.
#[test]
fn top_without_a_service_is_one_line_and_a_failure() {
    let scratch = tests::scratch_dir("service-top-none");
    let out = tests::tools::run_output(
        Command::new(tests::fdr_profiled())
            .args(["top", "--socket"])
            .arg(scratch.path().join("none.sock")),
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot reach the service"), "{stderr}");
}
