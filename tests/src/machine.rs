//! The emulated arm64 machine as the tests use it (issue 33): a shell script run by
//! `cargo xtask vm aarch64` (Debian's arm64 kernel under `qemu-system-aarch64`, the workspace
//! shared at the path it has here, so fixtures, the arm64 daemon and the results are the same
//! paths inside and out).
//!
//! The daemon writes its sessions to the machine's own `/tmp` (creating files on the 9p share
//! fails there, see the README); a script copies what the tests read into `$RESULTS`, a
//! directory of the share.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::tools::target_dir;

/// The daemon cross-built for arm64. Panics, saying what builds it, if it is missing.
pub fn arm64_daemon() -> PathBuf {
    let path = target_dir().join("aarch64-unknown-linux-gnu/release/fdr-profiled");
    assert!(
        path.is_file(),
        "{} is missing: `cargo xtask test` (or `cargo xtask test --arch aarch64`) builds it",
        path.display()
    );
    path
}

/// What one run of the machine left.
pub struct MachineRun {
    /// `$RESULTS`: what the script copied out.
    pub results: PathBuf,
    /// The machine's console and the xtask's own lines.
    pub console: String,
    /// How long the machine ran, boot included.
    pub wall: Duration,
    /// Keeps the results while the tests read them.
    _dir: tempfile::TempDir,
}

impl MachineRun {
    /// A file the script left in `$RESULTS`, as text (empty if it is not there).
    pub fn text(&self, name: &str) -> String {
        std::fs::read_to_string(self.results.join(name)).unwrap_or_default()
    }

    /// The path of `name` in `$RESULTS`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.results.join(name)
    }
}

/// Boots the arm64 machine and runs `script` (`sh`, with `$RESULTS` set) in it, at most
/// `timeout`. Panics if the machine cannot run or the script fails, with the console.
pub fn run(label: &str, script: &str, timeout: Duration) -> MachineRun {
    let xtask = target_dir().join("debug/xtask");
    assert!(
        xtask.is_file(),
        "{} is missing: run the tests through `cargo xtask test`, which builds it and the machine",
        xtask.display()
    );
    let dir = crate::tools::scratch_dir(label);
    let results = dir.path().join("results");
    std::fs::create_dir(&results).expect("results directory");
    let file = dir.path().join("script.sh");
    std::fs::write(
        &file,
        format!(
            "RESULTS={}\nexport RESULTS\n{script}",
            shell_quote(&results)
        ),
    )
    .expect("write the machine's script");
    let started = Instant::now();
    let out = crate::tools::run_output(
        Command::new(&xtask)
            .args(["vm", "aarch64", "--timeout"])
            .arg(timeout.as_secs().to_string())
            .arg("--")
            .arg("sh")
            .arg(&file),
    );
    let console = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the arm64 machine's script failed ({}):\n{console}",
        out.status
    );
    MachineRun {
        results,
        console,
        wall: started.elapsed(),
        _dir: dir,
    }
}

/// `path` quoted for `sh`.
pub fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "'\\''"))
}
