//! The one path of events from the kernel to where they are kept, for `record` and the
//! service alike: the per-CPU rings drained ([`crate::kernel::intake`]), each thread's events
//! put back in program order ([`super::order`]) and handed, with the losses right before each,
//! to a sink: the session's files (`record`), or the service's router to its targets.
//!
//! It also knows when a thread is over. A thread whose exit record found its ring full has
//! its books moved to the kernel's table of exited threads; its last events are in the rings
//! before those books are taken, so it is ended (with its trailing losses) once a drain has
//! emptied every ring ([`EventPipeline::end_exited`]); at the end, every thread the kernel
//! still has books for is ended ([`EventPipeline::finish`]).
pub mod parallel;

use super::order::{Gap, Sequencer};
use crate::kernel::intake::{Event, Intake};
use anyhow::Result;
use profiler_common::ThreadState;

/// The kernel's rings, drained and put in order.
pub struct EventPipeline {
    intake: Intake,
    order: Sequencer,
    /// Threads that exited with their ring full, their books taken, not ended yet.
    exited: Vec<(u32, ThreadState)>,
}

impl EventPipeline {
    pub fn new(intake: Intake) -> EventPipeline {
        EventPipeline {
            intake,
            order: Sequencer::default(),
            exited: Vec::new(),
        }
    }

    /// Drains at most `budget` records of each ring (every one with `u64::MAX`) into `sink`;
    /// whether every ring was emptied. While the programs record, a budget gives the caller's
    /// loop its turn even when they write faster than the daemon reads.
    pub fn drain(&mut self, budget: u64, sink: &mut impl FnMut(&mut Event, Option<Gap>)) -> bool {
        let order = &mut self.order;
        let (_, emptied) = self
            .intake
            .drain_some(budget, |event| order.push(event, sink));
        emptied
    }

    /// Ends the threads that exited with their ring full (`exited`: their books, just taken
    /// from the kernel's table), with those taken before and not ended yet, once a drain
    /// (at most `budget` records of each ring) has emptied every ring.
    pub fn end_exited(
        &mut self,
        exited: Vec<(u32, ThreadState)>,
        budget: u64,
        sink: &mut impl FnMut(&mut Event, Option<Gap>),
    ) {
        self.exited.extend(exited);
        if !self.exited.is_empty() && self.drain(budget, sink) {
            let exited = std::mem::take(&mut self.exited);
            self.order.end_threads(&exited, sink);
        }
    }

    /// The end, once the programs are disarmed: every ring drained, the threads that exited
    /// ended, then those the kernel still has books for (`books`: live and exited), each with
    /// the events it lost at its very end; events still waiting for predecessors that never
    /// came are delivered, the missing ones counted as lost.
    pub fn finish(
        &mut self,
        books: &[(u32, ThreadState)],
        sink: &mut impl FnMut(&mut Event, Option<Gap>),
    ) {
        self.drain(u64::MAX, sink);
        let exited = std::mem::take(&mut self.exited);
        self.order.end_threads(&exited, sink);
        self.order.finish(books, sink);
    }

    /// Resolves when a program found its ring filling up and asked to be drained.
    pub async fn wakeup(&self) -> Result<()> {
        self.intake.wakeup().await
    }

    /// Records that could not be decoded, or whose numbers could not be right (counted,
    /// dropped; never expected from our own programs).
    pub fn malformed(&self) -> u64 {
        self.intake.malformed() + self.order.stale()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::intake::in_memory::RingWriter;
    use profiler_common::{event_kind, EventHeader, SledKind};

    fn write(ring: &mut RingWriter, tid: u32, seq: u64) {
        let header = EventHeader {
            seq,
            tid,
            pid: 1,
            kind: SledKind::Entry as u8,
            ..EventHeader::default()
        };
        assert!(ring.write(&header.to_bytes()));
    }

    fn books(tid: u32, seq: u64, gap_lost: u32) -> (u32, ThreadState) {
        let state = ThreadState {
            seq,
            gap_lost,
            tid,
            ..ThreadState::default()
        };
        (tid, state)
    }

    #[test]
    fn threads_come_out_in_order_and_end_with_their_trailing_losses() {
        let (intake, mut rings) = Intake::in_memory(2, 4096).unwrap();
        let mut pipeline = EventPipeline::new(intake);
        let mut out: Vec<(u32, u64, u8, Option<u64>)> = Vec::new();
        let mut sink = |e: &mut Event, g: Option<Gap>| {
            out.push((e.header.tid, e.header.seq, e.header.kind, g.map(|g| g.lost)))
        };
        // Thread 1 moved from ring 1 to ring 0 (read first); thread 2 stays on ring 1.
        write(&mut rings[0], 1, 2);
        write(&mut rings[1], 1, 0);
        write(&mut rings[1], 1, 1);
        write(&mut rings[1], 2, 0);
        rings.iter_mut().for_each(RingWriter::publish);
        // Thread 1 exited with its ring full: 3 events lost after its last one (seq 2). Its
        // books are taken before the drain that empties the rings: ended after its events.
        pipeline.end_exited(vec![books(1, 6, 3)], u64::MAX, &mut sink);
        write(&mut rings[1], 2, 1);
        rings[1].publish();
        // The end: thread 2 is live, and lost its last 2 events.
        pipeline.finish(&[books(2, 4, 2)], &mut sink);
        let exit = event_kind::THREAD_EXIT;
        let entry = SledKind::Entry as u8;
        assert_eq!(
            out,
            vec![
                (1, 0, entry, None),
                (1, 1, entry, None),
                (1, 2, entry, None),
                (2, 0, entry, None),
                (1, 6, exit, Some(3)),
                (2, 1, entry, None),
                (2, 4, exit, Some(2)),
            ]
        );
        assert_eq!(pipeline.malformed(), 0);
    }
}
