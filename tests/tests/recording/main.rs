//! Recording: programs traced by `fdr-profiled` (launched with `-- CMD`, attached by `--pid`
//! or `--attach`) leave FDR files that hold exactly the calls each program counted itself,
//! read alike by our reader and llvm-xray 14 and 19. Each module's first lines say what it
//! proves.
//!
//! Needs root, BPF, clang-19, nightly rustc, llvm-xray 14/19 and a built daemon (`cargo xtask
//! test` builds it).

// The C++ and Rust fixtures, launched and attached; one process by pid; shared objects.
mod objects_launch;
mod trace_cpp;
mod trace_dso;
mod trace_pid;
// The inline engine: sleds patched from outside.
mod inline;
mod trace_rust;
// The live view (`top`) of a recording, in a terminal.
pub mod live;
// What the records carry: arguments, custom and typed events, CPUs, timestamps.
mod events;
mod migration;
mod migration_threads;
mod tsc_wrap;
// How calls end: exit modes, exceptions (also through a real library's parser), panics,
// longjmp, deep recursion.
mod deep_recursion;
mod exits;
mod exits_per_function;
mod json_parser;
mod longjmp;
mod panics;
// What the probes cost: measured at the start, estimated per function; kept under a budget.
mod budget;
mod costs;
// What is probed: `--functions`/`--exclude`, and the kernel's uprobe_multi links themselves.
mod select;
mod uprobe_multi;
