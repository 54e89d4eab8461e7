//! Least privilege (issue 18, item 7): fdr-profiled checks the capabilities it needs before it
//! does anything, and a user without them gets one line naming the missing ones and a non-zero
//! exit; with exactly the documented set (README "Requirements") it records.
//!
//! Needs root (to drop capabilities with `setpriv`, from util-linux, and to switch to nobody)
//! and BPF (the minimal sets record for real); built fixtures (clang-19).
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use tests::fixtures::workloads::calls_fixture;
use tests::service::ServiceStart;
use tests::{fdr_profiled, private_copy, scratch_dir, Finished, Running};

const TIMEOUT: Duration = Duration::from_secs(120);
const NOBODY: &[&str] = &["--reuid=65534", "--regid=65534", "--clear-groups"];

/// Runs fdr-profiled with `args` under `setpriv PRIV --`.
fn run_as(privileges: &[&str], args: &[&std::ffi::OsStr]) -> Finished {
    Running::spawn(
        "fdr-profiled under setpriv",
        Command::new("setpriv")
            .args(privileges)
            .arg("--")
            .arg(fdr_profiled())
            .args(args),
    )
    .finish(TIMEOUT)
}

/// `setpriv` arguments leaving root only `caps` (as setpriv names them: `bpf,perfmon`).
fn only(caps: &str) -> Vec<String> {
    vec![
        format!(
            "--bounding-set=-all{}",
            caps.split(',')
                .filter(|c| !c.is_empty())
                .map(|c| format!(",+{c}"))
                .collect::<String>()
        ),
        "--inh-caps=-all".into(),
    ]
}

fn assert_refused(f: &Finished, line: &str, out: &Path) {
    assert_eq!(f.status.code(), Some(1), "{}", f.stderr);
    assert_eq!(f.stderr, format!("fdr-profiled: error: {line}\n"));
    assert!(
        !out.exists(),
        "{} created by a refused session",
        out.display()
    );
}

/// A sleeping fixture to trace by pid (it runs 60 s unless killed).
fn sleeper(scratch: &Path) -> std::process::Child {
    tests::run::spawn_when_not_busy(
        Command::new(private_copy(&calls_fixture(), scratch))
            .args(["--seconds", "60", "--quiet"])
            .stdout(std::process::Stdio::null()),
    )
    .expect("start the fixture")
}

#[test]
fn nobody_is_told_which_capabilities_are_missing() {
    let scratch = scratch_dir("privileges-nobody");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let out = scratch.path().join("out");
    let os = |s: &str| std::ffi::OsString::from(s);
    let record =
        "missing CAP_BPF, CAP_PERFMON: recording needs CAP_BPF, CAP_PERFMON (run it as root)";
    let f = run_as(
        NOBODY,
        &[
            os("--out").as_ref(),
            out.as_os_str(),
            os("--").as_ref(),
            bin.as_os_str(),
        ],
    );
    assert_refused(&f, record, &out);
    let f = run_as(
        NOBODY,
        &[
            os("--attach").as_ref(),
            bin.as_os_str(),
            os("--out").as_ref(),
            out.as_os_str(),
        ],
    );
    assert_refused(&f, record, &out);
    let mut child = sleeper(scratch.path());
    let f = run_as(
        NOBODY,
        &[
            os("--pid").as_ref(),
            os(&child.id().to_string()).as_ref(),
            os("--out").as_ref(),
            out.as_os_str(),
        ],
    );
    let _ = child.kill();
    let _ = child.wait();
    assert_refused(
        &f,
        "missing CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE: recording with --pid needs CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE (run it as root)",
        &out,
    );
    let config = scratch.path().join("service.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nbinary = \"{}\"\nwindow = \"30s\"\n",
            out.display(),
            bin.display()
        ),
    )
    .unwrap();
    let setpriv: Vec<&str> = [&["setpriv"][..], NOBODY, &["--"]].concat();
    let f = ServiceStart::config(&config)
        .socket(&scratch.path().join("s.sock"))
        .wrapped(&setpriv)
        .spawn()
        .finish(TIMEOUT);
    assert_refused(
        &f,
        "missing CAP_BPF, CAP_PERFMON: the service needs CAP_BPF, CAP_PERFMON (run it as root)",
        &out,
    );
}

