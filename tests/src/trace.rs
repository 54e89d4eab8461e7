//! Checking a daemon output directory with the reference tools.
//!
//! Layout (the daemon's contract): `DIR/session.json` and one FDR file per
//! traced thread at `DIR/<exe-name>-<pid>/tid-<tid>.fdr`.
//! [`check_trace_dir`] loads every file with llvm-xray 14 and 19 (`convert`
//! and `account`, through [`xray_reference`]), and returns the records (from
//! llvm-xray's YAML, see [`crate::xray_yaml`]) per thread;
//! [`assert_process_calls`] compares them with a fixture's `count` lines.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::counts::ExpectedCalls;
use crate::xray_yaml::{Converted, Header, Record, RecordKind};

/// `session.json`, the fields the tests rely on.
#[derive(Debug, Clone)]
pub struct Session {
    pub events: u64,
    pub events_lost: u64,
    /// Optional (0 if absent): exits received without a traced entry (the
    /// process was already inside the function at attach) and therefore
    /// not written, as the FDR grammar requires.
    pub dropped_unmatched_exits: u64,
    pub processes: Vec<SessionProcess>,
    /// FDR version the daemon says it wrote (`fdr_version`; 1 when absent).
    pub fdr_version: u16,
    /// The whole document.
    pub json: serde_json::Value,
}

impl Session {
    /// The exits the daemon wrote in thread `tid`'s file to close frames proven gone (its
    /// `closing_exits`: runs of `[index among the file's function records, count]`).
    pub fn closing_exits(&self, tid: u32) -> Vec<[u64; 2]> {
        self.json["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|p| p["threads"].as_array().into_iter().flatten())
            .filter(|t| t["tid"].as_u64() == Some(u64::from(tid)))
            .flat_map(|t| t["closing_exits"].as_array().into_iter().flatten())
            .map(|r| {
                let n = |i: usize| r[i].as_u64().expect("closing_exits: [first, count]");
                [n(0), n(1)]
            })
            .collect()
    }

    /// Per thread of every process: integer field `key` of its `session.json` entry. Panics
    /// if a thread lacks it.
    pub fn thread_u64(&self, key: &str) -> BTreeMap<u32, u64> {
        let mut m = BTreeMap::new();
        for p in self.json["processes"].as_array().into_iter().flatten() {
            for t in p["threads"].as_array().into_iter().flatten() {
                let tid = t["tid"].as_u64().expect("thread tid") as u32;
                let v = t
                    .get(key)
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or_else(|| {
                        panic!("session.json thread {tid}: no integer {key:?}: {t}")
                    });
                m.insert(tid, v);
            }
        }
        m
    }
}

#[derive(Debug, Clone)]
pub struct SessionProcess {
    pub pid: u32,
    pub binary: String,
    pub threads: Vec<SessionThread>,
}

#[derive(Debug, Clone)]
pub struct SessionThread {
    pub tid: u32,
    /// Path relative to the output directory.
    pub file: String,
    pub records: u64,
}

/// Reads and checks the shape of `DIR/session.json`. Panics with the text
/// if a required field is missing or has the wrong type.
pub fn read_session(dir: &Path) -> Session {
    let path = dir.join("session.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON ({e}):\n{text}", path.display()));
    let bad = |what: &str| -> ! { panic!("{}: {what}:\n{text}", path.display()) };
    let uint = |v: &serde_json::Value, key: &str| -> u64 {
        v.get(key)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or_else(|| bad(&format!("missing or non-integer {key:?}")))
    };
    let processes = json
        .get("processes")
        .and_then(serde_json::Value::as_array)
        .unwrap_or_else(|| bad("missing array \"processes\""))
        .iter()
        .map(|p| SessionProcess {
            pid: uint(p, "pid") as u32,
            binary: p
                .get("binary")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_else(|| bad("process without string \"binary\""))
                .to_string(),
            threads: p
                .get("threads")
                .and_then(serde_json::Value::as_array)
                .unwrap_or_else(|| bad("process without array \"threads\""))
                .iter()
                .map(|t| SessionThread {
                    tid: uint(t, "tid") as u32,
                    file: t
                        .get("file")
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or_else(|| bad("thread without string \"file\""))
                        .to_string(),
                    records: uint(t, "records"),
                })
                .collect(),
        })
        .collect();
    let dropped_unmatched_exits = match json.get("dropped_unmatched_exits") {
        None => 0,
        Some(_) => uint(&json, "dropped_unmatched_exits"),
    };
    Session {
        events: uint(&json, "events"),
        events_lost: uint(&json, "events_lost"),
        dropped_unmatched_exits,
        processes,
        fdr_version: json
            .get("fdr_version")
            .and_then(serde_json::Value::as_u64)
            .map_or(1, |v| v as u16),
        json,
    }
}

