//! End to end: `--engine inline` never hurts the traced process when fdr-profiled dies.
//!
//! The sleds are patched and put back by a keeper process of fdr-profiled's own
//! (`fdr-inline`), which puts them back as soon as fdr-profiled is gone, however it ended. A
//! C++ server (throwing from deep recursion every fifth request) is traced by pid fifty times,
//! fdr-profiled killed with SIGKILL each time at a different moment, from before the keeper
//! exists to long after it patched: after each kill the keeper must end, the server's code be
//! its ELF file's byte for byte, nothing of the engine be left mapped in it, and the server
//! still serve; at the end it must end as it would untraced (exit 0, its last line).
//!
//! Needs root, BPF, clang-19 and a built daemon.

use std::process::Command;
use std::time::{Duration, Instant};

use tests::run::Running;

const TIMEOUT: Duration = Duration::from_secs(120);
const KILLS: u32 = 50;

/// The keepers of fdr-profiled sessions tracing `pid` (their command lines are fdr-profiled's,
/// forked), not ended yet.
fn keepers_of(pid: u32) -> Vec<u32> {
    let needle = format!("--pid\0{pid}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let zombie = stat
                .rsplit_once(") ")
                .is_some_and(|(_, s)| s.starts_with('Z'));
            comm.trim() == "fdr-inline"
                && !zombie
                && String::from_utf8_lossy(&cmdline).contains(&needle)
        })
        .collect()
}

fn trace(pid: u32, out: &std::path::Path, label: &str) -> Running {
    Running::spawn(
        label,
        Command::new(tests::fdr_profiled())
            .args([
                "--pid",
                &pid.to_string(),
                "--engine",
                "inline",
                "--no-report",
            ])
            .arg("--out")
            .arg(out),
    )
}

#[test]
fn the_process_survives_sigkill_of_fdr_profiled_at_any_moment() {
    let scratch = tests::scratch_dir("inline-kill");
    let bin = tests::fixtures::private_copy(
        &tests::fixtures::workloads::deep_server_fixture(),
        scratch.path(),
    );
    let server = tests::run::spawn_fixture("deep_server", &bin, &["5", "100", "50"]);
    let pid = server.pid();
    // How long fdr-profiled takes to patch, measured once: the kills are spread over twice
    // that.
    let started = Instant::now();
    let mut first = trace(
        pid,
        &scratch.path().join("out-measured"),
        "fdr-profiled (measured)",
    );
    first.wait_for_stderr_line("fdr-profiled: inline engine: ", TIMEOUT);
    let patching = started.elapsed();
    first.signal(libc::SIGINT);
    let done = first.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    let spread = u64::try_from(patching.as_micros() * 3 / 2)
        .unwrap_or(1)
        .max(1);
    eprintln!("inline_kill: patching takes {patching:?}: kills spread over {spread} us");
    let mut patched_before_kill = 0;
    for round in 0..KILLS {
        let out = scratch.path().join(format!("out-{round}"));
        let daemon = trace(pid, &out, &format!("fdr-profiled (kill {round})"));
        // Spread evenly, in an order that is not monotonic.
        let delay =
            Duration::from_micros(spread * u64::from((round * 37) % KILLS) / u64::from(KILLS));
        std::thread::sleep(delay);
        if daemon.output_so_far().1.contains("sleds patched") {
            patched_before_kill += 1;
        }
        daemon.signal(libc::SIGKILL);
        let _ = daemon.finish(TIMEOUT);
        // The keeper puts the process back and ends.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !keepers_of(pid).is_empty() {
            assert!(
                Instant::now() < deadline,
                "kill {round} after {delay:?}: the keeper did not end: {:?}",
                keepers_of(pid)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: kill with signal 0 only checks that the process exists.
        assert_eq!(
            unsafe { libc::kill(pid as i32, 0) },
            0,
            "kill {round} after {delay:?}: the server died: {:?}",
            server.output_so_far()
        );
        tests::memory::assert_put_back(pid, &bin, &format!("kill {round} after {delay:?}"));
    }
    server.signal(libc::SIGTERM);
    let done = server.finish(TIMEOUT);
    tests::run::assert_success("deep_server", &done);
    assert!(
        done.stdout.contains("deep_server: rounds="),
        "{}",
        done.stdout
    );
    // Many kills came after the sleds were patched (the others before or while: about half).
    assert!(
        patched_before_kill >= KILLS / 5,
        "only {patched_before_kill} of {KILLS} kills came after the patching"
    );
}
