//! `exits = "repair"`: each C++ process of the target traced by a keeper of its own, let go
//! with no ptrace relation left when the service stops, or is killed.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tests::fixtures::private_copy;
use tests::service::ServiceStart;
use tests::tools::run_output;
use tests::trace::check_trace_dir;

use crate::common::TIMEOUT;

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
    let mut service = ServiceStart::config(&config)
        .socket(&scratch.path().join("control.sock"))
        .start();
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
    let mut service = ServiceStart::config(&config)
        .socket(&scratch.path().join("control.sock"))
        .start();
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

/// `exits = "auto"` (the default) on a C++ target without a budget (`max_overhead = "none"`):
/// the service repairs its processes' stacks as
/// `exits = "repair"` does, and a server started while it runs is held from its exec until its
/// keeper has it: traced from its first instruction, which the status counts; a snapshot
/// says `repair` and why; the server serves and throws as untraced.
#[test]
fn an_auto_target_repairs_a_cpp_server_from_its_exec() {
    use tests::server::{server_fixture, total, Server};
    let scratch = tests::scratch_dir("service-repair-auto");
    let bin = private_copy(&server_fixture(), scratch.path());
    let (config, socket) = cpp_target(scratch.path(), &bin, "max_overhead = \"none\"\n");
    // Started: its targets are attached.
    let mut service = ServiceStart::config(&config).socket(&socket).start();
    // Held at its exec, the server is traced from there. A loaded host (this suite's tests
    // side by side on two CPUs, other daemons' real-time threads among them) may run a
    // process past its entry point before it is held: the service says so and counts it as
    // traced late; then another one is started, three at most.
    let mut late = 0;
    let (mut server, pid) = loop {
        let server = Server::start_copy(scratch.path(), &bin);
        let pid = server.pid();
        let line = service.wait_for_stderr_match("the server traced", TIMEOUT, |l| {
            l.contains(&format!("process {pid} traced with its stack repaired"))
        });
        if line.contains(&format!(
            "process {pid} traced with its stack repaired (from its exec)"
        )) {
            break (server, pid);
        }
        late += 1;
        assert!(late < 3, "three servers traced late: {line}");
        eprintln!("traced late, another server started: {line}");
        let last = server.stop();
        assert_eq!(total(&last, "long_caught"), 0, "{last}");
        service.wait_for_stderr_match("the late server's end seen", TIMEOUT, |l| {
            l.contains(&format!("process {pid} exited"))
        });
    };
    server.command(b'a');
    server.command(b't');
    std::thread::sleep(Duration::from_millis(1000));
    let json: serde_json::Value =
        serde_json::from_slice(&client(&socket, &["status", "--json"])).unwrap();
    let repair = &json["targets"][0]["binaries"][0]["repair"];
    assert_eq!(repair["processes_traced"], 1 + late, "{json}");
    assert_eq!(repair["traced_from_exec"], 1, "{json}");
    assert_eq!(repair["traced_late"], late, "{json}");
    let dir = snapshot_of_cpp(&socket);
    let trace = check_trace_dir(&dir, &bin);
    let session = &trace.session.json;
    assert_eq!(session["exits"], "repair", "{session}");
    assert!(
        session["exits_reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("auto: ") && r.contains("__gxx_personality_v0")),
        "{session}"
    );
    // Stopped while traced (the service's output stays open as long as a process started
    // after it runs): its totals are its untraced ones, its end is seen.
    let last = server.stop();
    assert_eq!(total(&last, "long_caught"), 1, "{last}");
    assert_eq!(total(&last, "caught"), total(&last, "third"), "{last}");
    service.wait_for_stderr_match("the server's end seen", TIMEOUT, |l| {
        l.contains(&format!("process {pid} exited"))
    });
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
}

/// `exits = "auto"` on a C++ target under the default budget: not repaired (a repaired
/// stack's probes are per process, which a budget cannot drop), its functions decided one by
/// one and budgeted: the session says so, the status has the budget, and the server throws,
/// catches and ends as untraced.
#[test]
fn an_auto_target_under_a_budget_is_decided_per_function_and_budgeted() {
    use tests::server::{server_fixture, total, tracers, Server};
    let scratch = tests::scratch_dir("service-auto-budget");
    let bin = private_copy(&server_fixture(), scratch.path());
    let (config, socket) = cpp_target(scratch.path(), &bin, "");
    let service = ServiceStart::config(&config).socket(&socket).start();
    let mut server = Server::start_copy(scratch.path(), &bin);
    let pid = server.pid();
    server.command(b'a');
    server.command(b't');
    std::thread::sleep(Duration::from_millis(1500));
    // No keeper: nothing traces it with ptrace.
    assert!(tracers(pid).iter().all(|&t| t == 0), "{:?}", tracers(pid));
    let json: serde_json::Value =
        serde_json::from_slice(&client(&socket, &["status", "--json"])).unwrap();
    let binary = &json["targets"][0]["binaries"][0];
    assert!(binary["repair"].is_null(), "{json}");
    assert_eq!(
        binary["budget"]["max_overhead_percent"].as_f64(),
        Some(2.0),
        "{json}"
    );
    let dir = snapshot_of_cpp(&socket);
    let trace = check_trace_dir(&dir, &bin);
    let session = &trace.session.json;
    assert_eq!(session["exits"], "per-function", "{session}");
    assert!(
        session["exits_reason"].as_str().is_some_and(
            |r| r.starts_with("auto: ") && r.contains("not repaired under max_overhead")
        ),
        "{session}"
    );
    assert!(session["budget"].is_object(), "{session}");
    let last = server.stop();
    assert_eq!(total(&last, "long_caught"), 1, "{last}");
    assert_eq!(total(&last, "caught"), total(&last, "third"), "{last}");
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
}

/// A service configuration with one target, `cpp`, on `bin` (flight recorder, 1 s window)
/// and `extra` lines, written into `scratch`; returns it and the control socket's path.
fn cpp_target(scratch: &std::path::Path, bin: &std::path::Path, extra: &str) -> (PathBuf, PathBuf) {
    let config = scratch.join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"cpp\"\nbinary = \"{}\"\nwindow = \"1s\"\n{extra}",
            scratch.join("out").display(),
            bin.display()
        ),
    )
    .unwrap();
    (config, scratch.join("control.sock"))
}

/// What `fdr-profiled ARGS --socket SOCKET` prints; it must succeed.
fn client(socket: &std::path::Path, args: &[&str]) -> Vec<u8> {
    let out = run_output(
        Command::new(tests::fdr_profiled())
            .args(args)
            .arg("--socket")
            .arg(socket),
    );
    assert!(out.status.success(), "{out:?}");
    out.stdout
}

/// A snapshot of target `cpp`: its directory.
fn snapshot_of_cpp(socket: &std::path::Path) -> PathBuf {
    let snapshot = String::from_utf8(client(socket, &["snapshot", "cpp"])).unwrap();
    PathBuf::from(
        snapshot
            .lines()
            .next()
            .unwrap_or_else(|| panic!("no snapshot: {snapshot:?}")),
    )
}
