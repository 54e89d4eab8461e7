//! The root service against a hostile local user (issue 34), with real BPF and real processes:
//! what an unprivileged user can make the service do must never write outside its output,
//! lend root's privileges, keep it down or lose events without counting them.
//!
//! - 30,000 short threads under a 32 MiB flight-recorder cap: every event the program made is
//!   held, aged out, evicted or lost, and the sum is exactly what it counted.
//!
//! Needs root, BPF, clang-19 and a built daemon.
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tests::counts::parse_count_lines;
use tests::fixtures::private_copy;
use tests::fixtures::workloads::calls_fixture;
use tests::run::{service_status, start_service, Running};
use tests::tools::{run_output, scratch_dir};

const TIMEOUT: Duration = Duration::from_secs(120);

/// Writes the configuration `text` to `scratch/fdr-profiled.toml` and starts the service on
/// it; returns it ready, and its socket.
fn service(scratch: &Path, text: &str) -> (Running, std::path::PathBuf) {
    let config = scratch.join("fdr-profiled.toml");
    std::fs::write(&config, text).unwrap();
    let socket = scratch.join("control.sock");
    (start_service(&config, &socket), socket)
}

/// Polls the service's status until `done` holds for it (or panics after [`TIMEOUT`]).
fn status_when(socket: &Path, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let start = std::time::Instant::now();
    loop {
        let status = service_status(socket);
        if done(&status) {
            return status;
        }
        assert!(start.elapsed() < TIMEOUT, "status never settled: {status}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn thread_churn_under_a_small_window_accounts_for_every_event() {
    let scratch = scratch_dir("hostile-churn");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let (service, socket) = service(
        scratch.path(),
        &format!(
            "output = \"{}\"\n[[target]]\nname = \"churn\"\nbinary = \"{}\"\nwindow = \"10s\"\nmax_memory = \"32MiB\"\n",
            scratch.path().join("out").display(),
            bin.display()
        ),
    );
    // 30,000 threads one batch of 100 after another, 51 calls each (cx_short, 50 cx_tiny).
    let out = run_output(Command::new(&bin).args([
        "--iterations",
        "0",
        "--short-threads",
        "30000",
        "--short-calls",
        "50",
    ]));
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines = parse_count_lines(&stdout);
    let threads: std::collections::BTreeSet<u32> = lines.iter().map(|l| l.tid).collect();
    assert_eq!(threads.len(), 30_001, "30,000 short threads and main");
    // Every call is an entry and an exit; every thread ends (one end event each); main's own
    // entry and exit are not in its counts.
    let made: u64 = lines.iter().map(|l| 2 * l.calls).sum::<u64>() + threads.len() as u64 + 2;
    let accounted = |s: &serde_json::Value| {
        let b = &s["targets"][0]["binaries"][0];
        let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        n(&b["events"]) + n(&b["expired"]) + n(&b["evicted"]) + n(&s["lost"])
    };
    // Events still in the kernel's buffers are drained within a few ticks.
    let status = status_when(&socket, |s| accounted(s) >= made);
    let b = &status["targets"][0]["binaries"][0];
    assert_eq!(accounted(&status), made, "{status}");
    // What the recorder was given is held, aged out or evicted; the cap was reached.
    assert_eq!(
        b["seen"].as_u64().unwrap(),
        b["events"].as_u64().unwrap()
            + b["expired"].as_u64().unwrap()
            + b["evicted"].as_u64().unwrap(),
        "{b}"
    );
    assert!(
        b["evicted"].as_u64().unwrap() > 0,
        "the cap was not reached: {b}"
    );
    assert!(b["threads_evicted"].as_u64().unwrap() > 0, "{b}");
    assert!(b["bytes"].as_u64().unwrap() <= 32 << 20, "{b}");
    // A snapshot says the same per thread: held + let go = what each thread did.
    let snap = run_output(
        Command::new(tests::tools::fdr_profiled())
            .args(["snapshot", "--socket"])
            .arg(&socket),
    );
    assert!(snap.status.success(), "{snap:?}");
    let dir = String::from_utf8_lossy(&snap.stdout).trim().to_owned();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(Path::new(&dir).join("session.json")).unwrap())
            .unwrap();
    let window = &manifest["window"];
    assert_eq!(window["seen"], b["seen"], "{window}");
    // Thread ids wrap (pid_max is often 32768): a reused id is two threads, one file each;
    // only the ids used once are checked one by one.
    let mut per_thread: std::collections::BTreeMap<u32, u64> = Default::default();
    let mut uses: std::collections::BTreeMap<u32, u32> = Default::default();
    for l in &lines {
        *per_thread.entry(l.tid).or_default() += 2 * l.calls;
        if l.function == "cx_tiny" {
            *uses.entry(l.tid).or_default() += 1;
        }
    }
    for p in manifest["processes"].as_array().unwrap() {
        for t in p["threads"].as_array().unwrap() {
            let tid = t["tid"].as_u64().unwrap() as u32;
            if uses.get(&tid).copied().unwrap_or(0) > 1 {
                continue;
            }
            let held = t["events"].as_u64().unwrap() + t["events_lost"].as_u64().unwrap();
            let gone =
                t["window"]["expired"].as_u64().unwrap() + t["window"]["evicted"].as_u64().unwrap();
            let main = if tid == p["pid"].as_u64().unwrap() as u32 {
                2
            } else {
                0
            };
            // Every thread had ended: its end, its newest event, is held whenever the thread
            // is in the snapshot at all, and the end is not counted among a file's events.
            assert_eq!(held + gone, per_thread[&tid] + main, "thread {tid}: {t}");
        }
    }
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
}
