//! The manifest's `objects` as [`Layout::open`] reads them: old manifests, good lists, and
//! hostile entries, each a one-line warning.
use super::*;
use fdr_session::manifest::MAX_MANIFEST_SIZE;
use serde_json::json;

fn open(process: serde_json::Value) -> Layout {
    let dir = tempfile::tempdir().unwrap();
    let manifest = json!({"processes": [process]});
    std::fs::write(
        dir.path().join(fdr_session::manifest::MANIFEST),
        serde_json::to_vec(&manifest).unwrap(),
    )
    .unwrap();
    Layout::open(dir.path()).unwrap()
}

fn entry(id: u8, path: &str, build_id: Option<&str>, deleted: bool) -> ObjectEntry {
    ObjectEntry {
        id,
        path: Some(PathBuf::from(path)),
        build_id: build_id.map(str::to_owned),
        deleted,
    }
}

#[test]
fn a_manifest_without_objects_has_the_binary_as_object_0() {
    let l = open(json!({"pid": 4, "binary": "/bin/app", "build_id": "ab", "binary_deleted": true}));
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    assert_eq!(
        l.processes[0].objects,
        [entry(0, "/bin/app", Some("ab"), true)]
    );
}

#[test]
fn objects_are_read_sorted_by_id_and_unknown_fields_ignored() {
    let l = open(json!({"pid": 4, "binary": "/bin/app", "objects": [
        {"object_id": 2, "path": "/lib/b.so", "deleted": false, "build_id": null,
         "load_address": 4096, "functions": 3, "probes": 6, "attached_ns": 9, "future": [1]},
        {"object_id": 0, "path": "/bin/app", "build_id": "cd"},
        {"object_id": 1, "path": "/lib/a.so", "build_id": "", "deleted": true},
    ]}));
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    assert_eq!(
        l.processes[0].objects,
        [
            entry(0, "/bin/app", Some("cd"), false),
            entry(1, "/lib/a.so", None, true),
            entry(2, "/lib/b.so", None, false),
        ]
    );
}

#[test]
fn bad_object_entries_are_warned_about_and_left_out() {
    let l = open(json!({"pid": 4, "binary": "/bin/app", "objects": [
        {"object_id": 16, "path": "/lib/big.so"},
        {"object_id": -1, "path": "/lib/neg.so"},
        {"object_id": 1, "path": "/lib/a.so"},
        {"object_id": 1, "path": "/lib/again\nso"},
        {"object_id": "3", "path": "/lib/str.so"},
        {"path": "/lib/noid.so"},
        17,
        {"object_id": 3, "path": ["not", "a", "string"]},
        {"object_id": 4},
    ]}));
    assert_eq!(
        l.processes[0].objects,
        [
            entry(1, "/lib/a.so", None, false),
            ObjectEntry {
                id: 4,
                path: None,
                build_id: None,
                deleted: false
            }
        ]
    );
    assert_eq!(l.warnings.len(), 7, "{:#?}", l.warnings);
    for w in &l.warnings {
        assert!(!w.contains('\n'), "one line: {w:?}");
        assert!(w.contains("pid 4") && w.contains("ignored"), "{w}");
    }
    assert!(l.warnings[0].contains("object_id 16, outside 0..=15"));
    assert!(l.warnings[1].contains("object_id -1, outside 0..=15"));
    assert!(l.warnings[2].contains("object 1 is listed twice"));
}

#[test]
fn an_empty_object_list_has_no_object() {
    let l = open(json!({"pid": 4, "binary": "/bin/app", "objects": []}));
    assert!(l.processes[0].objects.is_empty());
    assert_eq!(
        l.processes[0].binary.as_deref(),
        Some(Path::new("/bin/app"))
    );
}

/// A file of two threads (pids 7 and 8, version 5) written with the format crate's writer.
fn two_thread_file(dir: &Path) -> PathBuf {
    use xray_fdr::{FdrVersion, FunctionAction, ThreadWriter, WallClock};
    let path = dir.join("xray-log.app.abc");
    let mut bytes = Vec::new();
    for (pid, tid) in [(7u32, 70u32), (8, 80)] {
        let mut w = ThreadWriter::with_version(
            std::io::Cursor::new(Vec::new()),
            tid,
            pid,
            1_000_000_000,
            WallClock::default(),
            FdrVersion::V5,
        )
        .unwrap();
        w.function(FunctionAction::Entry, 1, 10, 0).unwrap();
        w.function(FunctionAction::Exit, 1, 20, 0).unwrap();
        let (sink, _) = w.finish().unwrap();
        let file = sink.into_inner();
        if bytes.is_empty() {
            bytes = file;
        } else {
            // A second thread's buffer after the first: its records without the file header.
            bytes.extend_from_slice(&file[32..]);
        }
    }
    std::fs::write(&path, &bytes).unwrap();
    path
}

#[test]
fn one_fdr_file_is_a_session_of_the_threads_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = two_thread_file(dir.path());
    let l = Layout::open(&path).unwrap();
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    let threads: Vec<(u32, u32, bool)> = l
        .processes
        .iter()
        .flat_map(|p| p.threads.iter().map(move |t| (p.pid, t.tid, t.shared_file)))
        .collect();
    assert_eq!(threads, [(7, 70, true), (8, 80, true)]);
    assert!(l.processes.iter().all(|p| p.binary.is_none()));
}

