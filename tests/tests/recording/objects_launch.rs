//! End to end, the shared-object cases `trace_dso` (a running process, by pid) leaves out:
//!
//! - `fdr-profiled -- dso-main`: the instrumented library the program links (DT_NEEDED through
//!   its RUNPATH) is probed by path before the program starts, so a `run` queued on stdin
//!   before the start is traced exactly, in the executable and in libfxlinked.so; a `dlopen`ed
//!   libfxloaded.so is found by a rescan and the next `run` is exact in all three objects;
//!   session.json lists objects 0, 1, 2 (paths, build-ids, load addresses); every file loads
//!   in llvm-xray 14 and 19; the daemon exits with the program's status.
//! - `--pid` on a process with 16 instrumented shared objects (libfxlinked.so and 15 copies of
//!   libfxloaded.so, dlopened one at a time): objects 1..15 are probed and listed, the 16th
//!   gets exactly one warning and no probes; calls into all of them leave exactly the calls of
//!   the first 15 in the trace, every record naming a function of objects 0..15.
//!
//! Needs root, BPF, clang-19, llvm-xray 14/19 and a built daemon.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tests::fixtures::dso::{
    call_counts, dso_fixture, extra_copies, private_dso_copy, run_section, DsoProcess,
    LINKED_FUNCTIONS, LOADED_FUNCTIONS, MAIN_FUNCTIONS, MARKER_BEGIN, MARKER_END,
};
use tests::launched::EXITS_PREFIX;
use tests::objects::counts::{assert_runs_counts, resolve_calls};
use tests::objects::{check_listed_objects, load_addresses, load_trace, Object, ObjectLine};
use tests::run::{assert_success, interrupt_and_finish, start_pid, Running};
use tests::trace::{assert_session_totals, check_trace_dir, summary_events_lost};
use tests::{fdr_profiled, scratch_dir};

/// `run N`: thread `index` does N + index rounds; `call N`: N calls of each extra library.
const ROUNDS: u32 = 20;
const TIMEOUT: Duration = Duration::from_secs(60);
/// A dlopened object is probed at the next rescan (200 ms); generous for loaded machines.
const NEW_OBJECT_BOUND: Duration = Duration::from_secs(10);
/// The status the launched program exits with (not 0, so that passing it on is visible).
const EXIT_STATUS: i32 = 3;

fn canon(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).expect("canonicalize a fixture copy")
}

