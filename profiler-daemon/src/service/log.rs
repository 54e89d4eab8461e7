//! The service's log. Under systemd (`JOURNAL_STREAM` names our standard error, as systemd
//! sets it for a unit whose output goes to the journal) each message is a journal entry of its
//! own, with the priority of its level and fields an operator can select on
//! (`journalctl FDR_TARGET=web`, `FDR_SNAPSHOT=...`, `FDR_PID=...`); otherwise it is a line on
//! standard error, `fdr-profiled: service: ...`, `fdr-profiled: warning: ...` or
//! `fdr-profiled: error: ...`, as every other command writes them.
//!
//! Messages are `tracing` events; their fields are named `fdr_*` (journald keeps only
//! upper-case ASCII names: `fdr_target` is `FDR_TARGET` there). Both sinks write every message
//! and field as one line ([`crate::console::one_line`]): a binary or function name with a
//! newline in it (anyone can name a file) cannot forge a line of the log.
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
                if tracing::subscriber::set_global_default(registry.with(OneLine(journal))).is_ok()
                {
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
        errln!(
            "fdr-profiled: {kind}: {}",
            crate::console::one_line(&message.0)
        );
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

/// A layer that hands `inner` each event with its text fields made one line
/// ([`crate::console::one_line`]): tracing-journald writes a value with a newline as is
/// (journald's binary field form), which a reader of `journalctl -o cat` sees as two lines.
struct OneLine<L>(L);

/// Most fields an event of ours has (there are at most six); an event with more goes through
/// unchanged.
const MAX_FIELDS: usize = 16;

impl<S: Subscriber, L: tracing_subscriber::Layer<S>> tracing_subscriber::Layer<S> for OneLine<L> {
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields(Vec::new(), false);
        event.record(&mut fields);
        let Fields(fields, changed) = fields;
        if !changed || fields.len() > MAX_FIELDS || fields.is_empty() {
            return self.0.on_event(event, ctx);
        }
        let texts: Vec<&str> = fields.iter().map(|(_, text)| text.as_str()).collect();
        let first = &fields[0].0;
        let mut values: [(&Field, Option<&dyn tracing::Value>); MAX_FIELDS] =
            [(first, None); MAX_FIELDS];
        for (i, (field, _)) in fields.iter().enumerate() {
            values[i] = (field, Some(&texts[i] as &dyn tracing::Value));
        }
        let values = event.metadata().fields().value_set(&values);
        self.0.on_event(&Event::new(event.metadata(), &values), ctx);
    }
}

/// Every field of an event as text, one line each, and whether any was changed.
struct Fields(Vec<(Field, String)>, bool);

impl Fields {
    fn add(&mut self, field: &Field, text: String) {
        let line = crate::console::one_line(&text);
        if let std::borrow::Cow::Owned(line) = line {
            self.1 = true;
            self.0.push((field.clone(), line));
        } else {
            self.0.push((field.clone(), text));
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.add(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.add(field, format!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// One event's fields, by name.
    type Fields = Vec<(String, String)>;

    /// What the inner layer saw, event by event.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<Fields>>>);

    impl<S: Subscriber> tracing_subscriber::Layer<S> for Seen {
        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            struct All(Vec<(String, String)>);
            impl Visit for All {
                fn record_str(&mut self, field: &Field, value: &str) {
                    self.0.push((field.name().to_owned(), value.to_owned()));
                }
                fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
                    self.0.push((field.name().to_owned(), format!("{value:?}")));
                }
            }
            let mut all = All(Vec::new());
            event.record(&mut all);
            self.0.lock().unwrap().push(all.0);
        }
    }

    #[test]
    fn the_journal_gets_every_field_as_one_line() {
        let seen = Seen::default();
        let subscriber = tracing_subscriber::registry().with(OneLine(seen.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let name = "nl\nfdr-profiled: service: FAKE LOG LINE";
            tracing::info!(fdr_binary = %name, fdr_pid = 7, "target t: {name} attached");
            tracing::info!(fdr_pid = 8, "plain");
        });
        let seen = seen.0.lock().unwrap();
        assert_eq!(seen.len(), 2);
        for (field, value) in &seen[0] {
            assert!(!value.contains('\n'), "{field}: {value:?}");
        }
        let message = &seen[0].iter().find(|(f, _)| f == "message").unwrap().1;
        assert_eq!(
            message,
            "target t: nl\\nfdr-profiled: service: FAKE LOG LINE attached"
        );
        assert!(seen[0].iter().any(|(f, v)| f == "fdr_pid" && v == "7"));
        assert!(seen[1].iter().any(|(f, v)| f == "message" && v == "plain"));
    }
}
