//! Output nobody reads: fdr-profiled never panics, and a recording never dies, because its
//! standard output or error is a pipe whose reader went away (`fdr-profiled verify DIR | head
//! -1`, a log pipe that died). A subcommand whose output reader is gone ends quietly with
//! status 0 (nobody reads the rest); a recording goes on to the end and writes valid files. And the traced command gets `SIGPIPE`'s default action back (Rust
//! ignores it in fdr-profiled, and an ignored signal stays ignored across exec).
//!
//! Needs root, BPF, clang-19 and a built daemon.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use tests::fixtures::workloads::{calls_fixture, CALLS_FUNCTIONS};
use tests::trace::{
    assert_every_event_accounted, assert_process_calls, assert_session_totals, check_trace_dir,
    MainCall, ProcessExpectation,
};
use tests::{
    expected_calls, fdr_profiled, parse_count_lines, scratch_dir, Finished, Running, CPP_MAIN,
};

const TIMEOUT: Duration = Duration::from_secs(120);

/// A pipe whose reading end is already closed: every write to it fails with `EPIPE`.
fn dead_pipe() -> Stdio {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    Stdio::from(writer)
}

fn run(label: &str, cmd: &mut Command) -> Finished {
    Running::spawn(label, cmd).finish(TIMEOUT)
}

/// Runs `cmd` with its standard output (`stdout`) or error (`stderr`) on a pipe nobody reads,
/// collecting the other stream; killed after [`TIMEOUT`].
fn run_unread(cmd: &mut Command, stdout_unread: bool) -> Finished {
    use std::io::Read as _;
    if stdout_unread {
        cmd.stdout(dead_pipe()).stderr(Stdio::piped());
    } else {
        cmd.stdout(Stdio::piped()).stderr(dead_pipe());
    }
    let mut child = cmd.spawn().expect("spawn");
    let mut stream: Box<dyn std::io::Read + Send> = if stdout_unread {
        Box::new(child.stderr.take().unwrap())
    } else {
        Box::new(child.stdout.take().unwrap())
    };
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stream.read_to_string(&mut text);
        text
    });
    let deadline = std::time::Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("{cmd:?} did not end within {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = reader.join().unwrap();
    let (stdout, stderr) = if stdout_unread {
        (String::new(), text)
    } else {
        (text, String::new())
    };
    Finished {
        status,
        stdout,
        stderr,
    }
}

fn assert_no_panic(what: &str, done: &Finished) {
    assert!(
        !done.stderr.contains("panicked"),
        "{what} panicked:\n{}",
        done.stderr
    );
}

/// `fdr-profiled --out OUT -- calls.c ARGS`.
fn record_calls(out: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(fdr_profiled());
    cmd.arg("--out")
        .arg(out)
        .arg("--")
        .arg(calls_fixture())
        .args(args);
    cmd
}

/// Records `calls.c` (2 threads) into `out`, output discarded.
fn record(out: &Path) {
    let done = run(
        "fdr-profiled",
        record_calls(out, &["--threads", "2", "--iterations", "1000"]).stdout(Stdio::null()),
    );
    assert!(done.status.success(), "{}", done.stderr);
}

#[test]
fn subcommands_whose_output_reader_is_gone_end_quietly() {
    let scratch = scratch_dir("pipes-tools");
    let out = scratch.path().join("out");
    record(&out);
    let file = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .find(|e| e.path().is_dir())
        .and_then(|process| {
            std::fs::read_dir(process.path())
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "fdr"))
        })
        .expect("a trace file");
    let calls = calls_fixture();
    let cases: Vec<(&str, Vec<&std::ffi::OsStr>)> = vec![
        ("list", vec!["list".as_ref(), calls.as_os_str()]),
        ("verify", vec!["verify".as_ref(), out.as_os_str()]),
        ("report", vec!["report".as_ref(), out.as_os_str()]),
        ("dump", vec!["dump".as_ref(), file.as_os_str()]),
    ];
    for (name, args) in cases {
        let done = run_unread(Command::new(fdr_profiled()).args(&args), true);
        assert_no_panic(name, &done);
        assert_eq!(
            done.status.code(),
            Some(0),
            "fdr-profiled {name} into a closed pipe: {:?}\n{}",
            done.status,
            done.stderr
        );
        assert!(
            done.stderr.is_empty(),
            "fdr-profiled {name}: nothing to say on stderr:\n{}",
            done.stderr
        );
    }
}

#[test]
fn a_recording_whose_stderr_reader_is_gone_writes_its_files() {
    let scratch = scratch_dir("pipes-record");
    let out = scratch.path().join("out");
    let done = run_unread(
        &mut record_calls(&out, &["--threads", "2", "--iterations", "20000"]),
        false,
    );
    assert!(done.status.success(), "{:?}", done.status);
    // Everything it would have said is in session.json, and the files are valid: llvm-xray 14
    // and 19 load them, and they hold exactly the calls the fixture counted (its count lines
    // went to the stdout we read).
    let trace = check_trace_dir(&out, &calls_fixture());
    assert_every_event_accounted(&trace.session);
    assert_session_totals(&trace);
    let calls = expected_calls(&parse_count_lines(&done.stdout));
    let pid = *trace.pids().iter().next().expect("one process");
    assert_process_calls(
        &trace,
        &ProcessExpectation {
            pid,
            calls: &calls,
            known: CALLS_FUNCTIONS,
            main_fn: CPP_MAIN,
            main: MainCall::Traced,
            only_known: true,
        },
    );
    let verify = run(
        "verify",
        Command::new(fdr_profiled()).arg("verify").arg(&out),
    );
    assert!(verify.status.success(), "{}", verify.stderr);
    assert_no_panic("verify", &verify);
}

#[test]
fn the_traced_command_gets_sigpipe_back() {
    // Not --quiet: the fixture prints its counts into a pipe nobody reads. With SIGPIPE's
    // default action it dies of it; ignored, it would go on and exit 0.
    let scratch = scratch_dir("pipes-child");
    let out = scratch.path().join("out");
    let done = run_unread(&mut record_calls(&out, &["--iterations", "100"]), true);
    assert_no_panic("fdr-profiled", &done);
    assert_eq!(
        done.status.code(),
        Some(141),
        "the command's status, killed by SIGPIPE: {:?}\n{}",
        done.status,
        done.stderr
    );
}
