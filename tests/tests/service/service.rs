//! `fdr-profiled service --config FILE` in flight-recorder mode, with real BPF and real
//! processes: every process that runs the target's binary is traced from its first call; the
//! last `window` of every thread is held in memory; `SIGUSR1` writes it as a session.
//!
//! One process runs, then, after more than the window, a second one with two threads; the
//! snapshot taken then holds exactly the second one: per thread and function, entries and exits
//! equal what it counted, llvm-xray 14 and 19 read every file, and `session.json` says that
//! exactly the first process's events aged out.
//!
//! A process that dies of SIGSEGV gets a snapshot of its own, named after the signal and the
//! process, whose trace ends with its last calls: the faulting function's entry.
//!
//! Needs root, BPF, llvm-xray 14/19, clang-19 and a built daemon.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tests::counts::{expected_calls, parse_count_lines};
use tests::fixtures::private_copy;
use tests::fixtures::workloads::{calls_fixture, crash_fixture, slow_fixture, CALLS_FUNCTIONS};
use tests::run::Running;
use tests::tools::run_output;
use tests::trace::{assert_process_calls, check_trace_dir, MainCall, ProcessExpectation, TraceDir};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The snapshot directories under `OUTPUT/<target>/`.
fn snapshots(output: &Path, target: &str) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(output.join(target))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// Starts the service on one target, `name`, tracing `bin` with `window`; returns it ready,
/// and the output root.
fn start_service(scratch: &Path, name: &str, bin: &Path, window: &str) -> (Running, PathBuf) {
    start_service_with(scratch, name, bin, window, "")
}

/// [`start_service`] with more top-level settings (`max_disk = ...`).
fn start_service_with(
    scratch: &Path,
    name: &str,
    bin: &Path,
    window: &str,
    settings: &str,
) -> (Running, PathBuf) {
    let output = scratch.join("out");
    let config = scratch.join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n{settings}\n[[target]]\nname = \"{name}\"\nbinary = \"{}\"\nwindow = \"{window}\"\n",
            output.display(),
            bin.display()
        ),
    )
    .unwrap();
    (spawn_service(scratch, &config), output)
}

#[test]
fn a_snapshot_holds_the_last_window_of_every_process_of_the_target() {
    let scratch = tests::scratch_dir("service-flight");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let (mut service, output) = start_service(scratch.path(), "calls", &bin, "2s");

    // The first process: its events age out of the 2 s window before the snapshot.
    let first = run_output(Command::new(&bin).args(["--iterations", "1000"]));
    assert!(first.status.success());
    std::thread::sleep(Duration::from_millis(2_600));
    // The second: two threads, all within the window.
    let second = Running::spawn(
        "calls",
        Command::new(&bin).args(["--threads", "2", "--iterations", "700"]),
    );
    let second_pid = second.pid();
    let second = second.finish(TIMEOUT);
    assert!(second.status.success(), "{}", second.stderr);
    // Its events are read within a drain period or two.
    std::thread::sleep(Duration::from_millis(300));
    service.signal(libc::SIGUSR1);
    service.wait_for_stderr_line("fdr-profiled: service: target calls: snapshot ", TIMEOUT);
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);

    let dirs = snapshots(&output, "calls");
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let name = dirs[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with("Z-sigusr1"), "{name}");
    let trace = check_trace_dir(&dirs[0], &bin);
    assert_eq!(
        trace.pids().into_iter().collect::<Vec<_>>(),
        vec![second_pid],
        "only the second process is in the window"
    );
    assert_calls_run(&trace, second_pid, &second.stdout);
    tests::assert_every_event_accounted(&trace.session);
    // The first process's events all aged out: main, cx_loop, 1000 calls of cx_tiny and
    // cx_report (entry and exit each), and its thread's end.
    let window = &trace.session.json["window"];
    assert_eq!(window["window_ns"], 2_000_000_000u64, "{window}");
    assert_eq!(window["expired"], 2 * 1003 + 1, "{window}");
    assert_eq!(window["evicted"], 0, "{window}");
    assert!(dirs[0].join("report.txt").is_file());
}

#[test]
fn a_process_dying_of_a_signal_gets_a_snapshot_ending_with_its_last_calls() {
    let scratch = tests::scratch_dir("service-crash");
    let bin = private_copy(&crash_fixture(), scratch.path());
    let (mut service, output) = start_service(scratch.path(), "crash", &bin, "30s");
    let crashed = Running::spawn("crash", Command::new(&bin).args(["--iterations", "300"]));
    let pid = crashed.pid();
    let crashed = crashed.finish(TIMEOUT);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&crashed.status),
        Some(libc::SIGSEGV),
        "{:?}",
        crashed.status
    );
    service.wait_for_stderr_line(
        &format!("fdr-profiled: service: target crash: process {pid} died of SIGSEGV"),
        TIMEOUT,
    );
    service.wait_for_stderr_line("fdr-profiled: service: target crash: snapshot ", TIMEOUT);
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);

    let dirs = snapshots(&output, "crash");
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let name = dirs[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with(&format!("Z-sigsegv-{pid}")), "{name}");
    let trace = check_trace_dir(&dirs[0], &bin);
    let thread = trace.thread(pid, pid).expect("the crashed thread's file");
    let calls = thread.calls();
    let work = calls.get("cr_work").copied().unwrap_or_default();
    assert_eq!((work.entries(), work.exits()), (300, 300));
    let fault = calls.get("cr_fault").copied().unwrap_or_default();
    assert_eq!(
        (fault.entries(), fault.exits()),
        (1, 0),
        "it died inside cr_fault"
    );
    let last = thread
        .records
        .iter()
        .rev()
        .find(|r| r.kind.is_function())
        .expect("function records");
    assert_eq!(
        (last.function.as_str(), last.kind.is_entry()),
        ("cr_fault", true),
        "the trace ends with the faulting call"
    );
}

/// systemd's notify protocol, as a test that owns `NOTIFY_SOCKET` sees it: `READY=1` once the
/// service is ready, `STATUS=` lines with its counts, `WATCHDOG=1` pings at half of
/// `WATCHDOG_USEC`, and `STOPPING=1` last.
#[test]
fn the_notify_protocol_is_spoken_in_order() {
    use std::os::unix::net::UnixDatagram;
    let scratch = tests::scratch_dir("service-notify");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let socket_path = scratch.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"calls\"\nbinary = \"{}\"\n",
            scratch.path().join("out").display(),
            bin.display()
        ),
    )
    .unwrap();
    // systemd names the pid the watchdog is for: the shell's, which exec keeps.
    let mut service = Running::spawn(
        "fdr-profiled service",
        Command::new("sh")
            .arg("-c")
            .arg("WATCHDOG_PID=$$ exec \"$0\" service --config \"$1\" --socket \"$2\"")
            .arg(tests::fdr_profiled())
            .arg(&config)
            .arg(scratch.path().join("control.sock"))
            .env("NOTIFY_SOCKET", &socket_path)
            .env("WATCHDOG_USEC", "400000"),
    );
    let mut messages: Vec<String> = Vec::new();
    let receive_for = |d: Duration, messages: &mut Vec<String>| {
        let end = std::time::Instant::now() + d;
        let mut buf = [0u8; 4096];
        while std::time::Instant::now() < end {
            if let Ok(n) = socket.recv(&mut buf) {
                messages.extend(
                    String::from_utf8_lossy(&buf[..n])
                        .lines()
                        .map(str::to_owned),
                );
            }
        }
    };
    service.wait_for_stderr_line("fdr-profiled: service: ready", TIMEOUT);
    receive_for(Duration::from_millis(300), &mut messages);
    let run = run_output(Command::new(&bin).args(["--iterations", "1000"]));
    assert!(run.status.success());
    receive_for(Duration::from_millis(2_500), &mut messages);
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    receive_for(Duration::from_millis(300), &mut messages);

    assert_eq!(
        messages.first().map(String::as_str),
        Some("READY=1"),
        "{messages:?}"
    );
    assert_eq!(
        messages.last().map(String::as_str),
        Some("STOPPING=1"),
        "{messages:?}"
    );
    let pings = messages.iter().filter(|m| *m == "WATCHDOG=1").count();
    assert!(pings >= 5, "a ping every 200 ms for 2.8 s: {messages:?}");
    let statuses: Vec<&String> = messages
        .iter()
        .filter(|m| m.starts_with("STATUS="))
        .collect();
    assert!(statuses.len() >= 2, "{messages:?}");
    assert!(
        statuses
            .iter()
            .all(|s| s.starts_with("STATUS=1 targets (1 binaries); ")),
        "{statuses:?}"
    );
    // The last status has seen the run: 1000 calls of cx_tiny, entry and exit, and more.
    let last = statuses.last().unwrap();
    let events: u64 = last
        .split("; ")
        .nth(1)
        .and_then(|p| p.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{last}"));
    assert!(events >= 2_000, "{last}");
}

