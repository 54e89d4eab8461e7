//! End to end: faults of fdr-profiled itself (issue 18, item 2).
//!
//! - SIGKILL mid-trace (`--pid`, with `uprobe_multi` links and with one perf event per probe):
//!   the kernel drops every BPF link and program the daemon held (found by their ids in its
//!   `/proc/PID/fdinfo` before the kill, looked up by id after it), no uprobe event is left in
//!   tracefs (where it is mounted), every FDR file left is valid (our reader, llvm-xray 14 and
//!   19), and the traced program goes on unchanged: it keeps calling its probed functions
//!   without a breakpoint left behind (no SIGTRAP) and ends normally with its own counts.
//! - SIGTERM, or SIGINT twice, while the probes of 2000 functions are being placed, and a second
//!   SIGINT or a SIGTERM right after the first SIGINT (while the session ends and its probes
//!   are removed):
//!   fdr-profiled ends within [`BOUNDED`], with a summary and valid files, and the program
//!   goes on.
//!
//! Needs root, BPF, clang-19, llvm-xray 14/19 and a built daemon.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tests::fdr_agree;
use tests::fixtures::workloads::{calls_fixture, many_fixture};
use tests::run::{Running, RECORDING_PREFIX};
use tests::{fdr_profiled, private_copy, scratch_dir};

const TIMEOUT: Duration = Duration::from_secs(60);
/// How long fdr-profiled may take to end after a stop signal.
const BOUNDED: Duration = Duration::from_secs(10);

/// `bpf(2)` commands (uapi).
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;

/// The BPF links and programs a process holds descriptors of, by id, from its fdinfo.
#[derive(Debug, Default)]
struct Held {
    links: BTreeSet<u32>,
    programs: BTreeSet<u32>,
}

fn held_by(pid: u32) -> Held {
    let mut held = Held::default();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let Ok(target) = std::fs::read_link(fd.path()) else {
            continue;
        };
        let target = target.to_string_lossy().into_owned();
        let Ok(info) = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        )) else {
            continue;
        };
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<u32>().ok())
        };
        match target.as_str() {
            // The kernel names link files "bpf_link" (programs "bpf-prog").
            "anon_inode:bpf_link" | "anon_inode:bpf-link" => {
                held.links.extend(field("link_id:"));
                held.programs.extend(field("prog_id:"));
            }
            "anon_inode:bpf-prog" => held.programs.extend(field("prog_id:")),
            _ => {}
        }
    }
    held
}

/// Whether the kernel still has the BPF object `id` (`cmd`: BPF_LINK/PROG_GET_FD_BY_ID).
fn alive(cmd: libc::c_long, id: u32) -> bool {
    // The attribute is the id, padded to the size the kernel reads for these commands.
    let mut attr = [0u32; 4];
    attr[0] = id;
    // SAFETY: bpf(2) with a valid, large enough attribute; a returned descriptor is closed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd >= 0 {
        // SAFETY: our own new descriptor.
        unsafe { libc::close(fd as i32) };
        return true;
    }
    let err = std::io::Error::last_os_error();
    assert_eq!(
        err.raw_os_error(),
        Some(libc::ENOENT),
        "bpf get-fd-by-id {id}: {err}"
    );
    false
}

