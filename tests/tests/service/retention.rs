//! What the service keeps on disk: `max_disk` (snapshots and segments, the oldest deleted first,
//! never a segment still open) and `min_free` (writing stops, is counted, and starts again).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tests::counts::{expected_calls, parse_count_lines};
use tests::fixtures::private_copy;
use tests::fixtures::workloads::calls_fixture;
use tests::run::Running;
use tests::service::ServiceStart;
use tests::tools::run_output;
use tests::trace::check_trace_dir;

use crate::common::{
    assert_calls_run, assert_runs_in, one_target, run_calls, snapshots, tree_bytes, wait_for_count,
    TIMEOUT,
};

/// With a tiny `max_disk`, the oldest snapshots are deleted as new ones are written: what is
/// left is at most the cap plus the newest snapshot, every file of it valid, and the newest
/// is never the one deleted.
#[test]
fn snapshots_stay_under_max_disk_oldest_deleted_first() {
    let scratch = tests::scratch_dir("service-retention");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let (start, output) = one_target(scratch.path(), "calls", &bin, "60s", "max_disk = \"40KB\"");
    let service = start.start();
    let mut sizes = Vec::new();
    for round in 0..5 {
        let run = run_output(Command::new(&bin).args(["--iterations", "500"]));
        assert!(run.status.success());
        std::thread::sleep(Duration::from_millis(300));
        service.signal(libc::SIGUSR1);
        // Each snapshot names its directory; wait for this round's.
        let want = round + 1;
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            let (_, stderr) = service.output_so_far();
            if stderr.matches("target calls: snapshot ").count() >= want {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{stderr}");
            std::thread::sleep(Duration::from_millis(20));
        }
        let dirs = snapshots(&output, "calls");
        let newest = dirs.last().unwrap().clone();
        sizes.push(tree_bytes(&newest));
        let total: u64 = dirs.iter().map(|d| tree_bytes(d)).sum();
        assert!(
            total <= 40_000 + tree_bytes(&newest),
            "round {round}: {total} bytes in {dirs:?}"
        );
    }
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    // The window grows by a run each round, so snapshots grow: some were deleted.
    assert!(
        done.stderr.contains("to stay under max_disk"),
        "sizes {sizes:?}: {}",
        done.stderr
    );
    let dirs = snapshots(&output, "calls");
    assert!(!dirs.is_empty() && dirs.len() < 5, "{dirs:?}");
    for d in &dirs {
        check_trace_dir(d, &bin);
    }
}