/// Bytes of the regular files under `dir`.
fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
    {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            total += tree_bytes(&e.path());
        } else if t.is_file() {
            total += e.metadata().unwrap().len();
        }
    }
    total
}

/// With a tiny `max_disk`, the oldest snapshots are deleted as new ones are written: what is
/// left is at most the cap plus the newest snapshot, every file of it valid, and the newest
/// is never the one deleted.
#[test]
fn snapshots_stay_under_max_disk_oldest_deleted_first() {
    let scratch = tests::scratch_dir("service-retention");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let (service, output) =
        start_service_with(scratch.path(), "calls", &bin, "60s", "max_disk = \"40KB\"");
    let mut sizes = Vec::new();
    for round in 0..5 {
        let run = run_output(Command::new(&bin).args(["--iterations", "500"]));
        assert!(run.status.success());
        std::thread::sleep(Duration::from_millis(300));
        service.signal(libc::SIGUSR1);
        // Each snapshot names its directory; wait for this round's.
        let want = round + 1;
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            let (_, stderr) = service.output_so_far();
            if stderr.matches("target calls: snapshot ").count() >= want {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{stderr}");
            std::thread::sleep(Duration::from_millis(20));
        }
        let dirs = snapshots(&output, "calls");
        let newest = dirs.last().unwrap().clone();
        sizes.push(tree_bytes(&newest));
        let total: u64 = dirs.iter().map(|d| tree_bytes(d)).sum();
        assert!(
            total <= 40_000 + tree_bytes(&newest),
            "round {round}: {total} bytes in {dirs:?}"
        );
    }
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    // The window grows by a run each round, so snapshots grow: some were deleted.
    assert!(
        done.stderr.contains("to stay under max_disk"),
        "sizes {sizes:?}: {}",
        done.stderr
    );
    let dirs = snapshots(&output, "calls");
    assert!(!dirs.is_empty() && dirs.len() < 5, "{dirs:?}");
    for d in &dirs {
        check_trace_dir(d, &bin);
    }
}

