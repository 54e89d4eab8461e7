//! The memory the handler writes and fdr-profiled reads: one mapping shared by both (anonymous
//! shared memory the traced process maps, which fdr-profiled maps again through
//! `/proc/PID/map_files`), laid out as
//!
//! - a header page (`handler::header`: hits of threads that found no slot);
//! - a table of slots by thread id (u32 each, the slot's number + 1), as many entries as the
//!   kernel has thread ids (`/proc/sys/kernel/pid_max`; only the pages of ids in use are ever
//!   touched);
//! - the slots: each a 64-byte header (`handler::slot`) and a ring of 32-byte records, owned
//!   by one thread at a time, which alone writes it.
//!
//! Reading a slot: records from its tail to its head, each once its commit word is set (a
//! record reserved and not written yet ends the read until the next drain); each record read
//! has its commit word cleared before the tail moves past it, so a set word always means a
//! record of the current lap. A slot whose thread is gone is read one last time, its thread
//! ended with its trailing losses, and freed for another thread.
use super::handler::{data, header, slot, RECORD_BYTES};
use crate::kernel::intake::Event;
use anyhow::{bail, Context as _, Result};
use profiler_common::{EventHeader, ThreadState};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Hits a full ring still takes (nested in a signal handler between the check and the
/// reservation) before it counts as full.
const RING_MARGIN: u64 = 64;

/// How the shared memory is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Entries of the table by thread id.
    pub table_len: u64,
    /// Slots: threads that can be traced at once.
    pub slots: u64,
    /// Records per slot's ring (a power of two).
    pub ring_records: u64,
}

const PAGE: u64 = 4096;

impl Layout {
    /// The layout for `slots` threads with `ring_bytes` of records each.
    pub fn new(slots: u64, ring_bytes: u64) -> Result<Layout> {
        let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(1 << 22);
        let ring_records = (ring_bytes / RECORD_BYTES as u64).max(4 * RING_MARGIN);
        if !ring_records.is_power_of_two() {
            bail!("inline buffer of {ring_bytes} bytes: not a power of two");
        }
        Ok(Layout {
            table_len: pid_max.min(1 << 22),
            slots,
            ring_records,
        })
    }

    /// Offset of the table.
    fn table(&self) -> u64 {
        PAGE
    }

    /// Offset of slot 0.
    fn slots_at(&self) -> u64 {
        (self.table() + self.table_len * 4).div_ceil(PAGE) * PAGE
    }

    /// Bytes per slot.
    fn slot_bytes(&self) -> u64 {
        slot::RING as u64 + self.ring_records * RECORD_BYTES as u64
    }

    /// Bytes of the whole mapping.
    pub fn bytes(&self) -> u64 {
        (self.slots_at() + self.slots * self.slot_bytes()).div_ceil(PAGE) * PAGE
    }

    /// The handler's data block for the shared memory mapped at `base` in the process, and a
    /// thread control block keeping the thread's id at `tid_offset`.
    pub fn data_block(&self, base: u64, tid_offset: u64) -> [u8; data::SIZE] {
        let mut block = [0u8; data::SIZE];
        let mut put =
            |at: usize, value: u64| block[at..at + 8].copy_from_slice(&value.to_le_bytes());
        put(data::TABLE, base + self.table());
        put(data::TABLE_LEN, self.table_len);
        put(data::SLOTS, base + self.slots_at());
        put(data::SLOT_BYTES, self.slot_bytes());
        put(data::SLOT_COUNT, self.slots);
        put(data::RING_MASK, self.ring_records - 1);
        put(data::RING_LIMIT, self.ring_records - RING_MARGIN);
        put(data::TID_OFFSET, tid_offset);
        put(data::HEADER, base);
        block
    }
}

/// One record as the handler wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub tsc: u64,
    pub sp: u64,
    pub function_id: u32,
    pub gap: u32,
    pub kind: u8,
    pub cpu: u8,
}

/// What the reader keeps of a slot between drains.
#[derive(Clone, Copy, Debug, Default)]
struct SlotState {
    /// The thread it was read for last (0: none), and its process.
    owner: u32,
    pid: u32,
}

/// fdr-profiled's mapping of the shared memory.
pub struct SharedBuffers {
    /// The traced process: the process of a thread gone before its first drain.
    pid: u32,
    base: *mut u8,
    layout: Layout,
    states: Vec<SlotState>,
}

// SAFETY: the mapping is owned by this value and only read or written through atomics and
// plain reads of records the commit protocol hands over.
unsafe impl Send for SharedBuffers {}