/// Root with one capability too few: the line names exactly that one.
#[test]
fn root_without_one_capability_is_told_which() {
    let scratch = scratch_dir("privileges-dropped");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let out = scratch.path().join("out");
    let os = |s: &str| std::ffi::OsString::from(s);
    let go = |caps: &str, args: &[&std::ffi::OsStr]| {
        let p = only(caps);
        let p: Vec<&str> = p.iter().map(String::as_str).collect();
        run_as(&p, args)
    };
    let f = go(
        "bpf",
        &[
            os("--out").as_ref(),
            out.as_os_str(),
            os("--").as_ref(),
            bin.as_os_str(),
        ],
    );
    assert_refused(
        &f,
        "missing CAP_PERFMON: recording needs CAP_BPF, CAP_PERFMON (run it as root)",
        &out,
    );
    let f = go(
        "perfmon,sys_ptrace",
        &[
            os("--out").as_ref(),
            out.as_os_str(),
            os("--").as_ref(),
            bin.as_os_str(),
        ],
    );
    assert_refused(
        &f,
        "missing CAP_BPF: recording needs CAP_BPF, CAP_PERFMON (run it as root)",
        &out,
    );
    let f = go(
        "bpf,perfmon",
        &[
            os("--no-uprobe-multi").as_ref(),
            os("--out").as_ref(),
            out.as_os_str(),
            os("--").as_ref(),
            bin.as_os_str(),
        ],
    );
    assert_refused(&f, "missing CAP_SYS_ADMIN: recording with --no-uprobe-multi needs CAP_SYS_ADMIN (run it as root)", &out);
    let mut child = sleeper(scratch.path());
    let f = go(
        "bpf,perfmon",
        &[
            os("--pid").as_ref(),
            os(&child.id().to_string()).as_ref(),
            os("--out").as_ref(),
            out.as_os_str(),
        ],
    );
    let _ = child.kill();
    let _ = child.wait();
    assert_refused(&f, "missing CAP_SYS_PTRACE: recording with --pid needs CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE (run it as root)", &out);
}

/// The documented sets are enough: a launched command with CAP_BPF and CAP_PERFMON, a running
/// process (`--pid`) with CAP_SYS_PTRACE too, each recording every call.
#[test]
fn the_documented_sets_suffice() {
    let scratch = scratch_dir("privileges-enough");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let os = |s: &str| std::ffi::OsString::from(s);
    let p = only("bpf,perfmon");
    let p: Vec<&str> = p.iter().map(String::as_str).collect();
    let out = scratch.path().join("launch");
    let f = run_as(
        &p,
        &[
            os("--out").as_ref(),
            out.as_os_str(),
            os("--no-report").as_ref(),
            os("--").as_ref(),
            bin.as_os_str(),
            os("--iterations").as_ref(),
            os("100").as_ref(),
        ],
    );
    assert!(f.status.success(), "{}", f.stderr);
    // cx_tiny 100 times, cx_loop and cx_report once, main: 103 calls, 206 events.
    assert!(
        f.stderr
            .contains("events of traced threads: 206 = 206 written"),
        "{}",
        f.stderr
    );

    let mut child = sleeper(scratch.path());
    let p = only("bpf,perfmon,sys_ptrace");
    let p: Vec<&str> = p.iter().map(String::as_str).collect();
    let out = scratch.path().join("pid");
    let f = run_as(
        &p,
        &[
            os("--pid").as_ref(),
            os(&child.id().to_string()).as_ref(),
            os("--duration").as_ref(),
            os("1").as_ref(),
            os("--no-report").as_ref(),
            os("--out").as_ref(),
            out.as_os_str(),
        ],
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(f.status.success(), "{}", f.stderr);
    assert!(!f.stderr.contains("warning"), "{}", f.stderr);
    assert!(out.join("session.json").is_file());
}
