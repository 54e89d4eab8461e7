//! `fdr-profiled [OPTIONS] -- FIXTURE ARGS` runs whose output the exit-mode, loss, migration and
//! event tests inspect themselves (the [`crate::scenario`] runs assert no loss and
//! `llvm-xray account`, which these tests cannot always ask for):
//! [`launch`] runs a private copy of a fixture under the daemon; [`Launched`] gives the
//! daemon's `exits:` line, `session.json` fields, and every FDR file read by our reader
//! ([`xray_fdr::reader::read`]) and by llvm-xray 14 and 19.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use xray_fdr::reader::{read, RawRecord, Reader, Trace};

use crate::fixtures::private_copy;
use crate::run::{assert_success, Finished, Running};
use crate::tools::{fdr_profiled, scratch_dir, target_dir, LLVM_XRAY_VERSIONS};
use crate::trace::{convert, read_session, Session};
use crate::xray_yaml::Converted;

/// The prefix of the daemon's stderr line naming the exit mode it chose.
pub const EXITS_PREFIX: &str = "fdr-profiled: exits: ";

/// The release build of the daemon: `$FDR_PROFILED_RELEASE` if set, else
/// `<target dir>/release/fdr-profiled`. The full-speed tests need it: an unoptimised daemon
/// drains the ring several times slower than the release build users run (measured: a debug
/// build lost 37% of the events of one thread at full speed, the release build none). Panics if
/// it does not exist.
pub fn release_daemon() -> PathBuf {
    let path = match std::env::var_os("FDR_PROFILED_RELEASE") {
        Some(p) => PathBuf::from(p),
        None => target_dir().join("release").join("fdr-profiled"),
    };
    assert!(
        path.is_file(),
        "release daemon not found at {}: run `cargo build --release -p profiler-daemon` \
         (`cargo xtask test` does), or point FDR_PROFILED_RELEASE at it",
        path.display()
    );
    path
}

/// A finished `fdr-profiled -- fixture` run.
pub struct Launched {
    /// Keeps the scratch directory alive.
    pub scratch: tempfile::TempDir,
    /// The private copy of the fixture that ran.
    pub bin: PathBuf,
    /// The output directory.
    pub out: PathBuf,
    /// The daemon's exit status and output (the fixture's stdout is in `done.stdout`).
    pub done: Finished,
    /// `session.json`.
    pub session: Session,
}

/// One thread's FDR file.
pub struct ThreadFile {
    /// Thread id (from the file name).
    pub tid: u32,
    /// The file.
    pub path: PathBuf,
    /// As our reader reads it.
    pub trace: Trace,
}

/// Runs `fdr-profiled --out DIR DAEMON_ARGS -- COPY FIXTURE_ARGS` on a private copy of `fixture`
/// (limit: `timeout`) and reads `session.json`. Panics if the daemon fails.
pub fn launch(
    label: &str,
    fixture: &Path,
    daemon_args: &[&str],
    fixture_args: &[&str],
    timeout: Duration,
) -> Launched {
    launch_with(
        &fdr_profiled(),
        label,
        fixture,
        daemon_args,
        fixture_args,
        timeout,
    )
}

/// [`launch`] with a given daemon binary (e.g. [`release_daemon`]).
pub fn launch_with(
    daemon: &Path,
    label: &str,
    fixture: &Path,
    daemon_args: &[&str],
    fixture_args: &[&str],
    timeout: Duration,
) -> Launched {
    let scratch = scratch_dir(label);
    let bin = private_copy(fixture, scratch.path());
    let out = scratch.path().join("out");
    let mut cmd = std::process::Command::new(daemon);
    cmd.arg("--out")
        .arg(&out)
        .args(daemon_args)
        .arg("--")
        .arg(&bin)
        .args(fixture_args);
    let done = Running::spawn("fdr-profiled", &mut cmd).finish(timeout);
    assert_success(&format!("fdr-profiled {daemon_args:?} -- {label}"), &done);
    let session = read_session(&out);
    Launched {
        scratch,
        bin,
        out,
        done,
        session,
    }
}

impl Launched {
    /// The daemon's `fdr-profiled: exits: ...` line, without the prefix. Panics if absent.
    pub fn exits_line(&self) -> &str {
        self.done
            .stderr
            .lines()
            .find_map(|l| l.strip_prefix(EXITS_PREFIX))
            .unwrap_or_else(|| {
                panic!(
                    "no stderr line starting with {EXITS_PREFIX:?}:\n{}",
                    self.done.stderr
                )
            })
    }

    /// A top-level string field of `session.json`. Panics if absent.
    pub fn session_str(&self, key: &str) -> &str {
        self.session
            .json
            .get(key)
            .and_then(serde_json::Value::as_str)
            .unwrap_or_else(|| panic!("session.json: no string {key:?}: {}", self.session.json))
    }

