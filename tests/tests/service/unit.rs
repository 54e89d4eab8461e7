//! The service's unit file and example configuration (`dist/`):
//! - `systemd-analyze verify` accepts the unit without a warning (its paths pointed at this
//!   build);
//! - the example configuration passes `service --check-config`;
//! - the unit's capability bounding set is exactly what the service needs to trace a program
//!   running as another user (nobody) with an instrumented shared object: with those
//!   capabilities (and root) it writes a snapshot with every call of the executable and the
//!   library; without CAP_BPF or CAP_PERFMON it refuses to start, without CAP_SYS_PTRACE it
//!   warns that the process's shared objects are not traced (and they are not), saying why.
//!
//! - the unit as it is runs under a real systemd (PID 1 of namespaces of its own, booted into
//!   an empty target): started (READY=1), snapshot over the control socket in its
//!   RuntimeDirectory, reloaded, its messages in that systemd's journal with their fields,
//!   stopped with success;
//! - the Debian package (cargo-deb, from the release build) holds the binary, the unit and the
//!   example configuration (a conffile) where the unit expects them, and no maintainer script:
//!   installing it starts nothing. Unpacked into a scratch root with `dpkg-deb -x`, the unit
//!   found there passes `systemd-analyze verify` and its binary checks the configuration.
//!
//! Needs root, BPF, systemd, unshare, nsenter, systemd-analyze, setpriv, cargo-deb, dpkg-deb, clang-19 and built daemons
//! (`cargo xtask test` builds both profiles).
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tests::fixtures::dso::{
    dso_fixture, run_section, DsoProcess, LINKED_FUNCTIONS, MAIN_FUNCTIONS, MARKER_BEGIN,
    MARKER_END,
};
use tests::fixtures::private_copy;
use tests::fixtures::workloads::calls_fixture;
use tests::objects::counts::resolve_calls;
use tests::objects::{assert_counts, load_trace, Object};
use tests::run::Running;
use tests::service::ServiceStart;
use tests::tools::run_output;

const TIMEOUT: Duration = Duration::from_secs(60);

fn dist(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("dist")
        .join(file)
}

/// The example configuration, tracing `bin` and writing under `output`.
fn example_config(dir: &Path, bin: &Path, output: &Path) -> PathBuf {
    let text = std::fs::read_to_string(dist("fdr-profiled.toml")).unwrap();
    // The quoted values only: a scratch path may itself hold `/var/lib/fdr-profiled`.
    let (binary, root) = ("\"/usr/local/bin/myserver\"", "\"/var/lib/fdr-profiled\"");
    assert!(text.contains(binary) && text.contains(root));
    let path = dir.join("fdr-profiled.toml");
    std::fs::write(
        &path,
        text.replace(root, &format!("{:?}", output.display().to_string()))
            .replace(binary, &format!("{:?}", bin.display().to_string())),
    )
    .unwrap();
    path
}

#[test]
fn the_unit_passes_systemd_analyze_verify() {
    let scratch = tests::scratch_dir("service-unit-verify");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let config = example_config(scratch.path(), &bin, &scratch.path().join("out"));
    let unit = std::fs::read_to_string(dist("fdr-profiled.service")).unwrap();
    assert!(unit.contains(
        "ExecStart=/usr/bin/fdr-profiled service --config /etc/fdr-profiled/fdr-profiled.toml"
    ));
    let path = scratch.path().join("fdr-profiled.service");
    std::fs::write(
        &path,
        unit.replace(
            "/usr/bin/fdr-profiled",
            &tests::fdr_profiled().display().to_string(),
        )
        .replace(
            "/etc/fdr-profiled/fdr-profiled.toml",
            &config.display().to_string(),
        ),
    )
    .unwrap();
    let out = run_output(Command::new("systemd-analyze").arg("verify").arg(&path));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {stderr}");
    assert!(
        stderr.trim().is_empty(),
        "systemd-analyze verify warns: {stderr}"
    );
}

#[test]
fn the_example_configuration_is_valid() {
    let scratch = tests::scratch_dir("service-unit-example");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let config = example_config(scratch.path(), &bin, &scratch.path().join("out"));
    let out = run_output(&mut ServiceStart::config(&config).check_command());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 target"), "{stdout}");
    assert!(stdout.contains("(flight recorder, window 30s)"), "{stdout}");
}

/// The capabilities the unit leaves the service (`CapabilityBoundingSet=`), as setpriv names them.
fn unit_capabilities() -> Vec<String> {
    let unit = std::fs::read_to_string(dist("fdr-profiled.service")).unwrap();
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit sets CapabilityBoundingSet");
    line.split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_lowercase())
        .collect()
}

