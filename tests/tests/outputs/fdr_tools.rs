//! `fdr-profiled dump` and `fdr-profiled verify` as users run them: output, one-line errors,
//! exit codes, function names from a binary or a session manifest.
//!
//! Needs a built daemon (`cargo xtask test` builds it), llvm-xray 14/19 and clang-19; no root.

use std::io::Cursor;
use std::process::{Command, Output};

use tests::{fdr_profiled, native_fdr_fixture, native_fdr_trace, scratch_dir, LLVM_XRAY_VERSIONS};
use xray_fdr::{FdrVersion, FunctionAction, ThreadWriter, WallClock};

fn run(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(fdr_profiled()).args(args).output().unwrap()
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

/// A small file of `version` with every record kind the writer makes.
fn sample(version: FdrVersion) -> Vec<u8> {
    let mut w = ThreadWriter::with_version(
        Cursor::new(Vec::new()),
        4242,
        77,
        1_000_000_000,
        WallClock {
            secs: 1_700_000_000,
            micros: 42,
        },
        version,
    )
    .unwrap()
    .with_commit_bytes(64);
    w.function(FunctionAction::Entry, 1, 1000, 3).unwrap();
    w.entry_with_args(2, 1010, 3, &[7, u64::MAX]).unwrap();
    w.custom_event(1011, 3, b"odd-sized").unwrap();
    // A printable type: in version 1 its bytes are part of a custom event's payload, which
    // llvm-xray prints raw.
    w.typed_event(1012, 3, 0x4142, b"typed").unwrap();
    w.function(FunctionAction::Exit, 2, 1020, 4).unwrap();
    w.function(FunctionAction::TailExit, 1, 1030 + (1 << 33), 4)
        .unwrap();
    w.finish().unwrap().0.into_inner()
}

#[test]
fn verify_reports_each_file_and_fails_on_any_bad_one() {
    let dir = scratch_dir("fdr-verify");
    let good1 = dir.path().join("a/one.fdr");
    let good5 = dir.path().join("a/b/five.fdr");
    std::fs::create_dir_all(good5.parent().unwrap()).unwrap();
    std::fs::write(&good1, sample(FdrVersion::V1)).unwrap();
    std::fs::write(&good5, sample(FdrVersion::V5)).unwrap();

    let ok = run(&["verify".as_ref(), dir.path().join("a").as_os_str()]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    let out = text(&ok.stdout);
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(
        out.contains("five.fdr: ok: version 5, 1 thread buffer(s), 4 function records, 2 events"),
        "{out}"
    );
    assert!(
        out.contains("one.fdr: ok: version 1, 1 thread buffer(s), 4 function records, 2 events"),
        "{out}"
    );

    // A cut file and a flipped byte: one error line each, with offset and record kind.
    let mut bytes = sample(FdrVersion::V1);
    let cut = dir.path().join("cut.fdr");
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
    bytes[32] = 0x15; // NewBuffer's introducer becomes metadata kind 10
    let flipped = dir.path().join("flipped.fdr");
    std::fs::write(&flipped, &bytes).unwrap();
    let bad = run(&[
        "verify".as_ref(),
        good1.as_os_str(),
        cut.as_os_str(),
        flipped.as_os_str(),
    ]);
    assert_eq!(bad.status.code(), Some(1));
    let err = text(&bad.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(lines[0].starts_with("fdr-profiled: error: "), "{err}");
    assert!(lines[0].contains("cut.fdr: offset "), "{err}");
    assert!(
        lines[0].contains("EndOfBuffer: the record needs 16 bytes"),
        "{err}"
    );
    assert!(
        lines[1].contains(
            "flipped.fdr: offset 32 (0x20), metadata record: unknown metadata record kind 10"
        ),
        "{err}"
    );
    assert!(text(&bad.stdout).contains("one.fdr: ok"));

    // Nothing to check is a failure too, and so is a missing file.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let none = run(&[
        "verify".as_ref(),
        empty.as_os_str(),
        "/nonexistent.fdr".as_ref(),
    ]);
    assert_eq!(none.status.code(), Some(1));
    assert_eq!(
        text(&none.stderr).lines().count(),
        2,
        "{}",
        text(&none.stderr)
    );
}

/// The bracketed part of each of our lines is what `llvm-xray fdr-dump` prints for the record
/// (file offsets, absolute ticks and names are additions after it).
#[test]
fn dump_matches_llvm_fdr_dump() {
    let dir = scratch_dir("fdr-dump");
    for version in [FdrVersion::V1, FdrVersion::V5] {
        let file = dir.path().join(format!("v{version}.fdr"));
        std::fs::write(&file, sample(version)).unwrap();
        let ours = run(&["dump".as_ref(), file.as_os_str()]);
        assert!(ours.status.success(), "{}", text(&ours.stderr));
        let ours = text(&ours.stdout);
        let mut lines = ours.lines();
        assert!(lines
            .next()
            .unwrap()
            .starts_with(&format!("<Header: version = {version}, type = 1")));
        let ours: Vec<String> = lines
            .filter(|l| !l.contains("<Padding:"))
            .map(|l| {
                let body = l.split_once(' ').unwrap().1;
                body[..=body.find('>').unwrap()].to_string()
            })
            .collect();
        for major in LLVM_XRAY_VERSIONS {
            let out = tests::xray_reference::run(major, ["fdr-dump".as_ref(), file.as_os_str()]);
            assert!(out.status.success());
            let theirs: Vec<String> = text(&out.stdout)
                .lines()
                // llvm-xray forgets the closing bracket of typed events.
                .map(|l| {
                    if l.starts_with("<Typed Event") {
                        format!("{l}>")
                    } else {
                        l.to_string()
                    }
                })
                .collect();
            assert_eq!(ours, theirs, "llvm-xray {major}, version {version}");
        }
        assert!(
            run(&["dump".as_ref(), file.as_os_str()]).stdout.len() > 500,
            "dump printed too little"
        );
    }
}

#[test]
fn dump_adds_times_and_names_and_stops_at_the_first_error() {
    let dir = scratch_dir("fdr-dump-names");
    let (trace, _) = native_fdr_trace(dir.path(), &["--iterations", "2"]);
    let bin = native_fdr_fixture();
    let out = run(&[
        "dump".as_ref(),
        "--binary".as_ref(),
        bin.as_os_str(),
        trace.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dump = text(&out.stdout);
    let enter = dump
        .lines()
        .find(|l| l.contains("<Function Enter: ") && l.ends_with(" fx::leaf(int)"))
        .unwrap_or_else(|| panic!("no named fx::leaf entry in:\n{dump}"));
    assert!(
        enter.contains(" tsc = ") && enter.contains(", cpu = "),
        "{enter}"
    );
    assert!(dump.contains(" fx_logged"), "{dump}");

    // --session: the binary comes from session.json, by the file's process directory.
    let session = dir.path().join("session");
    let proc_dir = session.join("threads-1234");
    std::fs::create_dir_all(&proc_dir).unwrap();
    let file = proc_dir.join("tid-1.fdr");
    std::fs::copy(&trace, &file).unwrap();
    let manifest = serde_json::json!({
        "processes": [
            {"pid": 1, "binary": "/nonexistent/other", "dir": "other-1"},
            {"pid": 1234, "binary": bin, "dir": "threads-1234"},
        ]
    });
    std::fs::write(session.join("session.json"), manifest.to_string()).unwrap();
    let by_session = run(&[
        "dump".as_ref(),
        "--session".as_ref(),
        session.as_os_str(),
        file.as_os_str(),
    ]);
    assert!(by_session.status.success(), "{}", text(&by_session.stderr));
    assert_eq!(text(&by_session.stdout), dump);

    // A bad file: records up to the problem on stdout, then one error line and status 1.
    let mut bytes = std::fs::read(&trace).unwrap();
    let len = bytes.len();
    bytes.truncate(len - 5);
    let bad = dir.path().join("bad.fdr");
    std::fs::write(&bad, &bytes).unwrap();
    let out = run(&["dump".as_ref(), bad.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stdout).lines().count() > 100);
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("fdr-profiled: error: ") && err.contains("bad.fdr: offset "),
        "{err}"
    );
    // `report` on it, with its binary: what it can read, the break said once (it is found
    // both when the file is listed and when it is replayed).
    let out = run(&[
        "report".as_ref(),
        bad.as_os_str(),
        "--binary".as_ref(),
        bin.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(
        said.matches("only the records before it are used").count(),
        1,
        "{said}"
    );

    // Not a file at all, or no manifest: one line, status 1, no panic.
    for args in [
        vec![
            "dump".into(),
            dir.path().join("missing.fdr").into_os_string(),
        ],
        vec![
            "dump".into(),
            "--session".into(),
            dir.path().as_os_str().to_owned(),
            trace.as_os_str().to_owned(),
        ],
    ] {
        let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        let out = run(&refs);
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(
            text(&out.stderr).lines().count(),
            1,
            "{}",
            text(&out.stderr)
        );
    }
}
