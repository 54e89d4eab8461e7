//! The fixture programs, built from `tests/fixtures/` at test time into
//! `<target dir>/fixtures/` and reused while they are fresh.
//!
//! | function | source | build |
//! |---|---|---|
//! | [`cpp_fixture`] | `threads.cpp` | `clang++-19 -O2 -g -fxray-instrument -fxray-instruction-threshold=1 -pthread` |
//! | [`rust_fixture`] | `threads.rs` | `rustc +nightly --edition 2021 -Zinstrument-xray=always -C opt-level=1 -g` |
//! | [`native_fdr_fixture`] | `threads.cpp` with `-DFX_NATIVE_FDR` | as the C++ fixture; runs compiler-rt's own FDR mode |
//! | [`plain_c_fixture`] | `plain.c` | `clang-19 -O2` (an ELF without `xray_instr_map`) |
//! | [`workloads`] | `calls.c`, `exceptions.cpp`, `events.cpp` | the exit-mode, loss, migration and event tests' fixtures |
//! | [`symbolize`] | `inlined_events.cpp`, split debug files | the symbolizer, report and convert tests' fixtures |
//! | [`arm64`] | any of the above, and Lua | the arm64 builds, for the tests in the emulated arm64 machine |
//! | [`dso`] | `dso_main.cpp`, `dso_linked.cpp`, `dso_loaded.cpp` | an executable, a linked and a `dlopen`ed instrumented shared object, driven through stdin |
//!
//! A build is redone when the output is missing, older than its source, or
//! was made by a different command line (kept next to it in `NAME.cmd`).
//! Builds are serialised across processes by `flock` on
//! `<target dir>/fixtures/.lock`, run in a private temporary directory and
//! `rename`d into place, so concurrent test processes never see a partial
//! file.
//!
//! Both threaded fixtures print, per thread, `count tid=<tid>
//! function=<name> calls=<n>` lines (see [`crate::counts`]) and accept
//! `--wait-file PATH` (print `fixture: waiting for PATH` on stderr, then poll
//! every 10 ms until PATH exists) and `--iterations N`. The C++ one also takes
//! `--gap-ms MS` and `--pin-cpu N`.

use std::ffi::OsString;
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::SystemTime;

use crate::tools::{clang, clangxx, target_dir};

pub mod arm64;
pub mod dso;
pub mod symbolize;
pub mod workloads;

/// The functions of the C++ fixture whose per-thread call counts it prints,
/// as `llvm-xray -symbolize` names them. Together with [`CPP_MAIN`] these are
/// all the functions in its instrumentation map.
pub const CPP_FUNCTIONS: &[&str] = &[
    "fx_thread_main",
    "fx::work(int, int)",
    "fx::outer(int)",
    "fx::middle(int)",
    "fx::leaf(int)",
    "fx_recurse",
    "fx_tail_caller",
    "fx_tail_target",
    "fx_logged",
    "fx_gap_probe",
    "fx_report",
];
/// The C++ fixture's `main` (instrumented, runs once on the main thread, not
/// in the `count` lines).
pub const CPP_MAIN: &str = "main";
/// The C++ function with a LOG_ARGS_ENTRY sled (`[[clang::xray_log_args(1)]]`);
/// it is only called with multiples of 3.
pub const CPP_LOGGED: &str = "fx_logged";
/// The C++ function called twice around the `--gap-ms` sleep.
pub const CPP_GAP_PROBE: &str = "fx_gap_probe";

/// The Rust fixture's known (`#[no_mangle]`) functions whose per-thread call
/// counts it prints. Its map also holds std generics instantiated in the
/// crate; for those the tests only check that entries and exits balance.
pub const RUST_FUNCTIONS: &[&str] = &[
    "rx_thread_body",
    "rx_work",
    "rx_outer",
    "rx_middle",
    "rx_leaf",
    "rx_recurse",
    "rx_tail_caller",
    "rx_tail_target",
    "rx_report",
];
/// The Rust fixture's `fn main` as llvm-xray names it (runs once on the main
/// thread, not in the `count` lines).
pub const RUST_MAIN: &str = "threads::main";

