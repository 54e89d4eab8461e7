//! Event intake: draining the kernel's per-CPU ring buffers.
//!
//! The eBPF side writes without waking us (`BPF_RB_NO_WAKEUP`): a wakeup per event would cost
//! more than the probe itself. The daemon drains on a short timer, and early when a program
//! finds its buffer half full and wakes us (`BPF_RB_FORCE_WAKEUP`); [`Intake::wakeup`] resolves
//! then. Each buffer holds one CPU's events in the order they happened there; putting a
//! thread's events back in program order across CPUs is [`crate::session::order`]'s job.
//!
//! The rings are read through a mapping of our own ([`Ring`]), not aya's item by item API: a
//! drain reads the producer position once, decodes the records in place, and gives their space
//! back every [`RELEASE_EVERY`] records, which at a million events a second is most of what the
//! daemon's intake costs.
use anyhow::{bail, Context as _, Result};
use aya::maps::{MapData, RingBuf};
use profiler_common::{ArgsEvent, EventHeader, EventPayload, SledKind, MAX_ARGS};
use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use tokio::io::unix::AsyncFd;

pub mod in_memory;

/// The payload of a custom or typed event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventData {
    /// Size the program passed; `bytes` is shorter when the payload was truncated.
    pub size: u64,
    /// Type of a typed event.
    pub event_type: u64,
    /// The bytes copied from the program.
    pub bytes: Vec<u8>,
}

/// One event from the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The fixed part.
    pub header: EventHeader,
    /// Argument registers of an entry that logs arguments (the first `nargs` are valid).
    pub args: [u64; MAX_ARGS],
    /// Number of valid `args`.
    pub nargs: usize,
    /// Custom/typed event payload.
    pub data: Option<Box<EventData>>,
}

impl Event {
    /// Decodes a ring-buffer record; `None` if it is malformed.
    pub fn from_record(bytes: &[u8]) -> Option<Event> {
        let mut event = Event::empty();
        event.decode(bytes).then_some(event)
    }

    /// An event of nothing, to decode records (or the inline engine's) into.
    pub fn empty() -> Event {
        Event {
            header: EventHeader::default(),
            args: [0; MAX_ARGS],
            nargs: 0,
            data: None,
        }
    }

    /// Decodes a ring-buffer record into `self`, as [`Event::from_record`] would build it
    /// (arguments past `nargs` zero, no payload unless the record has one), reusing its memory:
    /// the intake decodes every record into one `Event`. False if the record is malformed
    /// (`self` is then garbage).
    #[inline(always)]
    fn decode(&mut self, bytes: &[u8]) -> bool {
        // Nearly every record: a header alone, of an entry or an exit, after another such.
        if bytes.len() == EventHeader::SIZE && self.nargs == 0 && self.data.is_none() {
            if let Some(header) = EventHeader::from_bytes(bytes) {
                let plain = header.kind == SledKind::Entry as u8
                    || header.kind == SledKind::Exit as u8
                    || header.kind == SledKind::Tail as u8;
                if plain && header.payload_len == 0 {
                    self.header = header;
                    return true;
                }
            }
        }
        self.decode_any(bytes)
    }