impl SharedBuffers {
    /// Maps the shared memory process `pid` has at `at` (laid out as `layout`).
    pub fn map(pid: u32, at: u64, layout: Layout) -> Result<SharedBuffers> {
        let len = layout.bytes();
        let path = format!("/proc/{pid}/map_files/{at:x}-{:x}", at + len);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {path}"))?;
        // SAFETY: a fresh shared mapping of the file, checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error())
                .context("mapping the inline engine's buffers");
        }
        Ok(SharedBuffers {
            pid,
            base: base.cast(),
            layout,
            states: vec![SlotState::default(); layout.slots as usize],
        })
    }

    fn word(&self, offset: u64) -> &AtomicU64 {
        // SAFETY: every offset used is 8-byte aligned and within the mapping.
        unsafe { &*self.base.add(offset as usize).cast::<AtomicU64>() }
    }

    fn word32(&self, offset: u64) -> &AtomicU32 {
        // SAFETY: every offset used is 4-byte aligned and within the mapping.
        unsafe { &*self.base.add(offset as usize).cast::<AtomicU32>() }
    }

    fn slot(&self, index: u64) -> u64 {
        self.layout.slots_at() + index * self.layout.slot_bytes()
    }

    /// Slots: threads that can be traced at once.
    pub fn slots(&self) -> u64 {
        self.layout.slots
    }

    /// Hits of threads that found no slot.
    pub fn no_slot(&self) -> u64 {
        self.word(header::NO_SLOT as u64).load(Ordering::Relaxed)
    }

    /// Reads every record written since the last drain into events for `sink`, their times
    /// in CLOCK_MONOTONIC nanoseconds by `clock` (each ring at most once around: what was
    /// reserved when the read began). With `check`, each slot's thread is looked for: a thread
    /// that is gone is ended (pushed to `ended` with its books: its last number and trailing
    /// losses) and its slot freed.
    pub fn drain(
        &mut self,
        clock: &TscClock,
        check: bool,
        mut sink: impl FnMut(&mut Event),
        ended: &mut Vec<(u32, ThreadState)>,
    ) {
        let mut event = Event::empty();
        for index in 0..self.layout.slots {
            let at = self.slot(index);
            let owner = self.word32(at + slot::OWNER as u64).load(Ordering::Acquire);
            if owner == 0 {
                continue;
            }
            let state = self.states[index as usize];
            let pid = if state.owner == owner {
                state.pid
            } else {
                // Noted by the thread right after it claimed the slot, before its first record.
                let pid = self.word32(at + slot::PID as u64).load(Ordering::Acquire);
                if pid == 0 {
                    continue;
                }
                self.states[index as usize] = SlotState { owner, pid };
                pid
            };
            let mut read = |record: &Record| {
                fill(&mut event, record, pid, owner, clock);
                sink(&mut event);
            };
            self.read_slot(at, &mut read);
            if check && !alive(pid, owner) {
                // Gone: what it committed after the read above is read now; a hit it was
                // inside when it died stays unwritten, and counts as lost.
                self.read_slot(at, &mut read);
                ended.push((owner, self.free(index, at, pid, owner)));
            }
        }
    }

    /// Reads slot `at`'s committed records, up to the first one reserved and not written yet.
    fn read_slot(&self, at: u64, mut f: impl FnMut(&Record)) {
        let head = self.word(at + slot::HEAD as u64).load(Ordering::Acquire);
        let tail_word = self.word(at + slot::TAIL as u64);
        let mut tail = tail_word.load(Ordering::Relaxed);
        while tail < head {
            let rec = self.record(at, tail);
            let commit = self.word(rec).load(Ordering::Acquire);
            if commit == 0 {
                break;
            }
            let place = self.word(rec + 16).load(Ordering::Relaxed);
            let last = self.word(rec + 24).load(Ordering::Relaxed);
            let record = Record {
                seq: commit - 1,
                tsc: self.word(rec + 8).load(Ordering::Relaxed),
                sp: place & ((1 << 48) - 1),
                function_id: last as u32,
                gap: (last >> 32) as u32,
                kind: (place >> 48) as u8,
                cpu: (place >> 56) as u8,
            };
            self.word(rec).store(0, Ordering::Relaxed);
            tail += 1;
            f(&record);
        }
        tail_word.store(tail, Ordering::Release);
    }

    /// Where record number `position` of slot `at` is.
    fn record(&self, at: u64, position: u64) -> u64 {
        at + slot::RING as u64 + (position & (self.layout.ring_records - 1)) * RECORD_BYTES as u64
    }

    /// The books of slot `at`'s thread `tid` of process `pid`, its committed records read:
    /// its next number, and as lost the hits it lost and those it reserved and never wrote.
    fn slot_books(&self, at: u64, tid: u32, pid: u32) -> ThreadState {
        let word = |offset: usize| self.word(at + offset as u64).load(Ordering::Acquire);
        let lost = word(slot::PENDING) + word(slot::HEAD).saturating_sub(word(slot::TAIL));
        ThreadState {
            seq: word(slot::SEQ),
            lost,
            gap_lost: u32::try_from(lost).unwrap_or(u32::MAX),
            tid,
            pid,
            ..ThreadState::default()
        }
    }

    /// Frees slot `index` (at `at`) of thread `tid` of process `pid`, which is gone, once
    /// read; its books.
    fn free(&mut self, index: u64, at: u64, pid: u32, tid: u32) -> ThreadState {
        let books = self.slot_books(at, tid, pid);
        // The table first: a thread that reuses the id claims a slot again.
        if u64::from(tid) < self.layout.table_len {
            self.word32(self.layout.table() + u64::from(tid) * 4)
                .store(0, Ordering::Release);
        }
        // Every record read had its commit word cleared; what stays unread (reserved, maybe
        // written after one that never was) is cleared here, for the slot's next thread.
        let tail = self.word(at + slot::TAIL as u64).load(Ordering::Acquire);
        let head = self.word(at + slot::HEAD as u64).load(Ordering::Acquire);
        for position in tail..head.min(tail + self.layout.ring_records) {
            self.word(self.record(at, position))
                .store(0, Ordering::Relaxed);
        }
        for word in [slot::SEQ, slot::HEAD, slot::TAIL, slot::PENDING, slot::CPU] {
            self.word(at + word as u64).store(0, Ordering::Release);
        }
        self.word32(at + slot::PID as u64)
            .store(0, Ordering::Release);
        self.word32(at + slot::OWNER as u64)
            .store(0, Ordering::Release);
        self.states[index as usize] = SlotState::default();
        books
    }

    /// The books of every thread that has a slot: its next number and its trailing losses
    /// (the end of a session, once no thread can write).
    pub fn books(&self) -> Vec<(u32, ThreadState)> {
        (0..self.layout.slots)
            .filter_map(|index| {
                let at = self.slot(index);
                let tid = self.word32(at + slot::OWNER as u64).load(Ordering::Acquire);
                let pid = match self.word32(at + slot::PID as u64).load(Ordering::Acquire) {
                    0 => self.pid,
                    pid => pid,
                };
                (tid != 0).then(|| (tid, self.slot_books(at, tid, pid)))
            })
            .collect()
    }
}

