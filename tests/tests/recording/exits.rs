//! End to end: `--exits sleds|return|auto|per-function|repair`.
//!
//! - The C++ exception fixture (exceptions thrown through instrumented frames, caught above
//!   them) runs to its normal end under `auto` (a launched command: repaired), `repair`,
//!   `per-function` and `sleds`; `per-function` says it decided per function and chose exit
//!   sleds wherever an exception can pass (stderr and session.json); per thread, entries equal the calls the fixture counted and
//!   exits the calls that returned normally; the call structure equals compiler-rt's own FDR
//!   trace of the same program.
//! - `auto` chooses return probes for the plain C fixture; return probes there give exact
//!   counts and files llvm-xray 14 and 19 load.
//! - The C++ threads fixture (tail calls, recursion, logged arguments) has the call structure of
//!   its native XRay FDR trace in both explicit modes: one Tail_Exit per tail call and no
//!   second exit when the return probe of a tail-calling function fires later.
//!
//! Needs root, BPF, llvm-xray 14/19, clang-19 and a built daemon.

use std::collections::BTreeMap;
use std::time::Duration;

use tests::counts::{expected_calls, parse_count_lines, ExpectedCalls};
use tests::fixtures::workloads::{
    calls_fixture, exceptions_fixture, exceptions_native_fixture, native_trace,
    parse_returned_lines, CALLS_FUNCTIONS, EXCEPTIONS_DONE_20, EXCEPTIONS_FUNCTIONS,
};
use tests::launched::launch;
use tests::scenario::{trace_launched_with, FixtureSpec, CPP};
use tests::structure::{
    assert_same_structure, entries_and_exits, per_thread, without_closing_exits, Payloads,
};
use tests::{convert, native_fdr_fixture, native_fdr_trace, scratch_dir};

const TIMEOUT: Duration = Duration::from_secs(300);

/// The plain C fixture, for the shared scenario checks.
const CALLS: FixtureSpec = FixtureSpec {
    name: "calls",
    build: calls_fixture,
    known: CALLS_FUNCTIONS,
    main_fn: "main",
    only_known: true,
};

/// Per thread (tids differ between runs, so as a sorted list): function -> count.
fn by_content(calls: &ExpectedCalls) -> Vec<BTreeMap<String, u64>> {
    let mut v: Vec<_> = calls.values().cloned().collect();
    v.sort();
    v
}

