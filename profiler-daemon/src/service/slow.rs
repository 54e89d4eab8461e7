//! The slow-call trigger (`trigger_slower_than` on `trigger_functions`): each watched thread's
//! open calls of the chosen functions, matched to their exits by stack slot as the session
//! matches them, so that a call longer than the threshold is seen the moment it returns.
use crate::session::{slot_at_or_below, slot_below};
use profiler_common::{event_kind, EventHeader, SledKind};
use std::collections::{HashMap, HashSet};

/// Deepest stack of open chosen calls kept per thread (bounded memory).
const MAX_OPEN: usize = 4096;

/// A call that took longer than the threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowCall {
    pub function_id: u32,
    pub tid: u32,
    pub pid: u32,
    pub duration_ns: u64,
}

/// Open calls of the chosen functions, per thread.
#[derive(Debug)]
pub struct SlowCalls {
    threshold_ns: u64,
    functions: HashSet<u32>,
    /// By thread: (function id, slot, entry time), innermost last.
    open: HashMap<u32, Vec<(u32, u64, u64)>>,
}

impl SlowCalls {
    /// Watches `functions` (trace ids) for calls of at least `threshold_ns`.
    pub fn new(threshold_ns: u64, functions: HashSet<u32>) -> SlowCalls {
        SlowCalls {
            threshold_ns,
            functions,
            open: HashMap::new(),
        }
    }

    /// Watches `functions` too (those of a library found later).
    pub fn watch_more(&mut self, functions: impl IntoIterator<Item = u32>) {
        self.functions.extend(functions);
    }

    /// Takes a thread's next event (in program order, its function id without the service's
    /// tag); returns the call it ends when that call was slow.
    pub fn observe(&mut self, h: &EventHeader) -> Option<SlowCall> {
        let sp = h.sp;
        // The session's rule for a frame gone (see `slot_below`).
        let gone = |slot: u64| slot_at_or_below(slot, sp);
        let below = |slot: u64| slot_below(slot, sp);
        if h.kind == event_kind::THREAD_EXIT {
            self.open.remove(&h.tid);
            return None;
        }
        if h.kind == event_kind::CATCH {
            // Frames at or below the catch's stack pointer were unwound: not slow calls.
            if let Some(open) = self.open.get_mut(&h.tid) {
                open.retain(|&(_, slot, _)| !gone(slot));
            }
            return None;
        }
        match SledKind::from_u8(h.kind)? {
            SledKind::Entry | SledKind::LogArgsEntry if self.functions.contains(&h.function_id) => {
                let open = self.open.entry(h.tid).or_default();
                // Frames at or below a new frame's slot are gone (unwound, or left unseen).
                open.retain(|&(_, slot, _)| !gone(slot));
                if open.len() < MAX_OPEN {
                    open.push((h.function_id, h.sp, h.ts_ns));
                }
                None
            }
            SledKind::Exit | SledKind::Tail => {
                let open = self.open.get_mut(&h.tid)?;
                open.retain(|&(_, slot, _)| !below(slot));
                match open.last() {
                    Some(&(function_id, slot, entered))
                        if slot == h.sp && function_id == h.function_id =>
                    {
                        open.pop();
                        let duration_ns = h.ts_ns.saturating_sub(entered);
                        (duration_ns >= self.threshold_ns).then_some(SlowCall {
                            function_id,
                            tid: h.tid,
                            pid: h.pid,
                            duration_ns,
                        })
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: u8, function_id: u32, sp: u64, ts_ns: u64) -> EventHeader {
        EventHeader {
            kind,
            function_id,
            sp,
            ts_ns,
            tid: 5,
            pid: 5,
            ..EventHeader::default()
        }
    }

    #[test]
    fn a_chosen_call_over_the_threshold_is_reported_when_it_returns() {
        let mut w = SlowCalls::new(1_000, [7].into());
        let (entry, exit) = (SledKind::Entry as u8, SledKind::Exit as u8);
        assert_eq!(w.observe(&ev(entry, 7, 0x1000, 0)), None);
        assert_eq!(w.observe(&ev(entry, 8, 0x0ff0, 10)), None, "not chosen");
        assert_eq!(w.observe(&ev(exit, 8, 0x0ff0, 20)), None);
        let slow = w.observe(&ev(exit, 7, 0x1000, 1_500)).unwrap();
        assert_eq!((slow.function_id, slow.duration_ns), (7, 1_500));
        // A fast call is not reported.
        w.observe(&ev(entry, 7, 0x1000, 2_000));
        assert_eq!(w.observe(&ev(exit, 7, 0x1000, 2_999)), None);
    }

    #[test]
    fn a_call_on_another_stack_does_not_end_an_open_one() {
        let mut w = SlowCalls::new(1_000, [7].into());
        let (entry, exit) = (SledKind::Entry as u8, SledKind::Exit as u8);
        w.observe(&ev(entry, 7, 0x10_0000, 0));
        // A signal handler on an alternate stack far above calls 7 too: the stack pointer is
        // above the open call's slot, but on another stack.
        w.observe(&ev(entry, 7, 0x7000_0000_0000, 10));
        assert_eq!(w.observe(&ev(exit, 7, 0x7000_0000_0000, 20)), None);
        let slow = w.observe(&ev(exit, 7, 0x10_0000, 5_000)).unwrap();
        assert_eq!(slow.duration_ns, 5_000, "the outer call was still open");
    }

    #[test]
    fn unwound_calls_are_forgotten_not_reported() {
        let mut w = SlowCalls::new(10, [7].into());
        w.observe(&ev(SledKind::Entry as u8, 7, 0x0f00, 0));
        // A catch above the frame: it was unwound.
        w.observe(&ev(event_kind::CATCH, 0, 0x0f10, 100));
        assert_eq!(w.observe(&ev(SledKind::Exit as u8, 7, 0x0f00, 200)), None);
        assert!(w.open[&5].is_empty());
    }
}
