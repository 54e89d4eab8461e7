//! The calls of one binary's processes, aggregated by call stack and interval as they return:
//! what each pushed profile holds.
//!
//! Events come in each thread's program order (after the sequencer). A thread's open calls are
//! matched to their exits by stack slot, as the session matches them: a frame an exception or
//! `longjmp` left is ended where the next event proves it gone (a catch, a new frame at or above
//! its slot, an exit above it, on the same stack), as the recorder closes it, so a profile counts what `report`
//! counts for the same calls. A call counts in the interval its exit falls in (by the event's own
//! timestamp, not when it was drained), so intervals are exact however late events arrive.
//!
//! Memory is bounded: stacks are kept in a trie capped at [`MAX_STACKS`] nodes (calls under a
//! stack beyond it are counted, not kept), each thread's open calls at [`MAX_OPEN`].
use crate::session::{slot_at_or_below, slot_below};
use fdr_analysis::convert::pprof::StackValues;
use profiler_common::{event_kind, EventHeader, SledKind};
use rustc_hash::FxHashMap;

/// Deepest stack of open calls kept per thread.
pub const MAX_OPEN: usize = 4096;
/// Most distinct stacks kept for one binary (the trie's nodes: 16 bytes each, plus the index).
pub const MAX_STACKS: usize = 1 << 20;
/// The parent of outermost frames.
const ROOT: u32 = u32::MAX;
/// The node of an open call whose stack is beyond [`MAX_STACKS`]: it and the calls it makes are
/// counted in [`CallStacks::calls_not_kept`], and its time still goes to its caller.
const NOT_KEPT: u32 = u32::MAX - 1;

/// One open call of a thread.
#[derive(Clone, Copy, Debug)]
struct Open {
    node: u32,
    function_id: u32,
    sp: u64,
    entered_ns: u64,
    /// Inclusive time of the calls it made that returned.
    children_ns: u64,
}

/// One interval's aggregate of one process: per stack (trie node), what returned there.
pub type ProcessCalls = FxHashMap<u32, StackValues>;

/// The calls of a binary's processes, by interval, process and call stack.
#[derive(Debug)]
pub struct CallStacks {
    interval_ns: u64,
    /// Realtime minus monotonic (ns): intervals are aligned on the calendar.
    realtime_offset_ns: i128,
    /// (parent, function id) per node.
    nodes: Vec<(u32, u32)>,
    index: FxHashMap<(u32, u32), u32>,
    /// By (interval index, pid).
    intervals: FxHashMap<(u64, u32), ProcessCalls>,
    /// Open calls, by thread.
    open: FxHashMap<u32, Vec<Open>>,
    /// Calls not kept: deeper than [`MAX_OPEN`], or under a stack beyond [`MAX_STACKS`].
    pub calls_not_kept: u64,
}

/// One finished interval of one process.
#[derive(Debug)]
pub struct Interval {
    /// Its start, ns since the Unix epoch, and its length.
    pub start_unix_ns: u64,
    pub length_ns: u64,
    pub pid: u32,
    pub calls: ProcessCalls,
}

impl CallStacks {
    /// Aggregates by intervals of `interval_ns`, aligned to multiples of it since the epoch.
    pub fn new(interval_ns: u64, realtime_offset_ns: i128) -> CallStacks {
        CallStacks {
            interval_ns: interval_ns.max(1),
            realtime_offset_ns,
            nodes: Vec::new(),
            index: FxHashMap::default(),
            intervals: FxHashMap::default(),
            open: FxHashMap::default(),
            calls_not_kept: 0,
        }
    }

    /// The interval a monotonic timestamp falls in.
    fn interval_of(&self, monotonic_ns: u64) -> u64 {
        let unix = (i128::from(monotonic_ns) + self.realtime_offset_ns).max(0) as u128;
        (unix / u128::from(self.interval_ns)) as u64
    }

    /// The node of `function_id` called under `parent`; `None` past [`MAX_STACKS`].
    fn child(&mut self, parent: u32, function_id: u32) -> Option<u32> {
        if let Some(&n) = self.index.get(&(parent, function_id)) {
            return Some(n);
        }
        if self.nodes.len() >= MAX_STACKS {
            return None;
        }
        self.nodes.push((parent, function_id));
        let n = (self.nodes.len() - 1) as u32;
        self.index.insert((parent, function_id), n);
        Some(n)
    }

