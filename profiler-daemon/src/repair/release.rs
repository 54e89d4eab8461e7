//! How fdr-profiled and a keeper talk: the request to let a running process go (a signal, or
//! fdr-profiled gone), and the lines the keeper reports back (`let-go WHY` when it lets its
//! process go by itself, then what its repairs did).
use crate::session::summary::RepairsByThread;
use std::fs::File;
use std::io::Write as _;

/// The first word of the line by which a keeper says it lets its process go by itself.
pub(super) const LET_GO: &str = "let-go ";

/// What the keeper tells fdr-profiled, one line each (fdr-profiled may be gone: then nobody
/// reads it, which is fine).
pub(super) struct Reports(pub(super) File);

impl Reports {
    /// The process is let go by the keeper itself, and why (before it is).
    pub(super) fn let_go(&mut self, why: &str) {
        let line = format!("{LET_GO}{}\n", crate::console::one_line(why));
        let _ = self.0.write_all(line.as_bytes());
    }

    /// What the repairs did: the keeper's last word.
    pub(super) fn repairs(&mut self, stats: &RepairsByThread) {
        let line = serde_json::to_string(stats).unwrap_or_default() + "\n";
        let _ = self.0.write_all(line.as_bytes());
    }
}

/// How the keeper of a running process is asked to let it go, and how often at least it
/// looks for the request.
pub(super) const RELEASE_SIGNAL: libc::c_int = libc::SIGUSR2;

pub(super) const RELEASE_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// How long fdr-profiled waits for the keeper to have let the process go.
pub const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Set by [`RELEASE_SIGNAL`]'s handler.
pub(super) static RELEASE_ASKED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// A pidfd of fdr-profiled, readable once all of it is gone (see [`release_due`]); -1 when
/// there is none.
pub(super) static PARENT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

pub(super) extern "C" fn on_release_signal(_: libc::c_int) {
    RELEASE_ASKED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether the keeper of a running process must let it go now: fdr-profiled asked (having
/// removed its probes first), or fdr-profiled is gone, every thread of it. Not as soon as the
/// thread that forked the keeper is gone (a parent-death signal would come then): while another
/// thread of fdr-profiled lives, its probes are still in place and go on hooking frames, which
/// a keeper that had let go would leave for an exception to find.
pub(super) fn release_due() -> bool {
    if RELEASE_ASKED.load(std::sync::atomic::Ordering::SeqCst) {
        return true;
    }
    let fd = PARENT.load(std::sync::atomic::Ordering::SeqCst);
    if fd < 0 {
        return false;
    }
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait; a pidfd is readable once its process has exited.
    unsafe { libc::poll(&mut poll, 1, 0) > 0 }
}

/// The keeper of a running process lets it go when fdr-profiled asks ([`RELEASE_SIGNAL`]) or
/// is gone (see [`release_due`]). A wait for the tracee's next stop is interrupted by the
/// request, and by a timer every [`RELEASE_POLL`] (a request that came just before a wait
/// began, and fdr-profiled's end, are seen then).
pub(super) fn listen_for_release(parent: libc::pid_t) {
    // SAFETY: installing async-signal-safe handlers (an atomic store, nothing) and a timer.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_release_signal as extern "C" fn(libc::c_int) as usize;
        // No SA_RESTART: the wait returns EINTR.
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(RELEASE_SIGNAL, &action, std::ptr::null_mut());
        let mut tick: libc::sigaction = std::mem::zeroed();
        tick.sa_sigaction = on_tick as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut tick.sa_mask);
        libc::sigaction(libc::SIGALRM, &tick, std::ptr::null_mut());
        let every = libc::timeval {
            tv_sec: 0,
            tv_usec: RELEASE_POLL.as_micros() as libc::suseconds_t,
        };
        let timer = libc::itimerval {
            it_interval: every,
            it_value: every,
        };
        libc::setitimer(libc::ITIMER_REAL, &timer, std::ptr::null_mut());
        let pidfd = libc::syscall(libc::SYS_pidfd_open, parent, 0);
        if pidfd >= 0 && libc::getppid() == parent {
            PARENT.store(pidfd as i32, std::sync::atomic::Ordering::SeqCst);
        } else {
            // fdr-profiled is gone already: nobody will ask.
            on_release_signal(RELEASE_SIGNAL);
        }
    }
}

pub(super) extern "C" fn on_tick(_: libc::c_int) {}
