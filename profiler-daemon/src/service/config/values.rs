//! Values every part of the configuration parses the same way, and how their errors are
//! located (a leaf: `config` and its sections import it, it imports neither).
use std::time::Duration;

/// A result whose error carries the span (byte range in the file) of what is wrong.
pub(super) type Located<T> = Result<T, (std::ops::Range<usize>, String)>;

/// A duration such as `30s`, `50ms` or `10m`.
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration (write e.g. \"30s\" or \"50ms\"): {e}"))
}
