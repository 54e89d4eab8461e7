//! End to end, `--pid` on a running multi-threaded process, its shared objects and its new
//! threads (the fixture of `tests::fixtures::dso`):
//!
//! - a target and a bystander process run private copies of the executable (instrumented or
//!   not), `libfxlinked.so` (linked; deleted from disk after both started, so the daemon must
//!   read it through /proc/PID/map_files) and `libfxloaded.so` (dlopened on command after
//!   attach); the daemon must print its `(object K)` line for the latter soon after the
//!   `dlopen` (measured and printed; asserted only against a generous bound);
//! - both processes `run`: main thread, parked workers and threads created right then call
//!   functions of all three objects between two markers; the daemon is stopped by SIGINT, the
//!   target (and bystander) keep running, run once more and exit 0;
//! - session.json lists only the target, its objects with ids, paths, deleted flags, build-ids
//!   (llvm-readelf's) and load addresses (/proc/PID/maps); every FDR file loads in llvm-xray 14
//!   and 19; each record's packed id `(object << 24) | function` names a function of that object
//!   (`llvm-xray extract --symbolize`); per thread and function, entries and exits between the
//!   markers equal the fixture's counts, and nothing lies outside them; `events lost: 0`;
//!   report.txt names the shared objects' functions.
//!
//! `hostile/arguments.rs` (`pid_of_a_process_without_instrumentation`) covers a process with no
//! instrumented object at all. Needs root, BPF, clang-19, llvm-xray 14/19 and a built daemon.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tests::fixtures::dso::{
    dso_fixture, private_dso_copy, run_section, DsoProcess, LINKED_FUNCTIONS, LOADED_FUNCTIONS,
    MAIN_FUNCTIONS, MARKER_BEGIN, MARKER_END,
};
use tests::objects::{
    assert_counts, check_listed_objects, load_addresses, load_trace, Object, ObjectLine,
};
use tests::run::{assert_success, interrupt_and_finish, start_pid, Finished};
use tests::scratch_dir;
use tests::trace::{assert_session_totals, check_trace_dir, summary_events_lost};

/// `run N` of the fixture: thread `index` does N + index rounds.
const ROUNDS: u32 = 20;
/// The requirement is "probed within a second of the dlopen"; the test only fails beyond this
/// (loaded CI machines), and prints what it measured.
const NEW_OBJECT_BOUND: Duration = Duration::from_secs(10);
const ATTACH_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// One way to run the scenario.
#[derive(Clone, Copy)]
struct Scenario {
    label: &'static str,
    instrumented_exe: bool,
    daemon_args: &'static [&'static str],
    /// session.json `exits`, when the scenario chooses it.
    exits: Option<&'static str>,
}

#[test]
fn linked_deleted_and_dlopened_objects_by_pid() {
    run(Scenario {
        label: "sleds",
        instrumented_exe: true,
        daemon_args: &[],
        exits: None,
    });
}

#[test]
fn shared_objects_with_return_probes() {
    run(Scenario {
        label: "return",
        instrumented_exe: true,
        daemon_args: &["--exits", "return"],
        exits: Some("return"),
    });
}

/// Only the shared objects are instrumented: there is no object 0.
#[test]
fn uninstrumented_executable_with_instrumented_objects() {
    run(Scenario {
        label: "plain-exe",
        instrumented_exe: false,
        daemon_args: &[],
        exits: None,
    });
}

