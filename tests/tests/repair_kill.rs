//! End to end: `--exits repair` never hurts the command when fdr-profiled dies.
//!
//! The command's tracer under `--exits repair` is a keeper process of its own (`fdr-repair`),
//! so frames fdr-profiled hooked with return probes go on being repaired at each throw after
//! fdr-profiled is gone. Fifty times, the exception fixture (three threads, thousands of
//! throws through hooked frames, and with `--escape` a last throw through the main thread's
//! `ex_thread`, hooked from the start) is launched under `--exits repair` and fdr-profiled is
//! killed with SIGKILL at a different moment of the traced run: only a repair after
//! fdr-profiled's death keeps that last throw from ending the program. Each time the fixture must end
//! normally (exit 0, its done line with every exception caught), the keeper must end with it,
//! and no process may stay behind.
//!
//! This test binary makes itself a child subreaper, so that the orphaned fixture and keeper
//! become its children and their exit statuses can be read. Needs root, BPF, clang-19 and a
//! built daemon.

use std::process::Command;
use std::time::{Duration, Instant};

use tests::fixtures::workloads::exceptions_fixture;
use tests::run::{launched_child, Running};
use tests::scratch_dir;

const TIMEOUT: Duration = Duration::from_secs(120);
const KILLS: u32 = 50;
/// Traced, 4000 iterations with a catching thread take about a second: the kills are spread
/// over the first 80% of a traced run as long as the one measured first.
const ITERATIONS: &str = "4000";
const DONE: &str = "exceptions: done caught=12000 rounds=24000";

/// Launches the fixture under `--exits repair` into `out`; returns fdr-profiled once the
/// keeper is said.
fn launch(label: &str, out: &std::path::Path) -> Running {
    let mut daemon = Running::spawn(
        label,
        Command::new(tests::fdr_profiled())
            .args(["--exits", "repair", "--no-report", "--out"])
            .arg(out)
            .arg("--")
            .arg(exceptions_fixture())
            .args(["--iterations", ITERATIONS, "--catch-in-thread", "--escape"]),
    );
    daemon.wait_for_stderr_line(
        "fdr-profiled: repair: the command's tracer is process",
        TIMEOUT,
    );
    daemon
}

#[test]
fn the_command_survives_sigkill_of_fdr_profiled_at_any_moment() {
    // SAFETY: prctl on our own process.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(rc, 0, "PR_SET_CHILD_SUBREAPER");
    let scratch = scratch_dir("repair-kill");
    // How long a traced run takes on this machine now, from the command's start to its end (the
    // shortest of three: the first, colder, took twice as long as the others once): the kills
    // are spread over most of it.
    let run = (0..3)
        .map(|i| {
            let daemon = launch(
                "fdr-profiled (measured)",
                &scratch.path().join(format!("out-measured-{i}")),
            );
            let child = launched_child(daemon.pid(), &exceptions_fixture(), TIMEOUT);
            let started = Instant::now();
            // The command's own run: until it is a zombie (fdr-profiled reaps it after).
            while !exited(child) && std::path::Path::new(&format!("/proc/{child}")).exists() {
                std::thread::sleep(Duration::from_millis(2));
            }
            let run = started.elapsed();
            let done = daemon.finish(TIMEOUT);
            assert!(done.status.success(), "{}", done.stderr);
            run
        })
        .min()
        .unwrap_or(Duration::from_secs(1));
    let spread = u64::try_from(run.as_micros() * 8 / 10).unwrap_or(1).max(1);
    eprintln!("repair_kill: a traced run takes {run:?}: kills spread over {spread} us");
    let (mut mid_run, mut statuses) = (0, 0);
    // A fixed sequence of delays (a linear congruential generator), so a failure repeats.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    for round in 0..KILLS {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let delay = Duration::from_micros((seed >> 33) % spread);
        let out = scratch.path().join(format!("out-{round}"));
        let daemon = launch(&format!("fdr-profiled (kill {round})"), &out);
        let (_, stderr) = daemon.output_so_far();
        let keeper: i32 = stderr
            .lines()
            .find_map(|l| l.strip_prefix("fdr-profiled: repair: the command's tracer is process "))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no keeper pid in:\n{stderr}"));
        let child = launched_child(daemon.pid(), &exceptions_fixture(), TIMEOUT);
        std::thread::sleep(delay);
        daemon.signal(libc::SIGKILL);
        if !exited(child) {
            mid_run += 1;
        }
        let done = daemon.finish(TIMEOUT);
        // Killed; or, when the whole run was over before the delay (it is about as long as the
        // longest delays), ended normally: that round kills nothing and is not counted in
        // `mid_run` below.
        assert!(
            matches!(done.status.code(), None | Some(0)),
            "kill {round}: fdr-profiled ended with {:?}\n{}",
            done.status,
            done.stderr
        );
        // A command that ended before the kill was fdr-profiled's to reap (its output is
        // still checked below).
        if let Some(status) = wait(child) {
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "kill {round} after {delay:?}: the command ended with status {status:#x}\n--- stdout:\n{}\n--- stderr:\n{}",
                done.stdout,
                done.stderr
            );
            statuses += 1;
        }
        assert_eq!(
            done.stdout.lines().last(),
            Some(DONE),
            "kill {round} after {delay:?}: the command's output\n--- stderr:\n{}",
            done.stderr
        );
        if let Some(keeper_status) = wait(keeper) {
            assert!(
                libc::WIFEXITED(keeper_status) && libc::WEXITSTATUS(keeper_status) == 0,
                "kill {round}: the keeper ended with status {keeper_status:#x}"
            );
        }
    }
    // Most kills must have come while the command ran (the rest came as it was finishing).
    assert!(
        mid_run >= KILLS * 3 / 4 && statuses >= mid_run,
        "only {mid_run} of {KILLS} kills came while the command ran ({statuses} exit statuses read)"
    );
}

/// Whether `pid` (our child, as subreaper) is a zombie already.
fn exited(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s[s.rfind(')')? + 2..].chars().next())
        .is_none_or(|state| state == 'Z' || state == 'X')
}

/// The wait status of `pid` within [`TIMEOUT`], once it is a child of ours (as subreaper); None
/// when it is not (its parent reaped it before it could be orphaned).
fn wait(pid: i32) -> Option<i32> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut status = 0;
        // SAFETY: valid pointer to an int.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG | libc::__WALL) };
        if r == pid {
            return Some(status);
        }
        if r < 0 {
            let err = std::io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::ECHILD) => return None,
                Some(libc::EINTR) => continue,
                _ => panic!("waitpid({pid}): {err}"),
            }
        }
        assert!(
            Instant::now() < deadline,
            "{pid} still runs after {TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
