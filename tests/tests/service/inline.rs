//! `engine = "inline"`: each process of the target patched by an inline engine of its own,
//! recorded call for call, and put back as it was when the service stops.

use std::process::Command;
use std::time::Duration;

use tests::fixtures::private_copy;
use tests::fixtures::workloads::calls_fixture;
use tests::run::Running;
use tests::service::ServiceStart;
use tests::tools::run_output;
use tests::trace::check_trace_dir;

use crate::common::{assert_calls_run, snapshots, wait_for_count, TIMEOUT};

/// The calls fixture running for two minutes (killed before), there before the service is.
fn running_fixture(bin: &std::path::Path) -> tests::run::Running {
    let running = tests::run::spawn_fixture(
        "calls already running",
        bin,
        &["--seconds", "120", "--per-second", "--quiet"],
    );
    std::thread::sleep(Duration::from_millis(300));
    running
}

/// A record-mode target with `engine = "inline"`: a process running when the service starts
/// is patched where it is; two started while it runs are each held from their exec, patched
/// at their entry point and recorded whole (every call the program counted, `main` included,
/// as llvm-xray reads the segment); the status counts the processes patched, running and
/// ended; when the service stops, the one still running has its code put back byte for byte
/// and the engine's memory unmapped, and it runs on.
#[test]
fn an_inline_target_patches_each_process_and_puts_it_back() {
    let scratch = tests::scratch_dir("service-inline");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"fast\"\nbinary = \"{}\"\nengine = \"inline\"\n\
             mode = \"record\"\nsegment_age = \"10m\"\n",
            output.display(),
            bin.display()
        ),
    )
    .unwrap();
    let running = running_fixture(&bin);
    let running_pid = running.pid();
    let socket = scratch.path().join("control.sock");
    let service = ServiceStart::config(&config).socket(&socket).start();
    wait_for_count(
        &service,
        &format!("sleds patched in process {running_pid};"),
        1,
    );
    let mut runs = Vec::new();
    for args in [
        &["--threads", "2", "--iterations", "20000"][..],
        &["--iterations", "5000"][..],
    ] {
        let run = Running::spawn("calls", Command::new(&bin).args(args));
        let pid = run.pid();
        let done = run.finish(TIMEOUT);
        assert!(done.status.success(), "{}", done.stderr);
        runs.push((pid, done.stdout));
    }
    // Both ended: their engines are finished at the next drains.
    let mut stderr = String::new();
    for (pid, _) in &runs {
        stderr = wait_for_count(&service, &format!("process {pid} exited"), 1);
    }
    for (pid, _) in &runs {
        assert!(
            stderr.contains(&format!("sleds patched in process {pid};")),
            "{pid}: {stderr}"
        );
    }
    let status = run_output(
        Command::new(tests::fdr_profiled())
            .args(["status", "--json", "--socket"])
            .arg(&socket),
    );
    assert!(status.status.success(), "{status:?}");
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let inline = &json["targets"][0]["binaries"][0]["inline"];
    assert_eq!(inline["processes_patched"], 3, "{json}");
    assert_eq!(inline["processes_ended"], 2, "{json}");
    assert_eq!(inline["live"], serde_json::json!([running_pid]), "{json}");
    assert_eq!(inline["processes_not_traced"], 0, "{json}");
    // Its calls trap nowhere: no trap's cost is estimated for them.
    let probes = &json["targets"][0]["binaries"][0]["probes"];
    assert_eq!(probes["engine"], "inline", "{json}");
    assert!(probes["cpu_percent"].is_null(), "{json}");

    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        done.stderr
            .contains(&format!("process {running_pid} put back as it was")),
        "{}",
        done.stderr
    );
    tests::memory::assert_put_back(running_pid, &bin, &done.stderr);
    assert!(
        std::path::Path::new(&format!("/proc/{running_pid}")).exists(),
        "the process running before did not outlive the service"
    );
    running.signal(libc::SIGKILL);
    let _ = running.finish(TIMEOUT);

    let dirs = snapshots(&output, "fast");
    assert_eq!(dirs.len(), 1, "{dirs:?}\n{}", done.stderr);
    let trace = check_trace_dir(&dirs[0], &bin);
    // On a loaded host a process can run on between its exec holder and its keeper, and is
    // then patched past its entry point: said, and its first calls not recorded.
    let whole: Vec<_> = runs
        .iter()
        .filter(|(pid, _)| !tests::memory::taken_late(&done.stderr, *pid))
        .collect();
    assert!(
        !whole.is_empty(),
        "every run was taken late: {}",
        done.stderr
    );
    for (pid, stdout) in whole {
        assert_calls_run(&trace, *pid, stdout);
    }
    // The one running before: recorded from where it was found.
    assert!(
        trace
            .threads
            .iter()
            .any(|t| t.pid == running_pid && t.calls().contains_key("cx_tiny")),
        "the process running before is not in the segment"
    );
}

/// A reload that removes an inline target puts its processes back at once (the service runs
/// on): the code byte for byte, the engine's memory unmapped, the process running on.
#[test]
fn a_reload_that_removes_an_inline_target_puts_its_processes_back() {
    let scratch = tests::scratch_dir("service-inline-reload");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    let with_target = format!(
        "output = \"{}\"\n[[target]]\nname = \"fast\"\nbinary = \"{}\"\nengine = \"inline\"\n",
        output.display(),
        bin.display()
    );
    std::fs::write(&config, &with_target).unwrap();
    let running = running_fixture(&bin);
    let pid = running.pid();
    let service = ServiceStart::config(&config)
        .socket(&scratch.path().join("control.sock"))
        .start();
    wait_for_count(&service, &format!("sleds patched in process {pid};"), 1);
    assert!(!tests::memory::code_differences(pid, &bin).is_empty());
    // The target replaced by another, of a binary nothing runs.
    let other = scratch.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let other = private_copy(&calls_fixture(), &other);
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"other\"\nbinary = \"{}\"\n",
            output.display(),
            other.display()
        ),
    )
    .unwrap();
    service.signal(libc::SIGHUP);
    let stderr = wait_for_count(&service, &format!("process {pid} put back as it was"), 1);
    tests::memory::assert_put_back(pid, &bin, &stderr);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the process did not outlive its target"
    );
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    running.signal(libc::SIGKILL);
    let _ = running.finish(TIMEOUT);
}

/// Without CAP_SYS_ADMIN (the shipped unit's bounding set leaves it out) an inline target's
/// binary is refused in one line that says what is missing and how to add it.
#[test]
fn an_inline_target_without_cap_sys_admin_is_refused_in_one_line() {
    let scratch = tests::scratch_dir("service-inline-caps");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"fast\"\nbinary = \"{}\"\nengine = \"inline\"\n",
            scratch.path().join("out").display(),
            bin.display()
        ),
    )
    .unwrap();
    let out = run_output(
        Command::new("setpriv")
            .args(["--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin"])
            .arg(tests::fdr_profiled())
            .arg("service")
            .arg("--config")
            .arg(&config)
            .arg("--socket")
            .arg(scratch.path().join("control.sock")),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("engine = \"inline\""))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        line.contains("missing CAP_SYS_ADMIN") && line.contains("CapabilityBoundingSet"),
        "{stderr}"
    );
}
