//! Stage 5, `--exits repair`: return probes on every function, made safe for exceptions by
//! repairing the traced process's stack at each throw, from outside it.
//!
//! - [`keeper`]: the process's ptrace tracer (a process of its own, `fdr-repair`), and the
//!   throw and catch stops it serves; it follows the processes the traced one forks, and lets
//!   a running process go with no frame left hooked.
//! - [`processes`]: every process that runs one executable (`--attach`, the service's
//!   targets), each traced by a keeper of its own before any probe of it is placed.
pub mod keeper;
pub mod processes;
