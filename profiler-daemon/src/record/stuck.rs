//! Under `--exits repair`, a thread stuck at the kernel's limit of 64 pending return probes:
//! the return probes of frames an exception left are dropped only when a traced caller
//! returns, and under `--pid` (or `--attach`) none may, so the thread's later calls get no
//! return probe. The recording then observes the process's exits by their sleds instead.
use crate::kernel::bpf::KernelBooks;
use crate::session::Session;
use std::time::Duration;

pub use profiler_common::STUCK_BEYOND_RETURN_LIMIT;
/// How often threads are checked for that (reading the kernel's per-thread table).
pub const STUCK_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// A thread stuck at the kernel's limit of pending return probes (see
/// [`STUCK_BEYOND_RETURN_LIMIT`]), and how many of its calls have no return probe; with
/// `process`, only among that process's threads.
pub fn stuck_thread(
    books: &KernelBooks,
    session: &Session,
    process: Option<u32>,
) -> Option<(u32, u64)> {
    // The programs read the kernel's own count of the thread's pending return probes (when its
    // BTF says where it is) at each entry, and count the calls it does not hook while its
    // newest pending one is gone: exact. A destructor run while an exception unwinds (it
    // proves frames gone before the catch) is ordinary C++, no sign of the limit.
    let limit = u64::from(STUCK_BEYOND_RETURN_LIMIT);
    let of_process = |tid: u32| {
        process.is_none_or(|pid| std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists())
    };
    // The programs count each thread that reaches the limit: the books (a walk over every task
    // of the system) are read only once one has.
    let reached = books.counter(profiler_common::counter::BEYOND_RETURN_LIMIT) > 0;
    let threads = if reached { books.threads() } else { Vec::new() };
    let stuck = threads
        .into_iter()
        .find(|&(tid, s)| s.stuck_calls > STUCK_BEYOND_RETURN_LIMIT && of_process(tid))
        .map(|(tid, s)| (tid, u64::from(s.stuck_calls)));
    if stuck.is_some() || books.kernel_depth_known() {
        return stuck;
    }
    // Without the kernel's own count, the programs' misses the frames it hooked before
    // recording began (--pid); the frames it then no longer hooks show as frames proven gone
    // by a later call rather than by a catch.
    session
        .most_frames_closed_uncaught(|pid| process.is_none_or(|p| p == pid))
        .filter(|&(_, n)| n > limit)
}

/// What the manifest says when `whose` (a process, or "" for the session's) exits are observed
/// by their sleds from now on, thread `tid` having had `calls` calls without a return probe.
pub fn stuck_note(whose: &str, tid: u32, calls: u64) -> String {
    format!(
        "{whose}exits observed by their sleds from CLOCK_MONOTONIC {} ns on: thread {tid} had {calls} calls without a return probe, the kernel at its limit of 64 pending ones (return probes of frames an exception left, which the kernel drops only when a traced caller returns)",
        crate::session::monotonic_ns()
    )
}
