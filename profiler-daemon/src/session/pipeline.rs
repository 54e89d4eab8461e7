//! The one path of events from the kernel to where they are kept, for `record` and the
//! service alike: the per-CPU rings drained ([`crate::kernel::intake`]), each thread's events
//! put back in program order ([`super::order`]) and handed, with the losses right before each,
//! to a sink: the session's files (`record`), or the service's router to its targets.
//!
//! The work is spread over worker threads ([`parallel`]), each owning a share of the traced
//! threads; the calling thread is worker 0, its sink the caller's own, handed in at each
//! call. `record` runs one worker for every 4 CPUs ([`default_workers`]); the service runs
//! the calling thread alone ([`EventPipeline::alone`]): its router and its targets' flight
//! windows, budgets and triggers are state of that one thread.
//!
//! It also knows when a thread is over. A thread whose exit record found its ring full has
//! its books moved to the kernel's table of exited threads; its last events are in the rings
//! before those books are taken, so it is ended (with its trailing losses) once a drain has
//! emptied every ring ([`EventPipeline::end_exited`]); at the end, every thread the kernel
//! still has books for is ended ([`EventPipeline::finish`]).
mod parallel;

pub use parallel::{
    default_workers, locked, EventPipeline, NoHelpers, Sink, MAX_DEFAULT_WORKERS, PARALLEL_FROM,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::intake::in_memory::RingWriter;
    use crate::kernel::intake::{Event, Intake};
    use crate::session::order::Gap;
    use profiler_common::ThreadState;
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
        let mut pipeline = EventPipeline::alone(intake).unwrap();
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