/// `fdr-profiled status` and `fdr-profiled snapshot [TARGET]` over the control socket: the
/// status counts what the service holds, a requested snapshot is written and named, an unknown
/// target is refused, and only root gets in.
#[test]
fn status_and_snapshot_requests_over_the_control_socket() {
    let scratch = tests::scratch_dir("service-control");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let (service, output) = start_service(scratch.path(), "calls", &bin, "60s");
    let socket = scratch.path().join("control.sock");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&socket).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    let run = run_output(Command::new(&bin).args(["--iterations", "1000"]));
    assert!(run.status.success());
    std::thread::sleep(Duration::from_millis(300));
    let client = |args: &[&str]| {
        run_output(
            Command::new(tests::fdr_profiled())
                .args(args)
                .arg("--socket")
                .arg(&socket),
        )
    };
    let status = client(&["status", "--json"]);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let b = &json["targets"][0]["binaries"][0];
    assert_eq!(json["targets"][0]["name"], "calls", "{json}");
    // main, cx_loop, 1000 cx_tiny, cx_report: entries and exits, and the thread's end.
    assert_eq!(b["events"], 2 * 1003 + 1, "{json}");
    assert_eq!(json["events"], 2 * 1003 + 1, "{json}");
    assert_eq!(json["disk_used"], 0, "nothing written yet: {json}");
    assert_eq!(json["not_written"], 0, "{json}");
    assert_eq!(json["snapshots_not_written"], 0, "{json}");
    // Events per second, over the last second: the run's events, then none.
    let status_json = || -> serde_json::Value {
        let out = client(&["status", "--json"]);
        assert!(out.status.success());
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let rate = loop {
        let json = status_json();
        let rate = json["events_per_second"]
            .as_u64()
            .expect("events_per_second");
        if rate > 0 || std::time::Instant::now() > deadline {
            break rate;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // 2007 events in a period of about a second (ticks may come late, not early).
    assert!((1..=2 * 2007).contains(&rate), "{rate} events/s");
    std::thread::sleep(Duration::from_millis(2_200));
    assert_eq!(status_json()["events_per_second"], 0);
    let human = client(&["status"]);
    let text = String::from_utf8_lossy(&human.stdout).into_owned();
    assert!(text.contains("  calls ("), "{text}");
    assert!(
        text.starts_with(
            "fdr-profiled service: 2007 events, 0/s, 0 lost, 0 not written, 0 snapshots not written; output "
        )
            && text.contains(": 0 B used;"),
        "{text}"
    );

    let snap = client(&["snapshot", "calls"]);
    assert!(
        snap.status.success(),
        "{}",
        String::from_utf8_lossy(&snap.stderr)
    );
    let printed = String::from_utf8_lossy(&snap.stdout).trim().to_owned();
    let dirs = snapshots(&output, "calls");
    assert_eq!(dirs.len(), 1);
    assert_eq!(printed, dirs[0].display().to_string());
    assert!(printed.ends_with("Z-request"), "{printed}");
    let trace = check_trace_dir(&dirs[0], &bin);
    // (A session counts a thread's end apart from its events.)
    assert_eq!(trace.session.events, 2 * 1003);
    let status = client(&["status", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(json["last_snapshot"], printed.as_str(), "{json}");
    // The disk used is the snapshot's bytes.
    let used = tree_bytes(&dirs[0]);
    assert!(used > 0);
    assert_eq!(json["disk_used"], used, "{json}");
    let text = String::from_utf8_lossy(&client(&["status"]).stdout).into_owned();
    assert!(
        text.contains(&format!(": {used} B (")) && text.contains(" used; last snapshot "),
        "{text}"
    );

    let unknown = client(&["snapshot", "nope"]);
    assert!(!unknown.status.success());
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("no target named \"nope\""),
        "{}",
        String::from_utf8_lossy(&unknown.stderr)
    );
    // A process running now is listed under its binary, in the text too.
    let go = scratch.path().join("go");
    let mut waiting = Running::spawn(
        "calls",
        Command::new(&bin)
            .args(["--iterations", "10", "--wait-file"])
            .arg(&go),
    );
    waiting.wait_for_stderr_line("fixture: waiting for ", TIMEOUT);
    let deadline = std::time::Instant::now() + TIMEOUT;
    let listed = format!("      process {} (0 libraries probed)", waiting.pid());
    loop {
        let text = String::from_utf8_lossy(&client(&["status"]).stdout).into_owned();
        if text.lines().any(|l| l == listed) {
            // Asked after the text: the process, still waiting, is there too.
            let json = status_json();
            let processes = &json["targets"][0]["binaries"][0]["processes"];
            assert_eq!(processes[0]["pid"], waiting.pid(), "{json}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{listed:?} in {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(&go, "").unwrap();
    assert!(waiting.finish(TIMEOUT).status.success());
    // Not root: the socket is closed to it.
    let nobody = run_output(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(tests::fdr_profiled())
            .args(["status", "--socket"])
            .arg(&socket),
    );
    assert!(!nobody.status.success());
    assert!(
        String::from_utf8_lossy(&nobody.stderr).contains("cannot reach the service"),
        "{}",
        String::from_utf8_lossy(&nobody.stderr)
    );
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    assert!(!socket.exists(), "the socket is removed at the end");
}

/// `trigger_slower_than` on `trigger_functions`: the one call over the threshold writes a
/// snapshot named after its function, holding that call with its duration; the thousands of
/// fast calls of another function trigger nothing.
#[test]
fn a_slow_call_triggers_a_snapshot() {
    let scratch = tests::scratch_dir("service-slow");
    let bin = private_copy(&slow_fixture(), scratch.path());
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"slow\"\nbinary = \"{}\"\n\
             trigger_slower_than = \"50ms\"\ntrigger_functions = [\"sl_*\"]\n",
            output.display(),
            bin.display()
        ),
    )
    .unwrap();
    let mut service = Running::spawn(
        "fdr-profiled service",
        Command::new(tests::fdr_profiled())
            .args(["service", "--config"])
            .arg(&config)
            .arg("--socket")
            .arg(scratch.path().join("control.sock")),
    );
    service.wait_for_stderr_line("fdr-profiled: service: ready", TIMEOUT);
    let run = run_output(Command::new(&bin).args(["--slow-ms", "80"]));
    assert!(run.status.success());
    service.wait_for_stderr_line("fdr-profiled: service: target slow: snapshot ", TIMEOUT);
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    let took: Vec<&str> = done
        .stderr
        .lines()
        .filter(|l| l.contains(" took "))
        .collect();
    assert_eq!(took.len(), 1, "only sl_slow is slow: {took:?}");
    assert!(took[0].contains("target slow: sl_slow took "), "{took:?}");

    let dirs = snapshots(&output, "slow");
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let name = dirs[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.ends_with("Z-slow-sl_slow"), "{name}");
    let trace = check_trace_dir(&dirs[0], &bin);
    let thread = &trace.threads[0];
    let calls = thread.calls();
    let slow = calls.get("sl_slow").copied().unwrap_or_default();
    assert_eq!((slow.entries(), slow.exits()), (1, 1));
    let fast = calls.get("sl_fast").copied().unwrap_or_default();
    // The calls before the slow one, and those after it that were read before the snapshot.
    assert!((1000..=2000).contains(&fast.entries()), "{fast:?}");
    let enter = thread
        .records
        .iter()
        .find(|r| r.function == "sl_slow")
        .unwrap();
    let exit = thread
        .records
        .iter()
        .rev()
        .find(|r| r.function == "sl_slow")
        .unwrap();
    assert!(exit.tsc - enter.tsc >= 80_000_000, "{enter:?} {exit:?}");
}

/// Record mode: every call written, in segments closed past their age; each segment a valid
/// session, and over all of them every call of every run has its entry exactly once (and its
/// exit, or, for a call a rotation cut, an exit counted as without entry in the next one).
#[test]
fn record_mode_writes_every_call_into_rotated_segments() {
    let scratch = tests::scratch_dir("service-record");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"rec\"\nbinary = \"{}\"\n\
             mode = \"record\"\nsegment_age = \"1s\"\nsegment_size = \"1MB\"\n",
            output.display(),
            bin.display()
        ),
    )
    .unwrap();
    let mut service = Running::spawn(
        "fdr-profiled service",
        Command::new(tests::fdr_profiled())
            .args(["service", "--config"])
            .arg(&config)
            .arg("--socket")
            .arg(scratch.path().join("control.sock")),
    );
    service.wait_for_stderr_line("fdr-profiled: service: ready", TIMEOUT);
    let mut pids = Vec::new();
    for _ in 0..3 {
        let run = Running::spawn("calls", Command::new(&bin).args(["--iterations", "700"]));
        pids.push(run.pid());
        assert!(run.finish(TIMEOUT).status.success());
        std::thread::sleep(Duration::from_millis(1_300));
    }
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    let dirs = snapshots(&output, "rec");
    assert!(dirs.len() >= 2, "rotated by age: {dirs:?}\n{}", done.stderr);
    let (mut entries, mut exits, mut unmatched) = (0, 0, 0);
    let mut seen_pids = std::collections::BTreeSet::new();
    for d in &dirs {
        assert!(d.to_string_lossy().ends_with("-segment"), "{d:?}");
        let trace = check_trace_dir(d, &bin);
        seen_pids.extend(trace.pids());
        for t in &trace.threads {
            let c = t.calls().get("cx_tiny").copied().unwrap_or_default();
            entries += c.entries();
            exits += c.exits();
        }
        unmatched += trace.session.dropped_unmatched_exits;
    }
    assert_eq!(
        seen_pids,
        pids.iter().copied().collect(),
        "every run is recorded"
    );
    assert_eq!(entries, 3 * 700, "every call's entry, exactly once");
    assert!(
        exits <= entries && exits + unmatched >= entries,
        "{exits} exits, {unmatched} unmatched"
    );
}

/// SIGHUP with one target removed and one added: the kept target records on with no gap (a
/// process of it calls all through both reloads, about 100k calls a second, and every call is
/// in its files), the removed one has exactly its processes from before the reload, the added
/// one those from after; a reload with a bad file changes nothing. Record mode, so every call
/// is counted.
#[test]
fn a_reload_adds_and_removes_targets_and_keeps_the_others_running() {
    let scratch = tests::scratch_dir("service-reload");
    let copy = |name: &str| {
        let dir = scratch.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        private_copy(&calls_fixture(), &dir)
    };
    let (a, b, c) = (copy("a"), copy("b"), copy("c"));
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    let write = |targets: &[(&str, &Path, &str)]| {
        let mut text = format!("output = \"{}\"\n", output.display());
        for (name, bin, more) in targets {
            text.push_str(&format!(
                "[[target]]\nname = \"{name}\"\nbinary = \"{}\"\nmode = \"record\"\n{more}",
                bin.display()
            ));
        }
        std::fs::write(&config, text).unwrap();
    };
    // The removed target comes first: the kept one's place in the service's list changes.
    write(&[("b", &b, ""), ("a", &a, "")]);
    let mut service = Running::spawn(
        "fdr-profiled service",
        Command::new(tests::fdr_profiled())
            .args(["service", "--config"])
            .arg(&config)
            .arg("--socket")
            .arg(scratch.path().join("control.sock")),
    );
    service.wait_for_stderr_line("fdr-profiled: service: ready", TIMEOUT);
    let run = |bin: &Path, n: u32| {
        let r = Running::spawn(
            "calls",
            Command::new(bin).args(["--iterations", &n.to_string()]),
        );
        let pid = r.pid();
        let done = r.finish(TIMEOUT);
        assert!(done.status.success());
        (pid, done.stdout)
    };
    let before: Vec<_> = vec![run(&a, 300), run(&b, 400), run(&a, 500), run(&b, 600)];
    // A process of the kept target that runs across both reloads.
    let across = Running::spawn(
        "calls",
        Command::new(&a).args(["--seconds", "3", "--per-second"]),
    );
    std::thread::sleep(Duration::from_millis(500));

    // A bad file changes nothing.
    std::fs::write(&config, "output = 3\n").unwrap();
    service.signal(libc::SIGHUP);
    service.wait_for_stderr_line("fdr-profiled: error: reload refused", TIMEOUT);
    // It still runs when the reload begins.
    let state = std::fs::read_to_string(format!("/proc/{}/stat", across.pid())).unwrap();
    let state = state.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
    assert!(matches!(state, Some("R" | "S")), "{state:?}");
    // The added target asks for more logged arguments than the service loaded.
    write(&[("a", &a, ""), ("c", &c, "args = 3\n")]);
    service.signal(libc::SIGHUP);
    service.wait_for_stderr_line("fdr-profiled: service: reloaded ", TIMEOUT);
    let across_pid = across.pid();
    let across = across.finish(TIMEOUT);
    assert!(across.status.success());
    assert!(
        across
            .stdout
            .lines()
            .filter(|l| l.starts_with("span "))
            .count()
            >= 3,
        "{}",
        across.stdout
    );
    let mut after: Vec<_> = vec![run(&a, 700), run(&b, 800), run(&c, 900)];
    after.push((across_pid, across.stdout.clone()));
    std::thread::sleep(Duration::from_millis(300));
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        done.stderr.contains("1 targets kept, 1 added, 1 removed"),
        "{}",
        done.stderr
    );
    assert!(
        done.stderr
            .contains("target c: args = 3 and max_event_bytes = ")
            && done.stderr.contains("restart the service to raise them"),
        "{}",
        done.stderr
    );

    // Per target: the processes recorded, with exact counts.
    let recorded = |target: &str, bin: &Path| {
        let mut pids = std::collections::BTreeSet::new();
        for d in snapshots(&output, target) {
            let trace = check_trace_dir(&d, bin);
            for pid in trace.pids() {
                pids.insert(pid);
                let stdout = before
                    .iter()
                    .chain(&after)
                    .find(|(p, _)| *p == pid)
                    .map(|(_, o)| o.clone())
                    .unwrap_or_else(|| panic!("{target}: unknown process {pid}"));
                assert_calls_run(&trace, pid, &stdout);
            }
        }
        pids.into_iter().collect::<Vec<u32>>()
    };
    let sorted = |mut v: Vec<u32>| {
        v.sort();
        v
    };
    assert_eq!(
        recorded("a", &a),
        sorted(vec![before[0].0, before[2].0, after[0].0, across_pid]),
        "a is kept: every run, the one across the reloads with every call"
    );
    assert_eq!(
        recorded("b", &b),
        sorted(vec![before[1].0, before[3].0]),
        "b is removed: nothing after the reload"
    );
    assert_eq!(recorded("c", &c), vec![after[2].0], "c is added");
}

#[test]
fn a_bad_configuration_refuses_to_start() {
    let scratch = tests::scratch_dir("service-bad-config");
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        "output = \"/tmp\"\n[[target]]\nbinary = \"/bin/x\"\nwindow = \"soon\"\n",
    )
    .unwrap();
    let out = run_output(
        Command::new(tests::fdr_profiled())
            .args(["service", "--config"])
            .arg(&config),
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "fdr-profiled: error: {}:4:10: \"soon\" is not a duration",
            config.display()
        )),
        "{stderr}"
    );
}