/// Entry and exit counts of one function on one thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallCounts {
    pub enter: u64,
    pub enter_arg: u64,
    pub exit: u64,
    pub tail_exit: u64,
}

impl CallCounts {
    /// function-enter + function-enter-arg
    pub fn entries(&self) -> u64 {
        self.enter + self.enter_arg
    }
    /// function-exit + function-tail-exit
    pub fn exits(&self) -> u64 {
        self.exit + self.tail_exit
    }
}

/// One thread's FDR file, as llvm-xray 19 converted it.
#[derive(Debug, Clone)]
pub struct ThreadTrace {
    pub pid: u32,
    pub tid: u32,
    /// The process directory name (`<exe-name>-<pid>`).
    pub process_dir: String,
    pub path: PathBuf,
    pub header: Header,
    pub records: Vec<Record>,
}

impl ThreadTrace {
    /// Per function name: entries and exits in this file.
    pub fn calls(&self) -> BTreeMap<String, CallCounts> {
        let mut m: BTreeMap<String, CallCounts> = BTreeMap::new();
        for r in &self.records {
            let c = m.entry(r.function.clone()).or_default();
            match r.kind {
                RecordKind::Enter => c.enter += 1,
                RecordKind::EnterArg => c.enter_arg += 1,
                RecordKind::Exit => c.exit += 1,
                RecordKind::TailExit => c.tail_exit += 1,
                _ => {}
            }
        }
        m
    }

    /// Entry and exit records (of every kind) in this file.
    pub fn function_records(&self) -> u64 {
        self.records.iter().filter(|r| r.kind.is_function()).count() as u64
    }

    /// The records of `function`, in file order.
    pub fn records_of<'a>(&'a self, function: &'a str) -> impl Iterator<Item = &'a Record> + 'a {
        self.records.iter().filter(move |r| r.function == function)
    }
}

/// A checked output directory.
#[derive(Debug, Clone)]
pub struct TraceDir {
    pub dir: PathBuf,
    pub session: Session,
    /// Every FDR file, ordered by (pid, tid).
    pub threads: Vec<ThreadTrace>,
}

impl TraceDir {
    /// The pids that have a process directory.
    pub fn pids(&self) -> BTreeSet<u32> {
        self.threads.iter().map(|t| t.pid).collect()
    }
    /// The files of one process.
    pub fn process(&self, pid: u32) -> impl Iterator<Item = &ThreadTrace> {
        self.threads.iter().filter(move |t| t.pid == pid)
    }
    /// One thread's file.
    pub fn thread(&self, pid: u32, tid: u32) -> Option<&ThreadTrace> {
        self.threads.iter().find(|t| t.pid == pid && t.tid == tid)
    }
    /// Function records over all files.
    pub fn function_records(&self) -> u64 {
        self.threads.iter().map(ThreadTrace::function_records).sum()
    }
}

/// `-instr_map=BIN`.
fn instr_map_arg(bin: &Path) -> String {
    format!("-instr_map={}", bin.display())
}

