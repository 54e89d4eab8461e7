//! Output safety (issue 18, item 6), end to end: what the daemon and its subcommands create is
//! private whatever the umask, and symlinks planted at the names it will create, while it
//! records, are never followed. The module's own guarantees are unit-tested in
//! profiler-daemon/fdr-session/src/output_dir/tests.rs.
//!
//! Needs root and BPF (the recordings are real); built fixtures (clang-19).
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tests::fixtures::workloads::calls_fixture;
use tests::service::ServiceStart;
use tests::{fdr_profiled, private_copy, scratch_dir, Running};

const TIMEOUT: Duration = Duration::from_secs(120);

/// Every entry under `dir` (recursively, not through symlinks).
fn entries(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        out.push(path.clone());
        if std::fs::symlink_metadata(&path).unwrap().is_dir() {
            entries(&path, out);
        }
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

/// Runs `cmd` with umask 000: the most permissive, under which the old code made `session.json`
/// and `trace.json` 0644 and the process directories 0755.
fn with_umask_000(cmd: &mut Command) -> &mut Command {
    // SAFETY: umask is async-signal-safe and touches only the child's own state.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        })
    }
}

/// A recording, its report and timeline, `convert -o` and `report -o`, all under umask 000:
/// every file 0600, every directory 0700 (the missing parents of `--out` included), and a
/// second `report -o` or `convert -o` to the same file is refused with one line, the file left
/// as it was.
#[test]
fn everything_created_is_private_under_umask_000() {
    let scratch = scratch_dir("output-umask");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let out = scratch.path().join("new/parent/out");
    let f = Running::spawn(
        "fdr-profiled under umask 000",
        with_umask_000(
            Command::new(fdr_profiled())
                .arg("--out")
                .arg(&out)
                .arg("--")
                .arg(&bin)
                .args(["--threads", "3", "--iterations", "200"]),
        ),
    )
    .finish(TIMEOUT);
    assert!(f.status.success(), "{}", f.stderr);
    let mut all = vec![
        scratch.path().join("new"),
        scratch.path().join("new/parent"),
        out.clone(),
    ];
    entries(&out, &mut all);
    let names: Vec<String> = all
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in ["session.json", "report.txt", "trace.json"] {
        assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
    }
    assert!(
        names.iter().filter(|n| n.ends_with(".fdr")).count() >= 3,
        "{names:?}"
    );
    for p in &all {
        let meta = std::fs::symlink_metadata(p).unwrap();
        let want = if meta.is_dir() { 0o700 } else { 0o600 };
        assert!(meta.is_dir() || meta.is_file(), "{}: neither", p.display());
        assert_eq!(mode(p), want, "{}", p.display());
    }

    for (args, file) in [
        (vec!["report"], "r.txt"),
        (vec!["convert", "--format", "folded"], "stacks.folded"),
    ] {
        let target = scratch.path().join(file);
        let run = |what: &str| {
            Running::spawn(
                what,
                with_umask_000(
                    Command::new(fdr_profiled())
                        .args(&args)
                        .arg(&out)
                        .arg("-o")
                        .arg(&target),
                ),
            )
            .finish(TIMEOUT)
        };
        let first = run("first");
        assert!(first.status.success(), "{args:?}: {}", first.stderr);
        assert_eq!(mode(&target), 0o600, "{args:?}");
        let written = std::fs::read(&target).unwrap();
        let second = run("second");
        assert!(!second.status.success(), "{args:?} overwrote {file}");
        assert_eq!(
            second.stderr.trim(),
            format!(
                "fdr-profiled: error: {} exists; not overwriting it",
                target.display()
            ),
            "{args:?}"
        );
        assert_eq!(std::fs::read(&target).unwrap(), written);
    }
}

/// An output directory other users can write to (not sticky) is refused before anything is
/// traced, and so is a new one inside such a directory.
#[test]
fn a_directory_others_can_write_is_refused() {
    let scratch = scratch_dir("output-open");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let open = scratch.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    for (out, want) in [
        (
            open.clone(),
            format!(
                "fdr-profiled: error: output directory {} is writable by other users (mode 0777, not sticky): give a directory only its owner can write",
                open.display()
            ),
        ),
        (
            open.join("out"),
            format!(
                "fdr-profiled: error: {} is writable by other users (mode 0777, not sticky): choose an output directory elsewhere",
                open.display()
            ),
        ),
    ] {
        let f = Running::spawn(
            "fdr-profiled",
            Command::new(fdr_profiled())
                .arg("--out")
                .arg(&out)
                .arg("--")
                .arg(&bin),
        )
        .finish(TIMEOUT);
        assert!(!f.status.success());
        assert_eq!(f.stderr.trim(), want);
        assert_eq!(std::fs::read_dir(&open).unwrap().count(), 0);
    }
}