/// Record mode with tiny limits: segments rotated by size, the oldest deleted to stay under
/// `max_disk`. Sampled all along, the disk used never exceeds the cap by more than the largest
/// segment; every segment left is valid; the one being written is never deleted (the last
/// run's calls are all there).
#[test]
fn record_mode_segments_stay_under_max_disk() {
    let scratch = tests::scratch_dir("service-record-retention");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    const CAP: u64 = 400_000;
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\nmax_disk = \"{CAP}B\"\n[[target]]\nname = \"rec\"\nbinary = \"{}\"\n\
             mode = \"record\"\nsegment_size = \"100KB\"\nsegment_age = \"1h\"\n",
            output.display(),
            bin.display()
        ),
    )
    .unwrap();
    let service = ServiceStart::config(&config)
        .socket(&scratch.path().join("control.sock"))
        .start();
    // Disk used under the output, and the largest size each segment was seen at.
    let (mut peak, mut largest) = (0u64, std::collections::BTreeMap::<PathBuf, u64>::new());
    let mut sample = |peak: &mut u64| {
        let mut total = 0;
        for d in snapshots(&output, "rec") {
            // A directory being deleted may vanish under us: count what is there.
            let bytes = std::panic::catch_unwind(|| tree_bytes(&d)).unwrap_or(0);
            total += bytes;
            let seen = largest.entry(d).or_default();
            *seen = (*seen).max(bytes);
        }
        *peak = (*peak).max(total);
    };
    let mut last = None;
    for _ in 0..12 {
        let run = Running::spawn("calls", Command::new(&bin).args(["--iterations", "4000"]));
        let done = run.finish(TIMEOUT);
        assert!(done.status.success());
        last = Some(done);
        for _ in 0..6 {
            sample(&mut peak);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    sample(&mut peak);
    let deleted = done.stderr.matches("to stay under max_disk").count();
    assert!(deleted > 0, "nothing deleted:\n{}", done.stderr);
    let largest_segment = largest.values().copied().max().unwrap_or(0);
    assert!(
        peak <= CAP + largest_segment,
        "{peak} bytes at the peak, cap {CAP}, largest segment {largest_segment}"
    );
    let dirs = snapshots(&output, "rec");
    let total: u64 = dirs.iter().map(|d| tree_bytes(d)).sum();
    assert!(total <= CAP + largest_segment, "{total} bytes left");
    // The last run's process is in the segments left, with every call.
    let last = last.unwrap();
    let want = expected_calls(&parse_count_lines(&last.stdout));
    let mut cx_tiny = 0;
    for d in &dirs {
        let trace = check_trace_dir(d, &bin);
        for t in trace.threads.iter().filter(|t| want.contains_key(&t.tid)) {
            cx_tiny += t.calls().get("cx_tiny").map_or(0, |c| c.entries());
        }
    }
    assert_eq!(
        cx_tiny, 4000,
        "the last run's calls, in the newest segments"
    );
}

/// Two record-mode targets under a `max_disk` far below what they write: `open`'s only
/// segment, opened first (so the oldest of all), stays open for the whole test while `rot`'s
/// segments rotate and the oldest are deleted to stay under the cap. The open segment is never
/// deleted: at the end it holds both of `open`'s processes, every call, and every segment left
/// is valid.
#[test]
fn retention_never_deletes_another_targets_open_segment() {
    let scratch = tests::scratch_dir("service-retention-open");
    let copy = |name: &str| {
        let dir = scratch.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        private_copy(&calls_fixture(), &dir)
    };
    let (open_bin, rot_bin) = (copy("open"), copy("rot"));
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    const CAP: u64 = 150_000;
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\nmax_disk = \"{CAP}B\"\n\
             [[target]]\nname = \"open\"\nbinary = \"{}\"\nmode = \"record\"\n\
             segment_size = \"100MB\"\nsegment_age = \"1h\"\n\
             [[target]]\nname = \"rot\"\nbinary = \"{}\"\nmode = \"record\"\n\
             segment_size = \"50KB\"\nsegment_age = \"1h\"\n",
            output.display(),
            open_bin.display(),
            rot_bin.display()
        ),
    )
    .unwrap();
    let service = ServiceStart::config(&config)
        .socket(&scratch.path().join("control.sock"))
        .start();
    let mut open_runs = vec![run_calls(&open_bin, 3000)];
    // A status tick flushes it: its bytes count against the cap from now on.
    std::thread::sleep(Duration::from_millis(1_300));
    for _ in 0..8 {
        run_calls(&rot_bin, 4000);
        std::thread::sleep(Duration::from_millis(1_100));
    }
    open_runs.push(run_calls(&open_bin, 500));
    std::thread::sleep(Duration::from_millis(300));
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        done.stderr.contains("to stay under max_disk"),
        "rot's segments were deleted: {}",
        done.stderr
    );
    assert!(!done.stderr.contains("error"), "{}", done.stderr);
    let open = snapshots(&output, "open");
    assert_eq!(open.len(), 1, "{open:?}\n{}", done.stderr);
    assert_runs_in(&open[0], &open_bin, &open_runs);
    let rot = snapshots(&output, "rot");
    assert!(!rot.is_empty() && rot.len() < 8, "{rot:?}");
    for d in &rot {
        check_trace_dir(d, &rot_bin);
    }
}

