//! Launching the command to trace so that the probes are in place before its first instruction.
//!
//! The child is forked and parked on a pipe before `execv`; the daemon attaches its pid-scoped
//! probes to the forked pid (a pid survives exec) and then releases it. `std::process::Command`
//! cannot do this: its `spawn` waits for the exec to happen, so a `pre_exec` hook that waits for
//! the parent would deadlock.
use anyhow::{bail, Context as _, Result};
use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

/// A forked child waiting for [`HeldChild::release`] before it execs the command.
pub struct HeldChild {
    pid: libc::pid_t,
    go: libc::c_int,
    /// Let go already by someone else holding [`HeldChild::go_fd`] (the inline engine's
    /// keeper, which traces it through its exec).
    let_go: bool,
}

/// How a launched command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildExit {
    /// It exited with this status code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl ChildExit {
    /// The exit code a shell would report: the code, or 128 + the signal number.
    pub fn shell_code(self) -> i32 {
        match self {
            ChildExit::Code(c) => c,
            ChildExit::Signal(s) => 128 + s,
        }
    }
}

/// Finds `command` the way a shell does: as a path if it contains a `/`, else on `$PATH`.
pub fn resolve_program(command: &OsStr) -> Result<PathBuf> {
    let as_path = Path::new(command);
    if command.as_bytes().contains(&b'/') {
        return Ok(as_path.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(command);
        if is_executable(&candidate) {
            return Ok(candidate);
        }
    }
    bail!("{}: command not found", as_path.display())
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

impl HeldChild {
    /// Forks a child that will exec `program` with `args` (`args[0]` is `argv[0]`) once released.
    /// Must be called while the daemon is single-threaded (before the async runtime starts).
    /// The command runs with the signal mask `mask` (the one fdr-profiled started with).
    pub fn spawn(program: &Path, args: &[OsString], mask: &libc::sigset_t) -> Result<HeldChild> {
        let c_program = CString::new(program.as_os_str().as_bytes())
            .context("the command's path contains a NUL byte")?;
        let c_args: Vec<CString> = args
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .context("an argument contains a NUL byte")?;
        let mut argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let failure = b"fdr-profiled: error: cannot execute the command\n";

        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: fds is a valid array of two ints.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error()).context("pipe2");
        }
        let (wait_fd, go_fd) = (fds[0], fds[1]);
        // SAFETY: the daemon is single-threaded here; the child only makes async-signal-safe
        // calls (close, read, sigprocmask, signal, execv, write, _exit) on memory prepared before the
        // fork.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            let err = std::io::Error::last_os_error();
            // SAFETY: closing fds we own.
            unsafe {
                libc::close(wait_fd);
                libc::close(go_fd);
            }
            return Err(err).context("fork");
        }
        if pid == 0 {
            // SAFETY: see above.
            unsafe {
                libc::close(go_fd);
                let mut byte = 0u8;
                let n = loop {
                    let n = libc::read(wait_fd, (&raw mut byte).cast(), 1);
                    if n >= 0 || *libc::__errno_location() != libc::EINTR {
                        break n;
                    }
                };
                if n != 1 {
                    // The daemon gave up (attach failed) or died: never run untraced.
                    libc::_exit(127);
                }
                libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut());
                // Rust's runtime ignores SIGPIPE in fdr-profiled, and an ignored signal stays
                // ignored across exec: the command gets the default back, as
                // `std::process::Command` gives its children (`fdr-profiled -- yes | head`
                // must end like `yes | head`).
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                // ETXTBSY means another process still has the file open for writing (a build or
                // copy finishing): wait up to a second for it rather than fail the launch.
                for _ in 0..100 {
                    libc::execv(c_program.as_ptr(), argv.as_ptr());
                    if *libc::__errno_location() != libc::ETXTBSY {
                        break;
                    }
                    let pause = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 10_000_000,
                    };
                    libc::nanosleep(&pause, std::ptr::null_mut());
                }
                libc::write(2, failure.as_ptr().cast(), failure.len());
                libc::_exit(127);
            }
        }
        // SAFETY: the read end belongs to the child now.
        unsafe { libc::close(wait_fd) };
        Ok(HeldChild {
            pid,
            go: go_fd,
            let_go: false,
        })
    }

    /// The child's pid (the same before and after exec).
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// The pipe the child waits on (a byte written there lets it exec), for a process that
    /// lets it go instead: say so with [`HeldChild::let_go_elsewhere`].
    pub fn go_fd(&self) -> libc::c_int {
        self.go
    }

    /// The child was let go through [`HeldChild::go_fd`]: [`HeldChild::release`] has nothing
    /// left to do.
    pub fn let_go_elsewhere(&mut self) {
        self.let_go = true;
    }

    /// Lets the child exec the command. Returns its pid, to be waited for with [`wait_blocking`].
    pub fn release(self) -> Result<u32> {
        if self.let_go {
            return Ok(self.pid as u32);
        }
        let byte = 1u8;
        // SAFETY: writing one byte from a valid buffer to our pipe end.
        let n = unsafe { libc::write(self.go, (&raw const byte).cast(), 1) };
        let pid = self.pid as u32;
        let err = std::io::Error::last_os_error();
        drop(self);
        if n != 1 {
            return Err(err).context("releasing the launched command");
        }
        Ok(pid)
    }
}

impl Drop for HeldChild {
    /// Closing the pipe without a byte makes a still-parked child exit with 127.
    fn drop(&mut self) {
        // SAFETY: closing the fd we own.
        unsafe { libc::close(self.go) };
    }
}

/// Waits for the child `pid` to end (blocking; run it on its own thread).
pub fn wait_blocking(pid: u32) -> Result<ChildExit> {
    let mut status = 0;
    loop {
        // SAFETY: valid pointer to an int.
        let r = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
        if r == pid as libc::pid_t {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err).context("waiting for the launched command");
        }
    }
    if libc::WIFEXITED(status) {
        Ok(ChildExit::Code(libc::WEXITSTATUS(status)))
    } else {
        Ok(ChildExit::Signal(libc::WTERMSIG(status)))
    }
}

/// Reaps a child that never got released (attach failed).
pub fn reap(held: HeldChild) {
    let pid = held.pid();
    drop(held);
    let _ = wait_blocking(pid);
}