/// The race: while the daemon records, another thread keeps planting symlinks, pointing at a
/// victim file and a victim directory outside the output, at every name the daemon will create:
/// the trace file (and its hidden staging name) of each thread the fixture is about to start
/// (tids follow the pid), `report.txt`, `trace.json` and `session.json`. Afterwards the victims
/// are untouched, every file the daemon made is a real file of its own (0600), every symlink
/// under the output is one we planted, each refused thread is said on stderr with its events
/// counted as ignored, and the daemon ended normally, its exit status saying the trace is
/// incomplete.
#[test]
fn planted_symlinks_are_never_followed() {
    let scratch = scratch_dir("output-race");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let out = scratch.path().join("out");
    let victim = scratch.path().join("victim");
    std::fs::write(&victim, b"precious\n").unwrap();
    let victim_dir = scratch.path().join("victim-dir");
    std::fs::create_dir(&victim_dir).unwrap();
    let go = scratch.path().join("go");
    let mut daemon = Running::spawn(
        "fdr-profiled",
        Command::new(fdr_profiled())
            .arg("--out")
            .arg(&out)
            .arg("--")
            .arg(&bin)
            .arg("--wait-file")
            .arg(&go)
            .args(["--threads", "8", "--iterations", "20000"]),
    );
    daemon.wait_for_stderr_line("fixture: waiting for", TIMEOUT);
    let pid = tests::run::launched_child(daemon.pid(), &bin, TIMEOUT) as u32;
    // main() is traced from its entry, before it waits: its directory appears at the next drain.
    let proc_dir = out.join(format!(
        "{}-{pid}",
        bin.file_name().unwrap().to_string_lossy()
    ));
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !proc_dir.is_dir() {
        assert!(
            std::time::Instant::now() < deadline,
            "no {}",
            proc_dir.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The names to plant, and where each points (a file's names at the victim file, a
    // directory's at the victim directory).
    let mut names: Vec<(PathBuf, &Path)> = Vec::new();
    for tid in pid + 1..pid + 256 {
        names.push((proc_dir.join(format!("tid-{tid}.fdr")), &victim));
        names.push((proc_dir.join(format!(".tid-{tid}.fdr.tmp")), &victim));
    }
    for file in ["report.txt", "trace.json", "session.json"] {
        names.push((out.join(file), &victim));
    }
    names.push((
        out.join(format!(
            "{}-{pid}.1",
            bin.file_name().unwrap().to_string_lossy()
        )),
        &victim_dir,
    ));
    let names: Vec<(PathBuf, PathBuf)> = names
        .into_iter()
        .map(|(n, t)| (n, t.to_path_buf()))
        .collect();
    let plant = |names: &[(PathBuf, PathBuf)]| {
        for (name, target) in names {
            // EEXIST: the daemon's file, or our link, is there already.
            let _ = std::os::unix::fs::symlink(target, name);
        }
    };
    plant(&names);
    let stop = Arc::new(AtomicBool::new(false));
    let planter = {
        let stop = stop.clone();
        let names = names.clone();
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                plant(&names);
                rounds += 1;
            }
            rounds
        })
    };
    std::fs::write(&go, b"").unwrap();
    let f = daemon.finish(TIMEOUT);
    stop.store(true, Ordering::Relaxed);
    let rounds = planter.join().unwrap();
    assert!(rounds > 0);

    assert!(!f.stderr.contains("panicked"), "{}", f.stderr);
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious\n");
    assert_eq!(std::fs::read_dir(&victim_dir).unwrap().count(), 0);
    let mut all = vec![];
    entries(&out, &mut all);
    for p in &all {
        let meta = std::fs::symlink_metadata(p).unwrap();
        if meta.file_type().is_symlink() {
            let planted = names
                .iter()
                .any(|(n, t)| n == p && std::fs::read_link(p).unwrap() == *t);
            assert!(planted, "{}: a symlink we did not plant", p.display());
        } else {
            assert_eq!(meta.uid(), 0, "{}", p.display());
            assert_eq!(
                mode(p),
                if meta.is_dir() { 0o700 } else { 0o600 },
                "{}",
                p.display()
            );
        }
    }
    // The main thread's file was made before any link was planted.
    assert!(
        std::fs::symlink_metadata(proc_dir.join(format!("tid-{pid}.fdr")))
            .unwrap()
            .is_file()
    );
    // session.json is rewritten by renaming over whatever is there: a real file in the end.
    assert!(std::fs::symlink_metadata(out.join("session.json"))
        .unwrap()
        .is_file());
    // The loop threads (tids from the fixture's count lines) were all refused, each said once.
    let tids: std::collections::BTreeSet<u32> = tests::parse_count_lines(&f.stdout)
        .iter()
        .map(|c| c.tid)
        .filter(|&t| t != pid)
        .collect();
    assert_eq!(tids.len(), 7, "{}", f.stdout);
    // Tids follow the pid unless other tasks started in between: a thread outside the planted
    // range has its file; every one inside was refused, and said once.
    let mut refused = 0;
    for tid in &tids {
        if *tid > pid + 255 {
            let file = proc_dir.join(format!("tid-{tid}.fdr"));
            assert!(
                std::fs::symlink_metadata(&file).unwrap().is_file(),
                "{}",
                file.display()
            );
            continue;
        }
        let staging = proc_dir.join(format!(".tid-{tid}.fdr.tmp"));
        let line = format!(
            "fdr-profiled: warning: cannot create {}: it exists; not overwriting it; the events of thread {tid} are counted as ignored",
            staging.display()
        );
        assert_eq!(f.stderr.matches(&line).count(), 1, "{line}\n{}", f.stderr);
        refused += 1;
    }
    assert!(refused > 0, "no thread was raced:\n{}", f.stderr);
    // The refused threads' events are not stored: the trace is incomplete, and the exit status
    // (EX_IOERR, 74) says so, after the summary, instead of the command's own 0.
    assert_eq!(f.status.code(), Some(74), "{}", f.stderr);
    assert!(
        f.stderr
            .contains("fdr-profiled: error: the trace is incomplete: ")
            && f.stderr
                .contains("(the command's exit status was 0); exit status 74"),
        "{}",
        f.stderr
    );
    assert!(
        f.stderr.contains("report.txt exists; not overwriting it"),
        "{}",
        f.stderr
    );
}