    /// A top-level integer field of `session.json`. Panics if absent.
    pub fn session_u64(&self, key: &str) -> u64 {
        self.session
            .json
            .get(key)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or_else(|| panic!("session.json: no integer {key:?}: {}", self.session.json))
    }

    /// Per thread: integer field `key` of its `session.json` entry (see
    /// [`Session::thread_u64`]).
    pub fn thread_u64(&self, key: &str) -> BTreeMap<u32, u64> {
        self.session.thread_u64(key)
    }

    /// The pid of the (only) traced process.
    pub fn pid(&self) -> u32 {
        assert_eq!(
            self.session.processes.len(),
            1,
            "one process: {}",
            self.session.json
        );
        self.session.processes[0].pid
    }

    /// Every thread file listed in `session.json`, read by our reader (panics on a file it
    /// rejects, with the reader's error).
    pub fn files(&self) -> Vec<ThreadFile> {
        let mut files = Vec::new();
        for p in &self.session.processes {
            for t in &p.threads {
                let path = self.out.join(&t.file);
                let bytes =
                    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
                let trace = read(&bytes)
                    .unwrap_or_else(|e| panic!("our reader rejects {}: {e}", path.display()));
                files.push(ThreadFile {
                    tid: t.tid,
                    path,
                    trace,
                });
            }
        }
        files
    }

    /// Every thread file converted by llvm-xray `major` (`convert -symbolize` with this run's
    /// binary as the map), by tid.
    pub fn converted(&self, major: u32) -> BTreeMap<u32, Converted> {
        self.files()
            .into_iter()
            .map(|f| (f.tid, convert(major, &self.bin, &f.path)))
            .collect()
    }

    /// Every thread file converted by llvm-xray 14 and 19 as in [`Launched::converted`]; the
    /// two must agree on every record ([`xray_reference::both::convert`]). LLVM 19's reading,
    /// by tid.
    pub fn converted_both(&self) -> BTreeMap<u32, Converted> {
        let map = format!("-instr_map={}", self.bin.display());
        self.files()
            .into_iter()
            .map(|f| {
                let c = xray_reference::both::convert(&f.path, &["-symbolize", &map]);
                (f.tid, c)
            })
            .collect()
    }

    /// Runs `llvm-xray account` (14 and 19) on every file, with `extra` options; panics if one
    /// is rejected.
    pub fn account_all(&self, extra: &[&str]) {
        let map = format!("-instr_map={}", self.bin.display());
        let mut args = extra.to_vec();
        args.push(&map);
        for f in self.files() {
            for major in LLVM_XRAY_VERSIONS {
                xray_reference::account(major, &f.path, &args);
            }
        }
    }
}

/// Entries (Entry, Entry_Args) and exits (Exit, Tail_Exit) per function id in one FDR file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Entry and Entry_Args records.
    pub entries: u64,
    /// Exit and Tail_Exit records.
    pub exits: u64,
}

/// Counts the function records of a file by function id, streaming (for files too big to
/// collect): our reader checks every record on the way. Panics on a file it rejects.
pub fn stream_counts(path: &Path) -> BTreeMap<u32, Counts> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut reader = Reader::new(&bytes)
        .unwrap_or_else(|e| panic!("our reader rejects {}: {e}", path.display()));
    let mut m: BTreeMap<u32, Counts> = BTreeMap::new();
    loop {
        let step = match reader.next_step() {
            Ok(Some(step)) => step,
            Ok(None) => break,
            Err(e) => panic!("our reader rejects {}: {e}", path.display()),
        };
        if step.ignored {
            continue;
        }
        if let RawRecord::Function {
            action,
            function_id,
            ..
        } = step.record
        {
            let c = m.entry(function_id).or_default();
            if action.is_entry() {
                c.entries += 1;
            } else {
                c.exits += 1;
            }
        }
    }
    m
}

/// Function id -> name, from `llvm-xray extract --symbolize` (version 19) of `bin`.
pub fn function_names(bin: &Path) -> BTreeMap<u32, String> {
    crate::fixtures::extract_sleds(19, bin)
        .into_iter()
        .map(|s| (s.id, s.function_name))
        .collect()
}

/// Function id -> name from `fdr-profiled list BIN`, for binaries llvm-xray cannot read (an
/// instrumentation map with typed-event sleds). The `list` tool's ids are checked against
/// `llvm-xray extract` by the `list` tests.
pub fn function_names_from_list(bin: &Path) -> BTreeMap<u32, String> {
    crate::tools::list(bin.as_os_str())
        .1
        .into_iter()
        .map(|f| (f.id, f.name))
        .collect()
}
