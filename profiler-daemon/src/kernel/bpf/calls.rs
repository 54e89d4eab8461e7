//! The calls of each budgeted function, as the sled program counts them (`CALLS`, see
//! `profiler_common::CALLS_MAP`): one row of counters per possible CPU, a column per call
//! slot, read in place through a read-only mapping of the map, without a system call.
use anyhow::{bail, Context as _, Result};
use profiler_common::CALLS_MAP;
use std::os::fd::AsRawFd as _;
use std::ptr::NonNull;

/// Most call slots per CPU: slot 0 means "not counted", so this many functions less one can
/// be budgeted; the map takes `8 * MAX_CALL_SLOTS` bytes per possible CPU.
pub const MAX_CALL_SLOTS: u32 = 1 << 16;

/// Call slots for a tracer on `cpus` possible CPUs: [`MAX_CALL_SLOTS`], fewer where that
/// would take more than 64 MiB of counters in all.
pub fn call_slots_for(cpus: usize) -> u32 {
    let by_memory = (64u64 << 20) / 8 / (cpus.max(1) as u64);
    (by_memory.min(u64::from(MAX_CALL_SLOTS)) as u32).max(2)
}

/// The counters, mapped read-only.
pub struct CallCounts {
    base: NonNull<u64>,
    bytes: usize,
    slots: u32,
    cpus: u32,
}

// SAFETY: a read-only shared mapping, read with volatile loads; nothing here is tied to a thread.
unsafe impl Send for CallCounts {}

impl CallCounts {
    /// Maps the `CALLS` map of `ebpf`, of `slots` per CPU on `cpus` CPUs.
    pub(super) fn map(ebpf: &aya::Ebpf, slots: u32, cpus: u32) -> Result<CallCounts> {
        let map = ebpf
            .map(CALLS_MAP)
            .with_context(|| format!("the eBPF object has no {CALLS_MAP} map"))?;
        let fd = match map {
            aya::maps::Map::Array(data) => {
                use std::os::fd::AsFd as _;
                data.fd().as_fd().as_raw_fd()
            }
            _ => bail!("{CALLS_MAP} is not an array"),
        };
        let entries = slots as usize * cpus as usize;
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .unwrap_or(4096)
            .max(4096);
        let bytes = (entries * 8).div_ceil(page) * page;
        // SAFETY: maps `bytes` of the array (an mmapable BPF array of `entries` u64s, rounded
        // up to whole pages, as the kernel maps it) read-only and shared; unmapped in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            bail!(
                "cannot map the call counters: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(CallCounts {
            base: NonNull::new(ptr.cast()).context("mmap returned null")?,
            bytes,
            slots,
            cpus,
        })
    }

    /// Slots per CPU (slot 0 is never counted).
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// The calls counted in `slot` on every CPU since the programs were loaded.
    pub fn total(&self, slot: u16) -> u64 {
        let slot = u32::from(slot);
        if slot == 0 || slot >= self.slots {
            return 0;
        }
        (0..self.cpus)
            .map(|cpu| {
                let index = (cpu * self.slots + slot) as usize;
                // SAFETY: index < slots * cpus, inside the mapping; the programs update it
                // concurrently (an aligned u64: never torn).
                unsafe { self.base.as_ptr().add(index).read_volatile() }
            })
            .fold(0u64, u64::wrapping_add)
    }
}

impl Drop for CallCounts {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.bytes) };
    }
}