/// The service under umask 000: its output directory, a snapshot's directory and files, and
/// the control socket (and its directory) are private.
#[test]
fn the_services_snapshots_and_socket_are_private_under_umask_000() {
    let scratch = scratch_dir("output-service");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let out = scratch.path().join("out");
    let config = scratch.path().join("service.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nbinary = \"{}\"\nwindow = \"30s\"\n",
            out.display(),
            bin.display()
        ),
    )
    .unwrap();
    let mut fixture = Command::new(&bin)
        .args(["--seconds", "60", "--quiet"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the fixture");
    let socket = scratch.path().join("run/control.sock");
    let mut service = ServiceStart::config(&config)
        .socket(&socket)
        .adjusted(|cmd| {
            with_umask_000(cmd);
        })
        .start_within(TIMEOUT);
    std::thread::sleep(Duration::from_millis(300));
    service.signal(libc::SIGUSR1);
    let line = service.wait_for_stderr_match("a snapshot", TIMEOUT, |l| {
        l.starts_with("fdr-profiled: service: target ") && l.contains(": snapshot ")
    });
    let snapshot = PathBuf::from(line.rsplit_once(' ').unwrap().1);
    assert_eq!(mode(&socket), 0o600);
    assert_eq!(mode(socket.parent().unwrap()), 0o700);
    service.signal(libc::SIGTERM);
    let f = service.finish(TIMEOUT);
    let _ = fixture.kill();
    let _ = fixture.wait();
    assert!(f.status.success(), "{}", f.stderr);
    assert!(snapshot.starts_with(&out), "{}", snapshot.display());
    let mut all = vec![out.clone()];
    entries(&out, &mut all);
    let names: Vec<String> = all
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in ["session.json", "report.txt"] {
        assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
    }
    assert!(names.iter().any(|n| n.ends_with(".fdr")), "{names:?}");
    for p in &all {
        let meta = std::fs::symlink_metadata(p).unwrap();
        assert!(meta.is_dir() || meta.is_file(), "{}: neither", p.display());
        assert_eq!(
            mode(p),
            if meta.is_dir() { 0o700 } else { 0o600 },
            "{}",
            p.display()
        );
    }
}