fn fixture_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// `<target dir>/fixtures/`: where the fixtures are built.
pub fn fixture_cache_dir() -> PathBuf {
    target_dir().join("fixtures")
}

/// The C++ fixture (`tests/fixtures/threads.cpp`): built on first use, then
/// reused. Main + 3 pthreads; nested calls, recursion, tail calls (TAIL
/// sleds), a LOG_ARGS_ENTRY function; only the functions of [`CPP_FUNCTIONS`]
/// and `main` are instrumented.
pub fn cpp_fixture() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        build_cached(
            "threads-cpp",
            &[fixture_source("threads.cpp")],
            |src, out| {
                let mut c = Command::new(clangxx());
                c.args(CPP_FLAGS).arg(&src[0]).arg("-o").arg(out);
                c
            },
        )
    })
    .clone()
}

const CPP_FLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fxray-instrument",
    "-fxray-instruction-threshold=1",
    "-pthread",
    "-Wall",
    "-Wextra",
];

/// The Rust fixture (`tests/fixtures/threads.rs`), built with nightly rustc
/// and `-Zinstrument-xray=always`. Main + 3 std threads. Known functions:
/// [`RUST_FUNCTIONS`].
pub fn rust_fixture() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        build_cached("threads-rs", &[fixture_source("threads.rs")], |src, out| {
            rustc_xray(&src[0], "threads", out)
        })
    })
    .clone()
}

/// The command that builds a Rust fixture with XRay sleds: nightly rustc,
/// `-Zinstrument-xray=always`, `-C opt-level=1 -g`, no cargo.
fn rustc_xray(src: &Path, crate_name: &str, out: &Path) -> Command {
    let mut c = Command::new("rustc");
    c.arg("+nightly")
        .args([
            "--edition",
            "2021",
            "--crate-name",
            crate_name,
            "-Zinstrument-xray=always",
            "-C",
            "opt-level=1",
            "-g",
        ])
        .arg(src)
        .arg("-o")
        .arg(out);
    // Do not let cargo's test environment leak into the nightly compiler (its
    // dynamic library path points at the toolchain that runs the tests).
    for var in ["LD_LIBRARY_PATH", "RUSTUP_TOOLCHAIN", "RUSTC", "RUSTFLAGS"] {
        c.env_remove(var);
    }
    c
}

/// The C++ fixture compiled with `-DFX_NATIVE_FDR`: it switches on
/// compiler-rt's own FDR mode (`__xray_log_init_mode("xray-fdr", ...)`,
/// `__xray_patch()`) after parsing its options and flushes the log at the
/// end. Run it with [`native_fdr_trace`]. Reference only: its traces are
/// FDR version 5, all threads in one file.
pub fn native_fdr_fixture() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        build_cached(
            "threads-cpp-native",
            &[fixture_source("threads.cpp")],
            |src, out| {
                let mut c = Command::new(clangxx());
                c.arg("-DFX_NATIVE_FDR")
                    .args(CPP_FLAGS)
                    .arg(&src[0])
                    .arg("-o")
                    .arg(out);
                c
            },
        )
    })
    .clone()
}

/// Runs [`native_fdr_fixture`] with `args`, letting compiler-rt write its FDR
/// log into `dir` (`XRAY_OPTIONS=xray_logfile_base=DIR/`). Returns the trace
/// file and the program's stdout. Panics if the program fails or does not
/// write exactly one file.
pub fn native_fdr_trace(dir: &Path, args: &[&str]) -> (PathBuf, String) {
    workloads::native_trace(&native_fdr_fixture(), dir, args)
}

