//! The service, `fdr-profiled service --config FILE`, with real BPF and real processes.
//!
//! Needs root, BPF, clang-19, llvm-xray 14/19 and a built daemon; `export` needs golang-go,
//! `unit` systemd and cargo-deb.

mod config;
mod export;
mod objects;
mod service;
mod unit;
