//! What `fdr-profiled top` shows while a recording or the service runs: each function's calls
//! and their latencies, counted as they end, and the rates and percentiles of the last seconds.
//!
//! The producer (a recording's threads' totals, the service's matched calls) keeps running
//! sums: each function's calls, their total time and a histogram of their durations. A
//! [`LiveView`] is those sums at one moment, named; the viewer keeps a few of them and shows
//! the difference between the newest and one some seconds older ([`window`]): calls per
//! second, mean and p99 over exactly those seconds, with no per-second state in the producer.
pub use super::latencies::Latencies;
use super::thread::{slot_at_or_below, slot_below};
use profiler_common::{event_kind, EventHeader, SledKind};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// One function's calls so far.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LiveFunction {
    /// What the row says before the name: the service's target, empty in a recording.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    pub name: String,
    /// Calls ended (returned, or proven gone).
    pub calls: u64,
    /// Their durations' sum, ns.
    pub total_ns: u64,
    pub latencies: Latencies,
}

impl LiveFunction {
    /// A call of `ns` ended.
    #[inline]
    pub fn ended(&mut self, ns: u64) {
        self.calls += 1;
        self.total_ns = self.total_ns.saturating_add(ns);
        self.latencies.add(ns);
    }
}

/// A recording's or the service's sums at one moment: what `top` is sent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LiveView {
    /// When (CLOCK_MONOTONIC ns of the producer's host).
    pub at_ns: u64,
    /// Events received so far, and events the kernel lost.
    pub events: u64,
    pub lost: u64,
    pub functions: Vec<LiveFunction>,
}

/// One function's row over a window.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub group: String,
    pub name: String,
    pub calls: u64,
    pub calls_per_s: f64,
    /// Time in its calls per second of the window (inclusive: nested calls of a recursive
    /// function count at every level, so it can pass 1.0 even in one thread).
    pub busy: f64,
    pub mean_ns: u64,
    pub p99_ns: u64,
}

/// What happened between `before` and `now`: rows of the functions called in it, events and
/// losses per second, and the window's length in seconds.
pub struct Window {
    pub seconds: f64,
    pub events_per_s: f64,
    pub lost: u64,
    pub rows: Vec<Row>,
}

/// The window between two views of the same producer (`before` may be empty: since the start).
pub fn window(before: &LiveView, now: &LiveView) -> Window {
    let seconds = (now.at_ns.saturating_sub(before.at_ns) as f64 / 1e9).max(1e-3);
    let earlier: HashMap<(&str, &str), &LiveFunction> = (before.functions.iter())
        .map(|f| ((f.group.as_str(), f.name.as_str()), f))
        .collect();
    let rows = (now.functions.iter())
        .filter_map(|f| {
            let then = earlier.get(&(f.group.as_str(), f.name.as_str()));
            let calls = f.calls.saturating_sub(then.map_or(0, |t| t.calls));
            if calls == 0 {
                return None;
            }
            let total = f.total_ns.saturating_sub(then.map_or(0, |t| t.total_ns));
            let latencies = match then {
                Some(t) => f.latencies.since(&t.latencies),
                None => f.latencies.clone(),
            };
            Some(Row {
                group: f.group.clone(),
                name: f.name.clone(),
                calls,
                calls_per_s: calls as f64 / seconds,
                busy: total as f64 / 1e9 / seconds,
                mean_ns: total / calls,
                p99_ns: latencies.quantile(0.99).unwrap_or(0),
            })
        })
        .collect();
    Window {
        seconds,
        events_per_s: now.events.saturating_sub(before.events) as f64 / seconds,
        lost: now.lost.saturating_sub(before.lost),
        rows,
    }
}

/// Deepest stack of open calls kept per thread (bounded memory).
const MAX_OPEN: usize = 4096;

/// A call that ended, matched to its entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndedCall {
    pub function_id: u32,
    pub tid: u32,
    pub pid: u32,
    pub duration_ns: u64,
}

/// Each thread's open calls, matched to their exits by stack slot as the session's files
/// match them (`session::thread`), for those who see events without writing them (the
/// service's slow-call trigger and live view). Calls left by an exception or `longjmp` are
/// forgotten where an event proves them gone, not reported.
#[derive(Debug, Default)]
pub struct CallMatcher {
    /// The functions whose calls are matched; `None`: all.
    functions: Option<HashSet<u32>>,
    /// By thread: (function id, slot, entry time), innermost last.
    open: HashMap<u32, Vec<(u32, u64, u64)>>,
}

impl CallMatcher {
    /// Matches the calls of `functions` (trace ids), or of all with `None`.
    pub fn new(functions: Option<HashSet<u32>>) -> CallMatcher {
        CallMatcher {
            functions,
            open: HashMap::new(),
        }
    }

    /// Matches the calls of `functions` too (those of a library found later).
    pub fn watch_more(&mut self, functions: impl IntoIterator<Item = u32>) {
        if let Some(chosen) = &mut self.functions {
            chosen.extend(functions);
        }
    }

