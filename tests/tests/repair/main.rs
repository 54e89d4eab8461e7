//! Repair (`--exits repair`): a traced C++ program whose exceptions pass through hooked frames
//! runs on as it would untraced, with its stack repaired by a keeper process that follows its
//! forks and lets it go with no ptrace relation left.
//!
//! `repair_kill.rs`, which kills fdr-profiled at fifty moments, is a binary of its own: it
//! makes its process a child subreaper and times its kills.
//!
//! Needs root, BPF, clang-19, llvm-xray 14/19 and a built daemon.

// A running server by `--pid` and `--attach`.
mod pid;
// A launched program that forks while its frames are hooked.
mod forks;