/// What one run of the service under a capability bounding set gave.
struct CapsRun {
    /// The service's exit, and its stderr.
    ok: bool,
    stderr: String,
    /// The snapshot written, the traced process's pid and its stdout (the fixture's counts).
    snapshot: Option<PathBuf>,
    pid: u32,
    stdout: String,
    /// The fixture's objects, as the snapshot must name them.
    objects: Vec<Object>,
    /// Where the snapshot is (deleted when the run is dropped).
    _scratch: tempfile::TempDir,
}

/// Runs the service with bounding set `caps` on the example configuration (the unit runs it as
/// root), tracing the shared-object fixture (an instrumented executable linked against an
/// instrumented library) running as another user, nobody (uid 65534), as a real server's
/// processes do: the process runs before the service starts, does a run of calls once it is
/// ready, and a snapshot is asked for.
fn run_with(caps: &[String], label: &str) -> CapsRun {
    let scratch = tests::scratch_dir(label);
    let build = dso_fixture();
    let canon = |p: PathBuf| std::fs::canonicalize(p).expect("canonicalize a fixture copy");
    let exe = canon(private_copy(&build.exe, scratch.path()));
    let linked = canon(private_copy(&build.linked, scratch.path()));
    let mut main_functions = MAIN_FUNCTIONS.to_vec();
    main_functions.extend([MARKER_BEGIN, MARKER_END]);
    let objects: Vec<Object> = [
        (0, &exe, main_functions),
        (1, &linked, LINKED_FUNCTIONS.to_vec()),
    ]
    .map(|(id, path, functions)| Object {
        id,
        path: path.clone(),
        file: path.clone(),
        deleted: false,
        functions,
    })
    .into();
    let output = scratch.path().join("out");
    let config = example_config(scratch.path(), &exe, &output);
    let mut fixture = Running::spawn_piped(
        "dso-main as nobody",
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&exe),
    );
    fixture.wait_for_stderr_line("fixture: ready", TIMEOUT);
    let mut fixture = DsoProcess::driving(fixture);
    let pid = fixture.pid();
    let uid = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("Uid:")
                .map(|u| u.split_whitespace().next().unwrap().to_owned())
        });
    assert_eq!(uid.as_deref(), Some("65534"), "the fixture runs as nobody");
    let set: Vec<String> = caps.iter().map(|c| format!("+{c}")).collect();
    let mut service = ServiceStart::config(&config)
        .socket(&scratch.path().join("control.sock"))
        .wrapped(&[
            "setpriv".to_owned(),
            format!("--bounding-set=-all,{}", set.join(",")),
            "--inh-caps=-all".to_owned(),
            "--".to_owned(),
        ])
        .spawn();
    let ready = service.wait_for_stderr_match("ready or an error", TIMEOUT, |l| {
        l.starts_with("fdr-profiled: service: ready") || l.starts_with("fdr-profiled: error")
    });
    if ready.starts_with("fdr-profiled: error") {
        let stdout = fixture.quit("dso-main").stdout;
        let done = service.finish(TIMEOUT);
        return CapsRun {
            ok: done.status.success(),
            stderr: done.stderr,
            snapshot: None,
            pid,
            stdout,
            objects,
            _scratch: scratch,
        };
    }
    fixture.run(ROUNDS);
    std::thread::sleep(Duration::from_millis(300));
    service.signal(libc::SIGUSR1);
    let line = service.wait_for_stderr_match("a snapshot", TIMEOUT, |l| {
        l.starts_with("fdr-profiled: service: target ") && l.contains(": snapshot ")
    });
    let snapshot = PathBuf::from(line.rsplit_once(' ').unwrap().1);
    let stdout = fixture.quit("dso-main").stdout;
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    CapsRun {
        ok: done.status.success(),
        stderr: done.stderr,
        snapshot: Some(snapshot),
        pid,
        stdout,
        objects,
        _scratch: scratch,
    }
}

/// Calls of each thread of the fixture's run.
const ROUNDS: u32 = 20;

