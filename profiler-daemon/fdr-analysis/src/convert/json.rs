//! What the JSON formats (Chrome, speedscope) share: escaped names, times, payloads.
use crate::replay::{FunctionKey, Namer};
use std::collections::HashMap;

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