#[test]
fn a_path_that_is_no_session_gets_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, b"not a trace at all, but long enough for a header").unwrap();
    let e = Layout::open(&text).unwrap_err().to_string();
    assert!(e.contains("notes.txt") && !e.contains('\n'), "{e}");
    let e = Layout::open(&dir.path().join("missing"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("neither a session directory nor an FDR file"),
        "{e}"
    );
}

/// `Layout::open`'s error for a session directory whose manifest is `bytes`.
fn refused(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(fdr_session::manifest::MANIFEST), bytes).unwrap();
    let e = Layout::open(dir.path()).unwrap_err().to_string();
    assert!(!e.contains('\n'), "one line: {e:?}");
    e.replace(&dir.path().display().to_string(), "DIR")
}

#[test]
fn a_manifest_missing_what_every_manifest_has_is_an_error() {
    assert_eq!(
        refused(b"{}"),
        "DIR/session.json is not a valid session manifest: missing field `processes` at line 1 column 2"
    );
    assert_eq!(
        refused(br#"{"processes": [{"binary": "/bin/app"}]}"#),
        "DIR/session.json is not a valid session manifest: missing field `pid` at line 1 column 37"
    );
    assert!(
        refused(br#"{"processes": [{"pid": 1, "threads": [{"tid": 1}]}]}"#)
            .contains("missing field `file`")
    );
    assert!(refused(b"{\"processes\": [").contains("EOF while parsing"));
    assert!(refused(b"\xff\xfe").contains("is not a valid session manifest"));
    // Absurd numbers are refused by the types, not allocated.
    assert!(refused(br#"{"processes": [{"pid": 99999999999}]}"#).contains("invalid value"));
}

#[test]
fn relative_object_paths_are_refused() {
    assert_eq!(
        refused(br#"{"processes": [{"pid": 3, "binary": "../../etc/shadow"}]}"#),
        r#"session.json: pid 3: binary "../../etc/shadow" is not an absolute path; refused"#
    );
    assert_eq!(
        refused(br#"{"processes": [{"pid": 3, "objects": [{"object_id": 1, "path": "lib.so"}]}]}"#),
        r#"session.json: pid 3: objects[0].path "lib.so" is not an absolute path; refused"#
    );
}

#[test]
fn a_symlinked_manifest_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("elsewhere.json");
    std::fs::write(&real, br#"{"processes": []}"#).unwrap();
    std::os::unix::fs::symlink(&real, dir.path().join(fdr_session::manifest::MANIFEST)).unwrap();
    let e = Layout::open(dir.path()).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "{}/session.json is a symbolic link; refused (a recorder never writes one)",
            dir.path().display()
        )
    );
}

#[test]
fn a_huge_or_special_manifest_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join(fdr_session::manifest::MANIFEST);
    // Sparse: no disk used, and nothing of it is read.
    std::fs::File::create(&manifest)
        .unwrap()
        .set_len(MAX_MANIFEST_SIZE + 1)
        .unwrap();
    let e = Layout::open(dir.path()).unwrap_err().to_string();
    assert!(
        e.ends_with("session.json is larger than the 64 MiB a manifest may be; refused"),
        "{e}"
    );
    std::fs::remove_file(&manifest).unwrap();
    std::fs::create_dir(&manifest).unwrap();
    let e = Layout::open(dir.path()).unwrap_err().to_string();
    assert!(
        e.ends_with("session.json is not a regular file; refused"),
        "{e}"
    );
    // A FIFO: opened without blocking, then refused.
    std::fs::remove_dir(&manifest).unwrap();
    let c = std::ffi::CString::new(manifest.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = Layout::open(dir.path()).unwrap_err().to_string();
    assert!(
        e.ends_with("session.json is not a regular file; refused"),
        "{e}"
    );
}

#[test]
fn thread_files_reached_through_a_symlink_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("app-5");
    std::fs::create_dir(&p).unwrap();
    std::fs::write(p.join("tid-5.fdr"), b"").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", p.join("tid-6.fdr")).unwrap();
    std::os::unix::fs::symlink("app-5", dir.path().join("link-5")).unwrap();
    let manifest = json!({"processes": [{"pid": 5, "threads": [
        {"tid": 5, "file": "app-5/tid-5.fdr"},
        {"tid": 6, "file": "app-5/tid-6.fdr"},
        {"tid": 7, "file": "link-5/tid-5.fdr"},
    ]}]});
    let l = Layout::from_manifest(dir.path(), &serde_json::to_vec(&manifest).unwrap()).unwrap();
    let tids: Vec<u32> = l.processes[0].threads.iter().map(|t| t.tid).collect();
    assert_eq!(tids, [5]);
    assert_eq!(l.warnings.len(), 2, "{:?}", l.warnings);
    assert!(l.warnings[0].contains("thread 6") && l.warnings[0].contains("symbolic link"));
    assert!(l.warnings[1].contains("thread 7") && l.warnings[1].contains("link-5"));
}
