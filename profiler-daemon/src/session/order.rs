//! Putting each thread's events back in program order.
//!
//! A thread that migrates leaves its events in several per-CPU buffers, and a drain reads the
//! buffers one after another, so events of one thread can arrive out of order, one drain apart
//! at most. The kernel side numbers every event of a thread, written or lost, and each written
//! event says how many lost ones came right before it. So an event is ready exactly when every
//! number before it has been delivered or is accounted as lost: order and gaps are known, not
//! guessed from timestamps.
use crate::kernel::intake::Event;
use profiler_common::{event_kind, EventHeader, ThreadState};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// Events of a thread that were lost right before the event they come with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gap {
    /// How many.
    pub lost: u64,
}

#[derive(Default)]
struct Pending {
    /// Sequence number of the next event to deliver.
    next: u64,
    /// Events that arrived early, in runs of consecutive ones, by the first sequence number the
    /// run's first event accounts for. A ring holds a thread's events in their order, so what
    /// arrives early from one ring is one run: one map entry for thousands of events (a thread
    /// that moved to a CPU whose ring the drain reads first).
    waiting: BTreeMap<u64, Vec<Event>>,
    /// The run the latest early event went to: its key, and the first number its next event
    /// would account for.
    open_run: Option<(u64, u64)>,
}

/// Per-thread reordering.
///
/// Events go through by reference: one that is the next of its thread (nearly all of them) is
/// handed on where it lies; only an event that arrived early is copied, to wait. A ring holds
/// runs of one thread's events, so the thread of the last event is found without a lookup.
#[derive(Default)]
pub struct Sequencer {
    /// The threads being ordered, in no particular order; `index` says where each is.
    threads: Vec<(u32, Pending)>,
    index: FxHashMap<u32, usize>,
    /// The thread of the last event pushed, and where it is in `threads`.
    last: Option<(u32, usize)>,
    stale: u64,
}

impl Sequencer {
    /// Takes an event from the buffers; delivers it, and any events it was holding up, to
    /// `sink` in the thread's program order. The sink may change the events it is given (the
    /// service rewrites ids); `event` is kept (copied) only when it came early.
    #[inline]
    pub fn push(&mut self, event: &mut Event, sink: &mut impl FnMut(&mut Event, Option<Gap>)) {
        // Nearly every event: the next of the thread of the event before, nothing lost before
        // it, nothing waiting behind it, not the thread's end.
        let h = &event.header;
        if let Some((tid, slot)) = self.last {
            let pending = &mut self.threads[slot].1;
            if tid == h.tid
                && h.gap_lost == 0
                && h.seq == pending.next
                && pending.waiting.is_empty()
                && h.kind != event_kind::THREAD_EXIT
            {
                pending.next = h.seq + 1;
                sink(event, None);
                return;
            }
        }
        self.push_any(event, sink);
    }

    /// [`Sequencer::push`] for any event.
    #[inline(never)]
    fn push_any(&mut self, event: &mut Event, sink: &mut impl FnMut(&mut Event, Option<Gap>)) {
        let h = &event.header;
        let Some(first) = h.seq.checked_sub(u64::from(h.gap_lost)) else {
            self.stale += 1;
            return;
        };
        let slot = self.slot(h.tid);
        let pending = &mut self.threads[slot].1;
        if first < pending.next {
            // Only a corrupt record could number an event already delivered.
            self.stale += 1;
            return;
        }
        if first > pending.next {
            let next_of_run = h.seq + 1;
            match pending.open_run {
                Some((key, expected)) if expected == first => {
                    if let Some(run) = pending.waiting.get_mut(&key) {
                        run.push(event.clone());
                        pending.open_run = Some((key, next_of_run));
                        return;
                    }
                }
                _ => {}
            }
            if pending.waiting.contains_key(&first) {
                // Two events accounting for the same numbers: only a corrupt record.
                self.stale += 1;
                return;
            }
            pending.waiting.insert(first, vec![event.clone()]);
            pending.open_run = Some((first, next_of_run));
            return;
        }
        if deliver(pending, event, sink) {
            self.remove(slot);
            return;
        }
        while pending
            .waiting
            .first_key_value()
            .is_some_and(|(&k, _)| k == pending.next)
        {
            let Some((key, run)) = pending.waiting.pop_first() else {
                break;
            };
            if pending.open_run.is_some_and(|(open, _)| open == key) {
                pending.open_run = None;
            }
            // Consecutive: each is the next of its thread in turn.
            let mut run = run.into_iter();
            while let Some(mut event) = run.next() {
                if deliver(pending, &mut event, sink) {
                    // Its end: nothing of the thread can come after but a corrupt record.
                    self.stale += run.len() as u64;
                    self.remove(slot);
                    return;
                }
            }
        }
    }

