//! Stage 5, `--exits repair`: return probes on every function, made safe for exceptions by
//! repairing the traced process's stack at each throw, from outside it.
//!
//! - [`keeper`]: the process's ptrace tracer (a process of its own, `fdr-repair`): started,
//!   asked to let a running process go, its report read. Inside it, `repairer` serves every
//!   stop (the repairs at throws and catches, the forks it follows, the release with no frame
//!   left hooked), through the system calls of `ptrace`; `stops` places the throw and catch
//!   stops it serves, and `release` is how fdr-profiled and the keeper talk.
//! - [`processes`]: every process that runs one executable (`--attach`, the service's
//!   targets), each traced by a keeper of its own before any probe of it is placed.
pub mod hold;
pub mod keeper;
pub mod processes;
mod ptrace;
mod release;
mod repairer;
mod stops;
