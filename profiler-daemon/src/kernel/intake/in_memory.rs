//! Rings in this process's memory, laid out as the kernel lays out a BPF ring buffer, and the
//! writer that plays the programs' part: the whole pipeline after the kernel, run and measured
//! without BPF (`cargo xtask bench pipeline`, and tests).
use super::{Intake, Ring, Wakeups, BPF_RINGBUF_BUSY_BIT, BPF_RINGBUF_HDR_SZ};
use anyhow::{bail, Context as _, Result};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

impl Intake {
    /// An intake of `count` rings of `size` bytes each (a power of two, a multiple of the
    /// page size) in this process's memory, laid out as the kernel lays out a BPF ring buffer,
    /// with the writing end of each: the whole pipeline after the kernel, run and measured
    /// without BPF (`cargo xtask bench pipeline`, and tests). No wakeups: drain on a timer.
    /// One ring per CPU; see [`Intake::in_memory_split`].
    pub fn in_memory(count: usize, size: u64) -> Result<(Intake, Vec<RingWriter>)> {
        Intake::in_memory_split(count, 1, size)
    }

    /// [`Intake::in_memory`] with `rings_per_cpu` rings for each of `cpus` CPUs, the writer
    /// of thread `tid`'s events on CPU `cpu` being `profiler_common::ring_index(cpu, tid,
    /// rings_per_cpu)`, as the programs choose it.
    pub fn in_memory_split(
        cpus: usize,
        rings_per_cpu: usize,
        size: u64,
    ) -> Result<(Intake, Vec<RingWriter>)> {
        anyhow::ensure!(rings_per_cpu >= 1, "at least one ring per CPU");
        let count = cpus * rings_per_cpu;
        let mut rings = Vec::with_capacity(count);
        let mut writers = Vec::with_capacity(count);
        for _ in 0..count {
            let (ring, writer) = Ring::in_memory(size)?;
            rings.push(ring);
            writers.push(writer);
        }
        Ok((
            Intake {
                rings,
                rings_per_cpu,
                wakeups: Wakeups(None),
                malformed: 0,
            },
            writers,
        ))
    }
}

impl Ring {
    /// A ring of `size` bytes in anonymous shared memory, mapped as [`Ring::new`] maps the
    /// kernel's (consumer page, producer page, data pages twice in a row), and the writer that
    /// plays the programs' part.
    fn in_memory(size: u64) -> Result<(Ring, RingWriter)> {
        // SAFETY: sysconf has no preconditions.
        let page =
            usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).context("page size")?;
        if !size.is_power_of_two() || !(size as usize).is_multiple_of(page) {
            bail!("a ring of {size} bytes: not a power of two pages");
        }
        let data_len = size as usize;
        // SAFETY: plain system call with a valid C string; the result is checked.
        let fd = unsafe { libc::memfd_create(c"fdr-ring".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("memfd_create");
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // Consumer page, producer page, data pages.
        // SAFETY: plain system call on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), (2 * page + data_len) as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error()).context("sizing a ring in memory");
        }
        let ring_fd = fd.try_clone().context("a ring's descriptor")?;
        let map = |at: *mut libc::c_void, len: usize, offset: usize, fixed: bool| {
            let flags = libc::MAP_SHARED | if fixed { libc::MAP_FIXED } else { 0 };
            // SAFETY: maps our own descriptor; with MAP_FIXED, `at` lies in a reservation of
            // ours (below) that nothing else uses.
            let p = unsafe {
                libc::mmap(
                    at,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    flags,
                    fd.as_raw_fd(),
                    offset as libc::off_t,
                )
            };
            if p == libc::MAP_FAILED {
                Err(std::io::Error::last_os_error()).context("mapping a ring in memory")
            } else {
                Ok(p)
            }
        };
        let consumer = map(std::ptr::null_mut(), page, 0, false)?;
        // The producer page and the data, then the data again right after: reserved as one
        // range first, so that the second mapping lands exactly there.
        let len = page + 2 * data_len;
        // SAFETY: an anonymous reservation, replaced below by the two fixed mappings.
        let reserved = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if reserved == libc::MAP_FAILED {
            let err = std::io::Error::last_os_error();
            // SAFETY: mapped above, used by nothing.
            unsafe { libc::munmap(consumer, page) };
            return Err(err).context("reserving a ring in memory");
        }
        let map_data = |at| map(at, page + data_len, page, true);
        let mapped = map_data(reserved);
        // From here the ring owns both ranges (unmapped when it is dropped, on error too).
        let mut ring = Ring {
            fd: ring_fd,
            consumer: consumer.cast(),
            producer: reserved.cast(),
            data: std::ptr::null(),
            mask: size - 1,
            page,
        };
        mapped?;
        // SAFETY: within the reservation of `len` bytes.
        map(
            unsafe { reserved.cast::<u8>().add(page + data_len).cast() },
            data_len,
            2 * page,
            true,
        )?;
        // SAFETY: within the reservation.
        ring.data = unsafe { ring.producer.add(page) };
        let writer = RingWriter {
            consumer: ring.consumer,
            producer: ring.producer.cast_mut(),
            data: ring.data.cast_mut(),
            mask: ring.mask,
            pos: 0,
            published: 0,
        };
        Ok((ring, writer))
    }
}

