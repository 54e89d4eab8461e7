//! The XRay FDR trace format (see `shared/docs/fdr-format.md`): encoding ([`records`]), the
//! crash-safe per-thread writer ([`writer`], [`commit`], [`sink`]) and the checking reader
//! ([`reader`]).
//!
//! This module tree depends on nothing else in the crate (only `std` and `thiserror`), so the
//! fuzz crate can compile it on its own without building the daemon and its eBPF programs.
pub mod commit;
pub mod reader;
pub mod records;
pub mod sink;
pub mod version;
pub mod writer;

#[cfg(test)]
pub(crate) mod llvm_xray;

pub use reader::{read, ReadError, Record, RecordKind, Trace};
pub use records::FunctionAction;
pub use sink::TraceSink;
pub use version::FdrVersion;
pub use writer::{Recorded, ThreadStats, ThreadWriter, WallClock};