/// Runs `llvm-xray <major> convert --output-format=yaml -symbolize
/// -instr_map=BIN FILE` and parses it. Panics (with the tool's stderr and
/// `fdr-dump`'s view of the file) if the tool rejects the file.
pub fn convert(major: u32, bin: &Path, file: &Path) -> Converted {
    xray_reference::convert(major, file, &["-symbolize", &instr_map_arg(bin)])
}

/// Runs `llvm-xray <major> account -instr_map=BIN FILE`; returns its stdout.
/// Panics (with stderr and `fdr-dump` output) if the tool rejects the file.
pub fn account(major: u32, bin: &Path, file: &Path) -> String {
    xray_reference::account(major, file, &[&instr_map_arg(bin)])
}

/// Checks an output directory written by fdr-profiled for `bin`:
/// - `session.json` is there, lists exactly the FDR files found, and every
///   process it lists ran `bin`;
/// - every entry of DIR (besides regular files) is a process directory
///   `<exe-name>-<pid>` holding only `tid-<tid>.fdr` files;
/// - llvm-xray 14 and 19 both `convert` and `account` every file, and agree
///   on its records; every file is FDR version 1; every record belongs to the
///   file's thread; timestamps never go backwards.
///
/// Returns the records per thread. Panics with a description otherwise.
pub fn check_trace_dir(dir: &Path, bin: &Path) -> TraceDir {
    let session = read_session(dir);
    let bin_canon = std::fs::canonicalize(bin).unwrap_or_else(|_| bin.to_path_buf());

    // Files on disk.
    let mut found: BTreeMap<(u32, u32), (String, PathBuf)> = BTreeMap::new();
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.expect("dir entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        let ft = entry.file_type().expect("file type");
        if !ft.is_dir() {
            continue;
        }
        let pid: u32 = name
            .rsplit_once('-')
            .filter(|(exe, _)| !exe.is_empty())
            .and_then(|(_, pid)| pid.parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "{}: directory {name:?} is not `<exe-name>-<pid>`",
                    dir.display()
                )
            });
        for f in std::fs::read_dir(entry.path()).expect("read process dir") {
            let f = f.expect("dir entry");
            let fname = f.file_name().to_string_lossy().into_owned();
            let tid: u32 = fname
                .strip_prefix("tid-")
                .and_then(|s| s.strip_suffix(".fdr"))
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| {
                    panic!(
                        "{}/{name}: unexpected entry {fname:?} (want tid-<tid>.fdr)",
                        dir.display()
                    )
                });
            assert!(
                f.file_type().unwrap().is_file(),
                "{name}/{fname} is not a file"
            );
            let prev = found.insert((pid, tid), (name.clone(), f.path()));
            assert!(
                prev.is_none(),
                "two directories for pid {pid}: {prev:?} and {name}"
            );
        }
    }

    // Against session.json.
    let mut listed: BTreeMap<(u32, u32), String> = BTreeMap::new();
    for p in &session.processes {
        let binary_canon =
            std::fs::canonicalize(&p.binary).unwrap_or_else(|_| PathBuf::from(&p.binary));
        assert_eq!(
            binary_canon, bin_canon,
            "session.json: process {} ran {:?}, not the traced binary",
            p.pid, p.binary
        );
        for t in &p.threads {
            let prev = listed.insert((p.pid, t.tid), t.file.clone());
            assert!(
                prev.is_none(),
                "session.json lists pid {} tid {} twice",
                p.pid,
                t.tid
            );
        }
    }
    let found_files: BTreeMap<(u32, u32), String> = found
        .iter()
        .map(|(k, (pdir, path))| {
            (
                *k,
                format!("{pdir}/{}", path.file_name().unwrap().to_string_lossy()),
            )
        })
        .collect();
    let normalize = |s: &str| s.trim_start_matches("./").to_string();
    let listed_norm: BTreeMap<(u32, u32), String> =
        listed.iter().map(|(k, v)| (*k, normalize(v))).collect();
    assert_eq!(
        listed_norm,
        found_files,
        "session.json threads (left) differ from the FDR files in {} (right)",
        dir.display()
    );

    // Load every file with both llvm-xray versions.
    let mut threads = Vec::new();
    for ((pid, tid), (process_dir, path)) in found {
        let c: Converted =
            xray_reference::both::convert(&path, &["-symbolize", &instr_map_arg(bin)]);
        xray_reference::both::account(&path, Some(bin));
        assert_eq!(
            c.header.version,
            session.fdr_version,
            "{}: FDR version (session.json says {})",
            path.display(),
            session.fdr_version
        );
        assert_eq!(c.header.file_type, 1, "{}: file type", path.display());
        let mut last_tsc = 0;
        for r in &c.records {
            assert_eq!(
                r.thread,
                tid,
                "{}: record of thread {} in the file of thread {tid}: {r:?}",
                path.display(),
                r.thread
            );
            assert!(
                r.tsc >= last_tsc,
                "{}: tsc goes backwards at {r:?}",
                path.display()
            );
            last_tsc = r.tsc;
        }
        threads.push(ThreadTrace {
            pid,
            tid,
            process_dir,
            path,
            header: c.header,
            records: c.records,
        });
    }
    TraceDir {
        dir: dir.to_path_buf(),
        session,
        threads,
    }
}