/// The writing end of a ring in memory ([`Intake::in_memory`]): writes records as the kernel's
/// `bpf_ringbuf_output` does (an 8-byte header, the record, padding to 8 bytes), published
/// together by [`RingWriter::publish`]. Valid while its intake lives.
pub struct RingWriter {
    consumer: *const u8,
    producer: *mut u8,
    data: *mut u8,
    mask: u64,
    /// The producer position after the records written so far.
    pos: u64,
    /// The producer position the reader sees.
    published: u64,
}

// SAFETY: the pointers are to shared mappings of the intake's ring; the writer alone moves the
// producer position, the ring alone the consumer position (both atomics).
unsafe impl Send for RingWriter {}

impl RingWriter {
    /// Writes `record` after the others (not visible to the reader until published); false,
    /// writing nothing, when the ring has no room for it.
    pub fn write(&mut self, record: &[u8]) -> bool {
        let len = record.len() as u64;
        let total = (len + BPF_RINGBUF_HDR_SZ + 7) & !7;
        // SAFETY: the consumer position is the first, 8-byte aligned word of its page.
        let consumed = unsafe { &*self.consumer.cast::<AtomicU64>() }.load(Ordering::Acquire);
        if self.pos + total - consumed > self.mask + 1 {
            return false;
        }
        let offset = (self.pos & self.mask) as usize;
        // SAFETY: `offset` is within the data pages, which are mapped twice in a row, so the
        // header and the record (at most the ring's size) lie within the mapping; the reader
        // does not look past the published position.
        unsafe {
            let at = self.data.add(offset);
            at.cast::<u32>().write(len as u32);
            at.add(4).cast::<u32>().write(0);
            std::ptr::copy_nonoverlapping(
                record.as_ptr(),
                at.add(BPF_RINGBUF_HDR_SZ as usize),
                record.len(),
            );
        }
        self.pos += total;
        true
    }

    /// Writes `record` as [`RingWriter::write`] does, but as a record the kernel has reserved
    /// and not committed yet: readers stop at it until [`RingWriter::commit`]. Its position;
    /// `None`, writing nothing, when the ring has no room for it.
    pub fn reserve(&mut self, record: &[u8]) -> Option<u64> {
        let at = self.pos;
        if !self.write(record) {
            return None;
        }
        self.header(at).store(
            record.len() as u32 | BPF_RINGBUF_BUSY_BIT,
            Ordering::Release,
        );
        Some(at)
    }

    /// Commits the record [`RingWriter::reserve`] wrote at `at`.
    pub fn commit(&mut self, at: u64) {
        let header = self.header(at);
        let len = header.load(Ordering::Relaxed) & !BPF_RINGBUF_BUSY_BIT;
        header.store(len, Ordering::Release);
    }

    /// The record header at position `at`.
    fn header(&self, at: u64) -> &AtomicU32 {
        // SAFETY: within the data pages, 8-byte aligned (records are).
        unsafe { &*self.data.add((at & self.mask) as usize).cast::<AtomicU32>() }
    }

    /// Evicts the records written since the last [`RingWriter::publish`] from every cache,
    /// so that the reader finds them where it finds the kernel's, written on other CPUs: not
    /// in its own cache.
    pub fn evict_unpublished(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            let mut at = self.published & !63;
            while at < self.pos {
                // SAFETY: within the doubled data pages (the offset is below the ring's
                // size); a cache-line flush changes no byte.
                unsafe {
                    core::arch::x86_64::_mm_clflush(self.data.add((at & self.mask) as usize))
                };
                at += 64;
            }
        }
    }

    /// Makes every record written so far visible to the reader.
    pub fn publish(&mut self) {
        // SAFETY: the producer position is the first, 8-byte aligned word of its page.
        unsafe { &*self.producer.cast::<AtomicU64>() }.store(self.pos, Ordering::Release);
        self.published = self.pos;
    }
}
