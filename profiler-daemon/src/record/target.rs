//! What a recording traces, with what holds it until the probes are in place.
use crate::repair::keeper as repair;
use crate::traced::launch::HeldChild;
use crate::traced::process;
use anyhow::Result;
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

/// Resolves when the process traced by `--pid` exits; never without one.
pub async fn target_exited(pidfd: Option<&tokio::io::unix::AsyncFd<OwnedFd>>) -> Result<()> {
    match pidfd {
        Some(fd) => process::exited(fd).await,
        None => std::future::pending().await,
    }
}

pub async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
