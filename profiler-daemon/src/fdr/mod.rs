//! The XRay FDR trace format (see `shared/docs/fdr-format.md`).
pub mod records;
pub mod writer;
pub use records::FunctionAction;
pub use writer::{Recorded, ThreadStats, ThreadWriter, WallClock};
