//! Synthetic sessions: hand-made session directories in the daemon's layout (`session.json`
//! and one FDR file per thread at `<exe>-<pid>/tid-<tid>.fdr`), for the function ids of a real
//! fixture binary ([`function_id`], [`function_ids`]).
//!
//! Used by the `report`, `convert` and `viewer` tests (FDR files written with the daemon's own
//! writer from [`Ev`]s, [`write_session`]) and by the self-test of the trace checks in
//! `synthetic.rs` (FDR files encoded by hand from the format description, through
//! [`ThreadFile`] and [`write_session_with_counters`]). Also what `llvm-xray account` says about
//! a file ([`parse_account`], [`assert_thread_matches_account`]) and running our commands
//! ([`run_tool`], [`report_json`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tools::run_output;
use crate::{extract_sleds, fdr_profiled};
use xray_fdr::writer::{ThreadWriter, WallClock};
use xray_fdr::{FdrVersion, FunctionAction};
use xray_object::elf::ElfImage;

/// One thing a synthetic thread does.
#[derive(Clone, Debug)]
pub enum Ev {
    /// Entry of function id at ns.
    Enter(u32, u64),
    /// Entry with logged arguments.
    EnterArgs(u32, u64, Vec<u64>),
    /// Exit of function id at ns.
    Exit(u32, u64),
    /// A custom event at ns with a payload.
    Custom(u64, Vec<u8>),
}

/// What a synthetic thread's FDR file is written from.
pub trait ThreadFile {
    /// Writes the FDR file of thread `tid` of process `pid` at `path` (its directory exists).
    fn write_fdr(&self, path: &Path, pid: u32, tid: u32);
}

/// Events written with the daemon's own writer (`xray_fdr::ThreadWriter`): FDR version 1, a
/// 1 GHz clock, every record on CPU 0.
impl ThreadFile for Vec<Ev> {
    fn write_fdr(&self, path: &Path, pid: u32, tid: u32) {
        let file = std::fs::File::create(path).unwrap();
        let mut w = ThreadWriter::with_version(
            file,
            tid,
            pid,
            1_000_000_000,
            WallClock::default(),
            FdrVersion::V1,
        )
        .unwrap();
        for ev in self {
            match ev {
                Ev::Enter(id, ts) => w.function(FunctionAction::Entry, *id, *ts, 0),
                Ev::EnterArgs(id, ts, args) => w.entry_with_args(*id, *ts, 0, args),
                Ev::Exit(id, ts) => w.function(FunctionAction::Exit, *id, *ts, 0),
                Ev::Custom(ts, data) => w.custom_event(*ts, 0, data),
            }
            .unwrap();
        }
        w.finish().unwrap();
    }
}

/// One synthetic process: pid, recorded binary, recorded build-id, threads (tid, what its file
/// is written from: by default [`Ev`]s for the daemon's writer).
pub struct SynthProcess<T = Vec<Ev>> {
    pub pid: u32,
    pub binary: PathBuf,
    pub build_id: Option<String>,
    pub threads: Vec<(u32, T)>,
}

/// The daemon's counters as `session.json` states them. The commands that read sessions never
/// look at them; the trace checks ([`crate::trace::read_session`],
/// [`crate::trace::assert_session_totals`]) do.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// `events`.
    pub events: u64,
    /// `events_lost`; left out when `None`.
    pub events_lost: Option<u64>,
    /// Each thread's `records`, by (pid, tid); 0 for a thread not named here.
    pub records: BTreeMap<(u32, u32), u64>,
}

/// Writes a session directory `dir` holding `processes` (written with the daemon's writer),
/// with all counters 0 (`events: 0`, every thread's `records: 0`, no `events_lost`); returns
/// each thread file's path.
pub fn write_session(dir: &Path, processes: &[SynthProcess]) -> BTreeMap<(u32, u32), PathBuf> {
    write_session_with_counters(dir, processes, &Counters::default())
}