/// The uprobe events tracefs lists (where it is mounted) that name `bin`.
fn uprobe_events_of(bin: &Path) -> Vec<String> {
    let name = bin.to_string_lossy().into_owned();
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .filter_map(|d| std::fs::read_to_string(format!("{d}/uprobe_events")).ok())
        .flat_map(|t| {
            t.lines()
                .filter(|l| l.contains(&name))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn fdr_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "fdr") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Every FDR file under `dir` read by our reader and by llvm-xray 14 and 19, which agree on
/// its function records. Returns how many records they hold.
fn assert_valid_files(dir: &Path) -> usize {
    let files = fdr_files(dir);
    assert!(!files.is_empty(), "no FDR file in {}", dir.display());
    let mut records = 0;
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        let trace = xray_fdr::reader::read(&bytes)
            .unwrap_or_else(|e| panic!("our reader rejects {}: {e}", f.display()));
        records += fdr_agree::ours(&trace).len();
        fdr_agree::agree_on_counts(f, &trace).unwrap_or_else(|e| panic!("{e}"));
    }
    records
}

/// Starts `bin ARGS --wait-file F` (waiting), traces it with `--pid` and `daemon_args`, waits
/// for recording, then lets it go. Returns (fixture, daemon, output directory).
fn pid_session(
    scratch: &Path,
    bin: &Path,
    args: &[&str],
    daemon_args: &[&str],
) -> (Running, Running, PathBuf) {
    let go = scratch.join("go");
    let out = scratch.join("out");
    let mut fixture = Running::spawn(
        "fixture",
        Command::new(bin).args(args).arg("--wait-file").arg(&go),
    );
    fixture.wait_for_stderr_line(tests::WAITING_PREFIX, TIMEOUT);
    let mut daemon = Running::spawn(
        "fdr-profiled",
        Command::new(fdr_profiled())
            .args(["--no-report", "--pid", &fixture.pid().to_string(), "--out"])
            .arg(&out)
            .args(daemon_args),
    );
    daemon.wait_for_stderr_line(RECORDING_PREFIX, TIMEOUT);
    std::fs::write(&go, b"").unwrap();
    (fixture, daemon, out)
}

/// SIGKILL of fdr-profiled while it records a busy process: nothing of it stays in the kernel,
/// its files are valid, and the program ends as it would have untraced.
#[test]
fn sigkill_leaves_no_probe_and_the_program_unchanged() {
    for daemon_args in [&[][..], &["--no-uprobe-multi"][..]] {
        let scratch = scratch_dir("daemon-sigkill");
        let bin = private_copy(&calls_fixture(), scratch.path());
        let (fixture, daemon, out) = pid_session(
            scratch.path(),
            &bin,
            // About 100,000 calls a second (--per-second sleeps between blocks of calls): the
            // files stay small enough for llvm-xray to check quickly.
            &["--seconds", "2.5", "--per-second"],
            daemon_args,
        );
        // Mid-trace: after a flush (every second) wrote the first buffers.
        std::thread::sleep(Duration::from_millis(1300));
        let held = held_by(daemon.pid());
        assert!(
            !held.links.is_empty() && !held.programs.is_empty(),
            "{daemon_args:?}: fdr-profiled holds BPF links and programs: {held:?}"
        );
        daemon.signal(libc::SIGKILL);
        let done = daemon.finish(TIMEOUT);
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&done.status),
            Some(libc::SIGKILL)
        );
        // The kernel releases them once the last descriptor is gone (deferred work and RCU:
        // give it a little time).
        let deadline = Instant::now() + BOUNDED;
        loop {
            let links: Vec<u32> = held
                .links
                .iter()
                .copied()
                .filter(|id| alive(BPF_LINK_GET_FD_BY_ID, *id))
                .collect();
            let programs: Vec<u32> = held
                .programs
                .iter()
                .copied()
                .filter(|id| alive(BPF_PROG_GET_FD_BY_ID, *id))
                .collect();
            if links.is_empty() && programs.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{daemon_args:?}: {BOUNDED:?} after the kill the kernel still has links {links:?} and programs {programs:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            uprobe_events_of(&bin),
            Vec::<String>::new(),
            "{daemon_args:?}"
        );
        // The program keeps calling its probed functions, with no breakpoint left to trap
        // on, and ends by itself with its counts.
        let f = fixture.finish(TIMEOUT);
        assert!(
            f.status.success(),
            "{daemon_args:?}: the traced program ended with {} after fdr-profiled's death",
            f.status
        );
        assert_eq!(
            f.stdout.lines().last(),
            Some("calls: done threads=1"),
            "{daemon_args:?}"
        );
        // Its loop ran 2.5 s, past the kill (1.3 s in), to its end.
        let counts = tests::parse_count_lines(&f.stdout);
        assert!(
            counts
                .iter()
                .any(|c| c.function == "cx_tiny" && c.calls > 0),
            "{daemon_args:?}: {counts:?}"
        );
        let records = assert_valid_files(&out);
        assert!(records > 0, "{daemon_args:?}: a flush came before the kill");
    }
}

