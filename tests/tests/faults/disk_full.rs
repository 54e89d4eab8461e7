//! End to end: the output directory's file system fills up while recording (issue 18, item 3).
//!
//! A 2 MiB tmpfs is the output; two threads make 1.2 million calls, far more than fits. What a
//! recording does then (README, "Disk full"): each thread's file stops at its last complete
//! write and stays valid (our reader, llvm-xray 14 and 19; a failed write is cut back, so no
//! hole is left that a full tmpfs cannot even read); the events that could not be stored are
//! counted per thread in the summary and `session.json` (written when there is room for it,
//! since the failed writes gave theirs back); the exit status is 74 (`EX_IOERR`) with one
//! error line naming the launched command's own status. Every event the program made is
//! accounted for: stored, or counted as not stored.
//!
//! A tmpfs too small for even the first file: nothing can be written, the error says so and
//! the status is 74 too.
//!
//! Needs root (mount), BPF, clang-19, llvm-xray 14/19 and a built daemon.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tests::fdr_agree;
use tests::fixtures::workloads::calls_fixture;
use tests::run::Running;
use tests::{fdr_profiled, parse_count_lines, private_copy, scratch_dir};

const TIMEOUT: Duration = Duration::from_secs(120);
/// `WRITE_ERROR_STATUS` of the record command.
const WRITE_ERROR_STATUS: i32 = 74;

/// A tmpfs mounted for the test, unmounted (lazily, so a file still open cannot keep it) when
/// dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let c = |s: &[u8]| CString::new(s).unwrap();
        let (src, dir, fs, opts) = (
            c(b"tmpfs"),
            c(at.as_os_str().as_bytes()),
            c(b"tmpfs"),
            c(format!("size={size},mode=0700").as_bytes()),
        );
        // SAFETY: valid NUL-terminated strings.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                dir.as_ptr(),
                fs.as_ptr(),
                0,
                opts.as_ptr().cast(),
            )
        };
        assert_eq!(
            rc,
            0,
            "mount a {size} tmpfs on {} (needs root): {}",
            at.display(),
            std::io::Error::last_os_error()
        );
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let dir = CString::new(self.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid path.
        unsafe { libc::umount2(dir.as_ptr(), libc::MNT_DETACH) };
    }
}

fn record(out: &Path, bin: &Path, args: &[&str]) -> tests::Finished {
    Running::spawn(
        "fdr-profiled",
        Command::new(fdr_profiled())
            .arg("--out")
            .arg(out)
            .arg("--")
            .arg(bin)
            .args(args),
    )
    .finish(TIMEOUT)
}