/// How the fixture's `main` should appear in its main thread's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MainCall {
    /// Probes were in place before main started: one entry, one exit.
    Traced,
    /// The process was already inside main when the tracer attached: the
    /// daemon must not write an exit without its entry, so entries == exits
    /// and at most one call.
    InProgress,
}

/// What one traced fixture process should show.
#[derive(Debug, Clone)]
pub struct ProcessExpectation<'a> {
    pub pid: u32,
    /// From the fixture's `count` lines ([`crate::counts::expected_calls`]).
    pub calls: &'a ExpectedCalls,
    /// The functions the fixture counts; absent from a thread's `count`
    /// lines means zero calls there.
    pub known: &'a [&'a str],
    /// The name of `main` in the trace ([`crate::fixtures::CPP_MAIN`] or
    /// [`crate::fixtures::RUST_MAIN`]).
    pub main_fn: &'a str,
    pub main: MainCall,
    /// No other function may appear (the C++ fixture). Otherwise every other
    /// function must have as many entries as exits on each thread.
    pub only_known: bool,
}

/// Compares one process's files with what the fixture printed:
/// - the threads with files are exactly the threads with `count` lines, and
///   the main thread (tid == pid) is one of them;
/// - per thread and known function: entries (enter + enter-arg) and exits
///   (exit + tail-exit) both equal the fixture's count;
/// - `main` per [`MainCall`] on the main thread, absent elsewhere;
/// - other functions: forbidden, or balanced (see `only_known`).
///
/// Panics listing every mismatch.
pub fn assert_process_calls(trace: &TraceDir, exp: &ProcessExpectation) {
    let mut problems = String::new();
    let file_tids: BTreeSet<u32> = trace.process(exp.pid).map(|t| t.tid).collect();
    let count_tids: BTreeSet<u32> = exp.calls.keys().copied().collect();
    if file_tids != count_tids {
        let _ = writeln!(
            problems,
            "threads with FDR files {file_tids:?} != threads in the count lines {count_tids:?}"
        );
    }
    if !count_tids.contains(&exp.pid) {
        let _ = writeln!(problems, "no count lines for the main thread {}", exp.pid);
    }
    let empty = BTreeMap::new();
    for t in trace.process(exp.pid) {
        let calls = t.calls();
        let expected = exp.calls.get(&t.tid).unwrap_or(&empty);
        for name in expected.keys() {
            if !exp.known.contains(&name.as_str()) {
                let _ = writeln!(
                    problems,
                    "tid {}: count line for unknown function {name:?}",
                    t.tid
                );
            }
        }
        for name in exp.known {
            let want = expected.get(*name).copied().unwrap_or(0);
            let got = calls.get(*name).copied().unwrap_or_default();
            if got.entries() != want || got.exits() != want {
                let _ = writeln!(
                    problems,
                    "tid {} {name}: fixture counted {want} calls, trace has {} entries ({} enter, {} enter-arg) and {} exits ({} exit, {} tail-exit)",
                    t.tid,
                    got.entries(),
                    got.enter,
                    got.enter_arg,
                    got.exits(),
                    got.exit,
                    got.tail_exit
                );
            }
        }
        let main = calls.get(exp.main_fn).copied().unwrap_or_default();
        let main_ok = if t.tid != exp.pid {
            main.entries() == 0 && main.exits() == 0
        } else {
            match exp.main {
                MainCall::Traced => main.entries() == 1 && main.exits() == 1,
                MainCall::InProgress => main.entries() == main.exits() && main.entries() <= 1,
            }
        };
        if !main_ok {
            let _ = writeln!(
                problems,
                "tid {} {} ({:?}, main thread {}): {main:?}",
                t.tid, exp.main_fn, exp.main, exp.pid
            );
        }
        for (name, c) in &calls {
            if exp.known.contains(&name.as_str()) || name == exp.main_fn {
                continue;
            }
            if exp.only_known {
                let _ = writeln!(
                    problems,
                    "tid {}: unexpected function {name:?}: {c:?}",
                    t.tid
                );
            } else if c.entries() != c.exits() {
                let _ = writeln!(
                    problems,
                    "tid {} {name}: {} entries but {} exits: {c:?}",
                    t.tid,
                    c.entries(),
                    c.exits()
                );
            }
        }
    }
    if !problems.is_empty() {
        panic!(
            "pid {} in {}: trace does not match the fixture:\n{problems}",
            exp.pid,
            trace.dir.display()
        );
    }
}

