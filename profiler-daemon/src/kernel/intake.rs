//! Event intake: draining the kernel's per-CPU ring buffers.
//!
//! The eBPF side writes without waking us (`BPF_RB_NO_WAKEUP`): a wakeup per event would cost
//! more than the probe itself. The daemon drains on a short timer, and early when a program
//! finds its buffer half full and wakes us (`BPF_RB_FORCE_WAKEUP`); [`Intake::wakeup`] resolves
//! then. Each buffer holds one CPU's events in the order they happened there; putting a
//! thread's events back in program order across CPUs is [`crate::session::order`]'s job.
use anyhow::{Context as _, Result};
use aya::maps::{MapData, RingBuf};
use profiler_common::{ArgsEvent, EventHeader, EventPayload, SledKind, MAX_ARGS};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use tokio::io::unix::AsyncFd;

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

    /// An event of nothing, to decode records into.
    fn empty() -> Event {
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
    #[inline]
    fn decode(&mut self, bytes: &[u8]) -> bool {
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

/// The reading end of the kernel → daemon event path.
pub struct Intake {
    rings: Vec<RingBuf<MapData>>,
    /// An epoll instance watching every ring (edge-triggered), registered with tokio: readable
    /// when a program forced a wakeup.
    wakeups: AsyncFd<OwnedFd>,
    malformed: u64,
}

impl Intake {
    /// Takes over the per-CPU rings. Needs a tokio runtime with I/O enabled.
    pub fn new(rings: Vec<RingBuf<MapData>>) -> Result<Intake> {
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
                    ring.as_raw_fd(),
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
            wakeups,
            malformed: 0,
        })
    }

    /// Hands every event in the buffers to `sink`, buffer by buffer, until they are empty.
    /// Returns how many events were read. Use it once the programs are disarmed (nothing new
    /// comes in); while they record, [`Intake::drain_some`] gives the event loop its turn.
    pub fn drain(&mut self, sink: impl FnMut(&mut Event)) -> u64 {
        self.drain_some(u64::MAX, sink).0
    }

    /// Like [`Intake::drain`], but at most `per_ring` events from each buffer: when the
    /// programs write faster than the daemon reads (a slow build, a loaded machine), draining
    /// until empty would never end, and the event loop would never see a signal or a deadline.
    /// Returns how many events were read, and whether every buffer was emptied. The sink gets
    /// each event where it was decoded, and may change it.
    pub fn drain_some(&mut self, per_ring: u64, mut sink: impl FnMut(&mut Event)) -> (u64, bool) {
        let mut count = 0;
        let mut emptied = true;
        // Every record is decoded into this one event, where the sink reads it.
        let mut event = Event::empty();
        for ring in &mut self.rings {
            let mut taken = 0;
            loop {
                if taken == per_ring {
                    emptied = false;
                    break;
                }
                let Some(item) = ring.next() else {
                    break;
                };
                taken += 1;
                if event.decode(&item) {
                    count += 1;
                    sink(&mut event);
                } else {
                    // Cannot happen with our own eBPF object; counted rather than trusted.
                    self.malformed += 1;
                    event = Event::empty();
                }
            }
        }
        (count, emptied)
    }

    /// Resolves when a program found its buffer filling up and asked to be drained.
    pub async fn wakeup(&self) -> Result<()> {
        let mut guard = self.wakeups.readable().await?;
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 16];
        // Empty epoll's ready list so the next wakeup is a new edge.
        loop {
            // SAFETY: valid epoll descriptor and buffer of 16 entries; timeout 0 never blocks.
            let n = unsafe {
                libc::epoll_wait(
                    self.wakeups.get_ref().as_raw_fd(),
                    events.as_mut_ptr(),
                    16,
                    0,
                )
            };
            if n < 16 {
                break;
            }
        }
        guard.clear_ready();
        Ok(())
    }

    /// Ring-buffer records too short or too inconsistent to be an event.
    pub fn malformed(&self) -> u64 {
        self.malformed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(header: EventHeader, body: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; EventHeader::SIZE];
        // SAFETY: v has room for a header; plain data.
        unsafe { core::ptr::write_unaligned(v.as_mut_ptr() as *mut EventHeader, header) };
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
