//! What a repair stop costs its thread after the keeper is done with it: from the keeper's
//! `PTRACE_CONT` until the thread runs again (woken, its CPU out of idle, scheduled). The
//! keeper times each stop from the kernel's stamp at the throw or catch to its own
//! `PTRACE_CONT` and cannot see that last part, which on a virtual machine is as long as the
//! rest (measured 4 to 7 µs here, with stops of 5 µs); the overhead budget charges both, so
//! that it does not promise more than the program gets.
//!
//! Measured once per fdr-profiled, before it forks its first keeper (which inherits it), on a
//! child of its own that stops itself as a repaired thread is stopped (a signal its tracer
//! suppresses) and notes when it runs again.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Stops measured.
const ROUNDS: usize = 200;
/// The child's work between two stops: a thread runs between its throws.
const SPIN_NS: u64 = 20_000;

/// The mean time from `PTRACE_CONT` to the stopped thread running (the slowest tenth left
/// out: the measuring thread preempted meanwhile); 0 where it could not be measured.
pub fn resumption_ns() -> u64 {
    static MEASURED: OnceLock<u64> = OnceLock::new();
    *MEASURED.get_or_init(|| measure().unwrap_or(0))
}

fn now_ns() -> u64 {
    crate::session::monotonic_ns()
}

fn measure() -> Option<u64> {
    // A shared page: [0] when the child last ran again, [1] how many stops it has made.
    // SAFETY: an anonymous shared mapping of one page, unmapped below.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: the page is zeroed, aligned and lives until the munmap below; both processes
    // only touch it through atomics.
    let slots = unsafe { std::slice::from_raw_parts(page as *const AtomicU64, 2) };
    let samples = measure_with(slots);
    // SAFETY: mapped above, no reference to it is used after this.
    unsafe { libc::munmap(page, 4096) };
    let mut samples = samples?;
    samples.sort_unstable();
    samples.truncate(samples.len() - samples.len() / 10);
    (!samples.is_empty()).then(|| samples.iter().sum::<u64>() / samples.len() as u64)
}

fn measure_with(slots: &[AtomicU64]) -> Option<Vec<u64>> {
    // SAFETY: the child runs only system calls and atomics (async-signal-safe: the parent
    // has other threads), and ends with _exit.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return None;
    }
    if child == 0 {
        // SAFETY: plain system calls on our own process.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) != 0 {
                libc::_exit(1);
            }
            for round in 1..=ROUNDS as u64 {
                // A signal-delivery stop, as the repair's: the tracer suppresses it.
                libc::raise(libc::SIGUSR1);
                slots[0].store(now_ns(), Ordering::SeqCst);
                slots[1].store(round, Ordering::SeqCst);
                let until = now_ns() + SPIN_NS;
                while now_ns() < until {
                    std::hint::spin_loop();
                }
            }
            libc::_exit(0);
        }
    }
    let mut samples = Vec::with_capacity(ROUNDS);
    let mut resumed_by: Option<(u64, u64)> = None;
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child only.
        let waited = unsafe { libc::waitpid(child, &mut status, libc::__WALL) };
        if waited != child {
            // SAFETY: our own child; reaped if it is still there.
            unsafe {
                libc::kill(child, libc::SIGKILL);
                libc::waitpid(child, &mut status, libc::__WALL);
            }
            return None;
        }
        if let Some((round, cont)) = resumed_by {
            if slots[1].load(Ordering::SeqCst) == round {
                samples.push(slots[0].load(Ordering::SeqCst).saturating_sub(cont));
            }
        }
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            break;
        }
        let round = slots[1].load(Ordering::SeqCst) + 1;
        let cont = now_ns();
        // SAFETY: our own stopped child; the signal suppressed.
        unsafe { libc::ptrace(libc::PTRACE_CONT, child, 0, 0) };
        resumed_by = Some((round, cont));
    }
    Some(samples)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stopped_child_runs_again_within_a_second() {
        let ns = super::resumption_ns();
        assert!(ns > 0 && ns < 1_000_000_000, "{ns} ns");
    }
}