    /// [`Event::decode`] for any record.
    #[inline(never)]
    fn decode_any(&mut self, bytes: &[u8]) -> bool {
        let Some(header) = EventHeader::from_bytes(bytes) else {
            return false;
        };
        self.header = header;
        self.data = None;
        let Some(body) = bytes
            .get(EventHeader::SIZE..)
            .and_then(|b| b.get(..header.payload_len as usize))
        else {
            return false;
        };
        let kind = SledKind::from_u8(header.kind);
        if kind == Some(SledKind::LogArgsEntry) {
            if bytes.len() < core::mem::size_of::<ArgsEvent>() || body.len() % 8 != 0 {
                return false;
            }
            self.args = [0; MAX_ARGS];
            self.nargs = (body.len() / 8).min(MAX_ARGS);
            for (arg, chunk) in self.args.iter_mut().zip(body.chunks_exact(8)) {
                *arg = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            }
            return true;
        }
        if self.nargs != 0 {
            self.args = [0; MAX_ARGS];
            self.nargs = 0;
        }
        if matches!(kind, Some(SledKind::CustomEvent | SledKind::TypedEvent)) {
            let Some(meta) = body.get(..core::mem::size_of::<EventPayload>()) else {
                return false;
            };
            let size = u64::from_le_bytes(meta[0..8].try_into().expect("8 bytes"));
            let event_type = u64::from_le_bytes(meta[8..16].try_into().expect("8 bytes"));
            self.data = Some(Box::new(EventData {
                size,
                event_type,
                bytes: body[meta.len()..].to_vec(),
            }));
            return true;
        }
        body.is_empty()
    }
}

/// Most events taken from one ring buffer per drain while the programs record (~3 MiB): the
/// event loop gets its turn (signals, deadlines, the traced process's exit, requests) between
/// drains even when the programs write faster than the daemon reads.
pub const DRAIN_BUDGET: u64 = 1 << 16;

/// Records read from a ring before their space is given back to the programs (and at the end
/// of every drain): the kernel sees the consumer move in steps of at most this many records.
const RELEASE_EVERY: u32 = 64;

// The kernel's ring-buffer record header (include/uapi/linux/bpf.h): a u32 length whose top
// two bits say the record is still being written or was discarded, then a u32 page offset.
const BPF_RINGBUF_BUSY_BIT: u32 = 1 << 31;
const BPF_RINGBUF_DISCARD_BIT: u32 = 1 << 30;
const BPF_RINGBUF_HDR_SZ: u64 = 8;

/// How far ahead of the record being read the next records are asked for: the programs wrote
/// them on other CPUs, so each line is a miss the reader would otherwise wait for, one after
/// another.
const PREFETCH_AHEAD: usize = 1024;

