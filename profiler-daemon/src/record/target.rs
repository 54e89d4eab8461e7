//! What a recording traces, with what holds it until the probes are in place.
use crate::repair::keeper as repair;
use crate::traced::launch::HeldChild;
use std::os::fd::OwnedFd;

/// What to trace.
pub enum Target {
    /// Every process running the binary.
    Attach,
    /// A command we launched, parked until the probes are in place, and under
    /// `--exits repair` its tracer.
    Launch(HeldChild, Option<repair::Keeper>),
    /// A running process, a pidfd that tells when it exits, and under `--exits repair` its
    /// tracer.
    Pid(u32, OwnedFd, Option<repair::Keeper>),
}