    /// Where thread `tid` is in `threads`, adding it if it is new.
    #[inline]
    fn slot(&mut self, tid: u32) -> usize {
        if let Some((last, slot)) = self.last {
            if last == tid {
                return slot;
            }
        }
        let slot = *self.index.entry(tid).or_insert_with(|| {
            self.threads.push((tid, Pending::default()));
            self.threads.len() - 1
        });
        self.last = Some((tid, slot));
        slot
    }

    /// Forgets the thread at `slot` (it ended).
    fn remove(&mut self, slot: usize) {
        let (tid, _) = self.threads.swap_remove(slot);
        self.index.remove(&tid);
        if let Some(&(moved, _)) = self.threads.get(slot) {
            self.index.insert(moved, slot);
        }
        self.last = None;
    }

    /// Ends threads from their kernel-side books (threads whose exit record was lost, or all
    /// threads at the end of the session): each gets its end marker, with the events lost at
    /// its very end.
    pub fn end_threads(
        &mut self,
        books: &[(u32, ThreadState)],
        sink: &mut impl FnMut(&mut Event, Option<Gap>),
    ) {
        for &(tid, state) in books {
            let mut marker = Event {
                header: EventHeader {
                    seq: state.seq,
                    tid,
                    kind: event_kind::THREAD_EXIT,
                    gap_lost: state.gap_lost,
                    ..EventHeader::default()
                },
                args: [0; profiler_common::MAX_ARGS],
                nargs: 0,
                data: None,
            };
            self.push(&mut marker, sink);
        }
    }

    /// Ends the session: threads the kernel still has books for are ended (see
    /// [`Sequencer::end_threads`]), and events still waiting for predecessors that never came
    /// are delivered with the missing ones counted as lost.
    pub fn finish(
        &mut self,
        live: &[(u32, ThreadState)],
        sink: &mut impl FnMut(&mut Event, Option<Gap>),
    ) {
        self.end_threads(live, sink);
        self.index.clear();
        self.last = None;
        for (_, mut pending) in std::mem::take(&mut self.threads) {
            for mut event in std::mem::take(&mut pending.waiting).into_values().flatten() {
                // Runs never overlap but for corrupt records (or a thread id reused while
                // its predecessor's events still wait): those are counted, not delivered.
                let first = event.header.seq - u64::from(event.header.gap_lost);
                let Some(missing) = first.checked_sub(pending.next) else {
                    self.stale += 1;
                    continue;
                };
                let gap = Gap {
                    lost: missing + u64::from(event.header.gap_lost),
                };
                pending.next = event.header.seq + 1;
                sink(&mut event, Some(gap));
            }
        }
    }

    /// Records whose sequence number could not be right (counted, dropped).
    pub fn stale(&self) -> u64 {
        self.stale
    }

    /// Threads being tracked.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }
}

/// Delivers the next event of a thread; true when it was the thread's last.
fn deliver(
    pending: &mut Pending,
    event: &mut Event,
    sink: &mut impl FnMut(&mut Event, Option<Gap>),
) -> bool {
    let h = event.header;
    let gap = (h.gap_lost > 0).then_some(Gap {
        lost: u64::from(h.gap_lost),
    });
    pending.next = h.seq + 1;
    sink(event, gap);
    h.kind == event_kind::THREAD_EXIT
}

#[cfg(test)]
mod tests;
