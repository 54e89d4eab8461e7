//! The service, `fdr-profiled service --config FILE`, with real BPF and real processes: each
//! module's first lines say what it proves. Every test starts the service the one way the tests
//! have, `tests::service::ServiceStart`.
//!
//! Needs root, BPF, clang-19, llvm-xray 14/19 and a built daemon; `export` needs golang-go,
//! `unit` systemd, unshare, nsenter and cargo-deb.

mod common;

// Modes: the flight recorder's snapshots, record mode's segments.
mod flight_recorder;
// What tracing may cost a target: its budget.
mod budget;
mod record_mode;
// What it keeps on disk.
mod retention;
// How it is driven: configuration, control socket, systemd, targets that change, its unit.
mod config;
mod control;
mod systemd;
mod targets;
mod top;
mod unit;
// What it traces besides an executable: shared objects; C++ processes with their stack repaired.
mod objects;
mod repair;
// Each process patched by the inline engine instead of probed.
mod inline;
// Where it sends profiles.
mod export;