/// `session.json` totals: no events lost; `events` equals the number of
/// function records in the files, plus `dropped_unmatched_exits` if the
/// session reports any (exits of frames entered before attach, which the
/// FDR grammar forbids writing); each thread's `records` equals the function
/// records in its file.
pub fn assert_session_totals(trace: &TraceDir) {
    let s = &trace.session;
    assert_eq!(
        s.events_lost, 0,
        "session.json reports lost events: {}",
        s.json
    );
    assert_eq!(
        s.events,
        trace.function_records() + s.dropped_unmatched_exits,
        "session.json events (left) != function records in the FDR files + dropped_unmatched_exits {} (right): {}",
        s.dropped_unmatched_exits,
        s.json
    );
    assert_every_event_accounted(s);
    for p in &s.processes {
        for t in &p.threads {
            let file = trace
                .thread(p.pid, t.tid)
                .expect("check_trace_dir matched session.json with the files");
            assert_eq!(
                t.records,
                file.function_records(),
                "session.json records of pid {} tid {} (left) != function records in {} (right)",
                p.pid,
                t.tid,
                file.path.display()
            );
        }
    }
}

/// Per thread of `session.json`: every event received ends in exactly one named fate, and the
/// records of the file are the function events written plus the exits the daemon wrote for
/// frames it closed. Panics naming the thread otherwise.
pub fn assert_every_event_accounted(s: &Session) {
    const FATES: [&str; 9] = [
        "events_written",
        "exits_of_lost_entries",
        "dropped_unmatched_exits",
        "dropped_too_deep",
        "events_invalid",
        "unreadable_events",
        "catches",
        "dropped_write_errors",
        "events_unknown",
    ];
    const CLOSED: [&str; 3] = [
        "frames_unwound",
        "frames_closed_by_loss",
        "frames_beyond_return_limit",
    ];
    for p in s.json["processes"].as_array().into_iter().flatten() {
        for t in p["threads"].as_array().into_iter().flatten() {
            let get = |k: &str| {
                t[k].as_u64()
                    .unwrap_or_else(|| panic!("session.json thread without integer {k:?}: {t}"))
            };
            let fates: u64 = FATES.iter().map(|k| get(k)).sum();
            assert_eq!(
                get("events"),
                fates,
                "session.json thread: events (left) != the sum of {FATES:?} (right): {t}"
            );
            let closed: u64 = CLOSED.iter().map(|k| get(k)).sum();
            let function_events =
                get("events_written") - get("custom_events") - get("typed_events");
            // Records made but lost in a write that failed (the disk full) are not in the file.
            let not_stored = t["records_not_stored"].as_u64().unwrap_or(0);
            assert_eq!(
                get("records") + not_stored,
                function_events + closed,
                "session.json thread: records + records_not_stored (left) != function events written + frames closed (right): {t}"
            );
        }
    }
}

