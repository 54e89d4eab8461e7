//! `peak_rss CMD [ARGS...]`: runs CMD to its end, then prints `peak_rss_kib=N` (its peak
//! resident memory, from `wait4`) as the last line of standard error and exits with its status.
//!
//! The tests measure a command's memory through this small process: a child's peak counts the
//! memory of the process it was forked from until its `exec` (Linux keeps that high-water mark
//! across `exec`), so a test process holding a hundred MiB would otherwise be measured too.
use std::process::Command;

fn main() {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: peak_rss CMD [ARGS...]");
        std::process::exit(2);
    };
    let child = match Command::new(&program).args(args).spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("peak_rss: {}: {e}", program.to_string_lossy());
            std::process::exit(127);
        }
    };
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, writing into locals that outlive the call. (Reaped here,
    // so `child` is never waited for again.)
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    if r != pid {
        eprintln!("peak_rss: wait4: {}", std::io::Error::last_os_error());
        std::process::exit(125);
    }
    drop(child);
    eprintln!("peak_rss_kib={}", usage.ru_maxrss);
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    std::process::exit(code);
}
