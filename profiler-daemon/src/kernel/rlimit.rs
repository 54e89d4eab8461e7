//! Room for many open files. Without `uprobe_multi`, every probe is a perf event and holds one
//! file descriptor for as long as it is attached: 200,000 sleds are 200,000 descriptors, far
//! above the usual soft limit of 1,024 (or a container's 20,000).
use anyhow::{bail, Result};

/// Descriptors kept free beyond the ones asked for: trace files, pidfds, maps opened later.
const SLACK: u64 = 1024;

/// Makes sure `more` descriptors can be opened beyond those open now (plus some slack for the
/// session's own files): raises the soft `RLIMIT_NOFILE` towards the hard limit and, when that
/// is not enough and the process may (root, CAP_SYS_RESOURCE), the hard limit up to the
/// system's `fs.nr_open`. Returns the soft limit now in force. Errors when `more` descriptors
/// cannot fit whatever is raised.
///
/// Raise it after forking children that should keep the usual limit: they inherit it.
pub fn reserve_open_files(more: usize) -> Result<u64> {
    let open = open_files();
    let needed = open.saturating_add(more as u64);
    let wanted = needed.saturating_add(SLACK);
    let (soft, hard) = get()?;
    if soft >= wanted {
        return Ok(soft);
    }
    if hard < wanted {
        // Beyond fs.nr_open the kernel refuses the limit; stop there.
        let ceiling = nr_open().max(hard);
        let raised = wanted.min(ceiling);
        if set(raised, raised).is_ok() {
            return check(needed, more);
        }
    }
    // Without the right to raise the hard limit, the soft one can still reach it.
    let _ = set(wanted.min(hard), hard);
    check(needed, more)
}

fn check(needed: u64, more: usize) -> Result<u64> {
    let (soft, _) = get()?;
    if soft < needed {
        bail!(
            "{more} probes need as many open files, but the limit (RLIMIT_NOFILE) is {soft} and cannot be raised further (fs.nr_open is {}); select fewer functions with --functions/--exclude",
            nr_open()
        );
    }
    Ok(soft)
}

/// Number of descriptors this process has open (0 if /proc is unreadable).
pub fn open_files() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count() as u64)
}

fn nr_open() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20)
}

fn get() -> Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointer to an rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        bail!(
            "cannot read the open-files limit: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok((lim.rlim_cur, lim.rlim_max))
}

fn set(soft: u64, hard: u64) -> std::io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: valid pointer to an initialised rlimit.
    match unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether this process may raise its hard limits (CAP_SYS_RESOURCE, bit 24 of CapEff):
    /// containers often drop it.
    fn may_raise_hard_limit() -> bool {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let caps = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .unwrap();
        u64::from_str_radix(caps.trim(), 16).unwrap() & (1 << 24) != 0
    }

    #[test]
    fn raises_the_soft_limit_then_the_hard_one_if_allowed() {
        let (_, hard) = get().unwrap();
        set(1024.min(hard), hard).unwrap();
        let soft = reserve_open_files(4000).unwrap();
        assert!(
            soft >= open_files() + 4000 && soft <= hard,
            "soft {soft}, hard {hard}"
        );
        assert_eq!(get().unwrap(), (soft, hard));

        let beyond = hard as usize + 10_000;
        match (may_raise_hard_limit(), reserve_open_files(beyond)) {
            (true, Ok(soft)) => {
                assert!(soft >= open_files() + beyond as u64, "soft {soft}");
                // Opening beyond the old hard limit works.
                let files: Vec<std::fs::File> = (0..hard as usize + 100)
                    .map(|_| std::fs::File::open("/dev/null").unwrap())
                    .collect();
                drop(files);
            }
            (false, Err(err)) => assert!(err.to_string().contains("cannot be raised"), "{err}"),
            (allowed, result) => panic!("CAP_SYS_RESOURCE {allowed}, got {result:?}"),
        }

        let err = reserve_open_files(nr_open() as usize + 1).unwrap_err();
        assert!(err.to_string().contains("cannot be raised"), "{err}");
    }
}
