//! Commands that work on binaries and recorded traces rather than recording.
pub mod dump;
pub mod list;
pub mod verify;
