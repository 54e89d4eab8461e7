//! What a reader reports: the first violation, with its byte offset and record kind.
use std::fmt;

/// The first violation found: where, in which kind of record, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    /// Byte offset in the file of the record (or byte) at fault.
    pub offset: u64,
    /// Kind of that record: `FileHeader`, `Function`, `NewBuffer`, ... or `Padding`.
    pub record: &'static str,
    /// What is wrong.
    pub problem: String,
}

impl ReadError {
    /// An error at `offset` in a record of kind `record`.
    pub fn new(offset: u64, record: &'static str, problem: impl Into<String>) -> Self {
        ReadError {
            offset,
            record,
            problem: problem.into(),
        }
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "offset {} ({:#x}), {}: {}",
            self.offset, self.offset, self.record, self.problem
        )
    }
}

impl std::error::Error for ReadError {}