/// A plain C program (`tests/fixtures/plain.c`, `clang-19 -O2`): a valid ELF
/// executable without `xray_instr_map`.
pub fn plain_c_fixture() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        build_cached("plain-c", &[fixture_source("plain.c")], |src, out| {
            let mut c = Command::new(clang());
            c.args(["-O2", "-Wall"]).arg(&src[0]).arg("-o").arg(out);
            c
        })
    })
    .clone()
}

/// Copies `bin` into `dir` (same file name, mode 0755) and returns the copy.
///
/// A uprobe on a file fires in every process running that inode, so tests
/// that run in parallel must each trace their own copy.
pub fn private_copy(bin: &Path, dir: &Path) -> PathBuf {
    let name = bin
        .file_name()
        .unwrap_or_else(|| panic!("{} has no file name", bin.display()));
    let dest = dir.join(name);
    let mut tmp_name = OsString::from(".");
    tmp_name.push(name);
    static COPIES: AtomicUsize = AtomicUsize::new(0);
    tmp_name.push(format!(
        ".tmp-{}-{}",
        std::process::id(),
        COPIES.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = dir.join(tmp_name);
    std::fs::copy(bin, &tmp)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", bin.display(), tmp.display()));
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", tmp.display()));
    std::fs::rename(&tmp, &dest)
        .unwrap_or_else(|e| panic!("rename {} to {}: {e}", tmp.display(), dest.display()));
    dest
}

/// Builds `<fixture cache>/<name>` from `sources` with the command `make`
/// returns for (sources, output path), unless a fresh build is there.
fn build_cached(
    name: &str,
    sources: &[PathBuf],
    make: impl Fn(&[PathBuf], &Path) -> Command,
) -> PathBuf {
    let cache = fixture_cache_dir();
    std::fs::create_dir_all(&cache).unwrap_or_else(|e| panic!("mkdir {}: {e}", cache.display()));
    let out = cache.join(name);
    let stamp = cache.join(format!("{name}.cmd"));
    // The stamp records the command with a fixed placeholder output path.
    let recipe = format!("{:?}", make(sources, Path::new("OUTPUT")));

    let _lock = CacheLock::acquire(&cache.join(".lock"));
    if is_fresh(&out, &stamp, sources, &recipe) {
        return out;
    }
    let work = tempfile::Builder::new()
        .prefix(&format!(".build-{name}-"))
        .tempdir_in(&cache)
        .unwrap_or_else(|e| panic!("tempdir in {}: {e}", cache.display()));
    let tmp_out = work.path().join(name);
    let mut cmd = make(sources, &tmp_out);
    cmd.current_dir(work.path());
    let result = crate::tools::run_output(&mut cmd);
    if !result.status.success() || !tmp_out.is_file() {
        panic!(
            "building fixture {name} failed ({}): {cmd:?}\n{}{}",
            result.status,
            String::from_utf8_lossy(&result.stdout),
            String::from_utf8_lossy(&result.stderr)
        );
    }
    std::fs::rename(&tmp_out, &out)
        .unwrap_or_else(|e| panic!("rename {} to {}: {e}", tmp_out.display(), out.display()));
    let tmp_stamp = work.path().join("stamp");
    std::fs::write(&tmp_stamp, &recipe).expect("write fixture stamp");
    std::fs::rename(&tmp_stamp, &stamp).expect("rename fixture stamp");
    out
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

fn is_fresh(out: &Path, stamp: &Path, sources: &[PathBuf], recipe: &str) -> bool {
    let Some(built) = mtime(out) else {
        return false;
    };
    if std::fs::read_to_string(stamp).ok().as_deref() != Some(recipe) {
        return false;
    }
    sources.iter().all(|s| match mtime(s) {
        Some(t) => t <= built,
        None => panic!("fixture source {} missing", s.display()),
    })
}

/// An exclusive `flock` on a file, released on drop.
struct CacheLock(File);

impl CacheLock {
    fn acquire(path: &Path) -> CacheLock {
        let f = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        loop {
            // SAFETY: flock on a file descriptor we own.
            let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return CacheLock(f);
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                panic!("flock {}: {err}", path.display());
            }
        }
    }
}

impl Drop for CacheLock {
    fn drop(&mut self) {
        // SAFETY: as above; closing the file would release it anyway.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// `llvm-xray extract --symbolize BIN` with LLVM `major`, parsed (from the reference crate).
pub use xray_reference::extract_sleds;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::LLVM_XRAY_VERSIONS;
    use crate::xray_yaml::SledKind;
    use std::collections::{BTreeMap, BTreeSet};

    fn kinds_by_function(sleds: &[crate::xray_yaml::Sled]) -> BTreeMap<String, BTreeSet<SledKind>> {
        let mut m: BTreeMap<String, BTreeSet<SledKind>> = BTreeMap::new();
        for s in sleds {
            m.entry(s.function_name.clone())
                .or_default()
                .insert(s.kind.clone());
        }
        m
    }

    #[test]
    fn cpp_fixture_map_holds_only_known_functions() {
        let bin = cpp_fixture();
        for major in LLVM_XRAY_VERSIONS {
            let by_fn = kinds_by_function(&extract_sleds(major, &bin));
            let names: BTreeSet<&str> = by_fn.keys().map(String::as_str).collect();
            let mut want: BTreeSet<&str> = CPP_FUNCTIONS.iter().copied().collect();
            want.insert(CPP_MAIN);
            assert_eq!(names, want, "llvm-xray {major}: functions in the C++ map");
            for (f, kinds) in &by_fn {
                let entry = if f == CPP_LOGGED {
                    SledKind::LogArgsEntry
                } else {
                    SledKind::Entry
                };
                assert!(kinds.contains(&entry), "{f}: {kinds:?}");
                assert!(
                    kinds.contains(&SledKind::Exit) || kinds.contains(&SledKind::Tail),
                    "{f}: {kinds:?}"
                );
            }
            assert!(by_fn["fx_tail_caller"].contains(&SledKind::Tail));
            assert!(!by_fn["fx_tail_caller"].contains(&SledKind::Exit));
            assert!(by_fn["fx_recurse"].contains(&SledKind::Tail));
        }
    }

    #[test]
    fn rust_fixture_map_holds_known_functions() {
        let bin = rust_fixture();
        for major in LLVM_XRAY_VERSIONS {
            let by_fn = kinds_by_function(&extract_sleds(major, &bin));
            for f in RUST_FUNCTIONS.iter().chain([&RUST_MAIN]) {
                let kinds = by_fn
                    .get(*f)
                    .unwrap_or_else(|| panic!("llvm-xray {major}: {f} not in the Rust map"));
                assert!(kinds.contains(&SledKind::Entry), "{f}: {kinds:?}");
            }
            assert!(by_fn["rx_recurse"].contains(&SledKind::Exit));
        }
    }

    #[test]
    fn plain_c_fixture_has_no_xray_map() {
        let bin = plain_c_fixture();
        let data = std::fs::read(&bin).unwrap();
        assert_eq!(&data[..4], b"\x7fELF");
        let out = crate::tools::run_output(
            Command::new(crate::tools::llvm_xray(19))
                .arg("extract")
                .arg(&bin),
        );
        assert!(
            !out.status.success(),
            "llvm-xray extract accepted {}",
            bin.display()
        );
    }

    #[test]
    fn private_copy_is_a_new_inode() {
        use std::os::unix::fs::MetadataExt;
        let bin = cpp_fixture();
        let dir = crate::tools::scratch_dir("copy");
        let copy = private_copy(&bin, dir.path());
        assert_eq!(copy.file_name(), bin.file_name());
        assert_ne!(
            std::fs::metadata(&copy).unwrap().ino(),
            std::fs::metadata(&bin).unwrap().ino()
        );
        assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(&bin).unwrap());
        // Copying again over the same name works.
        assert_eq!(private_copy(&bin, dir.path()), copy);
    }
}
