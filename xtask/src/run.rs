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

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}