/// Asks for the cache line at `at` (a hint: never faults, whatever the address).
#[inline(always)]
fn prefetch(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it does not fault on any address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(at.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// One BPF ring buffer, mapped for reading as libbpf does: the consumer page read-write, the
/// producer page and the data pages (mapped twice in a row by the kernel, so a record that
/// wraps around the end is contiguous) read-only. Aya's handle is dropped once the map is
/// mapped here: its own mappings of the same pages would count twice in the resident size.
struct Ring {
    /// The map (a duplicate of the descriptor aya had).
    fd: OwnedFd,
    consumer: *mut u8,
    producer: *const u8,
    /// Data pages: `2 * (mask + 1)` bytes.
    data: *const u8,
    mask: u64,
    page: usize,
}

// SAFETY: the pointers are to shared mappings owned by this value (unmapped in Drop), usable
// from any thread; only `&mut self` methods move the consumer position, and the `&self` ones
// only read (the records, and the positions through atomics).
unsafe impl Send for Ring {}
// SAFETY: see above: shared references only read.
unsafe impl Sync for Ring {}

impl Ring {
    fn new(map: RingBuf<MapData>) -> Result<Ring> {
        // SAFETY: F_DUPFD_CLOEXEC on an open descriptor; the result is checked.
        let dup = unsafe { libc::fcntl(map.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(std::io::Error::last_os_error()).context("duplicating a ring's descriptor");
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(dup) };
        drop(map);
        let size = u64::from(
            super::sys::map_max_entries(owned.as_fd()).context("reading the ring buffer's size")?,
        );
        let fd = owned.as_raw_fd();
        if !size.is_power_of_two() {
            bail!("ring buffer of {size} bytes: not a power of two");
        }
        // SAFETY: sysconf has no preconditions.
        let page =
            usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).context("page size")?;
        // SAFETY: a fresh mapping of the map's consumer page, checked below; the kernel allows
        // it writable.
        let consumer = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if consumer == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("mapping a ring's consumer page");
        }
        let len = page + 2 * size as usize;
        // SAFETY: a fresh read-only mapping of the producer page and the doubled data pages.
        let producer = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                page as libc::off_t,
            )
        };
        if producer == libc::MAP_FAILED {
            let err = std::io::Error::last_os_error();
            // SAFETY: mapped just above, used by nothing.
            unsafe { libc::munmap(consumer, page) };
            return Err(err).context("mapping a ring's data pages");
        }
        Ok(Ring {
            fd: owned,
            consumer: consumer.cast(),
            producer: producer.cast(),
            // SAFETY: within the mapping of `len` bytes.
            data: unsafe { producer.cast::<u8>().add(page) },
            mask: size - 1,
            page,
        })
    }

    fn consumer_pos(&self) -> &AtomicU64 {
        // SAFETY: the consumer position is the first, 8-byte aligned word of its page.
        unsafe { &*self.consumer.cast::<AtomicU64>() }
    }

    fn producer_pos(&self) -> &AtomicU64 {
        // SAFETY: the producer position is the first, 8-byte aligned word of its page.
        unsafe { &*self.producer.cast::<AtomicU64>() }
    }

    /// Bytes written and not read yet.
    fn unread_bytes(&self) -> u64 {
        let prod = self.producer_pos().load(Ordering::Acquire);
        prod.saturating_sub(self.consumer_pos().load(Ordering::Relaxed))
    }

    /// Hands at most `limit` records to `f`, in order; returns how many. Stops early at the
    /// first record still being written. Discarded records are skipped (not counted).
    #[inline]
    fn read(&mut self, limit: u64, mut f: impl FnMut(&[u8])) -> u64 {
        let cons = self.consumer_pos().load(Ordering::Relaxed);
        let (cons, taken) = self.walk(cons, limit, |_, record| f(record), true);
        self.consumer_pos().store(cons, Ordering::Release);
        // As aya does when it catches up: either a later look at the producer sees a record
        // committed meanwhile, or its producer sees our position and can wake us.
        fence(Ordering::SeqCst);
        taken
    }

    /// Hands at most `limit` records from position `from` to `f` with the position of each,
    /// in order, as [`Ring::read`] does, but gives no space back: several readers may each
    /// walk the ring from a position of their own (the parallel pipeline), the space going
    /// back once all are past it ([`Ring::release`]). Returns the position reached and how
    /// many records.
    #[inline]
    fn scan(&self, from: u64, limit: u64, f: impl FnMut(u64, &[u8])) -> (u64, u64) {
        self.walk(from, limit, f, false)
    }

    /// Gives the space up to position `to` back to the programs.
    fn release(&mut self, to: u64) {
        if to > self.consumer_pos().load(Ordering::Relaxed) {
            self.consumer_pos().store(to, Ordering::Release);
        }
        fence(Ordering::SeqCst);
    }

    /// [`Ring::read`] and [`Ring::scan`]: with `release`, the space read is given back every
    /// [`RELEASE_EVERY`] records.
    #[inline(always)]
    fn walk(
        &self,
        mut cons: u64,
        limit: u64,
        mut f: impl FnMut(u64, &[u8]),
        release: bool,
    ) -> (u64, u64) {
        // Pairs with the kernel's release store: the headers up to it are visible.
        let mut prod = self.producer_pos().load(Ordering::Acquire);
        let mut taken = 0;
        let mut unreleased = 0;
        while taken < limit {
            if cons == prod {
                prod = self.producer_pos().load(Ordering::Acquire);
                if cons == prod {
                    break;
                }
            }
            let offset = (cons & self.mask) as usize;
            prefetch(self.data.wrapping_add(offset + PREFETCH_AHEAD));
            // SAFETY: `offset` is within the data pages and 8-byte aligned (records are).
            let header = unsafe { &*self.data.add(offset).cast::<AtomicU32>() };
            // Pairs with the kernel's commit (an xchg): the record's bytes are visible.
            let header = header.load(Ordering::Acquire);
            if header & BPF_RINGBUF_BUSY_BIT != 0 {
                break;
            }
            let len = header & !(BPF_RINGBUF_BUSY_BIT | BPF_RINGBUF_DISCARD_BIT);
            if u64::from(len) > self.mask {
                // Only a corrupted ring could say so; stop rather than read past the pages.
                break;
            }
            if header & BPF_RINGBUF_DISCARD_BIT == 0 {
                // SAFETY: the record lies within the doubled data pages (offset < size and
                // len <= size), and the kernel does not reuse it before the consumer position
                // passes it.
                let record = unsafe {
                    std::slice::from_raw_parts(
                        self.data.add(offset + BPF_RINGBUF_HDR_SZ as usize),
                        len as usize,
                    )
                };
                f(cons, record);
                taken += 1;
            }
            cons += (u64::from(len) + BPF_RINGBUF_HDR_SZ + 7) & !7;
            unreleased += 1;
            if release && unreleased == RELEASE_EVERY {
                self.consumer_pos().store(cons, Ordering::Release);
                unreleased = 0;
            }
        }
        (cons, taken)
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: both mappings were made in `Ring::new` with these lengths and nothing refers
        // to them once the ring is dropped.
        unsafe {
            libc::munmap(self.consumer.cast(), self.page);
            libc::munmap(
                self.producer.cast_mut().cast(),
                self.page + 2 * (self.mask as usize + 1),
            );
        }
    }
}