/// [`write_session`] with the counters `session.json` states given: each process's files in
/// `dir/<exe>-<pid>/tid-<tid>.fdr` (`<exe>`: the binary's file name), and `session.json`
/// (FDR version 1) listing them. Returns each thread file's path.
pub fn write_session_with_counters<T: ThreadFile>(
    dir: &Path,
    processes: &[SynthProcess<T>],
    counters: &Counters,
) -> BTreeMap<(u32, u32), PathBuf> {
    let mut files = BTreeMap::new();
    let mut manifest = Vec::new();
    for p in processes {
        let exe = p.binary.file_name().unwrap().to_string_lossy().into_owned();
        let pdir = format!("{exe}-{}", p.pid);
        std::fs::create_dir_all(dir.join(&pdir)).unwrap();
        let mut threads = Vec::new();
        for (tid, contents) in &p.threads {
            let rel = format!("{pdir}/tid-{tid}.fdr");
            let path = dir.join(&rel);
            contents.write_fdr(&path, p.pid, *tid);
            let records = counters.records.get(&(p.pid, *tid)).copied().unwrap_or(0);
            // As the daemon accounts for a thread whose every event became a function record.
            threads.push(serde_json::json!({
                "tid": tid, "file": rel, "records": records,
                "events": records, "events_written": records,
                "exits_of_lost_entries": 0, "dropped_unmatched_exits": 0, "dropped_too_deep": 0,
                "events_invalid": 0, "unreadable_events": 0, "catches": 0,
                "dropped_write_errors": 0, "events_unknown": 0, "custom_events": 0,
                "typed_events": 0, "frames_unwound": 0, "frames_closed_by_loss": 0,
                "frames_beyond_return_limit": 0,
            }));
            files.insert((p.pid, *tid), path);
        }
        manifest.push(serde_json::json!({
            "pid": p.pid,
            "binary": p.binary.display().to_string(),
            "binary_deleted": false,
            "build_id": p.build_id,
            "dir": pdir,
            "threads": threads,
        }));
    }
    let mut json =
        serde_json::json!({"fdr_version": 1, "events": counters.events, "processes": manifest});
    if let Some(lost) = counters.events_lost {
        json["events_lost"] = lost.into();
    }
    std::fs::write(
        dir.join("session.json"),
        serde_json::to_vec_pretty(&json).unwrap(),
    )
    .unwrap();
    files
}

/// The build-id of `bin`.
pub fn build_id(bin: &Path) -> String {
    ElfImage::open(bin).unwrap().build_id().expect("a build-id")
}

/// Function id of `name` in `bin`, per llvm-xray 19.
pub fn function_id(bin: &Path, name: &str) -> u32 {
    *function_ids(bin)
        .get(name)
        .unwrap_or_else(|| panic!("{name} not in {}", bin.display()))
}

/// Function ids of `bin` by name, per llvm-xray 19 (the first id of a name, should two
/// functions share it).
pub fn function_ids(bin: &Path) -> BTreeMap<String, u32> {
    let mut ids = BTreeMap::new();
    for s in extract_sleds(19, bin) {
        ids.entry(s.function_name).or_insert(s.id);
    }
    ids
}

/// A deterministic nest of calls: `rounds` times outer → middle → leaf (twice), durations
/// varying with the round, starting at `t0` ns. Ids are (outer, middle, leaf).
pub fn nested_calls(ids: (u32, u32, u32), rounds: u64, t0: u64) -> Vec<Ev> {
    let (outer, middle, leaf) = ids;
    let mut ev = Vec::new();
    let mut t = t0;
    for r in 0..rounds {
        ev.push(Ev::Enter(outer, t));
        t += 100 + r % 7;
        ev.push(Ev::Enter(middle, t));
        for k in 0..2 {
            t += 10;
            ev.push(Ev::Enter(leaf, t));
            t += 50 + (r * 13 + k) % 17 * 1_000;
            ev.push(Ev::Exit(leaf, t));
        }
        t += 20 + r % 3 * 500;
        ev.push(Ev::Exit(middle, t));
        t += 30;
        ev.push(Ev::Exit(outer, t));
        t += 1_000;
    }
    ev
}

/// The C++ fixture's `fx::outer(int)`, `fx::middle(int)` and `fx::leaf(int)` ids.
pub fn cpp_nest_ids(bin: &Path) -> (u32, u32, u32) {
    (
        function_id(bin, "fx::outer(int)"),
        function_id(bin, "fx::middle(int)"),
        function_id(bin, "fx::leaf(int)"),
    )
}

/// The events of [`cpp_session`]'s two threads (pid 40): tids 40 and 41.
pub fn cpp_session_threads(ids: (u32, u32, u32)) -> Vec<(u32, Vec<Ev>)> {
    vec![
        (40, nested_calls(ids, 25, 0)),
        (41, nested_calls(ids, 9, 7)),
    ]
}

/// A hand-made session of the C++ fixture in a new scratch directory `name`: process 40 with
/// the [`nested_calls`] of [`cpp_session_threads`]. Returns the directory and the binary.
pub fn cpp_session(name: &str) -> (tempfile::TempDir, PathBuf) {
    let bin = crate::cpp_fixture();
    let dir = crate::scratch_dir(name);
    write_session(
        dir.path(),
        &[SynthProcess {
            pid: 40,
            binary: bin.clone(),
            build_id: Some(build_id(&bin)),
            threads: cpp_session_threads(cpp_nest_ids(&bin)),
        }],
    );
    (dir, bin)
}

