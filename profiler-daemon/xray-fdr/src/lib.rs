//! The XRay FDR trace format (see `shared/docs/fdr-format.md`): encoding ([`records`]), the
//! crash-safe per-thread writer ([`writer`], [`commit`], [`sink`]) and the checking reader
//! ([`reader`]).
//!
//! The recorder writes through [`ThreadWriter`] (one file per thread, loadable by `llvm-xray`
//! at every instant, even after a kill mid-write); `verify`, `dump` and the session readers read
//! through [`reader::Reader`], which accepts what compiler-rt's own runtime writes (versions 1
//! to 5) and names the first byte of anything else.
//!
//! This crate depends on nothing but `std` and `thiserror`, so the fuzz crate (`fuzz/`) builds
//! it alone, without the daemon and its eBPF programs.
pub mod commit;
pub mod reader;
pub mod records;
pub mod sink;
pub mod version;
pub mod writer;

pub use reader::{read, ReadError, Record, RecordKind, Trace};
pub use records::FunctionAction;
pub use sink::TraceSink;
pub use version::FdrVersion;
pub use writer::{Recorded, ThreadStats, ThreadWriter, WallClock};
