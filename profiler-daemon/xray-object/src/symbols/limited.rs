//! Demangled text, bounded.
use std::fmt;

/// Longest demangled name kept; a longer demangling (exponential substitution blow-ups are
/// possible in the Itanium scheme) falls back to the raw name.
pub const MAX_DEMANGLED_LEN: usize = 16 * 1024;

/// A string writer that fails once [`MAX_DEMANGLED_LEN`] is exceeded, which stops the
/// demanglers early instead of letting a hostile name build a huge string.
#[derive(Default)]
pub(super) struct Limited {
    pub(super) text: String,
}

impl fmt::Write for Limited {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.text.len().saturating_add(s.len()) > MAX_DEMANGLED_LEN {
            return Err(fmt::Error);
        }
        self.text.push_str(s);
        Ok(())
    }
}
