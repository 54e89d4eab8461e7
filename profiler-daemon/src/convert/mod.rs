//! `convert`: a session as files other tools open.
//!
//! - [`chrome`]: Chrome trace-event JSON (Perfetto UI, `chrome://tracing`): one track per
//!   thread, named processes, nested calls with their logged arguments, events as instants.
//! - [`speedscope`]: speedscope's own JSON, one evented profile per thread.
//! - [`folded`]: folded stacks (`a;b;c N`, N the self time in ns), and from them a flame
//!   graph SVG drawn by inferno.
//!
//! The timelines stream: each record is written as it is read. Folded stacks and the flame
//! graph need memory for each distinct stack, not for each call.
pub mod chrome;
pub mod folded;
pub mod speedscope;

use crate::replay::{FunctionKey, Namer};
use std::collections::HashMap;

/// Output formats of `convert`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Chrome trace-event JSON (Perfetto UI, chrome://tracing).
    Chrome,
    /// speedscope JSON (evented profiles, one per thread).
    Speedscope,
    /// Folded stacks, one `a;b;c N` line per stack, N its self time in ns.
    Folded,
    /// A flame graph SVG (from the folded stacks).
    Svg,
}

impl Format {
    /// The usual file name extension.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Chrome | Format::Speedscope => "json",
            Format::Folded => "folded",
            Format::Svg => "svg",
        }
    }
}

/// Function names as JSON string literals, computed once per function.
pub(crate) struct JsonNames {
    namer: Namer,
    cache: HashMap<FunctionKey, String>,
}

impl JsonNames {
    pub(crate) fn new(namer: Namer) -> JsonNames {
        JsonNames {
            namer,
            cache: HashMap::new(),
        }
    }

    /// `"name"`, escaped.
    pub(crate) fn get(&mut self, key: FunctionKey) -> &str {
        let namer = &mut self.namer;
        self.cache.entry(key).or_insert_with(|| {
            serde_json::to_string(&namer.function(key).name).unwrap_or_else(|_| "\"?\"".into())
        })
    }

    /// The underlying namer.
    pub(crate) fn namer(&mut self) -> &mut Namer {
        &mut self.namer
    }
}

/// `ns` nanoseconds as microseconds with three decimals, exactly (the trace-event unit).
pub(crate) fn micros(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// An event payload for people: the text if it is printable UTF-8, else hex.
pub(crate) fn payload_text(data: &[u8]) -> String {
    match std::str::from_utf8(data) {
        Ok(s) if s.chars().all(|c| !c.is_control() || c == '\n' || c == '\t') => s.to_owned(),
        _ => data.iter().map(|b| format!("{b:02x}")).collect(),
    }
}
