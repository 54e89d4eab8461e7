//! The capabilities a session needs, checked before it does anything, so that a user without
//! them gets one line naming what is missing instead of an error from deep in the kernel.
//!
//! What each needs was found by running every mode under `setpriv --bounding-set` (Linux 6.18):
//! loading and attaching the eBPF programs (`uprobe_multi` links) needs `CAP_BPF` and
//! `CAP_PERFMON`, or `CAP_SYS_ADMIN`, which covers both; one perf event per probe
//! (`--no-uprobe-multi`) needs `CAP_SYS_ADMIN`; reading a running process's executable and
//! mappings (`--pid`) needs `CAP_SYS_PTRACE`, even for a process of our own user whose
//! capabilities are not a subset of ours. `--exits repair` of a launched command needs nothing
//! more (the tracer is its parent). Root has them all.
use anyhow::{bail, Context as _, Result};

/// A capability fdr-profiled may need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    /// Load BPF programs and create maps.
    Bpf,
    /// Attach tracing programs, open perf events.
    Perfmon,
    /// Everything `Bpf` and `Perfmon` allow, and perf-event uprobes.
    SysAdmin,
    /// Read another process's `/proc/PID/exe`, `maps` and `map_files`.
    SysPtrace,
}

impl Cap {
    /// The capability's bit in the kernel's sets (`linux/capability.h`).
    fn bit(self) -> u32 {
        match self {
            Cap::SysPtrace => 19,
            Cap::SysAdmin => 21,
            Cap::Perfmon => 38,
            Cap::Bpf => 39,
        }
    }

    /// The name the kernel and `capabilities(7)` use.
    pub fn name(self) -> &'static str {
        match self {
            Cap::Bpf => "CAP_BPF",
            Cap::Perfmon => "CAP_PERFMON",
            Cap::SysAdmin => "CAP_SYS_ADMIN",
            Cap::SysPtrace => "CAP_SYS_PTRACE",
        }
    }
}

/// This process's effective capability set (`CapEff` in `/proc/self/status`).
pub fn effective() -> Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    parse_cap_eff(&status).context("no CapEff line in /proc/self/status")
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// Which of `needed` the effective set `eff` lacks; `CAP_SYS_ADMIN` stands in for `CAP_BPF`
/// and `CAP_PERFMON` (the kernel accepts it for both).
pub fn missing(eff: u64, needed: &[Cap]) -> Vec<Cap> {
    let has = |c: Cap| eff & (1u64 << c.bit()) != 0;
    needed
        .iter()
        .copied()
        .filter(|&c| {
            let covered = matches!(c, Cap::Bpf | Cap::Perfmon) && has(Cap::SysAdmin);
            !(has(c) || covered)
        })
        .collect()
}

/// Fails with one line when this process lacks any of `needed` for `what` (e.g.
/// "recording with --pid"): which are missing, and the whole set.
pub fn require(needed: &[Cap], what: &str) -> Result<()> {
    let lacking = missing(effective()?, needed);
    if lacking.is_empty() {
        return Ok(());
    }
    let names = |caps: &[Cap]| caps.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ");
    bail!(
        "missing {}: {what} needs {} (run it as root)",
        names(&lacking),
        names(needed)
    )
}

/// [`require`], and then, on a kernel without `uprobe_multi` links (where every probe becomes
/// a perf event, which needs `CAP_SYS_ADMIN`), `CAP_SYS_ADMIN` too. The kernel's support is
/// probed with a BPF call, which only works once the first check has passed.
pub fn require_for_probes(needed: &[Cap], what: &str) -> Result<()> {
    require(needed, what)?;
    if !needed.contains(&Cap::SysAdmin) && !super::uprobe_multi::supported() {
        let mut all = needed.to_vec();
        all.push(Cap::SysAdmin);
        require(
            &all,
            &format!("{what} on a kernel without uprobe_multi links"),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BPF_PERFMON: u64 = (1 << 38) | (1 << 39);

    #[test]
    fn reads_cap_eff() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(parse_cap_eff(status), Some(0x1ff_ffff_ffff));
        assert_eq!(parse_cap_eff("Name:\tx\n"), None);
    }

    #[test]
    fn names_what_is_missing() {
        let all = [Cap::Bpf, Cap::Perfmon, Cap::SysPtrace];
        assert_eq!(missing(0, &all), all);
        assert_eq!(missing(BPF_PERFMON, &all), [Cap::SysPtrace]);
        assert_eq!(missing(BPF_PERFMON | (1 << 19), &all), []);
        // CAP_SYS_ADMIN covers CAP_BPF and CAP_PERFMON, not CAP_SYS_PTRACE.
        assert_eq!(missing(1 << 21, &all), [Cap::SysPtrace]);
        assert_eq!(missing(1 << 39, &[Cap::SysAdmin]), [Cap::SysAdmin]);
    }
}
