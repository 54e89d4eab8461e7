//! fdr-profiled: traces programs built with LLVM XRay without their cooperation.
//!
//! Data flows one way through these modules:
//! ELF file ([`elf`], [`instrmap`], [`symbols`]) → attach plan ([`plan`]) → kernel events
//! ([`bpf`], [`intake`]) → per-thread ordering and FDR files ([`session`], [`fdr`]) → summary
//! ([`summary`]).
pub mod bpf;
pub mod cli;
pub mod elf;
pub mod fdr;
pub mod instrmap;
pub mod intake;
pub mod launch;
pub mod output;
pub mod plan;
pub mod process;
pub mod record;
pub mod session;
pub mod summary;
pub mod symbols;
pub mod tools;
