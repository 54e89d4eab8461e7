//! `fdr-profiled service` and the shared objects of a target's processes, with real BPF and
//! the dso fixture (`tests::fixtures::dso`): an executable linked against an instrumented
//! `libfxlinked.so` that `dlopen`s an instrumented `libfxloaded.so` on command.
//!
//! - process A runs before the service starts: its libraries are probed at start;
//! - process B starts after: its libraries are probed once the service has seen its first
//!   traced call (a `call 0`, which only enters the markers), which `status --json` shows;
//! - both `dlopen` the second library (probed within a rescan) and `run` on all their threads;
//! - a bystander runs the same libraries from an uninstrumented executable: it is not a process
//!   of the target, so nothing of it may be recorded.
//!
//! The snapshot then holds exactly A and B; every file loads in llvm-xray 14 and 19; each
//! record's packed id `(object << 24) | function` names a function of that object; per thread
//! and function, entries and exits equal the fixture's counts in all three objects; session.json
//! lists the objects with one id each for the whole binary.
//!
//! Needs root, BPF, clang-19, llvm-xray 14/19 and a built daemon.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tests::counts::{expected_calls, parse_count_lines};
use tests::fixtures::dso::{
    dso_fixture, run_section, DsoProcess, LINKED_FUNCTIONS, LOADED_FUNCTIONS, MAIN_FUNCTIONS,
    MARKER_BEGIN, MARKER_END,
};
use tests::fixtures::private_copy;
use tests::objects::counts::resolve_calls;
use tests::objects::{assert_counts, load_trace, Object};
use tests::service::{service_status, ServiceStart};

const TIMEOUT: Duration = Duration::from_secs(60);
/// `run N`: thread `index` does N + index rounds.
const ROUNDS: u32 = 20;

/// How many libraries the service has probed in process `pid` (`None`: not one of its
/// processes).
fn libraries_probed(json: &serde_json::Value, pid: u32) -> Option<u64> {
    json["targets"][0]["binaries"][0]["processes"]
        .as_array()?
        .iter()
        .find(|p| p["pid"] == pid)
        .and_then(|p| p["libraries"].as_u64())
}

