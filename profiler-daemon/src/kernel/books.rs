//! The kernel side's own accounts of what it could not deliver: loss counters that belong to
//! no thread, the books of threads whose end record was lost, and (read through the
//! `thread_books` task iterator) the state of the threads still alive: what a session needs to
//! count every loss.
use anyhow::{Context as _, Result};
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray};
use profiler_common::{counter, ThreadState};

/// [`ThreadState`] as aya reads it from a map.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct PodThreadState(pub ThreadState);
// SAFETY: ThreadState is #[repr(C)] plain data without padding; any bit pattern is valid.
unsafe impl aya::Pod for PodThreadState {}

/// The kernel side's own accounts: loss counters that belong to no thread, and the state of
/// threads still alive (their trailing losses).
pub struct KernelBooks {
    /// Whether the programs read the kernel's own count of a thread's pending return probes
    /// (then `ThreadState::stuck_calls` counts exactly the calls it did not hook).
    kernel_depth: bool,
    counters: PerCpuArray<MapData, u64>,
    /// Threads whose exit record was lost, by thread id.
    exited: BpfHashMap<MapData, u32, PodThreadState>,
    /// The loaded `thread_books` task iterator, which writes the state of every live thread
    /// that has one; `None` for the floor.
    live: Option<std::os::fd::OwnedFd>,
}

impl KernelBooks {
    /// The books of a loaded tracer (see `Tracer::take_books`).
    pub(crate) fn new(
        kernel_depth: bool,
        counters: PerCpuArray<MapData, u64>,
        exited: BpfHashMap<MapData, u32, PodThreadState>,
        live: Option<std::os::fd::OwnedFd>,
    ) -> KernelBooks {
        KernelBooks {
            kernel_depth,
            counters,
            exited,
            live,
        }
    }

    /// Whether the programs read the kernel's own count of a thread's pending return probes.
    pub fn kernel_depth_known(&self) -> bool {
        self.kernel_depth
    }

    /// A counter (see `profiler_common::counter`), summed over CPUs.
    pub fn counter(&self, index: u32) -> u64 {
        self.counters
            .get(&index, 0)
            .map(|v| v.iter().sum())
            .unwrap_or(0)
    }

    /// Events lost that cannot be attributed to a thread.
    pub fn unattributed_lost(&self) -> u64 {
        self.counter(counter::NO_THREAD_STATE) + self.counter(counter::TRAILING_LOST_UNATTRIBUTED)
    }

    /// Every thread the kernel side still has state for: threads alive, and threads whose
    /// exit record was lost and not yet collected.
    pub fn threads(&self) -> Vec<(u32, ThreadState)> {
        let mut threads = self.exited();
        match self.live_threads() {
            Ok(live) => threads.extend(live.into_iter().map(|s| (s.tid, s))),
            Err(err) => {
                errln!("fdr-profiled: warning: cannot read the live threads' books: {err:#}")
            }
        }
        threads
    }

    /// The state of every live thread that has one, as the `thread_books` iterator writes it.
    fn live_threads(&self) -> Result<Vec<ThreadState>> {
        use std::io::Read as _;
        use std::os::fd::AsFd as _;
        let Some(program) = &self.live else {
            return Ok(Vec::new());
        };
        let mut bytes = Vec::new();
        crate::kernel::task_iter::for_every_task(program.as_fd())
            .and_then(|mut iter| iter.read_to_end(&mut bytes))
            .context("running the thread-books iterator")?;
        Ok(thread_states(&bytes))
    }

    fn exited(&self) -> Vec<(u32, ThreadState)> {
        self.exited
            .iter()
            .filter_map(|r| r.ok())
            .map(|(tid, s)| (tid, s.0))
            .collect()
    }

    /// Collects the state of threads that exited while their buffer was full (their exit
    /// record was lost), removing it from the table.
    pub fn take_exited(&mut self) -> Vec<(u32, ThreadState)> {
        let exited = self.exited();
        for (tid, _) in &exited {
            let _ = self.exited.remove(tid);
        }
        exited
    }
}

/// The [`ThreadState`]s in the bytes the `thread_books` iterator wrote, one after another (a
/// trailing partial record, which the kernel never writes, is ignored).
fn thread_states(bytes: &[u8]) -> Vec<ThreadState> {
    bytes
        .chunks_exact(std::mem::size_of::<ThreadState>())
        .map(|record| {
            // SAFETY: `record` holds size_of::<ThreadState>() bytes; ThreadState is plain data
            // of integers, valid for any bit pattern; the read is unaligned.
            unsafe { std::ptr::read_unaligned(record.as_ptr().cast::<ThreadState>()) }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(s: &ThreadState) -> &[u8] {
        // SAFETY: ThreadState is plain data without padding.
        unsafe {
            std::slice::from_raw_parts(
                (s as *const ThreadState).cast::<u8>(),
                std::mem::size_of::<ThreadState>(),
            )
        }
    }

    /// The iterator's output is whole states one after another, at any alignment; a partial
    /// one at the end (never written by the kernel) is not made up into a state.
    #[test]
    fn thread_states_reads_whole_records_only() {
        let a = ThreadState {
            seq: 7,
            gap_lost: 2,
            tid: 11,
            pid: 10,
            ..ThreadState::default()
        };
        let b = ThreadState {
            seq: 9,
            lost: 3,
            tid: 12,
            pid: 10,
            ..ThreadState::default()
        };
        let mut bytes = vec![0u8]; // misaligned start
        bytes.extend_from_slice(bytes_of(&a));
        bytes.extend_from_slice(bytes_of(&b));
        bytes.extend_from_slice(&bytes_of(&a)[..100]);
        assert_eq!(thread_states(&bytes[1..]), vec![a, b]);
        assert!(thread_states(&bytes[1..50]).is_empty());
    }
}