fn run(s: Scenario) {
    let build = dso_fixture();
    let scratch = scratch_dir(&format!("dso-{}", s.label));
    let copy = private_dso_copy(build, scratch.path(), s.instrumented_exe);
    let canon = |p: &PathBuf| std::fs::canonicalize(p).expect("canonicalize a fixture copy");
    let (exe, linked, loaded) = (canon(&copy.exe), canon(&copy.linked), canon(&copy.loaded));
    let mut objects = Vec::new();
    if s.instrumented_exe {
        let mut functions = MAIN_FUNCTIONS.to_vec();
        functions.extend([MARKER_BEGIN, MARKER_END]);
        objects.push(Object {
            id: 0,
            path: exe.clone(),
            file: exe.clone(),
            deleted: false,
            functions,
        });
    }
    objects.push(Object {
        id: 1,
        path: linked.clone(),
        file: build.linked.clone(),
        deleted: true,
        functions: LINKED_FUNCTIONS.to_vec(),
    });
    objects.push(Object {
        id: 2,
        path: loaded.clone(),
        file: loaded,
        deleted: false,
        functions: LOADED_FUNCTIONS.to_vec(),
    });

    let mut target = DsoProcess::start("target", &exe);
    let mut bystander = DsoProcess::start("bystander", &exe);
    let pid = target.pid();
    std::fs::remove_file(&linked).expect("delete the mapped libfxlinked.so");
    let out = scratch.path().join("out");
    let mut tracer = start_pid(pid, &out, s.daemon_args);
    let mut lines = BTreeMap::new();
    for o in objects.iter().filter(|o| o.id < 2) {
        lines.insert(o.id, ObjectLine::wait(&mut tracer, o.id, ATTACH_TIMEOUT));
    }
    // The daemon rescans right when its event loop starts, then every 200 ms: waiting past
    // the first rescan makes a periodic one find the dlopened object, as in real use.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let dlopen_ns = target.dlopen();
    let acked = Instant::now();
    lines.insert(2, ObjectLine::wait(&mut tracer, 2, NEW_OBJECT_BOUND));
    let seen_after = acked.elapsed();
    bystander.dlopen();
    target.run(ROUNDS);
    bystander.run(ROUNDS);
    let maps = load_addresses(pid);

    let tracer_done = interrupt_and_finish(tracer, STOP_TIMEOUT);
    assert_success("fdr-profiled --pid (stopped by SIGINT)", &tracer_done);
    assert!(target.is_alive(), "detaching must leave the target running");
    assert!(bystander.is_alive(), "the bystander must keep running");
    // Once more without the tracer: no probe may be left behind.
    target.run(1);
    let target_done = target.quit("target fixture");
    bystander.run(1);
    bystander.quit("bystander fixture");

    let session = tests::trace::read_session(&out);
    let attached_ns = check_manifest(&s, &session.json, pid, &exe, &objects, &lines, &maps);
    let latency_ns = attached_ns as i128 - dlopen_ns as i128;
    eprintln!(
        "[{}] libfxloaded.so probed {:.1} ms after dlopen returned (session.json attached_ns), daemon line seen {:.1} ms after the fixture's acknowledgement",
        s.label,
        latency_ns as f64 / 1e6,
        seen_after.as_secs_f64() * 1e3
    );
    assert!(
        latency_ns < NEW_OBJECT_BOUND.as_nanos() as i128,
        "libfxloaded.so probed {latency_ns} ns after dlopen"
    );
    check_trace(&s, &out, &exe, pid, &objects, &target_done, &tracer_done);
}

/// session.json against what the test knows; returns object 2's `attached_ns`.
fn check_manifest(
    s: &Scenario,
    json: &serde_json::Value,
    pid: u32,
    exe: &std::path::Path,
    objects: &[Object],
    lines: &BTreeMap<u32, ObjectLine>,
    maps: &BTreeMap<String, u64>,
) -> u64 {
    if let Some(exits) = s.exits {
        assert_eq!(json["exits"], exits, "session.json exits: {json}");
    }
    let processes = json["processes"]
        .as_array()
        .expect("session.json processes");
    assert_eq!(processes.len(), 1, "only the target is traced: {json}");
    let p = &processes[0];
    assert_eq!(p["pid"], pid, "the traced process: {json}");
    assert_eq!(p["binary"], *exe.to_string_lossy(), "{json}");
    check_listed_objects(p, objects, lines, maps)[&2]
}

fn check_trace(
    s: &Scenario,
    out: &std::path::Path,
    exe: &std::path::Path,
    pid: u32,
    objects: &[Object],
    target: &Finished,
    tracer: &Finished,
) {
    assert_eq!(
        summary_events_lost(&tracer.stderr),
        Some(0),
        "the daemon's summary must say `events lost: 0`:\n{}",
        tracer.stderr
    );
    if !s.instrumented_exe {
        let main_line = tracer
            .stderr
            .lines()
            .find(|l| ObjectLine::parse(l).is_some_and(|o| o.object == 0));
        assert_eq!(main_line, None, "the executable has no XRay map");
    }
    let trace = load_trace(out);
    if s.instrumented_exe {
        // Also with -instr_map of the executable (ids of the other objects stay numbers).
        check_trace_dir(out, exe);
    }
    assert_eq!(trace.pids(), BTreeSet::from([pid]), "process directories");
    assert_session_totals(&trace);
    assert_counts(
        &trace,
        pid,
        objects,
        &run_section(&target.stdout, 1),
        s.instrumented_exe,
    );
    let report = std::fs::read_to_string(out.join("report.txt")).expect("report.txt");
    for f in LINKED_FUNCTIONS.iter().chain(LOADED_FUNCTIONS) {
        assert!(
            report.contains(f),
            "report.txt does not name {f} (shared object function):\n{report}"
        );
    }
}
