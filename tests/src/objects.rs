//! What the tests of traced shared objects (the dso fixture of [`crate::fixtures::dso`]:
//! recording's `trace_dso` and `objects_launch`, the service's `objects` and `unit`) read and
//! compare besides the fixture: the daemon's per-object `attached` lines, build-ids
//! (llvm-readelf), load addresses (/proc/PID/maps), session.json's objects
//! ([`check_listed_objects`]), the output directory loaded with llvm-xray 14 and 19 without an
//! instrumentation map (the executable may have none, and ids of other objects are packed
//! `(object << 24) | function` anyway), and the records' packed ids resolved per object and
//! counted against the fixture ([`counts`]).

pub mod counts;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::run::{Running, ATTACHED_PREFIX};
use crate::tools::run_output;
use crate::trace::{read_session, ThreadTrace, TraceDir};
use crate::xray_reference::both;
pub use counts::assert_counts;

/// `fdr-profiled: attached N probes to M functions in PATH[ (object K)]` (no suffix: object 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectLine {
    pub probes: u64,
    pub functions: u64,
    pub path: String,
    pub object: u32,
}

impl ObjectLine {
    /// Parses one stderr line; `None` for any other line.
    pub fn parse(line: &str) -> Option<ObjectLine> {
        let rest = line.strip_prefix(ATTACHED_PREFIX)?.strip_prefix(' ')?;
        let (probes, rest) = rest.split_once(" probes to ")?;
        let (functions, rest) = rest.split_once(" functions in ")?;
        let (path, object) = match rest
            .strip_suffix(')')
            .and_then(|r| r.rsplit_once(" (object "))
        {
            Some((path, k)) => (path, k.parse().ok()?),
            None => (rest, 0),
        };
        Some(ObjectLine {
            probes: probes.parse().ok()?,
            functions: functions.parse().ok()?,
            path: path.to_string(),
            object,
        })
    }

    /// Waits for the daemon's line of `object`.
    pub fn wait(tracer: &mut Running, object: u32, timeout: Duration) -> ObjectLine {
        let line = tracer.wait_for_stderr_match(
            &format!("`attached ... (object {object})`"),
            timeout,
            |l| ObjectLine::parse(l).is_some_and(|o| o.object == object),
        );
        ObjectLine::parse(&line).expect("matched above")
    }
}

/// The GNU build-id of `file` as `llvm-readelf-19 --notes` prints it (lowercase hex).
pub fn build_id(file: &Path) -> String {
    let out = run_output(Command::new("llvm-readelf-19").arg("--notes").arg(file));
    assert!(
        out.status.success(),
        "llvm-readelf-19 --notes {}",
        file.display()
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Build ID:")
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| panic!("{} has no build-id", file.display()))
}

/// Per mapped path (without ` (deleted)`): the start of its lowest mapping at file offset 0.
pub fn load_addresses(pid: u32) -> BTreeMap<String, u64> {
    let path = format!("/proc/{pid}/maps");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let mut out = BTreeMap::new();
    for line in text.lines() {
        // start-end perms offset dev inode [path]; the path may contain blanks.
        let mut fields = line.splitn(6, ' ');
        let range = fields.next().unwrap_or_default();
        let offset = fields.nth(1).unwrap_or_default();
        let Some(file) = fields.nth(2).map(str::trim).filter(|f| f.starts_with('/')) else {
            continue;
        };
        if u64::from_str_radix(offset, 16) != Ok(0) {
            continue;
        }
        let start = range.split('-').next().unwrap_or_default();
        let start = u64::from_str_radix(start, 16)
            .unwrap_or_else(|e| panic!("{path}: bad line {line:?}: {e}"));
        let file = file.strip_suffix(" (deleted)").unwrap_or(file);
        out.entry(file.to_string()).or_insert(start);
    }
    out
}