/// One journal entry as the native protocol sends it: `KEY=value` lines, or `KEY`, a
/// little-endian u64 length and the bytes for values with a newline.
fn journal_fields(datagram: &[u8]) -> std::collections::BTreeMap<String, String> {
    let mut fields = std::collections::BTreeMap::new();
    let mut rest = datagram;
    while !rest.is_empty() {
        let line_end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
        let line = &rest[..line_end];
        if let Some(eq) = line.iter().position(|&b| b == b'=') {
            fields.insert(
                String::from_utf8_lossy(&line[..eq]).into_owned(),
                String::from_utf8_lossy(&line[eq + 1..]).into_owned(),
            );
            rest = rest.get(line_end + 1..).unwrap_or_default();
        } else {
            let key = String::from_utf8_lossy(line).into_owned();
            let after = &rest[line_end + 1..];
            let len = u64::from_le_bytes(after[..8].try_into().unwrap()) as usize;
            fields.insert(
                key,
                String::from_utf8_lossy(&after[8..8 + len]).into_owned(),
            );
            rest = after.get(8 + len + 1..).unwrap_or_default();
        }
    }
    fields
}

/// Under systemd (`JOURNAL_STREAM` names the service's standard error) the log goes to the
/// journal, one entry per message with its priority and `FDR_*` fields; nothing of it on
/// standard error. The service runs in a mount namespace of its own whose
/// `/run/systemd/journal/socket` is a datagram socket of this test.
#[test]
fn under_systemd_the_log_is_structured_journal_entries() {
    use std::os::unix::fs::MetadataExt as _;
    let scratch = tests::scratch_dir("service-journal");
    let dir = scratch.path();
    let bin = private_copy(&calls_fixture(), dir);
    let journal_dir = dir.join("journal");
    std::fs::create_dir_all(&journal_dir).unwrap();
    let journal = std::os::unix::net::UnixDatagram::bind(journal_dir.join("socket")).unwrap();
    journal
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let output = dir.join("out");
    let config = dir.join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"calls\"\nbinary = \"{}\"\nwindow = \"60s\"\n",
            output.display(),
            bin.display()
        ),
    )
    .unwrap();
    let stderr_path = dir.join("stderr");
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let meta = stderr.metadata().unwrap();
    let script = format!(
        "mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/journal && mount --bind '{}' /run/systemd/journal && exec '{}' service --config '{}' --socket '{}'",
        journal_dir.display(),
        tests::fdr_profiled().display(),
        config.display(),
        dir.join("control.sock").display()
    );
    let mut service = Command::new("unshare")
        .args(["--mount", "sh", "-c", &script])
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stderr(stderr)
        .spawn()
        .expect("unshare (util-linux)");
    let mut entries: Vec<std::collections::BTreeMap<String, String>> = Vec::new();
    let wait_for = |entries: &mut Vec<_>, what: &str| {
        let start = std::time::Instant::now();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if let Some(e) =
                entries
                    .iter()
                    .find(|e: &&std::collections::BTreeMap<String, String>| {
                        e.get("MESSAGE").is_some_and(|m| m.starts_with(what))
                    })
            {
                return e.clone();
            }
            assert!(
                start.elapsed() < TIMEOUT,
                "no journal entry {what:?}: {entries:#?}\nstderr: {}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
            if let Ok(n) = journal.recv(&mut buf) {
                entries.push(journal_fields(&buf[..n]));
            }
        }
    };
    let ready = wait_for(&mut entries, "ready: 1 target");
    assert_eq!(
        ready.get("PRIORITY").map(String::as_str),
        Some("5"),
        "{ready:?}"
    );
    assert_eq!(
        ready.get("SYSLOG_IDENTIFIER").map(String::as_str),
        Some("fdr-profiled")
    );
    assert_eq!(
        ready.get("FDR_OUTPUT").map(String::as_str),
        Some(&*output.to_string_lossy())
    );
    let attached = wait_for(&mut entries, "target calls: attached ");
    assert_eq!(
        attached.get("FDR_TARGET").map(String::as_str),
        Some("calls")
    );
    let run = run_output(Command::new(&bin).args(["--iterations", "100"]));
    assert!(run.status.success());
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: plain kill(2) of our child (sh exec'd into the service, same pid).
    unsafe { libc::kill(service.id() as i32, libc::SIGUSR1) };
    let snapshot = wait_for(&mut entries, "target calls: snapshot ");
    let dir_written = snapshots(&output, "calls");
    assert_eq!(dir_written.len(), 1);
    assert_eq!(
        snapshot.get("FDR_SNAPSHOT").map(String::as_str),
        Some(&*dir_written[0].to_string_lossy()),
        "{snapshot:?}"
    );
    assert_eq!(
        snapshot.get("FDR_TRIGGER").map(String::as_str),
        Some("sigusr1")
    );
    assert_eq!(
        snapshot.get("FDR_TARGET").map(String::as_str),
        Some("calls")
    );
    // SAFETY: as above.
    unsafe { libc::kill(service.id() as i32, libc::SIGTERM) };
    let status = service.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(
        !stderr.contains("snapshot"),
        "the log went to standard error too:\n{stderr}"
    );
    check_trace_dir(&dir_written[0], &bin);
}

