//! Commands that work on binaries and recorded traces rather than recording.
pub mod bench_attach;
pub mod convert;
pub mod dump;
pub mod list;
pub mod report;
pub mod verify;
