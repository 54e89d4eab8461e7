//! Under systemd: the notify protocol (`READY=1`, `STATUS=`, `WATCHDOG=1`, `STOPPING=1`) and the
//! log as structured journal entries. The unit file itself is `unit`'s.

use std::process::Command;
use std::time::Duration;

use tests::fixtures::private_copy;
use tests::fixtures::workloads::calls_fixture;
use tests::service::ServiceStart;
use tests::tools::run_output;
use tests::trace::check_trace_dir;

use crate::common::{snapshots, TIMEOUT};

/// systemd's notify protocol, as a test that owns `NOTIFY_SOCKET` sees it: `READY=1` once the
/// service is ready, `STATUS=` lines with its counts, `WATCHDOG=1` pings at half of
/// `WATCHDOG_USEC`, and `STOPPING=1` last.
#[test]
fn the_notify_protocol_is_spoken_in_order() {
    use std::os::unix::net::UnixDatagram;
    let scratch = tests::scratch_dir("service-notify");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let socket_path = scratch.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"calls\"\nbinary = \"{}\"\n",
            scratch.path().join("out").display(),
            bin.display()
        ),
    )
    .unwrap();
    // systemd names the pid the watchdog is for: the shell's, which exec keeps.
    let mut service = ServiceStart::config(&config)
        .socket(&scratch.path().join("control.sock"))
        .wrapped(&["sh", "-c", "WATCHDOG_PID=$$ exec \"$0\" \"$@\""])
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "400000")
        .spawn();
    let mut messages: Vec<String> = Vec::new();
    let receive_for = |d: Duration, messages: &mut Vec<String>| {
        let end = std::time::Instant::now() + d;
        let mut buf = [0u8; 4096];
        while std::time::Instant::now() < end {
            if let Ok(n) = socket.recv(&mut buf) {
                messages.extend(
                    String::from_utf8_lossy(&buf[..n])
                        .lines()
                        .map(str::to_owned),
                );
            }
        }
    };
    service.wait_for_stderr_line("fdr-profiled: service: ready", TIMEOUT);
    receive_for(Duration::from_millis(300), &mut messages);
    let run = run_output(Command::new(&bin).args(["--iterations", "1000"]));
    assert!(run.status.success());
    receive_for(Duration::from_millis(2_500), &mut messages);
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    receive_for(Duration::from_millis(300), &mut messages);

    assert_eq!(
        messages.first().map(String::as_str),
        Some("READY=1"),
        "{messages:?}"
    );
    assert_eq!(
        messages.last().map(String::as_str),
        Some("STOPPING=1"),
        "{messages:?}"
    );
    let pings = messages.iter().filter(|m| *m == "WATCHDOG=1").count();
    assert!(pings >= 5, "a ping every 200 ms for 2.8 s: {messages:?}");
    let statuses: Vec<&String> = messages
        .iter()
        .filter(|m| m.starts_with("STATUS="))
        .collect();
    assert!(statuses.len() >= 2, "{messages:?}");
    assert!(
        statuses
            .iter()
            .all(|s| s.starts_with("STATUS=1 targets (1 binaries); ")),
        "{statuses:?}"
    );
    // The last status has seen the run: 1000 calls of cx_tiny, entry and exit, and more.
    let last = statuses.last().unwrap();
    let events: u64 = last
        .split("; ")
        .nth(1)
        .and_then(|p| p.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{last}"));
    assert!(events >= 2_000, "{last}");
}

/// One journal entry as the native protocol sends it: `KEY=value` lines, or `KEY`, a
/// little-endian u64 length and the bytes for values with a newline.
fn journal_fields(datagram: &[u8]) -> std::collections::BTreeMap<String, String> {
    let mut fields = std::collections::BTreeMap::new();
    let mut rest = datagram;
    while !rest.is_empty() {
        let line_end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
        let line = &rest[..line_end];
        if let Some(eq) = line.iter().position(|&b| b == b'=') {
            fields.insert(
                String::from_utf8_lossy(&line[..eq]).into_owned(),
                String::from_utf8_lossy(&line[eq + 1..]).into_owned(),
            );
            rest = rest.get(line_end + 1..).unwrap_or_default();
        } else {
            let key = String::from_utf8_lossy(line).into_owned();
            let after = &rest[line_end + 1..];
            let len = u64::from_le_bytes(after[..8].try_into().unwrap()) as usize;
            fields.insert(
                key,
                String::from_utf8_lossy(&after[8..8 + len]).into_owned(),
            );
            rest = after.get(8 + len + 1..).unwrap_or_default();
        }
    }
    fields
}

