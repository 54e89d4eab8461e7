//! fdr-profiled refuses bad input with one line on stderr starting
//! `fdr-profiled: error:` that names the problem, a non-zero exit status,
//! and no panic: a missing binary, a file that is not ELF, an ELF without
//! `xray_instr_map`, a non-empty output directory, and running as non-root.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tests::{
    cpp_fixture, fdr_profiled, parse_count_lines, plain_c_fixture, private_copy, scratch_dir,
    Finished, Running,
};

const TIMEOUT: Duration = Duration::from_secs(60);

fn run(cmd: &mut Command) -> Finished {
    Running::spawn("fdr-profiled", cmd).finish(TIMEOUT)
}

fn attach(bin: &Path, out: &Path) -> Command {
    let mut c = Command::new(fdr_profiled());
    c.arg("--attach")
        .arg(bin)
        .arg("--out")
        .arg(out)
        .args(["--duration", "1"]);
    c
}

fn launch(bin: &Path, out: &Path) -> Command {
    let mut c = Command::new(fdr_profiled());
    c.arg("--out").arg(out).arg("--").arg(bin);
    c
}

/// Non-zero exit, no panic, exactly one stderr line, starting with
/// `fdr-profiled: error:` and containing one of `needles` (case-insensitive).
fn assert_one_line_error(f: &Finished, needles: &[&str]) -> String {
    assert!(
        !f.status.success(),
        "exit status {} should be non-zero\n{}",
        f.status,
        f.stderr
    );
    assert!(
        !f.stderr.contains("panicked"),
        "the daemon panicked:\n{}",
        f.stderr
    );
    let lines: Vec<&str> = f.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "want exactly one stderr line, got:\n{}",
        f.stderr
    );
    let line = lines[0];
    assert!(
        line.starts_with("fdr-profiled: error:"),
        "stderr line should start with `fdr-profiled: error:`: {line:?}"
    );
    let lower = line.to_lowercase();
    assert!(
        needles.iter().any(|n| lower.contains(&n.to_lowercase())),
        "the error should name the problem (one of {needles:?}): {line:?}"
    );
    // The launched program must not have run.
    assert!(
        parse_count_lines(&f.stdout).is_empty(),
        "the fixture ran anyway:\n{}",
        f.stdout
    );
    line.to_string()
}

fn file_name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn attach_missing_binary() {
    let dir = scratch_dir("bad-missing");
    let bin = dir.path().join("no-such-program");
    let f = run(&mut attach(&bin, &dir.path().join("out")));
    assert_one_line_error(&f, &[&file_name(&bin)]);
}

#[test]
fn launch_missing_binary() {
    let dir = scratch_dir("bad-missing-launch");
    let bin = dir.path().join("no-such-program");
    let f = run(&mut launch(&bin, &dir.path().join("out")));
    assert_one_line_error(&f, &[&file_name(&bin)]);
}

fn text_file(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("notes.txt");
    std::fs::write(&p, "this is not an ELF file\n").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[test]
fn attach_non_elf() {
    let dir = scratch_dir("bad-text");
    let bin = text_file(dir.path());
    let f = run(&mut attach(&bin, &dir.path().join("out")));
    assert_one_line_error(&f, &[&file_name(&bin)]);
}

#[test]
fn launch_non_elf() {
    let dir = scratch_dir("bad-text-launch");
    let bin = text_file(dir.path());
    let f = run(&mut launch(&bin, &dir.path().join("out")));
    assert_one_line_error(&f, &[&file_name(&bin)]);
}

#[test]
fn attach_elf_without_xray_map() {
    let dir = scratch_dir("bad-plain");
    let bin = private_copy(&plain_c_fixture(), dir.path());
    let f = run(&mut attach(&bin, &dir.path().join("out")));
    assert_one_line_error(&f, &[&file_name(&bin)]);
}

#[test]
fn launch_elf_without_xray_map() {
    let dir = scratch_dir("bad-plain-launch");
    let bin = private_copy(&plain_c_fixture(), dir.path());
    let f = run(&mut launch(&bin, &dir.path().join("out")));
    assert_one_line_error(&f, &[&file_name(&bin)]);
    assert!(
        !f.stdout.contains("plain:"),
        "the program ran anyway:\n{}",
        f.stdout
    );
}

#[test]
fn non_empty_output_dir() {
    let dir = scratch_dir("bad-out");
    let bin = private_copy(&cpp_fixture(), dir.path());
    let out = dir.path().join("occupied");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "precious\n").unwrap();
    let f = run(&mut launch(&bin, &out));
    assert_one_line_error(&f, &[&file_name(&out)]);
    assert_eq!(
        std::fs::read_to_string(out.join("keep.txt")).unwrap(),
        "precious\n"
    );
}

const NOBODY: u32 = 65534;
const NOT_ROOT: &[&str] = &[
    "root",
    "permission",
    "privilege",
    "not permitted",
    "capabilit",
    "cap_bpf",
    "cap_sys_admin",
    "eperm",
];

/// A valid XRay binary, but fdr-profiled runs as `nobody`.
#[test]
fn attach_not_root() {
    let dir = scratch_dir("bad-nonroot");
    let bin = private_copy(&cpp_fixture(), dir.path());
    let f = run(attach(&bin, &dir.path().join("out"))
        .uid(NOBODY)
        .gid(NOBODY));
    assert_one_line_error(&f, NOT_ROOT);
}

#[test]
fn launch_not_root() {
    let dir = scratch_dir("bad-nonroot-launch");
    let bin = private_copy(&cpp_fixture(), dir.path());
    let f = run(launch(&bin, &dir.path().join("out"))
        .uid(NOBODY)
        .gid(NOBODY));
    assert_one_line_error(&f, NOT_ROOT);
}

fn by_pid(pid: u32, out: &Path) -> Command {
    let mut c = Command::new(fdr_profiled());
    c.arg("--pid")
        .arg(pid.to_string())
        .arg("--out")
        .arg(out)
        .args(["--duration", "1"]);
    c
}

#[test]
fn pid_that_does_not_exist() {
    let scratch = scratch_dir("bad-pid-missing");
    // pid_max is at most 2^22 on Linux, so this pid cannot exist.
    let f = run(&mut by_pid(1 << 23, &scratch.path().join("out")));
    assert_one_line_error(&f, &["no process with pid 8388608"]);
    assert!(
        !scratch.path().join("out").exists(),
        "no output for a refused session"
    );
}

#[test]
fn pid_of_a_kernel_thread() {
    let scratch = scratch_dir("bad-pid-kthread");
    // kthreadd is pid 2 wherever the kernel has kernel threads (always here).
    let f = run(&mut by_pid(2, &scratch.path().join("out")));
    assert_one_line_error(&f, &["pid 2 is a kernel thread"]);
}

#[test]
fn pid_of_a_process_without_instrumentation() {
    let scratch = scratch_dir("bad-pid-plain");
    let mut sleeper = Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("start sleep");
    let f = run(&mut by_pid(sleeper.id(), &scratch.path().join("out")));
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_one_line_error(&f, &["maps no instrumented object"]);
}

#[test]
fn pid_as_non_root() {
    let scratch = scratch_dir("bad-pid-nonroot");
    let mut sleeper = Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("start sleep");
    let f = run(by_pid(sleeper.id(), &scratch.path().join("out"))
        .uid(65534)
        .gid(65534));
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    // Capabilities are checked before anything is read (hostile/privileges.rs has the
    // exact lines).
    assert_one_line_error(&f, &["missing cap_bpf, cap_perfmon, cap_sys_ptrace"]);
}