/// Record mode with tiny limits: segments rotated by size, the oldest deleted to stay under
/// `max_disk`. Sampled all along, the disk used never exceeds the cap by more than the largest
/// segment; every segment left is valid; the one being written is never deleted (the last
/// run's calls are all there).
#[test]
fn record_mode_segments_stay_under_max_disk() {
    let scratch = tests::scratch_dir("service-record-retention");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    const CAP: u64 = 400_000;
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\nmax_disk = \"{CAP}B\"\n[[target]]\nname = \"rec\"\nbinary = \"{}\"\n\
             mode = \"record\"\nsegment_size = \"100KB\"\nsegment_age = \"1h\"\n",
            output.display(),
            bin.display()
        ),
    )
    .unwrap();
    let mut service = Running::spawn(
        "fdr-profiled service",
        Command::new(tests::fdr_profiled())
            .args(["service", "--config"])
            .arg(&config)
            .arg("--socket")
            .arg(scratch.path().join("control.sock")),
    );
    service.wait_for_stderr_line("fdr-profiled: service: ready", TIMEOUT);
    // Disk used under the output, and the largest size each segment was seen at.
    let (mut peak, mut largest) = (0u64, std::collections::BTreeMap::<PathBuf, u64>::new());
    let mut sample = |peak: &mut u64| {
        let mut total = 0;
        for d in snapshots(&output, "rec") {
            // A directory being deleted may vanish under us: count what is there.
            let bytes = std::panic::catch_unwind(|| tree_bytes(&d)).unwrap_or(0);
            total += bytes;
            let seen = largest.entry(d).or_default();
            *seen = (*seen).max(bytes);
        }
        *peak = (*peak).max(total);
    };
    let mut last = None;
    for _ in 0..12 {
        let run = Running::spawn("calls", Command::new(&bin).args(["--iterations", "4000"]));
        let done = run.finish(TIMEOUT);
        assert!(done.status.success());
        last = Some(done);
        for _ in 0..6 {
            sample(&mut peak);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    sample(&mut peak);
    let deleted = done.stderr.matches("to stay under max_disk").count();
    assert!(deleted > 0, "nothing deleted:\n{}", done.stderr);
    let largest_segment = largest.values().copied().max().unwrap_or(0);
    assert!(
        peak <= CAP + largest_segment,
        "{peak} bytes at the peak, cap {CAP}, largest segment {largest_segment}"
    );
    let dirs = snapshots(&output, "rec");
    let total: u64 = dirs.iter().map(|d| tree_bytes(d)).sum();
    assert!(total <= CAP + largest_segment, "{total} bytes left");
    // The last run's process is in the segments left, with every call.
    let last = last.unwrap();
    let want = expected_calls(&parse_count_lines(&last.stdout));
    let mut cx_tiny = 0;
    for d in &dirs {
        let trace = check_trace_dir(d, &bin);
        for t in trace.threads.iter().filter(|t| want.contains_key(&t.tid)) {
            cx_tiny += t.calls().get("cx_tiny").map_or(0, |c| c.entries());
        }
    }
    assert_eq!(
        cx_tiny, 4000,
        "the last run's calls, in the newest segments"
    );
}

/// One process runs longer than the window (5 s against 2 s), cutting its loop into spans at
/// each CLOCK_MONOTONIC second and entering `cx_tick` at the start of each. The snapshot taken
/// right after it ends covers at least the window before it, and for every span it holds from
/// start to end, the calls of `cx_tiny` equal what the program counted in that span.
#[test]
fn a_flight_recorder_snapshot_holds_the_windows_calls_exactly() {
    let scratch = tests::scratch_dir("service-window");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let (mut service, output) = start_service(scratch.path(), "calls", &bin, "2s");
    let run = run_output(Command::new(&bin).args(["--seconds", "5", "--per-second"]));
    assert!(run.status.success());
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    // The span counts, in order.
    let spans: Vec<u64> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("span index="))
        .enumerate()
        .map(|(k, rest)| {
            let (index, n) = rest.split_once(" cx_tiny=").expect("a span line");
            assert_eq!(index.parse::<usize>().unwrap(), k);
            n.parse().unwrap()
        })
        .collect();
    assert!(spans.len() >= 5, "{stdout}");
    std::thread::sleep(Duration::from_millis(100));
    service.signal(libc::SIGUSR1);
    service.wait_for_stderr_line("fdr-profiled: service: target calls: snapshot ", TIMEOUT);
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    let dirs = snapshots(&output, "calls");
    let trace = check_trace_dir(&dirs[0], &bin);
    assert_eq!(trace.threads.len(), 1);
    let records = &trace.threads[0].records;
    // Cut the held records at the cx_tick entries; the last piece is the last span.
    let mut pieces: Vec<u64> = vec![0];
    for r in records.iter().filter(|r| r.kind.is_entry()) {
        match r.function.as_str() {
            "cx_tick" => pieces.push(0),
            "cx_tiny" => *pieces.last_mut().unwrap() += 1,
            _ => {}
        }
    }
    // The first piece is the tail of a span that aged out in part: only whole spans compare.
    let whole = &pieces[1..];
    assert!(
        whole.len() >= 2,
        "the 2 s window holds at least one whole span and the last one: {pieces:?}"
    );
    assert_eq!(
        whole,
        &spans[spans.len() - whole.len()..],
        "cx_tiny calls per span: held vs counted by the program ({spans:?})"
    );
    // The window: at least 2 s before the snapshot, which came after the last call.
    let first = records.first().unwrap().tsc;
    let last_tiny = records
        .iter()
        .rev()
        .find(|r| r.function == "cx_tiny")
        .unwrap()
        .tsc;
    assert!(
        last_tiny - first >= 1_900_000_000,
        "held {} ns before the last call",
        last_tiny - first
    );
    let window = &trace.session.json["window"];
    assert!(window["expired"].as_u64().unwrap() > 0, "{window}");
    assert_eq!(window["evicted"], 0, "{window}");
}

/// Starts `fdr-profiled service` on the configuration file `config` (control socket in
/// `scratch`); returns it once ready.
fn spawn_service(scratch: &Path, config: &Path) -> Running {
    tests::run::start_service(config, &scratch.join("control.sock"))
}

/// The run `pid` of the calls fixture, whose output is `stdout`, is in `trace` with exactly
/// the calls it counted.
fn assert_calls_run(trace: &TraceDir, pid: u32, stdout: &str) {
    assert_process_calls(
        trace,
        &ProcessExpectation {
            pid,
            calls: &expected_calls(&parse_count_lines(stdout)),
            known: CALLS_FUNCTIONS,
            main_fn: "main",
            main: MainCall::Traced,
            only_known: true,
        },
    );
}

/// The exact calls of each `(pid, stdout)` run found in `dir`'s trace.
fn assert_runs_in(dir: &Path, bin: &Path, runs: &[(u32, String)]) {
    let trace = check_trace_dir(dir, bin);
    let want: std::collections::BTreeSet<u32> = runs.iter().map(|(p, _)| *p).collect();
    assert_eq!(trace.pids(), want, "{}", dir.display());
    for (pid, stdout) in runs {
        assert_calls_run(&trace, *pid, stdout);
    }
}

/// Runs `bin --iterations n` to its end: (pid, stdout).
fn run_calls(bin: &Path, n: u32) -> (u32, String) {
    let r = Running::spawn(
        "calls",
        Command::new(bin).args(["--iterations", &n.to_string()]),
    );
    let pid = r.pid();
    let done = r.finish(TIMEOUT);
    assert!(done.status.success());
    (pid, done.stdout)
}

/// Two record-mode targets under a `max_disk` far below what they write: `open`'s only
/// segment, opened first (so the oldest of all), stays open for the whole test while `rot`'s
/// segments rotate and the oldest are deleted to stay under the cap. The open segment is never
/// deleted: at the end it holds both of `open`'s processes, every call, and every segment left
/// is valid.
#[test]
fn retention_never_deletes_another_targets_open_segment() {
    let scratch = tests::scratch_dir("service-retention-open");
    let copy = |name: &str| {
        let dir = scratch.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        private_copy(&calls_fixture(), &dir)
    };
    let (open_bin, rot_bin) = (copy("open"), copy("rot"));
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    const CAP: u64 = 150_000;
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\nmax_disk = \"{CAP}B\"\n\
             [[target]]\nname = \"open\"\nbinary = \"{}\"\nmode = \"record\"\n\
             segment_size = \"100MB\"\nsegment_age = \"1h\"\n\
             [[target]]\nname = \"rot\"\nbinary = \"{}\"\nmode = \"record\"\n\
             segment_size = \"50KB\"\nsegment_age = \"1h\"\n",
            output.display(),
            open_bin.display(),
            rot_bin.display()
        ),
    )
    .unwrap();
    let service = spawn_service(scratch.path(), &config);
    let mut open_runs = vec![run_calls(&open_bin, 3000)];
    // A status tick flushes it: its bytes count against the cap from now on.
    std::thread::sleep(Duration::from_millis(1_300));
    for _ in 0..8 {
        run_calls(&rot_bin, 4000);
        std::thread::sleep(Duration::from_millis(1_100));
    }
    open_runs.push(run_calls(&open_bin, 500));
    std::thread::sleep(Duration::from_millis(300));
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        done.stderr.contains("to stay under max_disk"),
        "rot's segments were deleted: {}",
        done.stderr
    );
    assert!(!done.stderr.contains("error"), "{}", done.stderr);
    let open = snapshots(&output, "open");
    assert_eq!(open.len(), 1, "{open:?}\n{}", done.stderr);
    assert_runs_in(&open[0], &open_bin, &open_runs);
    let rot = snapshots(&output, "rot");
    assert!(!rot.is_empty() && rot.len() < 8, "{rot:?}");
    for d in &rot {
        check_trace_dir(d, &rot_bin);
    }
}

