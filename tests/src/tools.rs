//! Where the programs the tests run live: the daemon under test, the C
//! compilers; and the cargo target directory the tests use for caches and
//! scratch space. llvm-xray 14 and 19 and running commands come from the
//! reference crate ([`xray_reference`]), re-exported here.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

pub use xray_reference::{fdr_dump, llvm_xray, run_output, tail_lines, LLVM_XRAY_VERSIONS};

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

/// `clang-19` (C). Panics if missing.
pub fn clang() -> PathBuf {
    tool_in_usr_bin("clang-19", "clang-19")
}

/// `clang++-19` (C++). Panics if missing.
pub fn clangxx() -> PathBuf {
    tool_in_usr_bin("clang++-19", "clang-19")
}

/// `go` (for `go tool pprof`, the reference reader of pprof profiles). Panics if missing.
pub fn go() -> PathBuf {
    tool_in_usr_bin("go", "golang-go")
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
    // Writable by the fixtures some tests run as nobody, and sticky like /tmp: fdr-profiled
    // refuses to create its output in a directory other users can write to otherwise.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777))
        .expect("chmod scratch dir");
    if std::env::var_os("FDR_KEEP_TMP").is_some() {
        eprintln!("keeping scratch dir {}", dir.path().display());
        dir.disable_cleanup(true);
    }
    dir
}

/// One row of `fdr-profiled list`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedFunction {
    /// The id a trace uses (packed for a shared object).
    pub id: u32,
    /// The function's address in its object.
    pub address: u64,
    /// Its sleds.
    pub sleds: usize,
    /// How `--exits per-function` observes its exits: `return` or `sleds`.
    pub exit: String,
    /// Its name as the summary shows it.
    pub name: String,
    /// Why that exit method.
    pub why: String,
}

/// `fdr-profiled list TARGET` (a path or a pid): the header lines of each object, and every
/// row. Panics if the command fails or a row does not have the documented columns
/// (`id address sleds kinds exit name  | why`).
pub fn list(target: &OsStr) -> (Vec<String>, Vec<ListedFunction>) {
    let out = run_output(
        std::process::Command::new(fdr_profiled())
            .arg("list")
            .arg(target),
    );
    assert!(
        out.status.success(),
        "fdr-profiled list {}: {}",
        target.to_string_lossy(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut headers = Vec::new();
    let mut rows = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((row, why)) = line.rsplit_once("  | ") else {
            if !line.is_empty() {
                headers.push(line.to_owned());
            }
            continue;
        };
        let cols: Vec<&str> = row.split_whitespace().collect();
        let Ok(id) = cols[0].parse() else {
            headers.push(line.to_owned()); // the column titles
            continue;
        };
        assert!(cols.len() >= 6, "a list row has 6 columns: {line:?}");
        assert!(
            cols[4] == "return" || cols[4] == "sleds",
            "exit method of {line:?}"
        );
        assert!(!why.trim().is_empty(), "a reason: {line:?}");
        rows.push(ListedFunction {
            id,
            address: u64::from_str_radix(cols[1].trim_start_matches("0x"), 16)
                .unwrap_or_else(|e| panic!("address of {line:?}: {e}")),
            sleds: cols[2]
                .parse()
                .unwrap_or_else(|e| panic!("sleds of {line:?}: {e}")),
            exit: cols[4].to_owned(),
            name: cols[5..].join(" "),
            why: why.to_owned(),
        });
    }
    (headers, rows)
}