/// Every `DIR/<exe>-<pid>/tid-<tid>.fdr`, each `convert`ed and `account`ed (no instrumentation
/// map) by llvm-xray 14 and 19, which must agree on its records; the set of files must be the
/// one session.json lists. Records as llvm-xray 19 read them.
pub fn load_trace(dir: &Path) -> TraceDir {
    let session = read_session(dir);
    let mut threads = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let entry = entry.expect("dir entry");
        if !entry.file_type().expect("file type").is_dir() {
            continue;
        }
        let process_dir = entry.file_name().to_string_lossy().into_owned();
        let pid: u32 = process_dir
            .rsplit_once('-')
            .and_then(|(_, pid)| pid.parse().ok())
            .unwrap_or_else(|| panic!("{process_dir:?} is not <exe>-<pid>"));
        for f in std::fs::read_dir(entry.path()).expect("read process dir") {
            let path = f.expect("dir entry").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let tid: u32 = name
                .strip_prefix("tid-")
                .and_then(|s| s.strip_suffix(".fdr"))
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("{process_dir}/{name} is not tid-<tid>.fdr"));
            // No instrumentation map: the ids of other objects are packed anyway.
            let c = both::convert(&path, &["-symbolize"]);
            both::account(&path, None);
            threads.push(ThreadTrace {
                pid,
                tid,
                process_dir: process_dir.clone(),
                path,
                header: c.header,
                records: c.records,
            });
        }
    }
    threads.sort_by_key(|t| (t.pid, t.tid));
    let files: BTreeSet<(u32, u32)> = threads.iter().map(|t| (t.pid, t.tid)).collect();
    let listed: BTreeSet<(u32, u32)> = session
        .processes
        .iter()
        .flat_map(|p| p.threads.iter().map(move |t| (p.pid, t.tid)))
        .collect();
    assert_eq!(
        listed,
        files,
        "session.json threads vs FDR files in {}",
        dir.display()
    );
    TraceDir {
        dir: dir.to_path_buf(),
        session,
        threads,
    }
}

/// An object the target maps, as the test knows it.
pub struct Object {
    pub id: u32,
    /// The path the process maps it at (canonical).
    pub path: PathBuf,
    /// A readable file with its bytes (the deleted one's original build).
    pub file: PathBuf,
    pub deleted: bool,
    pub functions: Vec<&'static str>,
}

/// session.json's `objects` of one process (`p`) against `objects` (all of them, in id order),
/// the daemon's `lines` and the process's `maps` ([`load_addresses`]); returns each object's
/// `attached_ns`.
pub fn check_listed_objects(
    p: &serde_json::Value,
    objects: &[Object],
    lines: &BTreeMap<u32, ObjectLine>,
    maps: &BTreeMap<String, u64>,
) -> BTreeMap<u32, u64> {
    let listed = p["objects"]
        .as_array()
        .unwrap_or_else(|| panic!("no objects in session.json: {p}"));
    let ids: Vec<u64> = listed
        .iter()
        .filter_map(|o| o["object_id"].as_u64())
        .collect();
    let want: Vec<u64> = objects.iter().map(|o| u64::from(o.id)).collect();
    assert_eq!(ids, want, "object ids in session.json: {p}");
    let mut attached = BTreeMap::new();
    for (o, m) in objects.iter().zip(listed) {
        let path = o.path.to_string_lossy();
        let line = &lines[&o.id];
        assert_eq!(line.path, path, "daemon line of object {}", o.id);
        assert_eq!(line.functions, o.functions.len() as u64, "{line:?}");
        assert_eq!(m["path"], *path, "object {}: {m}", o.id);
        assert_eq!(m["deleted"], o.deleted, "object {}: {m}", o.id);
        assert_eq!(m["build_id"], build_id(&o.file), "object {}: {m}", o.id);
        let mapped = maps
            .get(path.as_ref())
            .unwrap_or_else(|| panic!("{path} not in the target's maps: {maps:?}"));
        assert_eq!(m["load_address"], *mapped, "object {}: {m}", o.id);
        let functions = o.functions.len() as u64;
        assert_eq!(m["functions"], functions, "object {}: {m}", o.id);
        assert_eq!(m["probes"], line.probes, "object {}: {m}", o.id);
        let ns = m["attached_ns"].as_u64().unwrap_or(0);
        assert!(ns > 0, "object {}: no attached_ns: {m}", o.id);
        attached.insert(o.id, ns);
    }
    attached
}

#[test]
fn object_lines() {
    assert_eq!(
        ObjectLine::parse(
            "fdr-profiled: attached 6 probes to 3 functions in /a b/lib.so (object 1)"
        ),
        Some(ObjectLine {
            probes: 6,
            functions: 3,
            path: "/a b/lib.so".into(),
            object: 1
        })
    );
    assert_eq!(
        ObjectLine::parse("fdr-profiled: attached 8 probes to 4 functions in /x/dso-main")
            .map(|o| o.object),
        Some(0)
    );
    assert_eq!(ObjectLine::parse("fdr-profiled: exits: exit sleds"), None);
}