/// A tmpfs mounted for a test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = run_output(
            Command::new("mount")
                .args([
                    "-t",
                    "tmpfs",
                    "-o",
                    &format!("size={size},mode=0700"),
                    "tmpfs",
                ])
                .arg(dir),
        );
        assert!(
            out.status.success(),
            "mount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Waits until `service`'s stderr holds `needle` `count` times; returns its stderr.
fn wait_for_count(service: &Running, needle: &str, count: usize) -> String {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let (_, stderr) = service.output_so_far();
        if stderr.matches(needle).count() >= count {
            return stderr;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{needle:?} {count} times: {stderr}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `min_free` on a 16 MiB tmpfs with 12 MiB to keep free: a record-mode target writing about
/// 2.5 MB/s crosses it while its segment is open; the segment is closed at the next tick
/// (valid), writing stops with an error line, and what comes meanwhile is counted as not
/// written (`status`, and the `STATUS=` line's losses). Once space is freed writing starts
/// again (logged), a new process is recorded whole, and crossing the limit again stops writing
/// again (logged again). A flight recorder's snapshot asked for meanwhile is not written, and
/// counted.
#[test]
fn writing_stops_at_min_free_and_starts_again() {
    use std::os::unix::net::UnixDatagram;
    let scratch = tests::scratch_dir("service-min-free");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let fr_bin = {
        let dir = scratch.path().join("fr");
        std::fs::create_dir_all(&dir).unwrap();
        private_copy(&calls_fixture(), &dir)
    };
    let output = scratch.path().join("out");
    let _tmpfs = Tmpfs::mount(&output, "16m");
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\nmin_free = \"12MiB\"\n[[target]]\nname = \"rec\"\nbinary = \"{}\"\n\
             mode = \"record\"\nsegment_size = \"1GB\"\nsegment_age = \"1h\"\n\
             [[target]]\nname = \"fr\"\nbinary = \"{}\"\n",
            output.display(),
            bin.display(),
            fr_bin.display()
        ),
    )
    .unwrap();
    let notify_path = scratch.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    // Read as systemd does, all along: a full queue would block the service's sends.
    let statuses = std::thread::spawn(move || {
        notify
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 4096];
        let mut statuses = Vec::new();
        while let Ok(n) = notify.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            if text.lines().any(|l| l == "STOPPING=1") {
                break;
            }
            statuses.extend(
                text.lines()
                    .filter(|l| l.starts_with("STATUS="))
                    .map(str::to_owned),
            );
        }
        statuses
    });
    let mut service = Running::spawn(
        "fdr-profiled service",
        Command::new(tests::fdr_profiled())
            .args(["service", "--config"])
            .arg(&config)
            .arg("--socket")
            .arg(scratch.path().join("control.sock"))
            .env("NOTIFY_SOCKET", &notify_path),
    );
    service.wait_for_stderr_line("fdr-profiled: service: ready", TIMEOUT);
    let status = || -> serde_json::Value {
        let out = run_output(
            Command::new(tests::fdr_profiled())
                .args(["status", "--json", "--socket"])
                .arg(scratch.path().join("control.sock")),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    const STOP: &str = "rec: not writing: ";
    const START: &str = "writing again: above min_free";
    // About 100k calls a second, for 5 s: over 4 MiB in the first 2 s.
    let busy = Running::spawn(
        "calls",
        Command::new(&bin).args(["--seconds", "5", "--per-second", "--quiet"]),
    );
    let stderr = wait_for_count(&service, STOP, 1);
    assert!(
        stderr.contains("rec: not writing: ") && stderr.contains("min_free"),
        "{stderr}"
    );
    assert!(busy.finish(TIMEOUT).status.success());
    std::thread::sleep(Duration::from_millis(300));
    let first = snapshots(&output, "rec");
    assert_eq!(first.len(), 1, "{first:?}");
    check_trace_dir(&first[0], &bin);
    let json = status();
    let lost = json["not_written"].as_u64().unwrap();
    assert!(lost > 10_000, "{json}");
    assert_eq!(json["targets"][0]["binaries"][0]["not_written"], lost);
    assert!(
        json["targets"][0]["binaries"][0]["segment"].is_null(),
        "{json}"
    );
    assert_eq!(json["snapshots_not_written"], 0, "{json}");
    // A snapshot now is not written either, and counted.
    run_calls(&fr_bin, 100);
    std::thread::sleep(Duration::from_millis(200));
    service.signal(libc::SIGUSR1);
    wait_for_count(&service, "target fr: snapshot not written: ", 1);
    let json = status();
    assert_eq!(json["snapshots_not_written"], 1, "{json}");
    assert_eq!(
        json["targets"][1]["binaries"][0]["snapshots_not_written"],
        1
    );
    assert!(snapshots(&output, "fr").is_empty());
    // Room again: writing starts at the next tick, and a new process is recorded whole.
    std::fs::remove_dir_all(&first[0]).unwrap();
    wait_for_count(&service, START, 1);
    let run = run_calls(&bin, 2000);
    std::thread::sleep(Duration::from_millis(300));
    let json = status();
    assert_eq!(json["not_written"], lost, "nothing more lost: {json}");
    // And it stops again, saying so again.
    let busy = Running::spawn(
        "calls",
        Command::new(&bin).args(["--seconds", "5", "--per-second", "--quiet"]),
    );
    wait_for_count(&service, STOP, 2);
    assert!(busy.finish(TIMEOUT).status.success());
    std::thread::sleep(Duration::from_millis(1_200));
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    assert_eq!(done.stderr.matches(STOP).count(), 2, "{}", done.stderr);
    assert_eq!(done.stderr.matches(START).count(), 1, "{}", done.stderr);
    let segments = snapshots(&output, "rec");
    assert_eq!(segments.len(), 1, "{segments:?}");
    let trace = check_trace_dir(&segments[0], &bin);
    assert_calls_run(&trace, run.0, &run.1);
    // The STATUS= lines count what was not written.
    let statuses = statuses.join().unwrap();
    let last_status = statuses.last().cloned().unwrap_or_default();
    let counted: u64 = last_status
        .split(", not written ")
        .nth(1)
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{last_status:?}"));
    assert!(
        last_status.ends_with(", snapshots not written 1"),
        "{last_status}"
    );
    assert!(counted > lost, "{last_status}");
}

/// SIGTERM while a traced process keeps calling (about 100k calls a second): the service
/// disarms, drains and closes its open segment well within a generous bound, and the segment is
/// complete and valid. With `stop_timeout = "0s"` it is made final without its `report.txt`,
/// and says so.
#[test]
fn sigterm_finalizes_every_file_within_a_bounded_time() {
    for (settings, report) in [("", true), ("stop_timeout = \"0s\"\n", false)] {
        let scratch = tests::scratch_dir("service-stop");
        let bin = private_copy(&calls_fixture(), scratch.path());
        let output = scratch.path().join("out");
        let config = scratch.path().join("fdr-profiled.toml");
        std::fs::write(
            &config,
            format!(
                "output = \"{}\"\n{settings}[[target]]\nname = \"rec\"\nbinary = \"{}\"\n\
                 mode = \"record\"\nsegment_size = \"1GB\"\nsegment_age = \"1h\"\n",
                output.display(),
                bin.display()
            ),
        )
        .unwrap();
        let service = spawn_service(scratch.path(), &config);
        let busy = Running::spawn(
            "calls",
            Command::new(&bin).args(["--seconds", "120", "--per-second", "--quiet"]),
        );
        std::thread::sleep(Duration::from_millis(2_500));
        let start = std::time::Instant::now();
        service.signal(libc::SIGTERM);
        let done = service.finish(TIMEOUT);
        let took = start.elapsed();
        busy.signal(libc::SIGKILL);
        busy.finish(TIMEOUT);
        assert!(done.status.success(), "{}", done.stderr);
        eprintln!("{settings:?}: SIGTERM to exit: {took:?}");
        assert!(took < Duration::from_secs(15), "{took:?}: {}", done.stderr);
        let segments = snapshots(&output, "rec");
        assert_eq!(segments.len(), 1, "{segments:?}");
        let trace = check_trace_dir(&segments[0], &bin);
        let tiny: u64 = trace
            .threads
            .iter()
            .map(|t| t.calls().get("cx_tiny").map_or(0, |c| c.entries()))
            .sum();
        assert!(tiny > 100_000, "{tiny} calls recorded in 2.5 s");
        assert_eq!(segments[0].join("report.txt").exists(), report);
        assert_eq!(
            done.stderr
                .contains("report.txt not written: past the stop deadline"),
            !report,
            "{}",
            done.stderr
        );
        assert!(done.stderr.contains("stopped in "), "{}", done.stderr);
    }
}

/// The segment directories of `output`'s target `target`, each with the processes recorded in
/// it and their exact calls checked against `runs` (pid, stdout), `bin_of` naming the binary a
/// directory's session ran; returns the pids recorded in each directory, by directory name.
fn recorded_runs(
    output: &Path,
    target: &str,
    bin_of: &dyn Fn(&Path) -> PathBuf,
    runs: &[(u32, String)],
) -> std::collections::BTreeMap<String, Vec<u32>> {
    let mut found = std::collections::BTreeMap::new();
    for d in snapshots(output, target) {
        let trace = check_trace_dir(&d, &bin_of(&d));
        let mut pids = Vec::new();
        for pid in trace.pids() {
            let stdout = runs
                .iter()
                .find(|(p, _)| *p == pid)
                .map(|(_, o)| o.clone())
                .unwrap_or_else(|| panic!("{}: unknown process {pid}", d.display()));
            assert_calls_run(&trace, pid, &stdout);
            pids.push(pid);
        }
        found.insert(d.file_name().unwrap().to_string_lossy().into_owned(), pids);
    }
    found
}

/// A glob target: a binary copied into its directory after the service started (written in
/// place, not renamed in: it is attached only once it is whole) is attached within seconds,
/// said in the log, and a process started from it is recorded with every call, in segments of
/// its own; the first binary's process is recorded as before.
#[test]
fn a_binary_installed_after_the_start_is_traced() {
    let scratch = tests::scratch_dir("service-new-binary");
    let bins = scratch.path().join("bins");
    std::fs::create_dir_all(&bins).unwrap();
    let first = bins.join("calls-a");
    std::fs::copy(calls_fixture(), &first).unwrap();
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"glob\"\nbinary = \"{}/calls-*\"\nmode = \"record\"\n",
            output.display(),
            bins.display()
        ),
    )
    .unwrap();
    let service = spawn_service(scratch.path(), &config);
    let second = bins.join("calls-b");
    std::fs::copy(calls_fixture(), &second).unwrap();
    let line = wait_for_count(&service, "now matches", 1);
    assert!(
        line.contains(&format!("target glob: {} now matches", second.display())),
        "{line}"
    );
    let runs = vec![run_calls(&second, 700), run_calls(&first, 300)];
    std::thread::sleep(Duration::from_millis(300));
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    assert_eq!(
        done.stderr.matches("now matches").count(),
        1,
        "{}",
        done.stderr
    );
    let bin_of = |d: &Path| {
        if d.to_string_lossy().ends_with("-calls-b") {
            second.clone()
        } else {
            first.clone()
        }
    };
    let found = recorded_runs(&output, "glob", &bin_of, &runs);
    let of = |suffix: &str| -> Vec<u32> {
        found
            .iter()
            .filter(|(d, _)| d.ends_with(suffix))
            .flat_map(|(_, p)| p.clone())
            .collect()
    };
    assert_eq!(
        of("-calls-b"),
        vec![runs[0].0],
        "{found:?}\n{}",
        done.stderr
    );
    assert_eq!(
        of("-calls-a"),
        vec![runs[1].0],
        "{found:?}\n{}",
        done.stderr
    );
}