/// A tmpfs mounted for a test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = run_output(
            Command::new("mount")
                .args([
                    "-t",
                    "tmpfs",
                    "-o",
                    &format!("size={size},mode=0700"),
                    "tmpfs",
                ])
                .arg(dir),
        );
        assert!(
            out.status.success(),
            "mount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// `min_free` on a 16 MiB tmpfs with 12 MiB to keep free: a record-mode target writing about
/// 2.5 MB/s crosses it while its segment is open; the segment is closed at the next tick
/// (valid), writing stops with an error line, and what comes meanwhile is counted as not
/// written (`status`, and the `STATUS=` line's losses). Once space is freed writing starts
/// again (logged), a new process is recorded whole, and crossing the limit again stops writing
/// again (logged again). A flight recorder's snapshot asked for meanwhile is not written, and
/// counted.
#[test]
fn writing_stops_at_min_free_and_starts_again() {
    use std::os::unix::net::UnixDatagram;
    let scratch = tests::scratch_dir("service-min-free");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let fr_bin = {
        let dir = scratch.path().join("fr");
        std::fs::create_dir_all(&dir).unwrap();
        private_copy(&calls_fixture(), &dir)
    };
    let output = scratch.path().join("out");
    let _tmpfs = Tmpfs::mount(&output, "16m");
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            // Every call of the flat-out runs, counted: no budget.
            "output = \"{}\"\nmin_free = \"12MiB\"\n[[target]]\nname = \"rec\"\nbinary = \"{}\"\n\
             mode = \"record\"\nsegment_size = \"1GB\"\nsegment_age = \"1h\"\nmax_overhead = \"none\"\n\
             [[target]]\nname = \"fr\"\nbinary = \"{}\"\nmax_overhead = \"none\"\n",
            output.display(),
            bin.display(),
            fr_bin.display()
        ),
    )
    .unwrap();
    let notify_path = scratch.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    // Read as systemd does, all along: a full queue would block the service's sends.
    let statuses = std::thread::spawn(move || {
        // Until STOPPING=1; the timeout only ends a wait for a service that died (its start,
        // calibration included, takes seconds on a slow host before the first STATUS=).
        notify
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut buf = [0u8; 4096];
        let mut statuses = Vec::new();
        while let Ok(n) = notify.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            if text.lines().any(|l| l == "STOPPING=1") {
                break;
            }
            statuses.extend(
                text.lines()
                    .filter(|l| l.starts_with("STATUS="))
                    .map(str::to_owned),
            );
        }
        statuses
    });
    let service = ServiceStart::config(&config)
        .socket(&scratch.path().join("control.sock"))
        .env("NOTIFY_SOCKET", &notify_path)
        .start();
    let status = || -> serde_json::Value {
        let out = run_output(
            Command::new(tests::fdr_profiled())
                .args(["status", "--json", "--socket"])
                .arg(scratch.path().join("control.sock")),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    const STOP: &str = "rec: not writing: ";
    const START: &str = "writing again: above min_free";
    // About 100k calls a second, for 5 s: over 4 MiB in the first 2 s.
    let busy = Running::spawn(
        "calls",
        Command::new(&bin).args(["--seconds", "5", "--per-second", "--quiet"]),
    );
    let stderr = wait_for_count(&service, STOP, 1);
    assert!(
        stderr.contains("rec: not writing: ") && stderr.contains("min_free"),
        "{stderr}"
    );
    assert!(busy.finish(TIMEOUT).status.success());
    std::thread::sleep(Duration::from_millis(300));
    let first = snapshots(&output, "rec");
    assert_eq!(first.len(), 1, "{first:?}");
    check_trace_dir(&first[0], &bin);
    let json = status();
    let lost = json["not_written"].as_u64().unwrap();
    assert!(lost > 10_000, "{json}");
    assert_eq!(json["targets"][0]["binaries"][0]["not_written"], lost);
    assert!(
        json["targets"][0]["binaries"][0]["segment"].is_null(),
        "{json}"
    );
    assert_eq!(json["snapshots_not_written"], 0, "{json}");
    // A snapshot now is not written either, and counted.
    run_calls(&fr_bin, 100);
    std::thread::sleep(Duration::from_millis(200));
    service.signal(libc::SIGUSR1);
    wait_for_count(&service, "target fr: snapshot not written: ", 1);
    let json = status();
    assert_eq!(json["snapshots_not_written"], 1, "{json}");
    assert_eq!(
        json["targets"][1]["binaries"][0]["snapshots_not_written"],
        1
    );
    assert!(snapshots(&output, "fr").is_empty());
    // Room again: writing starts at the next tick, and a new process is recorded whole.
    std::fs::remove_dir_all(&first[0]).unwrap();
    wait_for_count(&service, START, 1);
    let run = run_calls(&bin, 2000);
    std::thread::sleep(Duration::from_millis(300));
    let json = status();
    assert_eq!(json["not_written"], lost, "nothing more lost: {json}");
    // And it stops again, saying so again.
    let busy = Running::spawn(
        "calls",
        Command::new(&bin).args(["--seconds", "5", "--per-second", "--quiet"]),
    );
    wait_for_count(&service, STOP, 2);
    assert!(busy.finish(TIMEOUT).status.success());
    std::thread::sleep(Duration::from_millis(1_200));
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    assert_eq!(done.stderr.matches(STOP).count(), 2, "{}", done.stderr);
    assert_eq!(done.stderr.matches(START).count(), 1, "{}", done.stderr);
    let segments = snapshots(&output, "rec");
    assert_eq!(segments.len(), 1, "{segments:?}");
    let trace = check_trace_dir(&segments[0], &bin);
    assert_calls_run(&trace, run.0, &run.1);
    // The STATUS= lines count what was not written.
    let statuses = statuses.join().unwrap();
    let last_status = statuses.last().cloned().unwrap_or_default();
    let counted: u64 = last_status
        .split(", not written ")
        .nth(1)
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{last_status:?}"));
    assert!(
        last_status.ends_with(", snapshots not written 1"),
        "{last_status}"
    );
    assert!(counted > lost, "{last_status}");
}