fn fdr_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in std::fs::read_dir(dir).unwrap().flatten() {
        if p.path().is_dir() {
            for f in std::fs::read_dir(p.path()).unwrap().flatten() {
                if f.path().extension().is_some_and(|x| x == "fdr") {
                    out.push(f.path());
                }
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_full_disk_keeps_the_files_valid_and_counts_what_was_not_stored() {
    let scratch = scratch_dir("disk-full");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let mnt = scratch.path().join("mnt");
    let _tmpfs = Tmpfs::mount(&mnt, "2m");
    let out = mnt.join("out");
    let done = record(&out, &bin, &["--threads", "2", "--iterations", "300000"]);

    assert_eq!(
        done.status.code(),
        Some(WRITE_ERROR_STATUS),
        "--- stderr:\n{}",
        done.stderr
    );
    assert!(
        done.stderr.lines().any(|l| l
            .starts_with("fdr-profiled: error: the trace is incomplete: ")
            && l.ends_with("(the command's exit status was 0); exit status 74")),
        "{}",
        done.stderr
    );
    assert!(
        done.stderr.contains("No space left on device"),
        "{}",
        done.stderr
    );
    // The program itself ran to its end, unaffected.
    assert_eq!(done.stdout.lines().last(), Some("calls: done threads=2"));

    // Every file left is valid, also read on the full file system.
    let files = fdr_files(&out);
    assert_eq!(files.len(), 2, "one file per thread: {files:?}");
    let mut on_disk = BTreeMap::new();
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        let trace = xray_fdr::reader::read(&bytes)
            .unwrap_or_else(|e| panic!("our reader rejects {}: {e}", f.display()));
        let records = fdr_agree::ours(&trace).len() as u64;
        assert!(records > 0, "{}: the first writes made it", f.display());
        fdr_agree::agree_on_counts(f, &trace).unwrap_or_else(|e| panic!("{e}"));
        tests::xray_reference::both::account(f, Some(&bin));
        on_disk.insert(
            f.file_name().unwrap().to_string_lossy().into_owned(),
            records,
        );
    }

    // session.json accounts for every event the program made: per thread, what its count
    // lines say it called (twice: entry and exit; main's too in the main thread), and each
    // event stored or counted as not stored.
    let session = tests::read_session(&out);
    tests::assert_every_event_accounted(&session);
    let counts = parse_count_lines(&done.stdout);
    let pid = session.processes[0].pid;
    let mut not_stored = 0;
    for t in &session.processes[0].threads {
        let json = session.json["processes"][0]["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["tid"].as_u64() == Some(t.tid.into()))
            .unwrap();
        let get = |k: &str| json[k].as_u64().unwrap();
        let calls: u64 = counts
            .iter()
            .filter(|c| c.tid == t.tid)
            .map(|c| c.calls)
            .sum();
        let main = if t.tid == pid { 1 } else { 0 };
        // On a loaded machine the kernel's ring can fill too: those events are counted lost.
        assert_eq!(
            get("events") + get("events_lost"),
            2 * (calls + main),
            "tid {}: every call's entry and exit reached the daemon or was counted lost: {json}",
            t.tid
        );
        assert!(
            get("dropped_write_errors") > 0,
            "tid {}: events after the error: {json}",
            t.tid
        );
        let name = Path::new(&t.file).file_name().unwrap().to_string_lossy();
        assert_eq!(
            Some(&get("records")),
            on_disk.get(name.as_ref()),
            "tid {}: session.json's records are the file's",
            t.tid
        );
        not_stored += get("dropped_write_errors") + get("records_not_stored");
    }
    assert_eq!(
        session.json["events_dropped_write_errors"]
            .as_u64()
            .unwrap()
            + session.json["records_not_stored"].as_u64().unwrap(),
        not_stored
    );
    assert!(
        done.stderr.contains(&format!(
            "the trace is incomplete: {not_stored} events or records could not be written"
        )),
        "{}",
        done.stderr
    );
    assert!(
        done.stderr
            .contains("  not stored (write errors, the disk full?): "),
        "{}",
        done.stderr
    );
}

/// No room for even the first file: the error says what could not be written, exit 74.
#[test]
fn no_room_at_all_is_an_error_with_its_own_status() {
    let scratch = scratch_dir("disk-full-at-once");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let mnt = scratch.path().join("mnt");
    let _tmpfs = Tmpfs::mount(&mnt, "8k");
    let out = mnt.join("out");
    std::fs::create_dir(&out).unwrap();
    // Fill it up.
    let filler = mnt.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 64 << 10]);
    let done = record(&out, &bin, &["--iterations", "1000"]);
    assert_eq!(
        done.status.code(),
        Some(WRITE_ERROR_STATUS),
        "--- stderr:\n{}",
        done.stderr
    );
    assert!(
        done.stderr.contains("No space left on device"),
        "{}",
        done.stderr
    );
    assert!(
        done.stderr.contains("fdr-profiled: session summary"),
        "the summary is shown all the same:\n{}",
        done.stderr
    );
    assert!(
        done.stderr
            .contains("fdr-profiled: error: the trace is incomplete: "),
        "{}",
        done.stderr
    );
    assert_eq!(done.stdout.lines().last(), Some("calls: done threads=1"));
}
