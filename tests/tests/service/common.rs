//! What the service's tests share: a one-target configuration, the snapshot or segment
//! directories the service writes, runs of the calls fixture and their exact calls in a trace.
//! The service itself is started with [`ServiceStart`], as everywhere in the tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tests::counts::{expected_calls, parse_count_lines};
use tests::fixtures::workloads::CALLS_FUNCTIONS;
use tests::run::Running;
use tests::service::ServiceStart;
use tests::trace::{assert_process_calls, check_trace_dir, MainCall, ProcessExpectation, TraceDir};

pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The service on one flight-recorder target, `name`, tracing `bin` with `window`, and the
/// top-level `settings` (`max_disk = ...`, or nothing); its output is `scratch/out`, its
/// configuration `scratch/fdr-profiled.toml`. Returns how to start it, and the output.
pub fn one_target(
    scratch: &Path,
    name: &str,
    bin: &Path,
    window: &str,
    settings: &str,
) -> (ServiceStart, PathBuf) {
    written_target(scratch, name, bin, window, settings, "")
}

/// [`one_target`] with no budget (`max_overhead = "none"`): every call of a flat-out run is
/// traced, as a test that counts them needs.
pub fn one_target_traced_whole(
    scratch: &Path,
    name: &str,
    bin: &Path,
    window: &str,
) -> (ServiceStart, PathBuf) {
    written_target(scratch, name, bin, window, "", "max_overhead = \"none\"\n")
}

/// The configuration of [`one_target`], `settings` before the target, `target_settings` in it.
fn written_target(
    scratch: &Path,
    name: &str,
    bin: &Path,
    window: &str,
    settings: &str,
    target_settings: &str,
) -> (ServiceStart, PathBuf) {
    let output = scratch.join("out");
    let start = ServiceStart::written(
        scratch,
        &format!(
            "output = \"{}\"\n{settings}\n[[target]]\nname = \"{name}\"\nbinary = \"{}\"\nwindow = \"{window}\"\n{target_settings}",
            output.display(),
            bin.display()
        ),
    );
    (start, output)
}

/// The snapshot directories under `OUTPUT/<target>/`.
pub fn snapshots(output: &Path, target: &str) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(output.join(target))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// Bytes of the regular files under `dir`.
pub fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
    {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            total += tree_bytes(&e.path());
        } else if t.is_file() {
            total += e.metadata().unwrap().len();
        }
    }
    total
}

/// Runs `bin --iterations n` to its end: (pid, stdout).
pub fn run_calls(bin: &Path, n: u32) -> (u32, String) {
    let r = Running::spawn(
        "calls",
        Command::new(bin).args(["--iterations", &n.to_string()]),
    );
    let pid = r.pid();
    let done = r.finish(TIMEOUT);
    assert!(done.status.success());
    (pid, done.stdout)
}

/// The run `pid` of the calls fixture, whose output is `stdout`, is in `trace` with exactly
/// the calls it counted.
pub fn assert_calls_run(trace: &TraceDir, pid: u32, stdout: &str) {
    assert_process_calls(
        trace,
        &ProcessExpectation {
            pid,
            calls: &expected_calls(&parse_count_lines(stdout)),
            known: CALLS_FUNCTIONS,
            main_fn: "main",
            main: MainCall::Traced,
            only_known: true,
        },
    );
}

/// The exact calls of each `(pid, stdout)` run found in `dir`'s trace.
pub fn assert_runs_in(dir: &Path, bin: &Path, runs: &[(u32, String)]) {
    let trace = check_trace_dir(dir, bin);
    let want: std::collections::BTreeSet<u32> = runs.iter().map(|(p, _)| *p).collect();
    assert_eq!(trace.pids(), want, "{}", dir.display());
    for (pid, stdout) in runs {
        assert_calls_run(&trace, *pid, stdout);
    }
}

/// The segment directories of `output`'s target `target`, each with the processes recorded in
/// it and their exact calls checked against `runs` (pid, stdout), `bin_of` naming the binary a
/// directory's session ran; returns the pids recorded in each directory, by directory name.
pub fn recorded_runs(
    output: &Path,
    target: &str,
    bin_of: &dyn Fn(&Path) -> PathBuf,
    runs: &[(u32, String)],
) -> std::collections::BTreeMap<String, Vec<u32>> {
    let mut found = std::collections::BTreeMap::new();
    for d in snapshots(output, target) {
        let trace = check_trace_dir(&d, &bin_of(&d));
        let mut pids = Vec::new();
        for pid in trace.pids() {
            let stdout = runs
                .iter()
                .find(|(p, _)| *p == pid)
                .map(|(_, o)| o.clone())
                .unwrap_or_else(|| panic!("{}: unknown process {pid}", d.display()));
            assert_calls_run(&trace, pid, &stdout);
            pids.push(pid);
        }
        found.insert(d.file_name().unwrap().to_string_lossy().into_owned(), pids);
    }
    found
}

/// Waits until `service`'s stderr holds `needle` `count` times; returns its stderr.
pub fn wait_for_count(service: &Running, needle: &str, count: usize) -> String {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let (_, stderr) = service.output_so_far();
        if stderr.matches(needle).count() >= count {
            return stderr;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{needle:?} {count} times: {stderr}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
