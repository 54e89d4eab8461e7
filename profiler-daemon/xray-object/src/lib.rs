//! An XRay-instrumented ELF file, read without a system call beyond opening and reading it:
//! the first stage of fdr-profiled's pipeline (ELF → attach plan → kernel events → per-thread
//! order → FDR files → reports), and what the readers of a trace use to name its functions.
//!
//! - [`elf`]: the file, loaded under a policy for hostile input (bounded sizes, checked
//!   headers), with the few questions asked of it (segments, sections, build-id).
//! - [`instrmap`]: the `xray_instr_map` section: sleds, their kinds and XRay's function ids.
//! - [`symbols`]: names from the ELF symbol tables, demangled as `llvm-xray` shows them.
//! - [`unwinding`]: which functions an exception can leave, from their machine code and
//!   exception tables (where a return probe is safe).
//!
//! Like `aya-obj` beside `aya`, this crate only parses: it places no probe and loads nothing
//! into the kernel, so everything that reads traces can depend on it without BPF.
pub mod elf;
pub mod instrmap;
pub mod symbols;
pub mod unwinding;

pub use elf::ElfImage;
pub use instrmap::InstrMap;
pub use symbols::SymbolTable;
