//! Targets that change while the service runs: a reload (SIGHUP) adds and removes targets, a
//! binary installed in a glob target's directory is traced, a binary replaced on disk is traced
//! again.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tests::fixtures::private_copy;
use tests::fixtures::workloads::calls_fixture;
use tests::run::Running;
use tests::service::ServiceStart;
use tests::trace::check_trace_dir;

use crate::common::{
    assert_calls_run, recorded_runs, run_calls, snapshots, wait_for_count, TIMEOUT,
};

/// SIGHUP with one target removed and one added: the kept target records on with no gap (a
/// process of it calls all through both reloads, about 100k calls a second, and every call is
/// in its files), the removed one has exactly its processes from before the reload, the added
/// one those from after; a reload with a bad file changes nothing. Record mode, so every call
/// is counted.
#[test]
fn a_reload_adds_and_removes_targets_and_keeps_the_others_running() {
    let scratch = tests::scratch_dir("service-reload");
    let copy = |name: &str| {
        let dir = scratch.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        private_copy(&calls_fixture(), &dir)
    };
    let (a, b, c) = (copy("a"), copy("b"), copy("c"));
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    let write = |targets: &[(&str, &Path, &str)]| {
        let mut text = format!("output = \"{}\"\n", output.display());
        for (name, bin, more) in targets {
            text.push_str(&format!(
                "[[target]]\nname = \"{name}\"\nbinary = \"{}\"\nmode = \"record\"\n{more}",
                bin.display()
            ));
        }
        std::fs::write(&config, text).unwrap();
    };
    // The removed target comes first: the kept one's place in the service's list changes.
    write(&[("b", &b, ""), ("a", &a, "")]);
    let mut service = ServiceStart::config(&config)
        .socket(&scratch.path().join("control.sock"))
        .start();
    let run = |bin: &Path, n: u32| {
        let r = Running::spawn(
            "calls",
            Command::new(bin).args(["--iterations", &n.to_string()]),
        );
        let pid = r.pid();
        let done = r.finish(TIMEOUT);
        assert!(done.status.success());
        (pid, done.stdout)
    };
    let before: Vec<_> = vec![run(&a, 300), run(&b, 400), run(&a, 500), run(&b, 600)];
    // A process of the kept target that runs across both reloads.
    let across = Running::spawn(
        "calls",
        Command::new(&a).args(["--seconds", "3", "--per-second"]),
    );
    std::thread::sleep(Duration::from_millis(500));

    // A bad file changes nothing.
    std::fs::write(&config, "output = 3\n").unwrap();
    service.signal(libc::SIGHUP);
    service.wait_for_stderr_line("fdr-profiled: error: reload refused", TIMEOUT);
    // It still runs when the reload begins.
    let state = std::fs::read_to_string(format!("/proc/{}/stat", across.pid())).unwrap();
    let state = state.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
    assert!(matches!(state, Some("R" | "S")), "{state:?}");
    // The added target asks for more logged arguments than the service loaded.
    write(&[("a", &a, ""), ("c", &c, "args = 3\n")]);
    service.signal(libc::SIGHUP);
    service.wait_for_stderr_line("fdr-profiled: service: reloaded ", TIMEOUT);
    let across_pid = across.pid();
    let across = across.finish(TIMEOUT);
    assert!(across.status.success());
    assert!(
        across
            .stdout
            .lines()
            .filter(|l| l.starts_with("span "))
            .count()
            >= 3,
        "{}",
        across.stdout
    );
    let mut after: Vec<_> = vec![run(&a, 700), run(&b, 800), run(&c, 900)];
    after.push((across_pid, across.stdout.clone()));
    std::thread::sleep(Duration::from_millis(300));
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        done.stderr.contains("1 targets kept, 1 added, 1 removed"),
        "{}",
        done.stderr
    );
    assert!(
        done.stderr
            .contains("target c: args = 3 and max_event_bytes = ")
            && done.stderr.contains("restart the service to raise them"),
        "{}",
        done.stderr
    );

    // Per target: the processes recorded, with exact counts.
    let recorded = |target: &str, bin: &Path| {
        let mut pids = std::collections::BTreeSet::new();
        for d in snapshots(&output, target) {
            let trace = check_trace_dir(&d, bin);
            for pid in trace.pids() {
                pids.insert(pid);
                let stdout = before
                    .iter()
                    .chain(&after)
                    .find(|(p, _)| *p == pid)
                    .map(|(_, o)| o.clone())
                    .unwrap_or_else(|| panic!("{target}: unknown process {pid}"));
                assert_calls_run(&trace, pid, &stdout);
            }
        }
        pids.into_iter().collect::<Vec<u32>>()
    };
    let sorted = |mut v: Vec<u32>| {
        v.sort();
        v
    };
    assert_eq!(
        recorded("a", &a),
        sorted(vec![before[0].0, before[2].0, after[0].0, across_pid]),
        "a is kept: every run, the one across the reloads with every call"
    );
    assert_eq!(
        recorded("b", &b),
        sorted(vec![before[1].0, before[3].0]),
        "b is removed: nothing after the reload"
    );
    assert_eq!(recorded("c", &c), vec![after[2].0], "c is added");
}

