//! Event intake: draining the kernel's ring buffer of [`SledEvent`]s.
//!
//! The eBPF side writes without waking us (`BPF_RB_NO_WAKEUP`), so the daemon calls
//! [`Intake::drain`] on a short timer; a wakeup per event would cost more than the probe itself.
use crate::bpf::LostCounter;
use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use profiler_common::SledEvent;

/// The reading end of the kernel → daemon event path.
pub struct Intake {
    ring: RingBuf<MapData>,
    lost: LostCounter,
    malformed: u64,
}

impl Intake {
    /// Wraps the ring buffer and the kernel's lost-events counter.
    pub fn new(ring: RingBuf<MapData>, lost: LostCounter) -> Intake {
        Intake {
            ring,
            lost,
            malformed: 0,
        }
    }

    /// Hands every event currently in the ring buffer to `sink`, in ring order (which is each
    /// thread's program order: a thread's events are reserved one after another). Returns how
    /// many events were read.
    pub fn drain(&mut self, mut sink: impl FnMut(&SledEvent)) -> u64 {
        let mut count = 0;
        while let Some(item) = self.ring.next() {
            match SledEvent::from_bytes(&item) {
                Some(event) => {
                    count += 1;
                    sink(&event);
                }
                // Cannot happen with our own eBPF object; counted rather than trusted.
                None => self.malformed += 1,
            }
        }
        count
    }

    /// Events the kernel side could not write because the ring buffer was full.
    pub fn lost_in_kernel(&self) -> Result<u64> {
        self.lost.total()
    }

    /// Ring-buffer records too short to be an event.
    pub fn malformed(&self) -> u64 {
        self.malformed
    }
}