fn object(id: u32, path: &Path, functions: &[&'static str]) -> Object {
    Object {
        id,
        path: path.to_path_buf(),
        file: path.to_path_buf(),
        deleted: false,
        functions: functions.to_vec(),
    }
}

fn executable(exe: &Path) -> Object {
    let mut functions = MAIN_FUNCTIONS.to_vec();
    functions.extend([MARKER_BEGIN, MARKER_END]);
    object(0, exe, &functions)
}

/// session.json's only process, which must be `pid` running `exe`.
fn listed_process(out: &Path, pid: u32, exe: &Path) -> serde_json::Value {
    let json = tests::trace::read_session(out).json;
    let processes = json["processes"]
        .as_array()
        .expect("session.json processes");
    assert_eq!(processes.len(), 1, "one traced process: {json}");
    let p = &processes[0];
    assert_eq!(p["pid"], pid, "the traced process: {json}");
    assert_eq!(p["binary"], *exe.to_string_lossy(), "{json}");
    p.clone()
}

#[test]
fn launched_command_traces_its_linked_library_from_the_start() {
    let scratch = scratch_dir("dso-launch");
    let copy = private_dso_copy(dso_fixture(), scratch.path(), true);
    let (exe, linked, loaded) = (canon(&copy.exe), canon(&copy.linked), canon(&copy.loaded));
    let objects = [
        executable(&exe),
        object(1, &linked, LINKED_FUNCTIONS),
        object(2, &loaded, LOADED_FUNCTIONS),
    ];
    let out = scratch.path().join("out");
    let mut daemon = Command::new(fdr_profiled());
    daemon.arg("--out").arg(&out).arg("--").arg(&exe);
    // The program inherits the daemon's stdin and stderr: the commands reach it through both.
    let mut p = DsoProcess::driving(Running::spawn_piped("fdr-profiled", &mut daemon));
    // Queued before the program starts: it runs at once, before any rescan could find
    // libfxlinked.so mapped, so only probes placed by path before the start can see it.
    p.run(ROUNDS);
    let ready = p
        .running()
        .wait_for_stderr_match("fixture: ready", TIMEOUT, |l| {
            l.starts_with("fixture: ready pid=")
        });
    let pid: u32 = ready["fixture: ready pid=".len()..].parse().expect("pid");
    let mut lines = BTreeMap::new();
    for id in [0, 1] {
        lines.insert(id, ObjectLine::wait(p.running(), id, TIMEOUT));
    }
    let dlopen_ns = p.dlopen();
    lines.insert(2, ObjectLine::wait(p.running(), 2, NEW_OBJECT_BOUND));
    p.run(ROUNDS);
    let maps = load_addresses(pid);
    let done = p.quit_with(
        "fdr-profiled -- dso-main (exit status passed on)",
        EXIT_STATUS,
    );

    // Daemon and program share stderr, so its order is the order things happened in.
    let at = |what: &str, f: &dyn Fn(&str) -> bool| {
        done.stderr
            .lines()
            .position(f)
            .unwrap_or_else(|| panic!("no {what} line:\n{}", done.stderr))
    };
    let object_at = |id: u32| {
        at(&format!("object {id}"), &|l| {
            ObjectLine::parse(l).is_some_and(|o| o.object == id)
        })
    };
    let order = [
        object_at(0),
        object_at(1),
        at("exits", &|l| l.starts_with(EXITS_PREFIX)),
        at("fixture: ready", &|l| l.starts_with("fixture: ready")),
        object_at(2),
    ];
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "want objects 0 and 1 probed, `exits:`, the program's start, object 2 (line numbers {order:?}):\n{}",
        done.stderr
    );
    let p = listed_process(&out, pid, &exe);
    let attached = check_listed_objects(&p, &objects, &lines, &maps);
    assert!(attached[&1] < dlopen_ns, "object 1 attached_ns: {p}");
    let latency_ns = attached[&2] as i128 - dlopen_ns as i128;
    eprintln!(
        "libfxloaded.so probed {:.1} ms after dlopen",
        latency_ns as f64 / 1e6
    );
    assert!(
        latency_ns < NEW_OBJECT_BOUND.as_nanos() as i128,
        "{latency_ns} ns"
    );

    assert_eq!(
        summary_events_lost(&done.stderr),
        Some(0),
        "{}",
        done.stderr
    );
    let trace = load_trace(&out);
    check_trace_dir(&out, &exe);
    assert_eq!(trace.pids(), BTreeSet::from([pid]), "process directories");
    assert_session_totals(&trace);
    let sections = [run_section(&done.stdout, 1), run_section(&done.stdout, 2)];
    assert_runs_counts(&trace, pid, &objects, &sections, true);
}

