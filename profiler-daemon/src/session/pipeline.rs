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
