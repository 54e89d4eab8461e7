//! fdr-profiled: traces programs built with LLVM XRay without their cooperation.
//!
//! Data flows one way through these modules:
//! ELF file ([`elf`], [`instrmap`], [`symbols`]) → attach plan ([`plan`]) → kernel events
//! ([`bpf`], [`intake`]) → per-thread ordering and FDR files ([`session`], [`fdr`]) → summary
//! ([`summary`]).
//!
//! Reading a session back: [`replay`] (calls in order, per thread) → [`symbolize`] (names,
//! source locations) → [`report`] (statistics) and [`convert`] (timelines, flame graphs).
pub mod bpf;
pub mod cli;
pub mod convert;
pub mod discovery;
pub mod elf;
pub mod eventsled;
pub mod exits;
pub mod fdr;
pub mod instrmap;
pub mod intake;
pub mod launch;
pub mod mappings;
pub mod objects;
pub mod order;
pub mod output;
pub mod plan;
pub mod process;
pub mod record;
pub mod replay;
pub mod report;
pub mod rlimit;
pub mod select;
pub mod session;
pub mod session_outputs;
pub mod summary;
pub mod symbolize;
pub mod symbols;
pub mod tools;
pub mod uprobe_multi;
