//! Where the programs the tests run live: the daemon under test, llvm-xray 14
//! and 19, the C compilers; and the cargo target directory the tests use for
//! caches and scratch space.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `<target dir>/<profile>`: the directory holding `deps/`, derived from the
/// running test executable (`target/debug/deps/<test>-<hash>` →
/// `target/debug`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .expect("test executable has a parent directory");
    if dir.file_name() == Some(OsStr::new("deps")) {
        dir.parent().expect("deps/ has a parent").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// The cargo target directory (`target/`), parent of [`profile_dir`].
pub fn target_dir() -> PathBuf {
    let profile = profile_dir();
    profile.parent().map(Path::to_path_buf).unwrap_or(profile)
}

/// The daemon binary: `$FDR_PROFILED` if set, else
/// `<target dir>/debug/fdr-profiled` (the profile the tests were built with).
/// Panics if it does not exist.
pub fn fdr_profiled() -> PathBuf {
    let path = match std::env::var_os("FDR_PROFILED") {
        Some(p) => PathBuf::from(p),
        None => profile_dir().join("fdr-profiled"),
    };
    if !path.is_file() {
        panic!(
            "fdr-profiled not found at {}: run `cargo build -p profiler-daemon` first \
             (`cargo xtask test` does), or point FDR_PROFILED at it",
            path.display()
        );
    }
    path
}

/// llvm-xray of LLVM `major` (14 or 19) from the Debian packages. Panics if
/// it is not installed: the tests never skip for a missing tool.
pub fn llvm_xray(major: u32) -> PathBuf {
    let path = PathBuf::from(format!("/usr/lib/llvm-{major}/bin/llvm-xray"));
    if !path.is_file() {
        panic!(
            "{} missing: install Debian packages llvm and llvm-19 (cargo xtask setup does)",
            path.display()
        );
    }
    path
}

/// The llvm-xray versions every trace is checked with.
pub const LLVM_XRAY_VERSIONS: [u32; 2] = [14, 19];

/// `clang-19` (C). Panics if missing.
pub fn clang() -> PathBuf {
    tool_in_usr_bin("clang-19", "clang-19")
}

/// `clang++-19` (C++). Panics if missing.
pub fn clangxx() -> PathBuf {
    tool_in_usr_bin("clang++-19", "clang-19")
}

fn tool_in_usr_bin(name: &str, package: &str) -> PathBuf {
    let path = Path::new("/usr/bin").join(name);
    if !path.exists() {
        panic!(
            "{} missing: install Debian package {package} (cargo xtask setup does)",
            path.display()
        );
    }
    path
}

/// A scratch directory under `<target dir>/e2e-tmp/`, mode 0777 so that
/// unprivileged runs (the non-root test) can use it too. Removed on drop
/// unless `FDR_KEEP_TMP` is set (then its path is printed).
pub fn scratch_dir(prefix: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let base = target_dir().join("e2e-tmp");
    std::fs::create_dir_all(&base).unwrap_or_else(|e| panic!("mkdir {}: {e}", base.display()));
    let mut dir = tempfile::Builder::new()
        .prefix(&format!("{prefix}-"))
        .tempdir_in(&base)
        .unwrap_or_else(|e| panic!("tempdir in {}: {e}", base.display()));
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
        .expect("chmod scratch dir");
    if std::env::var_os("FDR_KEEP_TMP").is_some() {
        eprintln!("keeping scratch dir {}", dir.path().display());
        dir.disable_cleanup(true);
    }
    dir
}

/// Runs a command to completion, capturing stdout and stderr. Panics if it
/// cannot be started.
pub fn run_output(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// `llvm-xray fdr-dump FILE` (stdout and stderr): shows the real parse
/// error that `convert`/`account` hide behind a YAML message.
pub fn fdr_dump(major: u32, file: &Path) -> String {
    let out = run_output(Command::new(llvm_xray(major)).arg("fdr-dump").arg(file));
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Keeps the last `n` lines of `text` (for panic messages).
pub fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let skip = lines.len().saturating_sub(n);
    let mut out = String::new();
    if skip > 0 {
        out.push_str(&format!("[... {skip} lines cut ...]\n"));
    }
    for l in &lines[skip..] {
        out.push_str(l);
        out.push('\n');
    }
    out
}