/// A target's binary replaced on disk as a package upgrade does it (a new file written under
/// another name, renamed over the old one: a new inode at the same path) is attached again:
/// a process started from the new file is recorded with every call, in segments named after
/// the binary, and a process of the old file that runs across the replacement keeps its
/// probes and is recorded with every call too (in the old file's segment).
#[test]
fn a_binary_replaced_on_disk_is_traced_again() {
    let scratch = tests::scratch_dir("service-replaced-binary");
    let bins = scratch.path().join("bins");
    std::fs::create_dir_all(&bins).unwrap();
    let bin = private_copy(&calls_fixture(), &bins);
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"up\"\nbinary = \"{}\"\nmode = \"record\"\n",
            output.display(),
            bin.display()
        ),
    )
    .unwrap();
    let service = spawn_service(scratch.path(), &config);
    let old = Running::spawn(
        "calls (old)",
        Command::new(&bin).args(["--seconds", "4", "--per-second"]),
    );
    std::thread::sleep(Duration::from_millis(500));
    let old_ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&bin).unwrap());
    assert_eq!(private_copy(&calls_fixture(), &bins), bin);
    let new_ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&bin).unwrap());
    assert_ne!(old_ino, new_ino);
    let line = wait_for_count(&service, "was replaced on disk", 1);
    assert!(
        line.contains(&format!(
            "target up: {} was replaced on disk (inode {old_ino}, now {new_ino})",
            bin.display()
        )) && line.contains("for the 1 processes still running it"),
        "{line}"
    );
    let new = run_calls(&bin, 800);
    let old_pid = old.pid();
    let old = old.finish(TIMEOUT);
    assert!(old.status.success());
    std::thread::sleep(Duration::from_millis(300));
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    let runs = vec![new.clone(), (old_pid, old.stdout)];
    let found = recorded_runs(&output, "up", &|_: &Path| bin.clone(), &runs);
    let of = |new_file: bool| -> Vec<u32> {
        found
            .iter()
            .filter(|(d, _)| d.ends_with("-segment-calls-c") == new_file)
            .flat_map(|(_, p)| p.clone())
            .collect()
    };
    assert_eq!(of(true), vec![new.0], "{found:?}\n{}", done.stderr);
    assert_eq!(of(false), vec![old_pid], "{found:?}\n{}", done.stderr);
}