/// The reading end of the kernel → daemon event path.
pub struct Intake {
    rings: Vec<Ring>,
    /// Rings per CPU, each for the threads of one remainder of their id
    /// (`profiler_common::ring_index`).
    rings_per_cpu: usize,
    wakeups: Wakeups,
    malformed: u64,
}

/// The programs' wakeups: an epoll instance watching every ring (edge-triggered), registered
/// with tokio, readable when a program forced a wakeup. `None` for rings in memory
/// ([`Intake::in_memory`]).
pub struct Wakeups(Option<AsyncFd<OwnedFd>>);

impl Intake {
    /// Takes over the rings, `rings_per_cpu` of each CPU in turn (as
    /// `profiler_common::ring_index` numbers them). Needs a tokio runtime with I/O enabled.
    pub fn new(rings: Vec<RingBuf<MapData>>, rings_per_cpu: usize) -> Result<Intake> {
        anyhow::ensure!(
            rings_per_cpu >= 1 && rings.len().is_multiple_of(rings_per_cpu),
            "{} rings cannot be {rings_per_cpu} per CPU",
            rings.len()
        );
        let rings = rings
            .into_iter()
            .map(Ring::new)
            .collect::<Result<Vec<_>>>()?;
        // SAFETY: epoll_create1 has no preconditions; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("epoll_create1");
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        for ring in &rings {
            let mut ev = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLET) as u32,
                u64: 0,
            };
            // SAFETY: both descriptors are open; `ev` is a valid epoll_event.
            let rc = unsafe {
                libc::epoll_ctl(
                    epoll.as_raw_fd(),
                    libc::EPOLL_CTL_ADD,
                    ring.fd.as_raw_fd(),
                    &mut ev,
                )
            };
            if rc != 0 {
                return Err(std::io::Error::last_os_error()).context("watching a ring buffer");
            }
        }
        // SAFETY: the OwnedFd moves into the AsyncFd, so it stays open and is the same epoll
        // instance for the AsyncFd's whole life.
        let wakeups =
            unsafe { AsyncFd::register_with_interest(epoll, tokio::io::Interest::READABLE) }
                .map_err(|e| e.into_parts().1)
                .context("registering the ring buffers with the event loop")?;
        Ok(Intake {
            rings,
            rings_per_cpu,
            wakeups: Wakeups(Some(wakeups)),
            malformed: 0,
        })
    }

    /// Hands the events in the buffers to `sink`, buffer by buffer, at most `per_ring` from
    /// each (`u64::MAX`: until they are empty, once the programs are disarmed): when the
    /// programs write faster than the daemon reads (a slow build, a loaded machine), draining
    /// until empty would never end, and the event loop would never see a signal or a deadline.
    /// Returns how many events were read, and whether every buffer was emptied. The sink gets
    /// each event where it was decoded, and may change it.
    pub fn drain_some(&mut self, per_ring: u64, mut sink: impl FnMut(&mut Event)) -> (u64, bool) {
        let mut count = 0;
        let mut emptied = true;
        // Every record is decoded into this one event, where the sink reads it.
        let mut event = Event::empty();
        let malformed = &mut self.malformed;
        for ring in &mut self.rings {
            let taken = ring.read(per_ring, |record| {
                if event.decode(record) {
                    count += 1;
                    sink(&mut event);
                } else {
                    // Cannot happen with our own eBPF object; counted rather than trusted.
                    *malformed += 1;
                    event = Event::empty();
                }
            });
            if taken == per_ring {
                emptied = false;
            }
        }
        (count, emptied)
    }

    /// Resolves when a program found its buffer filling up and asked to be drained.
    pub async fn wakeup(&self) -> Result<()> {
        self.wakeups.wait().await
    }

    /// The programs' wakeups, for a caller that shares the intake between threads: the
    /// intake's own [`Intake::wakeup`] never resolves after.
    pub fn take_wakeups(&mut self) -> Wakeups {
        std::mem::replace(&mut self.wakeups, Wakeups(None))
    }

    /// Hands the events of the threads `mine` selects to `sink`, as [`Intake::drain_some`]
    /// does, reading each ring `ring` selects from this reader's own position in `positions`
    /// (one per ring, from the consumer's on the first call) and giving no space back:
    /// several readers walk the rings at once, each taking its threads' events, and
    /// [`Intake::release`] gives the space back once every one is past it. Records of other
    /// threads are skipped unread but for their thread id. Returns whether every ring read
    /// was read to its end; records that are not an event are counted in `malformed` by the
    /// reader that `mine(0)` selects.
    pub fn scan_part(
        &self,
        positions: &mut Vec<u64>,
        per_ring: u64,
        ring: impl FnMut(usize) -> bool,
        mut mine: impl FnMut(u32) -> bool,
        malformed: &mut u64,
        mut sink: impl FnMut(&mut Event),
    ) -> bool {
        // One reader of `scan_rings`': reader 0, and no reader 1 for the others' records.
        self.scan_rings(
            &mut [positions],
            per_ring,
            ring,
            |tid| usize::from(!mine(tid)),
            malformed,
            |_, event| sink(event),
        )
    }

    /// [`Intake::scan_part`] for every reader at once, on this thread: each ring read once,
    /// each event handed to `sink` with the reader `owner` names for its thread, if that
    /// reader is not past it yet (`positions`: each reader's, as `scan_part` keeps them; a
    /// reader `owner` names past the last has its records skipped). Every
    /// reader is then where the one furthest on is. Whether every ring was read to its end;
    /// records that are not an event are counted in `malformed`.
    pub fn scan_all(
        &self,
        positions: &mut [&mut Vec<u64>],
        per_ring: u64,
        owner: impl FnMut(u32) -> usize,
        malformed: &mut u64,
        sink: impl FnMut(usize, &mut Event),
    ) -> bool {
        self.scan_rings(positions, per_ring, |_| true, owner, malformed, sink)
    }

    /// [`Intake::scan_all`] of the rings `ring` selects.
    fn scan_rings(
        &self,
        positions: &mut [&mut Vec<u64>],
        per_ring: u64,
        mut ring: impl FnMut(usize) -> bool,
        mut owner: impl FnMut(u32) -> usize,
        malformed: &mut u64,
        mut sink: impl FnMut(usize, &mut Event),
    ) -> bool {
        for at in positions.iter_mut() {
            // A reader's first drain starts where the consumer is.
            if at.len() != self.rings.len() {
                **at = self
                    .rings
                    .iter()
                    .map(|r| r.consumer_pos().load(Ordering::Relaxed))
                    .collect();
            }
        }
        let mut emptied = true;
        let mut event = Event::empty();
        for (index, this) in self.rings.iter().enumerate() {
            if !ring(index) {
                continue;
            }
            let Some(from) = positions.iter().map(|at| at[index]).min() else {
                return true;
            };
            let (to, taken) = this.scan(from, per_ring, |pos, record| {
                let reader = owner(EventHeader::tid_of(record).unwrap_or(0));
                if positions.get(reader).is_none_or(|at| pos < at[index]) {
                    return;
                }
                if event.decode(record) {
                    sink(reader, &mut event);
                } else {
                    *malformed += 1;
                    event = Event::empty();
                }
            });
            for at in positions.iter_mut() {
                at[index] = at[index].max(to);
            }
            if taken == per_ring {
                emptied = false;
            }
        }
        emptied
    }

    /// Gives back the space of ring `ring` up to position `to` (see [`Intake::scan_part`]).
    pub fn release(&mut self, ring: usize, to: u64) {
        if let Some(r) = self.rings.get_mut(ring) {
            r.release(to);
        }
    }

    /// Rings.
    pub fn rings(&self) -> usize {
        self.rings.len()
    }

    /// Rings per CPU: ring `r` holds only the events of threads whose id leaves the
    /// remainder `r % rings_per_cpu` (`profiler_common::ring_index`).
    pub fn rings_per_cpu(&self) -> usize {
        self.rings_per_cpu
    }

    /// Bytes the programs have written and the intake not read yet, in all rings.
    pub fn unread_bytes(&self) -> u64 {
        self.rings.iter().map(Ring::unread_bytes).sum()
    }

    /// Ring-buffer records too short or too inconsistent to be an event.
    pub fn malformed(&self) -> u64 {
        self.malformed
    }
}

