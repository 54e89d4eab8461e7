//! Running child commands with their command line echoed, so a failing CI log says what ran.
use anyhow::{bail, Context as _, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `cmd`, inheriting stdio; fails if it cannot start or exits non-zero.
pub fn status(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {}", describe(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("could not start {}", describe(cmd)))?;
    if !status.success() {
        bail!("{} failed: {status}", describe(cmd));
    }
    Ok(())
}

/// Compiles `source` into `out` with `compiler` (`clang-19`, `clang++-19`) and the flags the
/// tests' fixtures use: optimized, with debug info, every function XRay-instrumented;
/// `extra` after them.
pub fn xray_build(compiler: &str, source: &Path, out: &Path, extra: &[&str]) -> Result<()> {
    status(
        Command::new(compiler)
            .args([
                "-O2",
                "-g",
                "-fxray-instrument",
                "-fxray-instruction-threshold=1",
            ])
            .args(extra)
            .arg(source)
            .arg("-o")
            .arg(out),
    )
}

/// Downloads `url` into `tarball`, checks its SHA-256 against `sha256`, and unpacks it into
/// `dir` without its top directory (`tar --strip-components=1`; the compression is guessed).
pub fn fetch_source(url: &str, sha256: &str, tarball: &Path, dir: &Path) -> Result<()> {
    status(
        Command::new("curl")
            .args(["-fsSL", "-o"])
            .arg(tarball)
            .arg(url),
    )
    .with_context(|| format!("downloading {url}"))?;
    let sum = output(Command::new("sha256sum").arg(tarball)).unwrap_or_default();
    if sum.split_whitespace().next() != Some(sha256) {
        bail!(
            "{} is not the expected tarball (sha256 {sum:?})",
            tarball.display()
        );
    }
    std::fs::create_dir_all(dir)?;
    status(
        Command::new("tar")
            .arg("xf")
            .arg(tarball)
            .arg("-C")
            .arg(dir)
            .arg("--strip-components=1"),
    )
}

/// Runs `cmd` quietly and returns its stdout; `None` if it cannot start or fails.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs the cargo that runs us, in the workspace root.
pub fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    status(Command::new(cargo).args(args).current_dir(workspace_root()))
}

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is inside the workspace")
        .to_path_buf()
}

/// Totals over every `test result:` line of a `cargo test` run.
pub struct TestTotals {
    pub passed: u64,
    pub failed: u64,
    /// Whether cargo itself exited successfully.
    pub success: bool,
}

/// Runs `cargo test` with `args`, echoing its output as it comes, and adds up its results.
pub fn cargo_test(args: &[&str]) -> Result<TestTotals> {
    use std::io::{BufRead as _, BufReader};
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(args)
        .current_dir(workspace_root())
        .stdout(std::process::Stdio::piped());
    eprintln!("xtask: running {}", describe(&cmd));
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not start {}", describe(&cmd)))?;
    let mut totals = TestTotals {
        passed: 0,
        failed: 0,
        success: false,
    };
    let stdout = child.stdout.take().context("no stdout pipe")?;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo test output")?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            totals.passed += count_before(rest, " passed");
            totals.failed += count_before(rest, " failed");
        }
    }
    totals.success = child.wait()?.success();
    Ok(totals)
}

/// The number just before `label` in a `test result:` line (`ok. 3 passed; 0 failed; ...`).
fn count_before(line: &str, label: &str) -> u64 {
    line.find(label)
        .and_then(|end| line[..end].rsplit([' ', '.']).next()?.parse().ok())
        .unwrap_or(0)
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// The cargo target directory: `$CARGO_TARGET_DIR` if set (cargo builds there), else
/// `<workspace>/target`.
pub fn target_dir() -> std::path::PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => {
            let dir = std::path::PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                workspace_root().join(dir)
            }
        }
        None => workspace_root().join("target"),
    }
}