/// `exits = "repair"`: a C++ server running when the service starts and one started while it
/// runs are each traced by a keeper of their own (the second found as it starts); both serve,
/// throw through their hooked frames and get their signals as untraced; the one stopped
/// during the session ends with its totals exact and its probes removed; the status counts
/// the processes and their repairs; a snapshot reads in llvm-xray; when the service stops the
/// first is let go with no ptrace relation left, and a throw through its frames hooked at that
/// moment is caught.
#[test]
fn a_repaired_target_traces_each_cpp_process_with_its_stack_repaired() {
    use tests::server::{assert_untraced, server_fixture, total, tracers, Server};
    let scratch = tests::scratch_dir("service-repair");
    let (dir_a, dir_b) = (scratch.path().join("a"), scratch.path().join("b"));
    std::fs::create_dir_all(&dir_a).unwrap();
    std::fs::create_dir_all(&dir_b).unwrap();
    let bin = private_copy(&server_fixture(), scratch.path());
    let mut before = Server::start_copy(&dir_a, &bin);
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"cpp\"\nbinary = \"{}\"\nexits = \"repair\"\nwindow = \"1s\"\n",
            output.display(),
            bin.display()
        ),
    )
    .unwrap();
    let mut service = spawn_service(scratch.path(), &config);
    let traced = |pid: u32| {
        move |l: &str| l.contains(&format!("process {pid} traced with its stack repaired"))
    };
    service.wait_for_stderr_match("the running server traced", TIMEOUT, traced(before.pid()));
    let mut during = Server::start_copy(&dir_b, &bin);
    service.wait_for_stderr_match("the new server traced", TIMEOUT, traced(during.pid()));
    assert!(tracers(during.pid()).iter().all(|&t| t != 0));
    for server in [&mut before, &mut during] {
        server.command(b'a');
        server.command(b't');
        server.running.signal(libc::SIGUSR1);
    }
    std::thread::sleep(Duration::from_millis(1000));
    let during_pid = during.pid();
    let last = during.stop();
    assert_eq!(total(&last, "usr1"), 1, "{last}");
    assert_eq!(total(&last, "long_caught"), 1, "{last}");
    assert_eq!(total(&last, "caught"), total(&last, "third"), "{last}");
    service.wait_for_stderr_match("the stopped server reaped", TIMEOUT, |l| {
        l.contains(&format!("process {during_pid} exited"))
    });

    let socket = scratch.path().join("control.sock");
    let client = |args: &[&str]| {
        let out = run_output(
            Command::new(tests::fdr_profiled())
                .args(args)
                .arg("--socket")
                .arg(&socket),
        );
        assert!(out.status.success(), "{out:?}");
        out.stdout
    };
    let json: serde_json::Value = serde_json::from_slice(&client(&["status", "--json"])).unwrap();
    let repair = &json["targets"][0]["binaries"][0]["repair"];
    assert_eq!(repair["processes_traced"], 2, "{json}");
    assert_eq!(repair["processes_live"], 1, "{json}");
    assert_eq!(repair["processes_not_traced"], 0, "{json}");
    // The stopped server's repairs: its workers' throws, its long request's, each caught.
    let ended = &repair["of_processes_ended"];
    assert!(ended["throws"].as_u64().unwrap() > 10, "{json}");
    assert_eq!(ended["throws"], ended["catches"], "{json}");
    assert_eq!(ended["slots_left_alone"], 0, "{json}");
    // Its SIGUSR1 and the SIGTERM that stopped it, each passed on once.
    assert_eq!(ended["signals_passed_on"], 2, "{json}");
    // A snapshot of the last second: the running server's threads, for our reader and
    // llvm-xray alike.
    let snapshot = String::from_utf8(client(&["snapshot", "cpp"])).unwrap();
    let dir = PathBuf::from(
        snapshot
            .lines()
            .next()
            .unwrap_or_else(|| panic!("no snapshot: {snapshot:?}")),
    );
    let trace = check_trace_dir(&dir, &bin);
    assert_eq!(
        trace.session.json["exits"], "repair",
        "{}",
        trace.session.json
    );
    assert!(trace
        .threads
        .iter()
        .any(|t| t.calls().get("sv_request").is_some_and(|c| c.entries() > 0)));

    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        done.stderr.contains(&format!(
            "process {} let go, no frame left hooked",
            before.pid()
        )),
        "{}",
        done.stderr
    );
    assert_untraced(before.pid());
    // The long request entered while it was traced was hooked and released: throw through it.
    before.command(b't');
    std::thread::sleep(Duration::from_millis(300));
    let last = before.stop();
    assert_eq!(total(&last, "usr1"), 1, "{last}");
    assert_eq!(total(&last, "long_caught"), 2, "{last}");
    assert_eq!(total(&last, "caught"), total(&last, "third"), "{last}");
}

/// The service SIGKILLed while it repairs a C++ server, once it has a thread besides its main
/// one (the one that removes the probes of processes that exited): the server's keeper lets
/// it go only once all of the service is gone, its probes with it, so that no frame is hooked
/// after the release; the server goes on throwing and catching, untraced, and ends normally.
#[test]
fn a_repaired_server_outlives_the_service_killed() {
    use tests::server::{server_fixture, total, wait_untraced, Server};
    let scratch = tests::scratch_dir("service-repair-kill");
    let (dir_a, dir_b) = (scratch.path().join("a"), scratch.path().join("b"));
    std::fs::create_dir_all(&dir_a).unwrap();
    std::fs::create_dir_all(&dir_b).unwrap();
    let bin = private_copy(&server_fixture(), scratch.path());
    let mut server = Server::start_copy(&dir_a, &bin);
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"cpp\"\nbinary = \"{}\"\nexits = \"repair\"\nwindow = \"1s\"\n",
            scratch.path().join("out").display(),
            bin.display()
        ),
    )
    .unwrap();
    let mut service = spawn_service(scratch.path(), &config);
    service.wait_for_stderr_match("the server traced", TIMEOUT, |l| {
        l.contains(&format!(
            "process {} traced with its stack repaired",
            server.pid()
        ))
    });
    // A second server that exits: its probes are removed on the service's second thread.
    let short = Server::start_copy(&dir_b, &bin);
    let short_pid = short.pid();
    service.wait_for_stderr_match("the short server traced", TIMEOUT, |l| {
        l.contains(&format!(
            "process {short_pid} traced with its stack repaired"
        ))
    });
    short.stop();
    service.wait_for_stderr_match("the short server reaped", TIMEOUT, |l| {
        l.contains(&format!("process {short_pid} exited"))
    });
    server.command(b'r');
    std::thread::sleep(Duration::from_millis(300));
    service.signal(libc::SIGKILL);
    let _ = service.finish(TIMEOUT);
    wait_untraced(server.pid(), "the service");
    // Its workers throw and catch on, through frames no probe hooks any more.
    std::thread::sleep(Duration::from_millis(1000));
    server.command(b't');
    std::thread::sleep(Duration::from_millis(300));
    let last = server.stop();
    assert_eq!(total(&last, "caught"), total(&last, "third"), "{last}");
    assert_eq!(total(&last, "long_caught"), 1, "{last}");
}

/// Processes started at 0.5 s steps from the moment the service is ready up to 4 s after it
/// (across the service's periodic work: the targets' patterns matched again every other
/// status tick, at 1 s and 3 s; every process's mappings read again every 200 ms) are each
/// recorded whole: `status` counts every event of every run, and each run's segment holds
/// exactly the calls it counted. A report of runs started about 2 s after ready recording
/// nothing came from a reproduction that waited for `ready` in the log file of the previous
/// service before the new one truncated it: those runs started before the service was ready.
#[test]
fn processes_started_at_any_moment_after_ready_are_recorded_whole() {
    const ITERATIONS: u32 = 200;
    let scratch = tests::scratch_dir("service-after-ready");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"calls\"\nbinary = \"{}\"\nmode = \"record\"\n",
            output.display(),
            bin.display()
        ),
    )
    .unwrap();
    let service = spawn_service(scratch.path(), &config);
    let ready = std::time::Instant::now();
    let mut runs = Vec::new();
    for step in 0..=8u32 {
        let at = ready + Duration::from_millis(500) * step;
        std::thread::sleep(at.saturating_duration_since(std::time::Instant::now()));
        runs.push(run_calls(&bin, ITERATIONS));
    }
    // Every run is over: its last events are drained within a few 10 ms drains.
    std::thread::sleep(Duration::from_millis(300));
    let status = run_output(
        Command::new(tests::fdr_profiled())
            .args(["status", "--json", "--socket"])
            .arg(scratch.path().join("control.sock")),
    );
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    // Per run: main, cx_loop, the iterations' cx_tiny and cx_report, entries and exits, and
    // the thread's end.
    let per_run = 2 * (u64::from(ITERATIONS) + 3) + 1;
    assert_eq!(
        json["events"],
        per_run * runs.len() as u64,
        "{} runs of {per_run} events each: {json}",
        runs.len()
    );
    assert_eq!(json["lost"], 0, "{json}");
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    let found = recorded_runs(&output, "calls", &|_| bin.clone(), &runs);
    let mut recorded: Vec<u32> = found.into_values().flatten().collect();
    recorded.sort_unstable();
    let mut started: Vec<u32> = runs.iter().map(|(pid, _)| *pid).collect();
    started.sort_unstable();
    assert_eq!(recorded, started, "{}", done.stderr);
}