impl Wakeups {
    /// Resolves when a program found its buffer filling up and asked to be drained (never,
    /// without a kernel).
    pub async fn wait(&self) -> Result<()> {
        let Some(wakeups) = &self.0 else {
            return std::future::pending().await;
        };
        let mut guard = wakeups.readable().await?;
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 16];
        // Empty epoll's ready list so the next wakeup is a new edge.
        loop {
            // SAFETY: valid epoll descriptor and buffer of 16 entries; timeout 0 never blocks.
            let n = unsafe {
                libc::epoll_wait(wakeups.get_ref().as_raw_fd(), events.as_mut_ptr(), 16, 0)
            };
            if n < 16 {
                break;
            }
        }
        guard.clear_ready();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_in_memory_hands_on_every_record_in_order_across_its_end() {
        let page = 4096u64;
        let (mut intake, mut writers) = Intake::in_memory(2, page).unwrap();
        let header = |seq: u64, tid: u32| EventHeader {
            seq,
            tid,
            pid: 1,
            kind: SledKind::Entry as u8,
            ..EventHeader::default()
        };
        let mut next = [0u64; 2];
        let mut seen = Vec::new();
        // 56-byte records in a 4 KiB ring: it wraps around its end many times, records
        // straddling it, and fills up (the writer refuses) before each drain.
        for _ in 0..50 {
            for (i, writer) in writers.iter_mut().enumerate() {
                let mut written = 0;
                while writer.write(&record(header(next[i], i as u32), &[])) {
                    next[i] += 1;
                    written += 1;
                }
                // As many as fit in 4096 bytes, wherever the ring's positions are.
                assert_eq!(written, 4096 / 56);
                writer.publish();
            }
            let (count, emptied) = intake.drain_some(u64::MAX, |e| {
                seen.push((e.header.tid, e.header.seq));
            });
            assert!(emptied);
            assert_eq!(count, 2 * 73);
        }
        for tid in 0..2u32 {
            let seqs: Vec<u64> = seen
                .iter()
                .filter(|(t, _)| *t == tid)
                .map(|&(_, s)| s)
                .collect();
            assert_eq!(seqs, (0..next[tid as usize]).collect::<Vec<_>>());
        }
        assert_eq!(intake.malformed(), 0);
    }