    /// The function ids of `node`'s stack, innermost first.
    pub fn stack(&self, node: u32) -> impl Iterator<Item = u32> + '_ {
        let mut at = node;
        std::iter::from_fn(move || {
            if at == ROOT {
                return None;
            }
            let (parent, function_id) = self.nodes[at as usize];
            at = parent;
            Some(function_id)
        })
    }

    /// Takes a thread's next event (program order, function ids without the service's tag).
    pub fn observe(&mut self, h: &EventHeader) {
        let sp = h.sp;
        // The session's rule for a frame gone (see `slot_below`).
        let below = |slot: u64| slot_below(slot, sp);
        let at_or_below = |slot: u64| slot_at_or_below(slot, sp);
        if h.kind == event_kind::THREAD_EXIT {
            self.open.remove(&h.tid);
            return;
        }
        if h.kind == event_kind::CATCH {
            self.close_gone(h, at_or_below);
            return;
        }
        match SledKind::from_u8(h.kind) {
            Some(SledKind::Entry | SledKind::LogArgsEntry) => {
                // Frames at or below a new frame's slot are gone (unwound, or left unseen).
                self.close_gone(h, at_or_below);
                let open = self.open.entry(h.tid).or_default();
                if open.len() >= MAX_OPEN {
                    self.calls_not_kept += 1;
                    return;
                }
                let parent = open.last().map_or(ROOT, |o| o.node);
                let node = match parent {
                    NOT_KEPT => None,
                    _ => self.child(parent, h.function_id),
                };
                if node.is_none() {
                    self.calls_not_kept += 1;
                }
                self.open.entry(h.tid).or_default().push(Open {
                    node: node.unwrap_or(NOT_KEPT),
                    function_id: h.function_id,
                    sp: h.sp,
                    entered_ns: h.ts_ns,
                    children_ns: 0,
                });
            }
            Some(SledKind::Exit | SledKind::Tail) => {
                self.close_gone(h, below);
                let Some(open) = self.open.get_mut(&h.tid) else {
                    return;
                };
                match open.last() {
                    Some(top) if top.sp == h.sp && top.function_id == h.function_id => {
                        self.close_top(h);
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }

    /// Ends, innermost first, the open calls of `h`'s thread that `gone` says an exception or
    /// `longjmp` left: as the recorder does, each counts as a call ending at `h`, so a
    /// profile's numbers are the report's.
    fn close_gone(&mut self, h: &EventHeader, gone: impl Fn(u64) -> bool) {
        while self
            .open
            .get(&h.tid)
            .and_then(|o| o.last())
            .is_some_and(|top| gone(top.sp))
        {
            self.close_top(h);
        }
    }

    /// Ends the innermost open call of `h`'s thread at `h`'s time.
    fn close_top(&mut self, h: &EventHeader) {
        let key = (self.interval_of(h.ts_ns), h.pid);
        let Some(open) = self.open.get_mut(&h.tid) else {
            return;
        };
        let Some(top) = open.pop() else { return };
        let duration = h.ts_ns.saturating_sub(top.entered_ns);
        if let Some(parent) = open.last_mut() {
            parent.children_ns = parent.children_ns.saturating_add(duration);
        }
        if top.node == NOT_KEPT {
            return;
        }
        let v = self
            .intervals
            .entry(key)
            .or_default()
            .entry(top.node)
            .or_default();
        v.calls += 1;
        v.wall_ns = v.wall_ns.saturating_add(duration);
        v.self_ns = v
            .self_ns
            .saturating_add(duration.saturating_sub(top.children_ns));
    }

    /// Takes the intervals that ended before `monotonic_now_ns` minus `grace_ns` (events of
    /// later calls may still be on their way for that long), or every interval when `all`.
    pub fn take_finished(
        &mut self,
        monotonic_now_ns: u64,
        grace_ns: u64,
        all: bool,
    ) -> Vec<Interval> {
        let current = self.interval_of(monotonic_now_ns.saturating_sub(grace_ns));
        let done: Vec<(u64, u32)> = self
            .intervals
            .keys()
            .copied()
            .filter(|&(i, _)| all || i < current)
            .collect();
        let mut out: Vec<Interval> = done
            .into_iter()
            .filter_map(|key| {
                let calls = self.intervals.remove(&key)?;
                Some(Interval {
                    start_unix_ns: key.0.saturating_mul(self.interval_ns),
                    length_ns: self.interval_ns,
                    pid: key.1,
                    calls,
                })
            })
            .collect();
        out.sort_by_key(|i| (i.start_unix_ns, i.pid));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event of thread 5 of process 4.
    fn ev(kind: u8, function_id: u32, sp: u64, ts_ns: u64) -> EventHeader {
        EventHeader {
            pid: 4,
            ..crate::session::live::test_event(kind, function_id, sp, ts_ns)
        }
    }

    const E: u8 = SledKind::Entry as u8;
    const X: u8 = SledKind::Exit as u8;

    fn values(s: &CallStacks, i: &Interval, stack: &[u32]) -> StackValues {
        let (_, v) = i
            .calls
            .iter()
            .find(|(&n, _)| s.stack(n).collect::<Vec<_>>() == stack)
            .unwrap_or_else(|| panic!("no stack {stack:?} in {i:?}"));
        *v
    }

    #[test]
    fn calls_add_up_by_stack_with_self_time() {
        let mut s = CallStacks::new(1_000_000, 0);
        // 1 → 2 (twice) in one interval.
        s.observe(&ev(E, 1, 0x100, 10));
        s.observe(&ev(E, 2, 0x0f0, 20));
        s.observe(&ev(X, 2, 0x0f0, 50));
        s.observe(&ev(E, 2, 0x0f0, 60));
        s.observe(&ev(X, 2, 0x0f0, 70));
        s.observe(&ev(X, 1, 0x100, 100));
        assert!(
            s.take_finished(999_999, 0, false).is_empty(),
            "not over yet"
        );
        let done = s.take_finished(1_000_000, 0, false);
        assert_eq!(done.len(), 1);
        let i = &done[0];
        assert_eq!((i.start_unix_ns, i.length_ns, i.pid), (0, 1_000_000, 4));
        assert_eq!(
            values(&s, i, &[2, 1]),
            StackValues {
                calls: 2,
                wall_ns: 40,
                self_ns: 40
            }
        );
        assert_eq!(
            values(&s, i, &[1]),
            StackValues {
                calls: 1,
                wall_ns: 90,
                self_ns: 50
            }
        );
        assert!(s.take_finished(5_000_000, 0, true).is_empty());
    }

    #[test]
    fn a_call_counts_in_the_interval_of_its_exit_on_the_calendar() {
        // Monotonic 0 is Unix 2_500: intervals of 1_000 start at Unix 2_000, 3_000, ...
        let mut s = CallStacks::new(1_000, 2_500);
        s.observe(&ev(E, 1, 0x100, 100)); // Unix 2_600
        s.observe(&ev(X, 1, 0x100, 200)); // Unix 2_700: interval 2
        s.observe(&ev(E, 1, 0x100, 400)); // Unix 2_900
        s.observe(&ev(X, 1, 0x100, 600)); // Unix 3_100: interval 3
        let done = s.take_finished(10_000, 0, false);
        let starts: Vec<u64> = done.iter().map(|i| i.start_unix_ns).collect();
        assert_eq!(starts, [2_000, 3_000]);
        assert_eq!(values(&s, &done[1], &[1]).wall_ns, 200);
    }

    #[test]
    fn frames_an_exception_left_end_at_the_catch_as_the_recorder_ends_them() {
        let mut s = CallStacks::new(1_000_000, 0);
        s.observe(&ev(E, 1, 0x100, 0));
        s.observe(&ev(E, 2, 0x0f0, 10));
        s.observe(&ev(E, 3, 0x0e0, 20));
        // An exception from 3 caught in 1: frames 2 and 3 are gone at the catch (sp 0x0f8).
        s.observe(&ev(event_kind::CATCH, 0, 0x0f8, 30));
        s.observe(&ev(X, 1, 0x100, 40));
        let done = s.take_finished(0, 0, true);
        let i = &done[0];
        assert_eq!(
            values(&s, i, &[3, 2, 1]),
            StackValues {
                calls: 1,
                wall_ns: 10,
                self_ns: 10
            }
        );
        assert_eq!(
            values(&s, i, &[2, 1]),
            StackValues {
                calls: 1,
                wall_ns: 20,
                self_ns: 10
            }
        );
        assert_eq!(
            values(&s, i, &[1]),
            StackValues {
                calls: 1,
                wall_ns: 40,
                self_ns: 20
            }
        );
    }

    #[test]
    fn a_frame_on_another_stack_is_not_taken_for_gone() {
        let mut s = CallStacks::new(1_000_000, 0);
        s.observe(&ev(E, 1, 0x10_0000, 0));
        // A signal handler on an alternate stack far above: its stack pointer is above 1's
        // slot, but 1 stays open.
        s.observe(&ev(E, 2, 0x7000_0000_0000, 10));
        s.observe(&ev(X, 2, 0x7000_0000_0000, 20));
        s.observe(&ev(X, 1, 0x10_0000, 30));
        let done = s.take_finished(0, 0, true);
        assert_eq!(values(&s, &done[0], &[1]).wall_ns, 30);
        assert_eq!(values(&s, &done[0], &[2, 1]).calls, 1);
    }

    #[test]
    fn memory_is_bounded_and_what_is_not_kept_is_counted() {
        let mut s = CallStacks::new(1_000_000, 0);
        for depth in 0..(MAX_OPEN as u64 + 10) {
            s.observe(&ev(E, 1, 0x100_0000 - depth * 16, depth));
        }
        assert_eq!(s.calls_not_kept, 10);
        assert_eq!(s.open[&5].len(), MAX_OPEN);
        s.observe(&ev(event_kind::THREAD_EXIT, 0, 0, 0));
        assert!(s.open.is_empty());
    }
}
