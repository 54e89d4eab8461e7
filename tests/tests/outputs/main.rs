//! Outputs: what users read, checked against independent references. `report`, `convert` (every
//! format, pprof through `go tool pprof`, speedscope and the Chrome trace in a real viewer),
//! `list`, `dump`, `verify` and the symbolizer against llvm-xray 14/19 and llvm-symbolizer; the
//! traces compiler-rt's own runtime writes, read in full; outputs that stay small.
//!
//! Most need root, BPF, clang-19, llvm-xray 14/19 and a built daemon; each module's first lines
//! say what it needs.

mod bounded_outputs;
mod convert;
mod convert_pprof;
mod diff;
mod fdr_native;
mod fdr_tools;
mod list;
mod native_unwound;
mod perfetto;
mod report;
mod report_objects;
mod symbolize;
mod viewer;
