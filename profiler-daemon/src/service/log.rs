//! The service's log. Under systemd (`JOURNAL_STREAM` names our standard error, as systemd
//! sets it for a unit whose output goes to the journal) each message is a journal entry of its
//! own, with the priority of its level and fields an operator can select on
//! (`journalctl FDR_TARGET=web`, `FDR_SNAPSHOT=...`, `FDR_PID=...`); otherwise it is a line on
//! standard error, `fdr-profiled: service: ...`, `fdr-profiled: warning: ...` or
//! `fdr-profiled: error: ...`, as every other command writes them.
//!
//! Messages are `tracing` events; their fields are named `fdr_*` (journald keeps only
//! upper-case ASCII names: `fdr_target` is `FDR_TARGET` there).
use std::fmt::Write as _;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt as _};

/// Where the log goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sink {
    Journal,
    Stderr,
}

/// Installs the service's log for the rest of the process; says where it goes.
pub fn init() -> Sink {
    let registry = tracing_subscriber::registry();
    if stderr_is_journal_stream() {
        match tracing_journald::layer() {
            Ok(journal) => {
                let journal = journal
                    .with_field_prefix(None)
                    .with_syslog_identifier("fdr-profiled".to_owned());
                if tracing::subscriber::set_global_default(registry.with(journal)).is_ok() {
                    return Sink::Journal;
                }
                return Sink::Stderr;
            }
            Err(err) => errln!(
                "fdr-profiled: warning: JOURNAL_STREAM is set but the journal cannot be reached ({err}): logging to standard error"
            ),
        }
    }
    let _ = tracing::subscriber::set_global_default(registry.with(StderrLines));
    Sink::Stderr
}

/// Whether `JOURNAL_STREAM` (`DEVICE:INODE`) names the file our standard error is: systemd's
/// way of saying that a process's output goes to the journal. A variable inherited by a
/// process whose standard error was redirected since names another file, and is ignored.
fn stderr_is_journal_stream() -> bool {
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = value.to_str().and_then(|v| {
        let (dev, ino) = v.split_once(':')?;
        Some((dev.parse::<u64>().ok()?, ino.parse::<u64>().ok()?))
    }) else {
        return false;
    };
    // SAFETY: fstat writes into the zeroed struct we own; fd 2 may be closed (then it fails).
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(2, &mut stat) } != 0 {
        return false;
    }
    stat.st_dev == dev && stat.st_ino == ino
}

/// The log as lines on standard error: the message, after a prefix that says its level.
struct StderrLines;

impl<S: Subscriber> tracing_subscriber::Layer<S> for StderrLines {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        let kind = match *event.metadata().level() {
            Level::ERROR => "error",
            Level::WARN => "warning",
            _ => "service",
        };
        errln!("fdr-profiled: {kind}: {}", message.0);
    }
}

/// An event's message (its other fields are for the journal; the message says it all).
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        }
    }
}