/// The unit's bounding set is the least the service needs to trace a server running as a user
/// of its own: with it, the snapshot holds every call of the run in the executable and its
/// library, exactly. Without CAP_BPF or CAP_PERFMON the service cannot start; without
/// CAP_SYS_PTRACE it starts (the executable's probes follow the file) but cannot read the
/// process's mappings, says so, and its library's calls are missing.
#[test]
fn the_units_capabilities_are_exactly_what_the_service_needs() {
    let caps = unit_capabilities();
    assert_eq!(caps, ["bpf", "perfmon", "sys_ptrace"]);
    let run = run_with(&caps, "service-unit-caps");
    assert!(run.ok, "{}", run.stderr);
    assert!(!run.stderr.contains("warning"), "{}", run.stderr);
    let trace = load_trace(run.snapshot.as_ref().expect("a snapshot"));
    assert_counts(
        &trace,
        run.pid,
        &run.objects,
        &run_section(&run.stdout, 1),
        true,
    );
    for dropped in &caps {
        let fewer: Vec<String> = caps.iter().filter(|c| *c != dropped).cloned().collect();
        let run = run_with(&fewer, &format!("service-unit-no-{dropped}"));
        let name = format!("CAP_{}", dropped.to_uppercase());
        if dropped == "sys_ptrace" {
            assert!(
                run.stderr.contains(&format!(
                    "process {}: its shared objects are not traced: ",
                    run.pid
                )) && run.stderr.contains("need CAP_SYS_PTRACE"),
                "without {name}: {}",
                run.stderr
            );
            let trace = load_trace(run.snapshot.as_ref().expect("a snapshot"));
            let (calls, _) = resolve_calls(&trace, run.pid, &run.objects);
            assert!(
                calls.iter().any(|c| c.object == 0) && !calls.iter().any(|c| c.object == 1),
                "without {name}: the executable's calls only"
            );
            continue;
        }
        assert!(!run.ok, "started without {name}: {}", run.stderr);
        // Checked before anything is done (src/kernel/caps.rs).
        assert!(
            run.stderr.contains(&format!(
                "fdr-profiled: error: missing {name}: the service needs CAP_BPF, CAP_PERFMON (run it as root)"
            )),
            "without {name}: {}",
            run.stderr
        );
    }
}

#[test]
fn the_debian_package_holds_the_binary_unit_and_configuration() {
    let scratch = tests::scratch_dir("service-package");
    let release = tests::tools::target_dir()
        .join("release")
        .join("fdr-profiled");
    assert!(
        release.is_file(),
        "{} missing: `cargo xtask test` builds it",
        release.display()
    );
    let out = run_output(
        Command::new("cargo")
            .args([
                "deb",
                "--package",
                "profiler-daemon",
                "--no-build",
                "--output",
            ])
            .arg(scratch.path())
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("..")),
    );
    assert!(
        out.status.success(),
        "cargo deb (install it with `cargo xtask setup`): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deb = std::fs::read_dir(scratch.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("a .deb");
    let root = scratch.path().join("root");
    let x = run_output(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root));
    assert!(x.status.success(), "{}", String::from_utf8_lossy(&x.stderr));
    let control = scratch.path().join("control");
    let e = run_output(Command::new("dpkg-deb").arg("-e").arg(&deb).arg(&control));
    assert!(e.status.success());
    let mut scripts: Vec<String> = std::fs::read_dir(&control)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    scripts.sort();
    for script in ["preinst", "postinst", "prerm", "postrm"] {
        assert!(
            !scripts.iter().any(|s| s == script),
            "{script}: {scripts:?}"
        );
    }
    assert!(scripts.iter().any(|s| s == "conffiles"), "{scripts:?}");
    let conffiles = std::fs::read_to_string(control.join("conffiles")).unwrap();
    assert_eq!(conffiles.trim(), "/etc/fdr-profiled/fdr-profiled.toml");

    let binary = root.join("usr/bin/fdr-profiled");
    let unit = root.join("lib/systemd/system/fdr-profiled.service");
    let example = root.join("etc/fdr-profiled/fdr-profiled.toml");
    // The release build, stripped by cargo-deb: it runs and knows the service.
    let help = run_output(Command::new(&binary).arg("--help"));
    assert!(help.status.success(), "the packaged binary runs");
    assert!(String::from_utf8_lossy(&help.stdout).contains("service"));
    // The unit as packaged, its paths pointed into the unpacked root.
    let text = std::fs::read_to_string(&unit).unwrap();
    assert_eq!(
        text,
        std::fs::read_to_string(dist("fdr-profiled.service")).unwrap()
    );
    let bin = private_copy(&calls_fixture(), scratch.path());
    let config = example_config(scratch.path(), &bin, &scratch.path().join("out"));
    assert_eq!(
        std::fs::read_to_string(&example).unwrap(),
        std::fs::read_to_string(dist("fdr-profiled.toml")).unwrap()
    );
    let local = scratch.path().join("fdr-profiled.service");
    std::fs::write(
        &local,
        text.replace("/usr/bin/fdr-profiled", &binary.display().to_string())
            .replace(
                "/etc/fdr-profiled/fdr-profiled.toml",
                &config.display().to_string(),
            ),
    )
    .unwrap();
    let verify = run_output(Command::new("systemd-analyze").arg("verify").arg(&local));
    let stderr = String::from_utf8_lossy(&verify.stderr);
    assert!(
        verify.status.success() && stderr.trim().is_empty(),
        "{stderr}"
    );
    let check = run_output(
        Command::new(&binary)
            .args(["service", "--check-config"])
            .arg(&config),
    );
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