/// Ends `daemon` with `first`, then `second` after `gap` (None: no second signal); checks it
/// ends within [`BOUNDED`] of the first, with its summary and valid files, and that the
/// program still runs.
fn stop_twice(
    what: &str,
    fixture: &Running,
    daemon: Running,
    bin: &Path,
    out: &Path,
    first: libc::c_int,
    second: Option<(Duration, libc::c_int)>,
) {
    let start = Instant::now();
    daemon.signal(first);
    if let Some((gap, sig)) = second {
        std::thread::sleep(gap);
        // It may be gone already: that is an end within the bound too.
        // SAFETY: kill(2) of our own child (not reaped yet: its pid is still ours).
        unsafe { libc::kill(daemon.pid() as i32, sig) };
    }
    let done = daemon.finish(BOUNDED + Duration::from_secs(5));
    let took = start.elapsed();
    assert!(took <= BOUNDED, "{what}: fdr-profiled took {took:?} to end");
    tests::run::assert_success(what, &done);
    assert!(
        done.stderr.contains("fdr-profiled: session summary"),
        "{what}: {}",
        done.stderr
    );
    // Whatever was recorded (when the signal came first, the session may have ended before
    // the program's first event) is valid.
    tests::check_trace_dir(out, bin);
    // SAFETY: signal 0 only checks that the program still runs.
    assert_eq!(
        unsafe { libc::kill(fixture.pid() as i32, 0) },
        0,
        "{what}: the program goes on"
    );
}

/// SIGTERM, or SIGINT twice, while the probes of 2000 functions are placed: fdr-profiled
/// starts recording, then ends in bounded time.
#[test]
fn stop_signals_during_attach_end_in_bounded_time() {
    // During attach: the signal comes once fdr-profiled holds it (blocked from its start until
    // its event loop runs, so the signal is pending while every probe is placed) and before it
    // says it is recording: SIGTERM, and SIGINT twice.
    for (first, second) in [
        (libc::SIGTERM, None),
        (libc::SIGINT, Some((Duration::ZERO, libc::SIGINT))),
    ] {
        let scratch = scratch_dir("daemon-signal-attach");
        let bin = private_copy(&many_fixture(), scratch.path());
        let fixture = Running::spawn("many", Command::new(&bin).args(["--seconds", "60"]));
        let daemon = Running::spawn(
            "fdr-profiled",
            Command::new(fdr_profiled())
                .args(["--no-report", "--pid", &fixture.pid().to_string(), "--out"])
                .arg(scratch.path().join("out")),
        );
        let held = |pid: u32| {
            tests::run::signal_mask(pid.into(), "SigBlk")
                .is_some_and(|mask| mask & (1 << (first - 1)) != 0)
        };
        let deadline = Instant::now() + TIMEOUT;
        while !held(daemon.pid()) {
            assert!(
                Instant::now() < deadline,
                "fdr-profiled never held signal {first}"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        let (_, stderr) = daemon.output_so_far();
        assert!(
            !stderr.contains("every probe is in place"),
            "the signal must come before recording starts:\n{stderr}"
        );
        stop_twice(
            &format!("signal {first} (then {second:?}) while attaching"),
            &fixture,
            daemon,
            &bin,
            &scratch.path().join("out"),
            first,
            second,
        );
        fixture.signal(libc::SIGKILL);
    }
}

/// A second SIGINT, or a SIGTERM, just after the first SIGINT, while the session ends and
/// the probes of 2000 functions are removed: fdr-profiled ends in bounded time all the same.
#[test]
fn a_second_stop_signal_during_detach_ends_in_bounded_time() {
    // A second signal 0 and 20 ms after the first SIGINT.
    for (gap_ms, second) in [(0, libc::SIGINT), (20, libc::SIGINT), (5, libc::SIGTERM)] {
        let scratch = scratch_dir("daemon-second-signal");
        let bin = private_copy(&many_fixture(), scratch.path());
        let (fixture, daemon, out) = pid_session(scratch.path(), &bin, &["--seconds", "60"], &[]);
        std::thread::sleep(Duration::from_millis(300));
        stop_twice(
            &format!("SIGINT, then signal {second} after {gap_ms} ms"),
            &fixture,
            daemon,
            &bin,
            &out,
            libc::SIGINT,
            Some((Duration::from_millis(gap_ms), second)),
        );
        fixture.signal(libc::SIGKILL);
    }
}