    /// Takes a thread's next event (in program order); returns the call it ends, if one.
    pub fn observe(&mut self, h: &EventHeader) -> Option<EndedCall> {
        let sp = h.sp;
        // The session's rule for a frame gone (see `slot_below`).
        let gone = |slot: u64| slot_at_or_below(slot, sp);
        let below = |slot: u64| slot_below(slot, sp);
        if h.kind == event_kind::THREAD_EXIT {
            self.open.remove(&h.tid);
            return None;
        }
        if h.kind == event_kind::CATCH {
            // Frames at or below the catch's stack pointer were unwound.
            if let Some(open) = self.open.get_mut(&h.tid) {
                open.retain(|&(_, slot, _)| !gone(slot));
            }
            return None;
        }
        match SledKind::from_u8(h.kind)? {
            SledKind::Entry | SledKind::LogArgsEntry
                if self
                    .functions
                    .as_ref()
                    .is_none_or(|f| f.contains(&h.function_id)) =>
            {
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
                        Some(EndedCall {
                            function_id,
                            tid: h.tid,
                            pid: h.pid,
                            duration_ns: h.ts_ns.saturating_sub(entered),
                        })
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

/// Tests: an event of thread 5 of process 5.
#[cfg(test)]
pub fn test_event(kind: u8, function_id: u32, sp: u64, ts_ns: u64) -> EventHeader {
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

#[cfg(test)]
mod tests {
    use super::*;

    use super::test_event as ev;

    #[test]
    fn p99_is_the_slowest_hundredth_and_windows_subtract() {
        let mut f = LiveFunction::default();
        for _ in 0..990 {
            f.ended(100);
        }
        for _ in 0..10 {
            f.ended(1_000_000);
        }
        let before = LiveView {
            at_ns: 0,
            events: 0,
            lost: 0,
            functions: vec![f.clone()],
        };
        assert!((f.latencies.quantile(0.99).unwrap() as i64 - 100).abs() <= 12);
        assert!(f.latencies.quantile(0.999).unwrap() > 900_000);
        // Two seconds later: 2,000 more calls, all of 5 µs.
        for _ in 0..2_000 {
            f.ended(5_000);
        }
        let now = LiveView {
            at_ns: 2_000_000_000,
            events: 4_000,
            lost: 3,
            functions: vec![f],
        };
        let w = window(&before, &now);
        assert_eq!(w.rows.len(), 1);
        let row = &w.rows[0];
        assert_eq!(
            (row.calls, row.calls_per_s, row.mean_ns),
            (2_000, 1_000.0, 5_000)
        );
        assert!(row.p99_ns.abs_diff(5_000) <= 5_000 / 8, "{}", row.p99_ns);
        assert_eq!((w.events_per_s, w.lost), (2_000.0, 3));
        // The wire keeps every count.
        let json = serde_json::to_string(&now).unwrap();
        assert_eq!(serde_json::from_str::<LiveView>(&json).unwrap(), now);
    }

    #[test]
    fn calls_are_matched_by_slot() {
        let mut m = CallMatcher::new(Some([7].into()));
        let (entry, exit) = (SledKind::Entry as u8, SledKind::Exit as u8);
        assert_eq!(m.observe(&ev(entry, 7, 0x1000, 0)), None);
        assert_eq!(m.observe(&ev(entry, 8, 0x0ff0, 10)), None, "not chosen");
        assert_eq!(m.observe(&ev(exit, 8, 0x0ff0, 20)), None);
        let call = m.observe(&ev(exit, 7, 0x1000, 1_500)).unwrap();
        assert_eq!((call.function_id, call.duration_ns), (7, 1_500));
        let mut all = CallMatcher::new(None);
        all.observe(&ev(entry, 8, 0x0ff0, 10));
        assert_eq!(
            all.observe(&ev(exit, 8, 0x0ff0, 25)).unwrap().duration_ns,
            15
        );
    }

    #[test]
    fn a_call_on_another_stack_does_not_end_an_open_one() {
        let mut m = CallMatcher::new(Some([7].into()));
        let (entry, exit) = (SledKind::Entry as u8, SledKind::Exit as u8);
        m.observe(&ev(entry, 7, 0x10_0000, 0));
        // A signal handler on an alternate stack far above calls 7 too: the stack pointer is
        // above the open call's slot, but on another stack.
        m.observe(&ev(entry, 7, 0x7000_0000_0000, 10));
        assert_eq!(
            m.observe(&ev(exit, 7, 0x7000_0000_0000, 20))
                .unwrap()
                .duration_ns,
            10
        );
        let call = m.observe(&ev(exit, 7, 0x10_0000, 5_000)).unwrap();
        assert_eq!(call.duration_ns, 5_000, "the outer call was still open");
    }

    #[test]
    fn unwound_calls_are_forgotten_not_reported() {
        let mut m = CallMatcher::new(None);
        m.observe(&ev(SledKind::Entry as u8, 7, 0x0f00, 0));
        // A catch above the frame: it was unwound.
        m.observe(&ev(event_kind::CATCH, 0, 0x0f10, 100));
        assert_eq!(m.observe(&ev(SledKind::Exit as u8, 7, 0x0f00, 200)), None);
        assert!(m.open[&5].is_empty());
    }
}
