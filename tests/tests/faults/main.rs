//! Faults: the traced program killed, crashing, exec'ing, forking or stopped; fdr-profiled
//! itself killed or signalled at any moment; the disk full; its output pipes closed. Files stay
//! valid (our reader, llvm-xray 14 and 19), every event is accounted for, the traced program
//! goes on unchanged, and every wait is bounded.
//!
//! Needs root, BPF, clang-19, llvm-xray 14/19 and a built daemon.

// Faults of the traced program, in each mode.
mod program;
// Faults of fdr-profiled: SIGKILL mid-trace, stop signals while probes are placed or removed.
mod daemon;
// fdr-profiled SIGKILLed at random moments: the files it leaves are valid.
mod crash_safety;
// The output's file system full.
mod disk_full;
// Output nobody reads.
mod pipes;
