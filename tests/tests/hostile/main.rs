//! Bad and hostile input: what a wrong or hostile argument, file, output directory, missing
//! privilege or local user gives fdr-profiled is refused with one line naming the problem and a
//! non-zero exit status, never a panic, a hang, a link followed or a privilege lent.
//!
//! The FDR reader's own bad-input tests are `xray-fdr`'s (`profiler-daemon/xray-fdr/tests/`).
//!
//! Needs root, BPF, clang-19, llvm-xray 14/19 and a built daemon.

// A missing binary, a file that is not ELF, no instrumentation map, a bad pid, not root.
mod arguments;
// Malformed ELF files, hostile session manifests and FDR files.
mod files;
// What is created is private; planted symbolic links are never followed.
mod output_safety;
// Capabilities checked first, and the documented sets suffice.
mod privileges;
// The root service and `--exits repair` against an unprivileged local user.
mod user;