impl Drop for SharedBuffers {
    fn drop(&mut self) {
        // SAFETY: mapped in `map` with this length; nothing refers to it after.
        unsafe { libc::munmap(self.base.cast(), self.layout.bytes() as usize) };
    }
}

fn fill(event: &mut Event, record: &Record, pid: u32, tid: u32, clock: &TscClock) {
    event.header = EventHeader {
        ts_ns: clock.ns(record.tsc),
        seq: record.seq,
        pid,
        tid,
        function_id: record.function_id,
        kind: record.kind,
        flags: 0,
        cpu: u16::from(record.cpu),
        gap_lost: record.gap,
        payload_len: 0,
        sp: record.sp,
    };
}

/// Whether thread `tid` of process `pid` still runs.
fn alive(pid: u32, tid: u32) -> bool {
    std::fs::metadata(format!("/proc/{pid}/task/{tid}")).is_ok()
}

/// TSC ticks to CLOCK_MONOTONIC nanoseconds, from two readings of both, some milliseconds
/// apart, taken by fdr-profiled before the handler runs (the TSC is the same on every CPU:
/// `constant_tsc`, `nonstop_tsc`).
#[derive(Clone, Copy, Debug)]
pub struct TscClock {
    tsc0: u64,
    ns0: u64,
    /// Nanoseconds per tick, times 2^32.
    mult: u128,
}

impl TscClock {
    /// Measures the TSC against CLOCK_MONOTONIC over `over`.
    pub fn measure(over: std::time::Duration) -> TscClock {
        let (tsc0, ns0) = pair();
        std::thread::sleep(over);
        let (tsc1, ns1) = pair();
        let ticks = (tsc1 - tsc0).max(1);
        TscClock {
            tsc0,
            ns0,
            mult: (u128::from(ns1 - ns0) << 32) / u128::from(ticks),
        }
    }

    /// The time of TSC reading `tsc`.
    pub fn ns(&self, tsc: u64) -> u64 {
        let ticks = i128::from(tsc) - i128::from(self.tsc0);
        let delta = (ticks.unsigned_abs() * self.mult) >> 32;
        if ticks >= 0 {
            self.ns0 + delta as u64
        } else {
            self.ns0.saturating_sub(delta as u64)
        }
    }
}

/// A TSC reading and the time, taken together (the narrowest of a few tries).
fn pair() -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..16 {
        let before = crate::arch::cycles();
        let ns = crate::session::monotonic_ns();
        let after = crate::arch::cycles();
        if after - before < best.0 {
            best = (after - before, before + (after - before) / 2, ns);
        }
    }
    (best.1, best.2)
}

#[cfg(test)]
mod tests;