/// Waits until the service has probed `n` libraries in `pid`.
fn wait_probed(socket: &Path, pid: u32, n: u64) {
    let start = Instant::now();
    loop {
        let json = service_status(socket);
        if libraries_probed(&json, pid) == Some(n) {
            return;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "process {pid}: {n} libraries never probed: {json}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_libraries_of_every_process_of_a_target_are_traced() {
    let build = dso_fixture();
    let scratch = tests::scratch_dir("service-objects");
    let dir = scratch.path();
    let canon = |p: PathBuf| std::fs::canonicalize(p).expect("canonicalize a fixture copy");
    let exe = canon(private_copy(&build.exe, dir));
    let plain = canon(private_copy(&build.plain_exe, dir));
    let linked = canon(private_copy(&build.linked, dir));
    let loaded = canon(private_copy(&build.loaded, dir));
    let mut main_functions = MAIN_FUNCTIONS.to_vec();
    main_functions.extend([MARKER_BEGIN, MARKER_END]);
    let objects = [
        (0, &exe, main_functions),
        (1, &linked, LINKED_FUNCTIONS.to_vec()),
        (2, &loaded, LOADED_FUNCTIONS.to_vec()),
    ]
    .map(|(id, path, functions)| Object {
        id,
        path: path.clone(),
        file: path.clone(),
        deleted: false,
        functions,
    });

    let mut a = DsoProcess::start("process A", &exe);
    let output = dir.join("out");
    let start = ServiceStart::written(
        dir,
        &format!(
            "output = \"{}\"\n[[target]]\nname = \"dso\"\nbinary = \"{}\"\nwindow = \"120s\"\n",
            output.display(),
            exe.display()
        ),
    );
    let socket = start.socket_path().to_path_buf();
    let mut service = start.start();
    // A was running: its linked library was probed before the service said it is ready.
    assert_eq!(libraries_probed(&service_status(&socket), a.pid()), Some(1));

    let mut b = DsoProcess::start("process B", &exe);
    let mut bystander = DsoProcess::start("bystander", &plain);
    // B's first traced call makes the service look at it.
    b.call(0);
    wait_probed(&socket, b.pid(), 1);

    a.dlopen();
    service.wait_for_stderr_match("the service's line probing libfxloaded.so", TIMEOUT, |l| {
        l.contains("probing 3 functions of") && l.contains("libfxloaded.so (object 2)")
    });
    wait_probed(&socket, a.pid(), 2);
    b.dlopen();
    wait_probed(&socket, b.pid(), 2);
    bystander.dlopen();
    a.run(ROUNDS);
    b.run(ROUNDS);
    bystander.run(ROUNDS);
    let json = service_status(&socket);
    assert_eq!(
        libraries_probed(&json, bystander.pid()),
        None,
        "the bystander is no process of the target: {json}"
    );
    std::thread::sleep(Duration::from_millis(300));
    service.signal(libc::SIGUSR1);
    let line = service.wait_for_stderr_match("the snapshot line", TIMEOUT, |l| {
        l.starts_with("fdr-profiled: service: target dso: snapshot ")
    });
    let snapshot = PathBuf::from(line.rsplit_once(' ').unwrap().1);
    let (a_pid, b_pid) = (a.pid(), b.pid());
    let a_done = a.quit("process A");
    let b_done = b.quit("process B");
    bystander.quit("bystander");
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);

    let trace = load_trace(&snapshot);
    assert_eq!(
        trace.pids(),
        BTreeSet::from([a_pid, b_pid]),
        "processes in the snapshot (never the bystander)"
    );
    tests::assert_every_event_accounted(&trace.session);
    check_objects(&trace.session.json, &objects);
    // A: every call of its run, in all three objects, between the markers.
    assert_counts(
        &trace,
        a_pid,
        &objects,
        &run_section(&a_done.stdout, 1),
        true,
    );
    // B: its run, and the markers of its first `call 0` too.
    let (calls, problems) = resolve_calls(&trace, b_pid, &objects);
    assert!(problems.is_empty(), "{problems:#?}");
    let mut got: BTreeMap<(u32, String), (u64, u64)> = BTreeMap::new();
    for c in &calls {
        let n = got.entry((c.tid, c.name.clone())).or_default();
        match c.entry {
            true => n.0 += 1,
            false => n.1 += 1,
        }
    }
    let mut want: BTreeMap<(u32, String), (u64, u64)> = BTreeMap::new();
    for (tid, functions) in expected_calls(&parse_count_lines(&run_section(&b_done.stdout, 1))) {
        for (f, n) in functions {
            want.insert((tid, f), (n, n));
        }
    }
    for marker in [MARKER_BEGIN, MARKER_END] {
        want.insert((b_pid, marker.to_owned()), (2, 2));
    }
    let objects_seen: BTreeSet<u32> = calls.iter().map(|c| c.object).collect();
    assert_eq!(objects_seen, BTreeSet::from([0, 1, 2]), "B's objects");
    assert_eq!(
        got, want,
        "process B: (entries, exits) per thread and function"
    );
}

/// session.json names each object once for the binary, with the id its records carry.
fn check_objects(json: &serde_json::Value, objects: &[Object]) {
    let listed: Vec<&serde_json::Value> = json["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["objects"].as_array().into_iter().flatten())
        .collect();
    assert!(!listed.is_empty(), "no objects in session.json: {json}");
    for o in objects {
        let path = o.path.to_string_lossy();
        assert!(
            listed
                .iter()
                .any(|m| m["object_id"] == o.id && m["path"] == *path),
            "object {} ({path}) not listed: {json}",
            o.id
        );
    }
}