/// The exception fixture under `daemon_args`: normal end, exit sleds where exceptions pass,
/// exact entries and exits, native structure.
fn exceptions_under(daemon_args: &[&str], mode_label: &str) {
    let untraced = tests::tools::run_output(
        std::process::Command::new(exceptions_fixture()).args(["--iterations", "20"]),
    );
    assert!(untraced.status.success());
    let untraced = String::from_utf8_lossy(&untraced.stdout).into_owned();

    let run = launch(
        &format!("exits-exceptions-{mode_label}"),
        &exceptions_fixture(),
        daemon_args,
        &["--iterations", "20"],
        TIMEOUT,
    );
    let stdout = &run.done.stdout;
    assert_eq!(
        stdout.lines().last(),
        Some(EXCEPTIONS_DONE_20),
        "the traced fixture must end normally:\n{stdout}"
    );
    let calls = expected_calls(&parse_count_lines(stdout));
    let returned = parse_returned_lines(stdout);
    assert_eq!(
        by_content(&calls),
        by_content(&expected_calls(&parse_count_lines(&untraced))),
        "traced and untraced runs count the same calls"
    );
    assert_eq!(
        by_content(&returned),
        by_content(&parse_returned_lines(&untraced))
    );

    let line = run.exits_line();
    assert!(!run.session_str("exits_reason").is_empty());
    if mode_label == "per-function" {
        // Only ex_report (printf, fflush, syscall) and the signal handler's leaf ex_on_signal
        // are proven safe for a return probe: every other function can be left by the
        // exception or calls one that can.
        assert!(
            line.starts_with("per function: 2 return probes, 6 exit sleds ("),
            "{mode_label}: exits line {line:?}"
        );
        assert!(
            line.contains("personality"),
            "auto must say it found a personality routine: {line:?}"
        );
        assert_eq!(run.session_str("exits"), "per-function");
        for f in run.session.json["functions"].as_array().unwrap() {
            let want = if f["name"] == "ex_report" || f["name"] == "ex_on_signal" {
                "return"
            } else {
                "sleds"
            };
            assert_eq!(f["exit"], want, "{f}");
        }
    } else if mode_label == "repair" || mode_label == "auto" {
        assert!(
            line.starts_with("return probes ("),
            "{mode_label}: exits line {line:?}"
        );
        assert_eq!(run.session_str("exits"), "repair");
        if mode_label == "auto" {
            // The defaults repair a launched command whose image can unwind, and say why.
            assert!(
                line.contains("auto: ") && line.contains("personality"),
                "{line:?}"
            );
        }
        // Every throw was repaired, and every catch hooked the live frames again.
        let caught: u64 = EXCEPTIONS_DONE_20
            .split_whitespace()
            .nth(2)
            .and_then(|c| c.strip_prefix("caught="))
            .and_then(|c| c.parse().ok())
            .unwrap();
        let (repair, _) = tests::trace::repair_books(&run.session, &run.done.stderr);
        assert!(
            repair.starts_with(&format!("{caught} throws (")),
            "{repair}"
        );
        assert!(
            repair.contains(&format!(", {caught} catches (")),
            "{repair}"
        );
        // Every slot the repairs looked at was a live hooked frame, or one the exception left
        // (by the stack pointer at the probe, not the registers after its `push`).
        assert!(repair.contains(" 0 slots left alone;"), "{repair}");
    } else {
        assert!(
            line.starts_with("exit sleds ("),
            "{mode_label}: exits line {line:?}"
        );
        assert_eq!(run.session_str("exits"), "sleds");
    }
    assert_eq!(run.session.events_lost, 0, "{}", run.session.json);
    tests::assert_every_event_accounted(&run.session);

    // Our reader accepts every file (files() panics otherwise); llvm-xray 14 and 19 read the
    // same records; per thread and function: entries = calls, exits = normal returns.
    let pid = run.pid();
    let files = run.files();
    assert_eq!(files.len(), 3, "3 threads ran instrumented code");
    // (converted_both asserts that 14 and 19 agree on every record of every file.)
    let converted = run.converted_both();
    for (tid, c) in &converted {
        // The daemon's closing exits, exactly as session.json lists them.
        let closing_runs = run.session.closing_exits(*tid);
        let (_, unwound_exits) = without_closing_exits(c.records.iter(), &closing_runs);
        let mut unwound_in_thread = 0;
        let want_calls = calls
            .get(tid)
            .unwrap_or_else(|| panic!("no count lines for {tid}"));
        let want_returns = &returned[tid];
        for f in EXCEPTIONS_FUNCTIONS {
            let (entries, exits) = entries_and_exits(&c.records, f);
            let want = want_calls.get(*f).copied().unwrap_or(0);
            let want_ret = want_returns.get(*f).copied().unwrap_or(0);
            // Every entry has one exit in our files: its return, or for a frame an exception
            // unwound, the exit the daemon writes where the exception is caught (so that its
            // duration ends there and llvm-xray's account loads the file; native XRay writes
            // none).
            let unwound = unwound_exits
                .get(&(*tid, f.to_string()))
                .copied()
                .unwrap_or(0);
            assert_eq!(
                (entries, exits - unwound, unwound),
                (want, want_ret, want - want_ret),
                "tid {tid} {f}: (entries, returns, exits of unwound frames)"
            );
            unwound_in_thread += unwound;
        }
        assert_eq!(
            run.thread_u64("frames_unwound")
                .get(tid)
                .copied()
                .unwrap_or(0),
            unwound_in_thread,
            "tid {tid}: session.json frames_unwound"
        );
        // Without the closing exits (`dump --xray-stream`) the stream is XRay's own: entries =
        // calls, exits = normal returns.
        let file = files.iter().find(|f| f.tid == *tid).unwrap();
        let dump = |extra: &[&str]| {
            let out = tests::tools::run_output(
                std::process::Command::new(tests::tools::fdr_profiled())
                    .arg("dump")
                    .arg(&file.path)
                    .arg("--session")
                    .arg(&run.out)
                    .args(extra),
            );
            assert!(out.status.success(), "dump: {out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        let count =
            |text: &str, what: &str| text.lines().filter(|l| l.contains(what)).count() as u64;
        let xray = dump(&["--xray-stream"]);
        let marked = dump(&[]);
        let calls_total: u64 = want_calls.values().sum();
        let returns_total: u64 = EXCEPTIONS_FUNCTIONS
            .iter()
            .map(|f| want_returns.get(*f).copied().unwrap_or(0))
            .sum();
        // main (not counted by the fixture) enters and returns once, in the main thread.
        let main_calls = u64::from(*tid == pid);
        assert_eq!(
            count(&xray, "<Function Enter"),
            calls_total + main_calls,
            "tid {tid}"
        );
        assert_eq!(
            count(&xray, "<Function Exit") + count(&xray, "<Function Tail Exit"),
            returns_total + main_calls,
            "tid {tid}"
        );
        assert_eq!(count(&xray, "closed by fdr-profiled"), 0, "tid {tid}");
        assert_eq!(
            count(&marked, "closed by fdr-profiled"),
            calls_total - returns_total,
            "tid {tid}"
        );
        // Each catch closes its frames before the catching function goes on: the record after
        // a run of closing exits is the catcher's own exit, later.
        let (kept, _) = without_closing_exits(c.records.iter(), &closing_runs);
        let closing: Vec<u64> = c
            .records
            .iter()
            .filter(|r| !kept.iter().any(|k| std::ptr::eq(*k, *r)))
            .map(|r| r.tsc)
            .collect();
        for tick in closing
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<u64>>()
        {
            let after = c
                .records
                .iter()
                .find(|r| r.tsc > tick)
                .unwrap_or_else(|| panic!("tid {tid}: nothing after the catch at {tick}"));
            assert_eq!(
                (after.function.as_str(), after.kind.clone()),
                ("ex_catcher", tests::xray_yaml::RecordKind::Exit),
                "tid {tid}: after the catch at {tick}"
            );
        }
        let main_records = c.records.iter().filter(|r| r.function == "main").count();
        assert_eq!(
            main_records,
            if *tid == pid { 2 } else { 0 },
            "tid {tid}: main"
        );
    }

    // Every exception the fixture caught was seen caught.
    let catches: u64 = run.thread_u64("catches").values().sum();
    assert_eq!(
        Some(format!("caught={catches}").as_str()),
        EXCEPTIONS_DONE_20.split_whitespace().nth(2),
        "session.json catches"
    );

    // The report written at the end counts the calls the daemon closed at a catch, as
    // session.json does.
    let unwound: u64 = run.thread_u64("frames_unwound").values().sum();
    let report = std::fs::read_to_string(run.out.join("report.txt")).expect("report.txt");
    assert!(
        report.contains(&format!("{unwound} calls, timed to that point")),
        "report.txt does not count the {unwound} frames closed at a catch:\n{report}"
    );

    // Durations bounded by the caller: in the timeline every call, the unwound ones included,
    // begins and ends within the call that made it, and in `report --per-thread` no function's
    // longest call outlasts its callers' (a frame closed only at the thread's end would).
    tests::durations::assert_durations_within_callers(
        &run.out,
        run.scratch.path(),
        &["ex_middle", "ex_thrower"],
        &calls,
    );

    // The structure of compiler-rt's own trace of the same program.
    let native_dir = scratch_dir("exits-exceptions-native");
    let native_bin = exceptions_native_fixture();
    let (native_file, native_stdout) =
        native_trace(&native_bin, native_dir.path(), &["--iterations", "20"]);
    assert_eq!(native_stdout.lines().last(), Some(EXCEPTIONS_DONE_20));
    let native = convert(19, &native_bin, &native_file);
    let ours: Vec<_> = converted
        .iter()
        .flat_map(|(tid, c)| {
            without_closing_exits(c.records.iter(), &run.session.closing_exits(*tid)).0
        })
        .collect();
    assert_same_structure(
        &format!("exceptions, {mode_label}"),
        &per_thread(ours),
        &per_thread(&native.records),
        Payloads { max_bytes: 0 },
    );
}

/// `--exits` not given (auto): the C++ runtime is in the image and fdr-profiled launches the
/// command, so it repairs the stack (return probes everywhere); the program runs to its end
/// with the same exact counts, catches and native structure.
#[test]
fn exceptions_complete_under_auto() {
    exceptions_under(&[], "auto");
}

/// `--exits per-function`: each function is decided from its code (two return probes, exit
/// sleds for the functions exceptions pass through); the program runs to its end.
#[test]
fn exceptions_complete_under_per_function() {
    exceptions_under(&["--exits", "per-function"], "per-function");
}

/// `--exits repair`: return probes on every function, the stack repaired at each throw; the
/// same exact counts, catches and native structure.
#[test]
fn exceptions_complete_under_repair() {
    exceptions_under(&["--exits", "repair"], "repair");
}

/// `--exits sleds`: the same.
#[test]
fn exceptions_complete_under_sleds() {
    exceptions_under(&["--exits", "sleds"], "sleds");
}

/// `auto` on a plain C program: no personality routine anywhere, so return probes; exact counts
/// and valid files (the scenario's checks).
#[test]
fn auto_picks_return_probes_for_plain_c() {
    let run = trace_launched_with(&CALLS, 5_000, &[]);
    let line = run
        .tracer
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix(tests::launched::EXITS_PREFIX))
        .unwrap_or_else(|| panic!("no exits line:\n{}", run.tracer.stderr));
    assert!(line.starts_with("return probes ("), "{line:?}");
    assert_eq!(run.trace.session.json["exits"], "return");
    assert!(run.trace.session.json["exits_reason"]
        .as_str()
        .is_some_and(|r| !r.is_empty()));
}

/// Explicit modes on the C fixture: exact per-thread counts, llvm-xray 14 and 19 load the files,
/// no loss (the scenario's checks), and the daemon says it used the mode asked for.
#[test]
fn explicit_modes_on_plain_c() {
    for (mode, said) in [("return", "return probes ("), ("sleds", "exit sleds (")] {
        let run = trace_launched_with(&CALLS, 20_000, &["--exits", mode]);
        assert!(
            run.tracer.stderr.lines().any(|l| l
                .strip_prefix(tests::launched::EXITS_PREFIX)
                .is_some_and(|r| r.starts_with(said))),
            "--exits {mode}:\n{}",
            run.tracer.stderr
        );
        assert_eq!(run.trace.session.json["exits"], mode);
    }
}

/// The C++ threads fixture in both modes: exact counts (scenario checks), one Tail_Exit and no
/// Exit per call of the tail-calling function, and the structure of the native trace.
#[test]
fn tail_calls_and_structure_match_native_in_both_modes() {
    let native_dir = scratch_dir("exits-threads-native");
    let (native_file, _) = native_fdr_trace(native_dir.path(), &["--iterations", "30"]);
    let native = per_thread(&convert(19, &native_fdr_fixture(), &native_file).records);
    for mode in ["return", "sleds"] {
        let run = trace_launched_with(&CPP, 30, &["--exits", mode]);
        tests::scenario::assert_cpp_logged_args(&run.trace);
        for t in &run.trace.threads {
            let c = t.calls().get("fx_tail_caller").copied().unwrap_or_default();
            assert!(c.entries() > 0, "tid {}: fx_tail_caller ran", t.tid);
            assert_eq!(
                (c.tail_exit, c.exit),
                (c.entries(), 0),
                "--exits {mode}, tid {}: fx_tail_caller leaves by a tail exit only",
                t.tid
            );
        }
        let ours = per_thread(run.trace.threads.iter().flat_map(|t| t.records.iter()));
        assert_same_structure(
            &format!("threads.cpp, --exits {mode}"),
            &ours,
            &native,
            Payloads { max_bytes: 0 },
        );
    }
}

/// `--exits repair` makes fdr-profiled's keeper the command's ptrace tracer: signals meant for
/// the program must reach it unchanged and promptly, and a stop must stop it. While the
/// exception fixture throws thousands of times, the test sends it 70 signals (its handler calls
/// a traced function): queued real-time ones and, every fourth, SIGURG, which the program
/// catches, so its threads must be stopped for their repairs with another signal. Then SIGSTOP
/// (the program must show as stopped and make no progress) and SIGCONT. The program handles
/// every signal (SIGURGs that came while one was pending merge, as untraced), ends as untraced
/// would, every delivery was passed on, and the trace holds the handler calls, each closed once.
#[test]
fn repair_passes_signals_and_stops_on_unchanged() {
    use std::process::Command;
    use tests::run::Running;
    let scratch = scratch_dir("exits-repair-signals");
    let out = scratch.path().join("out");
    let mut daemon = Running::spawn(
        "fdr-profiled",
        Command::new(tests::fdr_profiled())
            .args(["--exits", "repair", "--out"])
            .arg(&out)
            .arg("--")
            .arg(exceptions_fixture())
            .args(["--iterations", "4000", "--signals"]),
    );
    daemon.wait_for_stderr_line("fdr-profiled: recording: every probe is in place", TIMEOUT);
    let child = tests::run::launched_child(daemon.pid(), &exceptions_fixture(), TIMEOUT);
    let state = || {
        std::fs::read_to_string(format!("/proc/{child}/stat"))
            .ok()
            .and_then(|s| s[s.rfind(')')? + 2..].chars().next())
    };
    let signal = libc::SIGRTMIN() + 1;
    // The default action of a real-time signal ends the program: send none before its
    // handler is in place (the caught-signal mask in /proc/PID/status).
    let deadline = std::time::Instant::now() + TIMEOUT;
    let handler_installed = || {
        tests::run::signal_mask(child.into(), "SigCgt")
            .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
    };
    while !handler_installed() {
        assert!(
            std::time::Instant::now() < deadline,
            "the fixture never installed its handler"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // fdr-profiled holds SIGINT and SIGTERM blocked while it attaches: the command must get
    // the mask fdr-profiled started with (nothing blocked here). glibc blocks every signal for
    // a moment while it creates a thread, so the main thread's mask is read until it is empty.
    let blocked = || tests::run::signal_mask(child.into(), "SigBlk");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut mask = blocked();
    while mask != Some(0) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(100));
        mask = blocked();
    }
    assert_eq!(mask, Some(0), "the command's blocked signals");
    for i in 0..70 {
        // Every fourth a SIGURG: the program catches it, so the repairs must stop its threads
        // with another signal and leave every SIGURG to it.
        let signal = if i % 4 == 3 { libc::SIGURG } else { signal };
        // SAFETY: plain kill(2) of our grandchild.
        let sent = unsafe { libc::kill(child, signal) };
        assert_eq!(
            sent,
            0,
            "kill({child}, {signal}): {}",
            std::io::Error::last_os_error()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    // SAFETY: as above.
    unsafe { libc::kill(child, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_millis(200));
    let stopped = state();
    let progress = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s[s.rfind(')')? + 2..]
                    .split_whitespace()
                    .nth(11)?
                    .parse::<u64>()
                    .ok()
            })
    };
    let utime = progress(child);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        progress(child),
        utime,
        "a stopped program makes no progress"
    );
    // SAFETY: as above.
    unsafe { libc::kill(child, libc::SIGCONT) };
    assert!(
        matches!(stopped, Some('T' | 't')),
        "SIGSTOP must stop the traced program: state {stopped:?}"
    );
    let done = daemon.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    let mut lines = done.stdout.lines().rev();
    assert_eq!(
        lines.next(),
        Some("exceptions: done caught=12000 rounds=24000"),
        "{}",
        done.stderr
    );
    // SIGURG is not queued: one sent while another is pending merges with it.
    let handled: u32 = lines
        .next()
        .and_then(|l| l.strip_prefix("exceptions: signals="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", done.stdout));
    assert!((53..=70).contains(&handled), "{handled} signals handled");
    let session = tests::trace::read_session(&out);
    let (repair, throws) = tests::trace::repair_books(&session, &done.stderr);
    assert_eq!(throws, 12000, "{repair}");
    // The signals handled, SIGSTOP and SIGCONT.
    let passed_on: u64 = repair
        .rsplit("; ")
        .next()
        .and_then(|s| s.strip_suffix(" signals passed on"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{repair}"));
    assert_eq!(passed_on, u64::from(handled) + 2, "{repair}");
    assert_eq!(session.events_lost, 0);
    tests::assert_every_event_accounted(&session);
    let (mut entries, mut exits) = (0, 0);
    for dir in std::fs::read_dir(&out).unwrap().flatten() {
        if !dir.file_type().unwrap().is_dir() {
            continue;
        }
        for f in std::fs::read_dir(dir.path()).unwrap().flatten() {
            let c = convert(19, &exceptions_fixture(), &f.path());
            for r in c.records.iter().filter(|r| r.function == "ex_on_signal") {
                if r.kind.is_entry() {
                    entries += 1;
                } else if r.kind.is_exit() {
                    exits += 1;
                }
            }
        }
    }
    assert_eq!(
        (entries, exits),
        (handled, handled),
        "the handler's calls in the trace"
    );
}

/// A destructor run while an exception unwinds proves the frames the exception left gone
/// before the catch does: ordinary C++, no sign of the kernel's limit of pending return
/// probes. Launched with the defaults (repair), 30,000 rounds, a throw in three: no fall-back to
/// exit sleds, every exit observed by a return probe, and every call's entry and exit in the
/// file (llvm-xray 14 and 19) as the program counted them.
#[test]
fn destructors_during_unwinding_keep_the_return_probes() {
    let run = launch(
        "exits-cleanup",
        &tests::fixtures::workloads::cleanup_fixture(),
        &[],
        &["--iterations", "30000"],
        TIMEOUT,
    );
    let stdout = &run.done.stdout;
    assert!(
        stdout.contains("cleanup: done caught=10000 released=30000"),
        "{stdout}"
    );
    assert!(
        !run.done.stderr.contains("instead of return probes"),
        "a fall-back to exit sleds: {}",
        run.done.stderr
    );
    let methods = &run.session.json["exit_methods"];
    assert_eq!(methods["exit_sled_calls"], 0, "{methods}");
    assert!(
        methods["return_probe_calls"].as_u64() >= Some(40_000),
        "{methods}"
    );
    let calls = expected_calls(&parse_count_lines(stdout));
    let pid = run.pid();
    let converted = run.converted_both();
    let c = &converted[&pid];
    for (name, want) in &calls[&pid] {
        let count = |exit: bool| {
            c.records
                .iter()
                .filter(|r| r.function == *name && r.kind.is_exit() == exit)
                .count() as u64
        };
        assert_eq!(
            (count(false), count(true)),
            (*want, *want),
            "{name}: (entries, exits)"
        );
    }
}