    fn record(header: EventHeader, body: &[u8]) -> Vec<u8> {
        let mut v = header.to_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn decodes_args_and_payloads() {
        let h = EventHeader {
            kind: SledKind::LogArgsEntry as u8,
            payload_len: 16,
            ..Default::default()
        };
        let mut body = Vec::new();
        for a in [7u64, 9, 0, 0, 0, 0] {
            body.extend_from_slice(&a.to_le_bytes());
        }
        let mut rec = record(h, &body);
        let e = Event::from_record(&rec).unwrap();
        assert_eq!((e.nargs, e.args[0], e.args[1]), (2, 7, 9));
        rec.truncate(EventHeader::SIZE + 8);
        assert_eq!(Event::from_record(&rec), None, "args record cut short");

        let h = EventHeader {
            kind: SledKind::CustomEvent as u8,
            payload_len: 16 + 3,
            ..Default::default()
        };
        let mut body = 100u64.to_le_bytes().to_vec();
        body.extend_from_slice(&0u64.to_le_bytes());
        body.extend_from_slice(b"abc");
        let e = Event::from_record(&record(h, &body)).unwrap();
        let d = e.data.unwrap();
        assert_eq!((d.size, d.bytes.as_slice()), (100, &b"abc"[..]));
    }

    /// One `Event` decodes every record of a drain: after an event with arguments or a payload,
    /// a plain entry or exit (the fast path) comes out as `from_record` builds it.
    #[test]
    fn reused_event_decodes_like_a_fresh_one() {
        let args = EventHeader {
            kind: SledKind::LogArgsEntry as u8,
            payload_len: 16,
            ..Default::default()
        };
        let custom = EventHeader {
            kind: SledKind::CustomEvent as u8,
            payload_len: 16 + 2,
            ..Default::default()
        };
        let mut custom_body = 2u64.to_le_bytes().to_vec();
        custom_body.extend_from_slice(&[0; 8]);
        custom_body.extend_from_slice(b"hi");
        let records = [
            record(args, &[1u8; 8 * MAX_ARGS]),
            record(
                EventHeader {
                    tid: 5,
                    kind: SledKind::Exit as u8,
                    ..Default::default()
                },
                &[],
            ),
            record(custom, &custom_body),
            record(
                EventHeader {
                    tid: 6,
                    kind: SledKind::Entry as u8,
                    ..Default::default()
                },
                &[],
            ),
            record(
                EventHeader {
                    tid: 7,
                    kind: SledKind::Tail as u8,
                    ..Default::default()
                },
                &[],
            ),
            record(
                EventHeader {
                    kind: profiler_common::event_kind::CATCH,
                    ..Default::default()
                },
                &[],
            ),
        ];
        let mut event = Event::empty();
        for r in &records {
            assert!(event.decode(r));
            assert_eq!(Some(&event), Event::from_record(r).as_ref());
        }
    }

    #[test]
    fn rejects_inconsistent_records() {
        assert_eq!(Event::from_record(&[0u8; 10]), None);
        let h = EventHeader {
            kind: SledKind::Entry as u8,
            payload_len: 64,
            ..Default::default()
        };
        assert_eq!(Event::from_record(&record(h, &[0; 8])), None);
        let h = EventHeader {
            kind: SledKind::CustomEvent as u8,
            payload_len: 4,
            ..Default::default()
        };
        assert_eq!(Event::from_record(&record(h, &[0; 4])), None);
    }
}
