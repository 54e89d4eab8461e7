//! A running process given with `--pid`: checking it is something we can trace, finding its
//! executable, and noticing when it exits.
use anyhow::{bail, Context as _, Result};
use std::os::fd::{FromRawFd as _, OwnedFd};
use std::path::PathBuf;

/// A process we are about to trace.
#[derive(Debug)]
pub struct TracedProcess {
    /// Its pid.
    pub pid: u32,
    /// `/proc/PID/exe`: opening this reaches the executable even if it was deleted or replaced on
    /// disk since the process started, or lives in another mount namespace; uprobes placed
    /// through it land on the very inode the process runs.
    pub exe_link: PathBuf,
    /// The executable's path as the process sees it (for messages and directory names).
    pub exe_path: String,
}

impl TracedProcess {
    /// Checks that `pid` names a user-space process other than ourselves.
    pub fn find(pid: u32) -> Result<TracedProcess> {
        if pid == 0 {
            bail!("pid 0 is not a process");
        }
        if pid == std::process::id() {
            bail!("pid {pid} is fdr-profiled itself");
        }
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        if !proc_dir.exists() {
            bail!("no process with pid {pid}");
        }
        let exe_link = proc_dir.join("exe");
        let exe_path = match std::fs::read_link(&exe_link) {
            Ok(path) => path.to_string_lossy().into_owned(),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                if is_kernel_thread(pid) {
                    bail!("pid {pid} is a kernel thread: it runs no executable to trace");
                }
                bail!("pid {pid} has no executable (it is exiting or has exited)");
            }
            Err(err) if err.kind() == std::io::ErrorKind::PermissionDenied => {
                bail!("permission denied reading /proc/{pid}/exe: the process belongs to another user or is protected from tracing")
            }
            Err(err) => return Err(err).with_context(|| format!("cannot read /proc/{pid}/exe")),
        };
        Ok(TracedProcess {
            pid,
            exe_link,
            exe_path,
        })
    }

    /// The executable's path without the kernel's " (deleted)" suffix.
    pub fn exe_path_on_disk(&self) -> &str {
        self.exe_path
            .strip_suffix(" (deleted)")
            .unwrap_or(&self.exe_path)
    }

    /// Whether the file the process runs was deleted or replaced since it started (the path
    /// then names another file, or none).
    pub fn exe_deleted(&self) -> bool {
        self.exe_path.ends_with(" (deleted)")
    }

    /// The executable's file name.
    pub fn exe_name(&self) -> String {
        super::file_name(self.exe_path_on_disk()).to_owned()
    }
}

/// Kernel threads have the PF_KTHREAD flag in the 9th field of /proc/PID/stat.
fn is_kernel_thread(pid: u32) -> bool {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The command name (field 2) may contain spaces and parentheses: fields resume after the
    // last ')'. Field 9 (flags) is then the 7th.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(6)?.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_KTHREAD != 0)
}

/// The processes whose executable is the file `executable` (device and inode), now.
pub fn running(executable: super::mappings::FileId) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != std::process::id())
        .filter(|&pid| super::mappings::executable_id(pid) == Some(executable))
        .collect();
    pids.sort_unstable();
    pids
}

/// When `pid` started (clock ticks after boot, field 22 of /proc/PID/stat): with the pid, it
/// names one process, not whichever later reuses the number. `None` once it is gone.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields resume after the command name's last ')'; field 22 is then the 20th.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// The ids of the threads of process `pid` now (`/proc/PID/task`).
pub fn threads(pid: u32) -> std::io::Result<Vec<u32>> {
    let mut tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// The pid of the process ptrace-tracing thread `tid` (`TracerPid` in its status; 0: none).
pub fn tracer_of(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))?
        .trim()
        .parse()
        .ok()
}

/// `AT_SECURE` in an auxiliary vector: the kernel's word that an exec changed the process's
/// credentials (`<linux/auxvec.h>`).
const AT_SECURE: u64 = 23;

/// Whether the exec process `pid` just made (it is stopped at its exec event) gave it
/// privileges it did not have: what changed, for the log, or `None`. The kernel's own verdict
/// is `AT_SECURE` in the new image's auxiliary vector (a set-user-ID or set-group-ID file,
/// file capabilities, a security module's transition), backed by effective or saved ids that
/// differ from the real ones. Fails safe: what cannot be read counts as raised.
pub fn exec_raised_privileges(pid: u32) -> Option<String> {
    let program = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "a program".to_owned());
    let Ok(auxv) = std::fs::read(format!("/proc/{pid}/auxv")) else {
        return Some(format!("{program} (its credentials cannot be read)"));
    };
    let secure = auxv
        .chunks_exact(16)
        .map(|pair| {
            let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().unwrap_or_default());
            (word(&pair[..8]), word(&pair[8..]))
        })
        .take_while(|&(kind, _)| kind != 0)
        .any(|(kind, value)| kind == AT_SECURE && value != 0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    // `Uid:` and `Gid:` list the real, effective, saved and filesystem ids.
    let ids = |key: &str| -> Option<Vec<u32>> {
        let line = status.lines().find_map(|l| l.strip_prefix(key))?;
        line.split_whitespace().map(|v| v.parse().ok()).collect()
    };
    let changed = |ids: &Option<Vec<u32>>| match ids.as_deref() {
        Some([real, effective, saved, ..]) => effective != real || saved != real,
        _ => true,
    };
    let (uids, gids) = (ids("Uid:"), ids("Gid:"));
    if !secure && !changed(&uids) && !changed(&gids) {
        return None;
    }
    let shown = |ids: &Option<Vec<u32>>| match ids.as_deref() {
        Some([real, effective, ..]) => format!("{effective} (real {real})"),
        _ => "unknown".to_owned(),
    };
    Some(format!(
        "{program}, which raised its privileges (effective uid {}, gid {})",
        shown(&uids),
        shown(&gids)
    ))
}

/// A pidfd: becomes readable when the process exits (no polling of /proc, no pid reuse races).
pub fn open_pidfd(pid: u32) -> Result<OwnedFd> {
    // SAFETY: plain syscall; a non-negative result is a new descriptor we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("pidfd_open({pid})"));
    }
    // SAFETY: fd is a fresh descriptor returned by the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Waits until the process behind `pidfd` has exited.
pub async fn exited(pidfd: &tokio::io::unix::AsyncFd<OwnedFd>) -> Result<()> {
    let mut guard = pidfd
        .readable()
        .await
        .context("waiting for the traced process")?;
    guard.retain_ready();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_ourselves_missing_pids_and_kernel_threads() {
        let me = std::process::id();
        assert!(TracedProcess::find(me)
            .unwrap_err()
            .to_string()
            .contains("itself"));
        assert!(TracedProcess::find(0).is_err());
        // pid_max is at most 2^22: this pid cannot exist.
        let err = TracedProcess::find(1 << 23).unwrap_err().to_string();
        assert!(err.contains("no process"), "{err}");
        // kthreadd is pid 2 on every Linux system with kernel threads.
        assert!(start_time(me).is_some_and(|t| t > 0));
        assert_eq!(start_time(1 << 23), None);
        let exe = crate::traced::mappings::executable_id(me).expect("our executable");
        assert!(
            !running(exe).contains(&me),
            "we never count ourselves as a process to trace"
        );
        if is_kernel_thread(2) {
            let err = TracedProcess::find(2).unwrap_err().to_string();
            assert!(err.contains("kernel thread"), "{err}");
        }
    }
}
