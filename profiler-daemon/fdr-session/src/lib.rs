//! What an fdr-profiled session is on disk, shared by the recorder that writes it and the
//! readers (`fdr-analysis`) that read it back:
//!
//! - [`schema`]: the types of `session.json`, declared once, serialised by the recorder and
//!   deserialised by the readers;
//! - [`manifest`]: the manifest's name and the one safe way to read its bytes;
//! - [`output_dir`]: where outputs are written, through directory descriptors, never following
//!   a link someone planted;
//! - [`units`]: how durations are written for people, the same in the recorder's summary and
//!   the readers' reports.
//!
//! No BPF, no ELF, no FDR: a crate both sides can depend on without depending on each other.
pub mod manifest;
pub mod output_dir;
pub mod schema;
pub mod units;