#[test]
fn a_sixteenth_shared_object_is_refused_with_a_warning() {
    let scratch = scratch_dir("dso-sixteen");
    let copy = private_dso_copy(dso_fixture(), scratch.path(), true);
    let (exe, linked) = (canon(&copy.exe), canon(&copy.linked));
    // libfxlinked.so is shared object 1; 15 copies of libfxloaded.so make 16.
    let extras = extra_copies(&copy.loaded, 15);
    let refused = &extras[14];
    let mut objects = vec![executable(&exe), object(1, &linked, LINKED_FUNCTIONS)];
    for (id, e) in (2..).zip(&extras[..14]) {
        objects.push(object(id, e, LOADED_FUNCTIONS));
    }

    let mut target = DsoProcess::start("target", &exe);
    let pid = target.pid();
    let out = scratch.path().join("out");
    let mut tracer = start_pid(pid, &out, &[]);
    let mut lines = BTreeMap::new();
    for id in [0, 1] {
        lines.insert(id, ObjectLine::wait(&mut tracer, id, TIMEOUT));
    }
    // One at a time, each probed before the next is loaded: ids follow the dlopen order.
    for o in &objects[2..] {
        target.dlopen_path(&o.path);
        lines.insert(o.id, ObjectLine::wait(&mut tracer, o.id, NEW_OBJECT_BOUND));
    }
    target.dlopen_path(refused);
    let warning = tracer.wait_for_stderr_match("a `not traced` warning", NEW_OBJECT_BOUND, |l| {
        l.contains(": not traced: ")
    });
    let want = format!(
        "fdr-profiled: warning: {}: not traced: a trace holds at most 15 instrumented shared objects per process",
        refused.display()
    );
    assert!(warning.starts_with(&want), "{warning:?}, want {want:?}...");
    // Later rescans (every 200 ms) must neither probe it nor warn again.
    std::thread::sleep(Duration::from_millis(600));
    target.call(ROUNDS);
    let maps = load_addresses(pid);
    let tracer_done = interrupt_and_finish(tracer, TIMEOUT);
    assert_success("fdr-profiled --pid (stopped by SIGINT)", &tracer_done);
    let target_done = target.quit("target fixture");

    let stderr = &tracer_done.stderr;
    let not_traced: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("not traced"))
        .collect();
    assert_eq!(not_traced, [warning.as_str()], "one warning:\n{stderr}");
    let probed: Vec<ObjectLine> = stderr.lines().filter_map(ObjectLine::parse).collect();
    let ids: Vec<u32> = probed.iter().map(|o| o.object).collect();
    assert_eq!(
        ids,
        (0..=15).collect::<Vec<u32>>(),
        "attached lines:\n{stderr}"
    );
    let p = listed_process(&out, pid, &exe);
    check_listed_objects(&p, &objects, &lines, &maps);

    assert_eq!(summary_events_lost(stderr), Some(0), "{stderr}");
    let trace = load_trace(&out);
    assert_eq!(trace.pids(), BTreeSet::from([pid]), "process directories");
    assert_session_totals(&trace);
    let (calls, problems) = resolve_calls(&trace, pid, &objects);
    assert!(
        problems.is_empty(),
        "records of no known function:\n{}",
        problems.join("\n")
    );
    // Exact per object and function: the copies' own counters, markers once, nothing else.
    let fixture = call_counts(&target_done.stdout, 1);
    let id_of: BTreeMap<String, u32> = objects
        .iter()
        .map(|o| (o.path.display().to_string(), o.id))
        .collect();
    let mut want = BTreeMap::new();
    for ((path, function), n) in fixture.iter().filter(|(_, n)| **n > 0) {
        if let Some(id) = id_of.get(path) {
            want.insert((*id, function.clone()), (*n, *n));
        }
    }
    assert_eq!(want.len(), 14 * LOADED_FUNCTIONS.len(), "{fixture:?}");
    let refused_calls = fixture[&(refused.display().to_string(), "ld_entry".to_string())];
    assert_eq!(
        refused_calls,
        u64::from(ROUNDS),
        "the 16th object was called"
    );
    want.insert((0, MARKER_BEGIN.to_string()), (1, 1));
    want.insert((0, MARKER_END.to_string()), (1, 1));
    let mut got: BTreeMap<(u32, String), (u64, u64)> = BTreeMap::new();
    for c in &calls {
        assert_eq!(c.tid, pid, "only the main thread calls: {c:?}");
        let n = got.entry((c.object, c.name.clone())).or_default();
        if c.entry {
            n.0 += 1;
        } else {
            n.1 += 1;
        }
    }
    assert_eq!(got, want, "(object, function) -> (entries, exits)");
    let mark = |m: &str| {
        calls
            .iter()
            .find(|c| c.name == m && c.entry)
            .expect("marker")
            .tsc
    };
    let (begin, end) = (mark(MARKER_BEGIN), mark(MARKER_END));
    let outside: Vec<_> = calls
        .iter()
        .filter(|c| c.object > 0 && !(begin < c.tsc && c.tsc < end))
        .collect();
    assert!(outside.is_empty(), "calls outside the markers: {outside:?}");
    let report = std::fs::read_to_string(out.join("report.txt")).expect("report.txt");
    let tag = |p: &Path| format!("ld_entry [{}]", p.file_name().unwrap().to_string_lossy());
    assert!(
        extras[..14].iter().all(|e| report.contains(&tag(e))),
        "{report}"
    );
    assert!(!report.contains(&tag(refused)), "{report}");
}