/// The `N` of the last `events lost: N` in the daemon's stderr summary.
pub fn summary_events_lost(stderr: &str) -> Option<u64> {
    stderr.lines().rev().find_map(|l| {
        let i = l.find("events lost:")?;
        l[i + "events lost:".len()..]
            .split_whitespace()
            .next()?
            .trim_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .ok()
    })
}

/// What `--exits repair` did, as the summary and `session.json` say it, checked against each
/// other and against the session's own count of catches: returns the summary's line (after
/// `repair: `) and the total throws repaired. Every thread's exceptions caught (the catch
/// probe, counted by the session) must be the catches its repairs saw, and the totals the
/// sum of the threads'.
pub fn repair_books(s: &Session, stderr: &str) -> (String, u64) {
    const COUNTS: [&str; 7] = [
        "throws",
        "frames_restored",
        "catches",
        "frames_hooked_again",
        "slots_left_alone",
        "signals_passed_on",
        "repair_ns_total",
    ];
    let line = stderr
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("repair: "))
        .unwrap_or_else(|| panic!("no repair line in the summary:\n{stderr}"))
        .to_owned();
    let total = &s.json["repair"];
    assert!(total.is_object(), "session.json has no repair: {}", s.json);
    let mut sums = [0u64; COUNTS.len()];
    let mut worst = 0;
    for p in s.json["processes"].as_array().into_iter().flatten() {
        for t in p["threads"].as_array().into_iter().flatten() {
            let repair = &t["repair"];
            let catches = t["catches"].as_u64().unwrap();
            if repair.is_null() {
                assert_eq!(catches, 0, "a thread that caught needs repairs: {t}");
                continue;
            }
            assert_eq!(
                repair["catches"].as_u64(),
                Some(catches),
                "the thread's catches (session) and its repairs' catches: {t}"
            );
            for (sum, k) in sums.iter_mut().zip(COUNTS) {
                *sum += repair[k].as_u64().unwrap();
            }
            worst = worst.max(repair["repair_ns_max"].as_u64().unwrap());
        }
    }
    // Threads not recorded (those of forked processes) are accounted apart.
    let unrecorded = &s.json["repair_unrecorded_threads"];
    for (sum, k) in sums.iter().zip(COUNTS) {
        assert_eq!(
            total[k].as_u64(),
            Some(*sum + unrecorded[k].as_u64().unwrap_or(0)),
            "session.json repair.{k}: {total} (threads not recorded: {unrecorded})"
        );
    }
    assert_eq!(
        total["repair_ns_max"].as_u64(),
        Some(worst.max(unrecorded["repair_ns_max"].as_u64().unwrap_or(0)))
    );
    let throws = total["throws"].as_u64().unwrap();
    assert!(
        line.starts_with(&format!("{throws} throws (")),
        "summary {line:?} against session.json {total}"
    );
    (line, throws)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_lost_summary() {
        assert_eq!(
            summary_events_lost("x\nfdr-profiled: 12 events, events lost: 0\n"),
            Some(0)
        );
        assert_eq!(summary_events_lost("events lost: 17, files: 3"), Some(17));
        assert_eq!(summary_events_lost("nothing"), None);
    }
}