/// Under systemd (`JOURNAL_STREAM` names the service's standard error) the log goes to the
/// journal, one entry per message with its priority and `FDR_*` fields; nothing of it on
/// standard error. The service runs in a mount namespace of its own whose
/// `/run/systemd/journal/socket` is a datagram socket of this test.
#[test]
fn under_systemd_the_log_is_structured_journal_entries() {
    use std::os::unix::fs::MetadataExt as _;
    let scratch = tests::scratch_dir("service-journal");
    let dir = scratch.path();
    let bin = private_copy(&calls_fixture(), dir);
    let journal_dir = dir.join("journal");
    std::fs::create_dir_all(&journal_dir).unwrap();
    let journal = std::os::unix::net::UnixDatagram::bind(journal_dir.join("socket")).unwrap();
    journal
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let output = dir.join("out");
    let config = dir.join("fdr-profiled.toml");
    std::fs::write(
        &config,
        format!(
            "output = \"{}\"\n[[target]]\nname = \"calls\"\nbinary = \"{}\"\nwindow = \"60s\"\n",
            output.display(),
            bin.display()
        ),
    )
    .unwrap();
    let stderr_path = dir.join("stderr");
    let stderr = std::fs::File::create(&stderr_path).unwrap();
    let meta = stderr.metadata().unwrap();
    let script = format!(
        "mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/journal && mount --bind '{}' /run/systemd/journal && exec \"$0\" \"$@\"",
        journal_dir.display(),
    );
    // Its standard error is the file `JOURNAL_STREAM` names, not a pipe of the test's.
    let mut service = ServiceStart::config(&config)
        .socket(&dir.join("control.sock"))
        .wrapped(&["unshare", "--mount", "sh", "-c", &script])
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .command()
        .stderr(stderr)
        .spawn()
        .expect("unshare (util-linux)");
    let mut entries: Vec<std::collections::BTreeMap<String, String>> = Vec::new();
    let wait_for = |entries: &mut Vec<_>, what: &str| {
        let start = std::time::Instant::now();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if let Some(e) =
                entries
                    .iter()
                    .find(|e: &&std::collections::BTreeMap<String, String>| {
                        e.get("MESSAGE").is_some_and(|m| m.starts_with(what))
                    })
            {
                return e.clone();
            }
            assert!(
                start.elapsed() < TIMEOUT,
                "no journal entry {what:?}: {entries:#?}\nstderr: {}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
            if let Ok(n) = journal.recv(&mut buf) {
                entries.push(journal_fields(&buf[..n]));
            }
        }
    };
    let ready = wait_for(&mut entries, "ready: 1 target");
    assert_eq!(
        ready.get("PRIORITY").map(String::as_str),
        Some("5"),
        "{ready:?}"
    );
    assert_eq!(
        ready.get("SYSLOG_IDENTIFIER").map(String::as_str),
        Some("fdr-profiled")
    );
    assert_eq!(
        ready.get("FDR_OUTPUT").map(String::as_str),
        Some(&*output.to_string_lossy())
    );
    let attached = wait_for(&mut entries, "target calls: attached ");
    assert_eq!(
        attached.get("FDR_TARGET").map(String::as_str),
        Some("calls")
    );
    let run = run_output(Command::new(&bin).args(["--iterations", "100"]));
    assert!(run.status.success());
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: plain kill(2) of our child (sh exec'd into the service, same pid).
    unsafe { libc::kill(service.id() as i32, libc::SIGUSR1) };
    let snapshot = wait_for(&mut entries, "target calls: snapshot ");
    let dir_written = snapshots(&output, "calls");
    assert_eq!(dir_written.len(), 1);
    assert_eq!(
        snapshot.get("FDR_SNAPSHOT").map(String::as_str),
        Some(&*dir_written[0].to_string_lossy()),
        "{snapshot:?}"
    );
    assert_eq!(
        snapshot.get("FDR_TRIGGER").map(String::as_str),
        Some("sigusr1")
    );
    assert_eq!(
        snapshot.get("FDR_TARGET").map(String::as_str),
        Some("calls")
    );
    // SAFETY: as above.
    unsafe { libc::kill(service.id() as i32, libc::SIGTERM) };
    let status = service.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(
        !stderr.contains("snapshot"),
        "the log went to standard error too:\n{stderr}"
    );
    check_trace_dir(&dir_written[0], &bin);
}