/// A glob target: a binary copied into its directory after the service started (written in
/// place, not renamed in: it is attached only once it is whole) is attached within seconds,
/// said in the log, and a process started from it is recorded with every call, in segments of
/// its own; the first binary's process is recorded as before.
#[test]
fn a_binary_installed_after_the_start_is_traced() {
    let scratch = tests::scratch_dir("service-new-binary");
    let bins = scratch.path().join("bins");
    std::fs::create_dir_all(&bins).unwrap();
    let first = bins.join("calls-a");
    std::fs::copy(calls_fixture(), &first).unwrap();
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"glob\"\nbinary = \"{}/calls-*\"\nmode = \"record\"\n",
            output.display(),
            bins.display()
        ),
    )
    .unwrap();
    let service = ServiceStart::config(&config)
        .socket(&scratch.path().join("control.sock"))
        .start();
    let second = bins.join("calls-b");
    std::fs::copy(calls_fixture(), &second).unwrap();
    let line = wait_for_count(&service, "now matches", 1);
    assert!(
        line.contains(&format!("target glob: {} now matches", second.display())),
        "{line}"
    );
    let runs = vec![run_calls(&second, 700), run_calls(&first, 300)];
    std::thread::sleep(Duration::from_millis(300));
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    assert_eq!(
        done.stderr.matches("now matches").count(),
        1,
        "{}",
        done.stderr
    );
    let bin_of = |d: &Path| {
        if d.to_string_lossy().ends_with("-calls-b") {
            second.clone()
        } else {
            first.clone()
        }
    };
    let found = recorded_runs(&output, "glob", &bin_of, &runs);
    let of = |suffix: &str| -> Vec<u32> {
        found
            .iter()
            .filter(|(d, _)| d.ends_with(suffix))
            .flat_map(|(_, p)| p.clone())
            .collect()
    };
    assert_eq!(
        of("-calls-b"),
        vec![runs[0].0],
        "{found:?}\n{}",
        done.stderr
    );
    assert_eq!(
        of("-calls-a"),
        vec![runs[1].0],
        "{found:?}\n{}",
        done.stderr
    );
}

/// A target's binary replaced on disk as a package upgrade does it (a new file written under
/// another name, renamed over the old one: a new inode at the same path) is attached again:
/// a process started from the new file is recorded with every call, in segments named after
/// the binary, and a process of the old file that runs across the replacement keeps its
/// probes and is recorded with every call too (in the old file's segment).
#[test]
fn a_binary_replaced_on_disk_is_traced_again() {
    let scratch = tests::scratch_dir("service-replaced-binary");
    let bins = scratch.path().join("bins");
    std::fs::create_dir_all(&bins).unwrap();
    let bin = private_copy(&calls_fixture(), &bins);
    let output = scratch.path().join("out");
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            // Every call of the flat-out runs, counted: no budget.
            "output = \"{}\"\n[[target]]\nname = \"up\"\nbinary = \"{}\"\nmode = \"record\"\nmax_overhead = \"none\"\n",
            output.display(),
            bin.display()
        ),
    )
    .unwrap();
    let service = ServiceStart::config(&config)
        .socket(&scratch.path().join("control.sock"))
        .start();
    let old = Running::spawn(
        "calls (old)",
        Command::new(&bin).args(["--seconds", "4", "--per-second"]),
    );
    std::thread::sleep(Duration::from_millis(500));
    let old_ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&bin).unwrap());
    assert_eq!(private_copy(&calls_fixture(), &bins), bin);
    let new_ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&bin).unwrap());
    assert_ne!(old_ino, new_ino);
    let line = wait_for_count(&service, "was replaced on disk", 1);
    assert!(
        line.contains(&format!(
            "target up: {} was replaced on disk (inode {old_ino}, now {new_ino})",
            bin.display()
        )) && line.contains("for the 1 processes still running it"),
        "{line}"
    );
    let new = run_calls(&bin, 800);
    let old_pid = old.pid();
    let old = old.finish(TIMEOUT);
    assert!(old.status.success());
    std::thread::sleep(Duration::from_millis(300));
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    let runs = vec![new.clone(), (old_pid, old.stdout)];
    let found = recorded_runs(&output, "up", &|_: &Path| bin.clone(), &runs);
    let of = |new_file: bool| -> Vec<u32> {
        found
            .iter()
            .filter(|(d, _)| d.ends_with("-segment-calls-c") == new_file)
            .flat_map(|(_, p)| p.clone())
            .collect()
    };
    assert_eq!(of(true), vec![new.0], "{found:?}\n{}", done.stderr);
    assert_eq!(of(false), vec![old_pid], "{found:?}\n{}", done.stderr);
}