/// A systemd of our own: PID 1 of new PID and mount namespaces, `/run` and `/var/log` on
/// tmpfs there (its units, sockets and journal vanish with it), booted into an empty target so
/// that it starts nothing of the host's. Killed (and with it every process it started) when
/// dropped.
struct PrivateSystemd {
    unshare: std::process::Child,
    pid: u32,
}

impl PrivateSystemd {
    /// Boots it with `units` (name, text) in `/run/systemd/system`; waits until it runs.
    fn boot(scratch: &Path, units: &[(&str, String)]) -> PrivateSystemd {
        let staged = scratch.join("units");
        for (name, text) in units {
            let path = staged.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
        }
        let script = format!(
            "mount -t tmpfs tmpfs /run && mount -t tmpfs tmpfs /var/log && mkdir -p /run/systemd/system && cp -r '{}'/. /run/systemd/system/ && exec /lib/systemd/systemd --system --unit=fdr-test.target --log-target=console",
            staged.display()
        );
        let log = std::fs::File::create(scratch.join("systemd.log")).unwrap();
        let unshare = Command::new("unshare")
            .args([
                "--fork",
                "--pid",
                "--mount",
                "--mount-proc",
                "sh",
                "-c",
                &script,
            ])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("unshare (util-linux, installed by cargo xtask setup)");
        let start = std::time::Instant::now();
        let mut booted = PrivateSystemd { unshare, pid: 0 };
        loop {
            let children = format!("/proc/{0}/task/{0}/children", booted.unshare.id());
            booted.pid = std::fs::read_to_string(children)
                .ok()
                .and_then(|c| c.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            if booted.pid != 0 {
                let state = booted.run("systemctl is-system-running");
                if state.0.trim() == "running" {
                    return booted;
                }
            }
            assert!(
                start.elapsed() < TIMEOUT,
                "systemd in its own namespaces did not come up:\n{}",
                std::fs::read_to_string(scratch.join("systemd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `command` (sh) inside its namespaces; returns stdout and whether it succeeded.
    fn run(&self, command: &str) -> (String, bool) {
        let out = run_output(
            Command::new("nsenter")
                .args(["-t", &self.pid.to_string(), "-m", "-p", "sh", "-c", command])
                .stdin(std::process::Stdio::null()),
        );
        (
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
            out.status.success(),
        )
    }

    /// Runs `command`, which must succeed; returns its output.
    fn ok(&self, command: &str) -> String {
        let (out, ok) = self.run(command);
        assert!(ok, "{command}: failed:\n{out}");
        out
    }

    /// `systemctl show -p PROPERTY UNIT`'s value.
    fn property(&self, unit: &str, property: &str) -> String {
        let out = self.ok(&format!("systemctl show -p {property} --value {unit}"));
        out.trim().to_owned()
    }
}

impl Drop for PrivateSystemd {
    fn drop(&mut self) {
        // PID 1 of the namespace: its death kills every process in it.
        if self.pid != 0 {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

/// The unit of `dist/` as it is (Type=notify, the watchdog, the whole sandbox, the capability
/// bounding set) under a real systemd: a drop-in only points it at this build and a scratch
/// configuration, and lets it write there. `systemctl start` returns once the service said
/// READY=1; the traced program's calls are in the snapshot `fdr-profiled snapshot` asks for
/// over the control socket in the unit's RuntimeDirectory; `systemctl reload` keeps it
/// running; the journal (a journald of that systemd) has its messages with their `FDR_*`
/// fields; `systemctl stop` ends it with success.
#[test]
fn the_unit_runs_under_a_real_systemd() {
    let scratch = unit_scratch();
    let dir = scratch.path();
    let bin = private_copy(&calls_fixture(), dir);
    let output = dir.join("out");
    let config = example_config(dir, &bin, &output);
    // The daemon the unit runs, where the unit can see it.
    let daemon = private_copy(&tests::fdr_profiled(), dir);
    let dropin = format!(
        "[Unit]\n# Started alone in an empty boot target: no sysinit.target to wait for.\nDefaultDependencies=no\n[Service]\nExecStartPre=\nExecStartPre={d} service --check-config {c}\nExecStart=\nExecStart={d} service --config {c}\nReadWritePaths={o}\n",
        d = daemon.display(),
        c = config.display(),
        o = dir.display()
    );
    let systemd = PrivateSystemd::boot(
        dir,
        &[
            (
                "fdr-test.target",
                "[Unit]\nDescription=fdr-profiled test boot\nDefaultDependencies=no\n".to_owned(),
            ),
            (
                "fdr-profiled.service",
                std::fs::read_to_string(dist("fdr-profiled.service")).unwrap(),
            ),
            ("fdr-profiled.service.d/test.conf", dropin),
        ],
    );
    systemd.ok("systemctl start systemd-journald.socket systemd-journald.service");
    systemd.ok("systemctl start fdr-profiled.service");
    assert_eq!(systemd.property("fdr-profiled", "ActiveState"), "active");
    assert!(
        systemd
            .property("fdr-profiled", "StatusText")
            .starts_with("1 targets (1 binaries); "),
        "{}",
        systemd.property("fdr-profiled", "StatusText")
    );

    let run = run_output(Command::new(&bin).args(["--iterations", "500"]));
    assert!(run.status.success());
    std::thread::sleep(Duration::from_millis(300));
    let snapshot = systemd.ok(&format!("{} snapshot", daemon.display()));
    let snapshot = PathBuf::from(snapshot.trim());
    assert!(snapshot.starts_with(&output), "{}", snapshot.display());
    // The example configuration names the target after the binary.
    let target = snapshot.parent().unwrap().file_name().unwrap();
    assert_eq!(target, bin.file_name().unwrap());
    let trace = tests::trace::check_trace_dir(&snapshot, &bin);
    // main, cx_loop, 500 cx_tiny, cx_report: entries and exits.
    assert_eq!(trace.session.events, 2 * 503);

    systemd.ok("systemctl reload fdr-profiled.service");
    systemd.ok("systemctl is-active fdr-profiled.service");
    let journal = systemd.ok("journalctl -u fdr-profiled.service -o json --no-pager");
    let entries: Vec<serde_json::Value> = journal
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let snapshot_entry = entries
        .iter()
        .find(|e| e["FDR_SNAPSHOT"] == *snapshot.to_string_lossy())
        .unwrap_or_else(|| panic!("no journal entry with FDR_SNAPSHOT: {journal}"));
    assert_eq!(
        snapshot_entry["FDR_TARGET"],
        *target.to_string_lossy(),
        "{snapshot_entry}"
    );
    assert_eq!(snapshot_entry["FDR_TRIGGER"], "request", "{snapshot_entry}");
    assert_eq!(snapshot_entry["PRIORITY"], "5", "{snapshot_entry}");
    assert!(
        entries.iter().any(|e| e["MESSAGE"]
            .as_str()
            .is_some_and(|m| m.starts_with("reloaded "))),
        "{journal}"
    );
    systemd.ok("systemctl stop fdr-profiled.service");
    assert_eq!(systemd.property("fdr-profiled", "Result"), "success");
    assert_eq!(systemd.property("fdr-profiled", "NRestarts"), "0");
}

/// Where the real-systemd test works: its own scratch directory, except under a checkout in
/// `/tmp` or `/var/tmp`, which the unit's `PrivateTmp=yes` replaces with directories of its
/// own (the daemon, the fixture and the configuration would be invisible to the service):
/// there, a directory of `/var/lib/fdr-profiled-tests`, removed after.
fn unit_scratch() -> tempfile::TempDir {
    let target = tests::tools::target_dir();
    let target = std::fs::canonicalize(&target).unwrap_or(target);
    if !(target.starts_with("/tmp") || target.starts_with("/var/tmp")) {
        return tests::scratch_dir("service-systemd");
    }
    let base = Path::new("/var/lib/fdr-profiled-tests");
    std::fs::create_dir_all(base).unwrap_or_else(|e| panic!("mkdir {}: {e}", base.display()));
    tempfile::Builder::new()
        .prefix("service-systemd-")
        .tempdir_in(base)
        .unwrap_or_else(|e| panic!("tempdir in {}: {e}", base.display()))
}