/// One row of `llvm-xray account`'s text output.
#[derive(Clone, Debug, PartialEq)]
pub struct AccountRow {
    pub id: u32,
    pub count: u64,
    /// min, median, p90, p99, max as printed (seconds, 6 decimals).
    pub stats: [String; 5],
    pub sum: f64,
    /// `file:line:column` as printed.
    pub debug: String,
    pub function: String,
}

/// Parses `llvm-xray account` text output.
pub fn parse_account(text: &str) -> BTreeMap<u32, AccountRow> {
    let mut rows = BTreeMap::new();
    for line in text.lines().skip(2) {
        let (head, rest) = line.split_once('[').expect("account line has [");
        let (stats, tail) = rest.split_once(']').expect("account line has ]");
        let mut head = head.split_whitespace();
        let id: u32 = head.next().unwrap().parse().unwrap();
        let count: u64 = head.next().unwrap().parse().unwrap();
        let stats: Vec<String> = stats.split(',').map(|s| s.trim().to_owned()).collect();
        let tail = tail.trim_start();
        let (sum, names) = tail.split_once(char::is_whitespace).unwrap();
        let (debug, function) = names.trim_start().split_once(": ").unwrap();
        rows.insert(
            id,
            AccountRow {
                id,
                count,
                stats: stats.try_into().unwrap(),
                sum: sum.parse().unwrap(),
                debug: debug.to_owned(),
                function: function.to_owned(),
            },
        );
    }
    rows
}

/// Nanoseconds as `llvm-xray account` prints seconds.
pub fn seconds(ns: u64) -> String {
    format!("{:.6}", ns as f64 / 1e9)
}

/// Runs `fdr-profiled ARGS`; returns (success, stdout, stderr).
pub fn run_tool(args: &[&std::ffi::OsStr]) -> (bool, String, String) {
    let out = run_output(Command::new(fdr_profiled()).args(args));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `fdr-profiled report DIR --format json EXTRA...`, parsed; panics unless it succeeds.
pub fn report_json(dir: &Path, extra: &[&str]) -> (serde_json::Value, String) {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "report".as_ref(),
        dir.as_os_str(),
        "--format".as_ref(),
        "json".as_ref(),
    ];
    args.extend(extra.iter().map(|s| std::ffi::OsStr::new(*s)));
    let (ok, stdout, stderr) = run_tool(&args);
    assert!(ok, "report {}: {stderr}", dir.display());
    let json = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    (json, stderr)
}

/// The report's function rows as (pid, tid, id) → row.
pub fn rows_by_thread(json: &serde_json::Value) -> BTreeMap<(u64, u64, u32), serde_json::Value> {
    json["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                (
                    r["pid"].as_u64().unwrap_or(0),
                    r["tid"].as_u64().unwrap_or(0),
                    r["id"].as_u64().unwrap() as u32,
                ),
                r.clone(),
            )
        })
        .collect()
}

/// Checks one thread's rows of a per-thread report against `llvm-xray account` (LLVM 19) of
/// its file: the same functions, calls, min, median, p90, p99, max and sum, and the same names.
pub fn assert_thread_matches_account(
    rows: &BTreeMap<(u64, u64, u32), serde_json::Value>,
    pid: u32,
    tid: u32,
    bin: &Path,
    file: &Path,
) {
    let account = parse_account(&crate::account(19, bin, file));
    let ours: BTreeMap<u32, &serde_json::Value> = rows
        .iter()
        .filter(|((p, t, _), _)| *p == u64::from(pid) && *t == u64::from(tid))
        .map(|((_, _, id), r)| (*id, r))
        .collect();
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        account.keys().collect::<Vec<_>>(),
        "functions of {}",
        file.display()
    );
    for (id, want) in &account {
        let got = ours[id];
        let ns = |k: &str| got[k].as_u64().unwrap();
        let name = got["name"].as_str().unwrap();
        assert_eq!(got["calls"].as_u64().unwrap(), want.count, "{name}");
        let stats = [
            seconds(ns("min_ns")),
            seconds(ns("median_ns")),
            seconds(ns("p90_ns")),
            seconds(ns("p99_ns")),
            seconds(ns("max_ns")),
        ];
        assert_eq!(stats, want.stats, "{name} in {}", file.display());
        assert!(
            (ns("total_ns") as f64 / 1e9 - want.sum).abs() < 1.5e-6,
            "{name}: sum {} vs {}",
            ns("total_ns"),
            want.sum
        );
        assert_eq!(
            name,
            crate::fixtures::symbolize::unescape_rust_legacy(&want.function),
            "name of {id}"
        );
    }
}
