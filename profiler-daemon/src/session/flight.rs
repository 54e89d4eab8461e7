//! The flight recorder: the most recent stretch of every thread's events, held in memory
//! instead of written, so that a snapshot can write exactly that stretch as complete FDR files
//! when something goes wrong, without gigabytes of traces nobody reads.
//!
//! Events arrive in each thread's program order (after [`crate::session::order`]). Each thread
//! keeps its events of the last `window` (measured against the newest event of the whole
//! recorder, so an idle thread's old calls age out too) in a compact form, about 40 bytes a
//! function event. Memory is also capped: past `max_bytes` the oldest events of all threads go
//! first, and are counted (`evicted`), so a snapshot then covers less than the window and
//! says so. A snapshot replays every thread's window, in order, into a fresh
//! [`Session`](crate::session::Session): its files are written exactly like a recording's, the
//! exits of calls entered before the window are dropped and counted as exits without entry, and
//! frames unwound inside the window are closed where they were.
use crate::kernel::intake::{Event, EventData};
use crate::session::order::Gap;
pub use fdr_session::schema::{FlightStats, ThreadWindow};
use profiler_common::{event_kind, EventHeader, MAX_ARGS};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

/// One event as held: what a snapshot needs to write it again.
#[derive(Clone, Debug)]
struct Held {
    ts_ns: u64,
    sp: u64,
    function_id: u32,
    kind: u8,
    flags: u8,
    cpu: u16,
    /// Events lost right before this one (the thread's gap).
    gap_lost: u32,
    /// Arguments and payloads, rare: boxed so that plain events stay small.
    extra: Option<Box<Extra>>,
}

#[derive(Clone, Debug)]
struct Extra {
    args: [u64; MAX_ARGS],
    nargs: usize,
    data: Option<Box<EventData>>,
}

impl Held {
    fn of(event: &Event, gap: Option<Gap>) -> Held {
        let h = &event.header;
        let extra = (event.nargs > 0 || event.data.is_some()).then(|| {
            Box::new(Extra {
                args: event.args,
                nargs: event.nargs,
                data: event.data.clone(),
            })
        });
        Held {
            ts_ns: h.ts_ns,
            sp: h.sp,
            function_id: h.function_id,
            kind: h.kind,
            flags: h.flags,
            cpu: h.cpu,
            gap_lost: gap.map_or(0, |g| u32::try_from(g.lost).unwrap_or(u32::MAX)),
            extra,
        }
    }

    /// Memory it holds, for the cap.
    fn bytes(&self) -> u64 {
        let extra = self.extra.as_ref().map_or(0, |e| {
            std::mem::size_of::<Extra>()
                + e.data
                    .as_ref()
                    .map_or(0, |d| std::mem::size_of::<EventData>() + d.bytes.len())
        });
        (std::mem::size_of::<Held>() + extra) as u64
    }

    fn event(&self, pid: u32, tid: u32) -> (Event, Option<Gap>) {
        let (args, nargs, data) = match &self.extra {
            Some(e) => (e.args, e.nargs, e.data.clone()),
            None => ([0; MAX_ARGS], 0, None),
        };
        let event = Event {
            header: EventHeader {
                ts_ns: self.ts_ns,
                seq: 0,
                pid,
                tid,
                function_id: self.function_id,
                kind: self.kind,
                flags: self.flags,
                cpu: self.cpu,
                gap_lost: 0,
                payload_len: 0,
                sp: self.sp,
            },
            args,
            nargs,
            data,
        };
        let gap = (self.gap_lost > 0).then_some(Gap {
            lost: u64::from(self.gap_lost),
        });
        (event, gap)
    }
}

/// One thread's events as held, and what it let go of before the first of them. A thread
/// still running is remembered when it holds nothing (its counts go on); one that ended is
/// forgotten with its last event.
#[derive(Debug, Default)]
struct Thread {
    held: VecDeque<Held>,
    /// Its events that aged out, and that were evicted.
    expired: u64,
    evicted: u64,
}

/// Memory a held thread takes besides its events: its entry in the map and in the index of
/// the oldest events, its queue's header.
const THREAD_BYTES: u64 = (std::mem::size_of::<Thread>() + 96) as u64;

/// Why events are let go.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Why {
    Expired,
    Evicted,
}

/// The recent events of every thread, by (pid, tid).
#[derive(Debug)]
pub struct FlightRecorder {
    window_ns: u64,
    max_bytes: u64,
    threads: BTreeMap<(u32, u32), Thread>,
    /// The oldest held event of each thread, oldest first: eviction takes the first, in
    /// logarithmic time whatever the number of threads (30,000 short threads once made a scan
    /// per evicted event slow enough for the kernel's buffers to overflow).
    oldest: BTreeSet<(u64, (u32, u32))>,
    bytes: u64,
    /// Events held, and threads' ends held (not events: see [`FlightStats::events`]).
    events: u64,
    thread_ends: u64,
    newest_ns: u64,
    stats: FlightStats,
}

impl FlightRecorder {
    /// Keeps at least `window` of every thread's events, within `max_bytes`.
    pub fn new(window: Duration, max_bytes: u64) -> FlightRecorder {
        FlightRecorder {
            window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            max_bytes,
            threads: BTreeMap::new(),
            oldest: BTreeSet::new(),
            bytes: 0,
            events: 0,
            thread_ends: 0,
            newest_ns: 0,
            stats: FlightStats::default(),
        }
    }

    /// Holds a thread's next event (in its program order); `gap` says how many of its events
    /// were lost right before it. A thread's end is held too (a snapshot then closes its file),
    /// and its events stay until they age out: a process that crashed keeps its last calls.
    pub fn push(&mut self, event: &Event, gap: Option<Gap>) {
        let h = &event.header;
        let key = (h.pid, h.tid);
        let held = Held::of(event, gap);
        self.newest_ns = self.newest_ns.max(h.ts_ns);
        self.stats.seen += 1;
        self.stats.lost += gap.map_or(0, |g| g.lost);
        self.bytes += held.bytes();
        // A thread's end is held (it closes the thread's file in a snapshot) but is not an
        // event, as a session does not count it one: the events held are a snapshot's events.
        if h.kind == event_kind::THREAD_EXIT {
            self.thread_ends += 1;
        } else {
            self.events += 1;
        }
        let thread = match self.threads.entry(key) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                self.bytes += THREAD_BYTES;
                v.insert(Thread::default())
            }
        };
        if thread.held.is_empty() {
            self.oldest.insert((held.ts_ns, key));
        }
        thread.held.push_back(held);
        // Amortized: this thread's front, every push; all threads in `expire`.
        let horizon = self.newest_ns.saturating_sub(self.window_ns);
        if thread.held.front().is_some_and(|e| e.ts_ns < horizon) {
            self.let_go(key, |e| e.ts_ns < horizon, Why::Expired);
        }
        if self.bytes > self.max_bytes {
            self.evict();
        }
    }

    /// Lets go of the front events of thread `key` while `go` says so, counted as `why`; the
    /// thread itself goes once it holds nothing. Keeps the index of oldest events right.
    fn let_go(&mut self, key: (u32, u32), mut go: impl FnMut(&Held) -> bool, why: Why) -> u64 {
        let Some(thread) = self.threads.get_mut(&key) else {
            return 0;
        };
        let Some(front) = thread.held.front().map(|e| e.ts_ns) else {
            return 0;
        };
        // What is let go, and the thread's end among it.
        let mut gone = 0;
        let mut ended = false;
        while let Some(e) = thread.held.front() {
            if !go(e) {
                break;
            }
            self.bytes -= e.bytes();
            ended = e.kind == event_kind::THREAD_EXIT;
            thread.held.pop_front();
            gone += 1;
        }
        if gone == 0 {
            return 0;
        }
        self.events -= gone - u64::from(ended);
        self.thread_ends -= u64::from(ended);
        match why {
            Why::Expired => {
                thread.expired += gone;
                self.stats.expired += gone;
            }
            Why::Evicted => {
                thread.evicted += gone;
                self.stats.evicted += gone;
            }
        }
        self.oldest.remove(&(front, key));
        match thread.held.front() {
            Some(next) => {
                self.oldest.insert((next.ts_ns, key));
                // A queue that held a burst gives its memory back once mostly empty.
                let (len, cap) = (thread.held.len(), thread.held.capacity());
                if cap > 64 && len * 4 < cap {
                    thread.held.shrink_to(len * 2);
                }
            }
            // A thread that ended is forgotten with its last event; one still running keeps
            // its counts (and its bookkeeping's bytes) for the events it has yet to make.
            None if ended => {
                self.threads.remove(&key);
                self.bytes -= THREAD_BYTES;
                match why {
                    Why::Expired => self.stats.threads_expired += 1,
                    Why::Evicted => self.stats.threads_evicted += 1,
                }
            }
            None => {}
        }
        gone
    }

    /// Lets go of every event older than the window, in every thread (call it now and then:
    /// [`FlightRecorder::push`] only looks at the thread it adds to).
    pub fn expire(&mut self) {
        let horizon = self.newest_ns.saturating_sub(self.window_ns);
        // The index is ordered by oldest event: the threads with something to let go come first.
        while let Some(&(ts, key)) = self.oldest.first() {
            if ts >= horizon {
                break;
            }
            self.let_go(key, |e| e.ts_ns < horizon, Why::Expired);
        }
    }

    /// Drops the oldest events of all threads until the recorder holds at most 7/8 of its cap
    /// (a batch, so that eviction does not run again at the next event).
    fn evict(&mut self) {
        let target = self.max_bytes - self.max_bytes / 8;
        while self.bytes > target {
            let Some(&(_, key)) = self.oldest.first() else {
                break;
            };
            // This thread's oldest events up to the next thread's oldest go together.
            let next = self.oldest.iter().nth(1).map_or(u64::MAX, |&(ts, _)| ts);
            let mut first = true;
            let over = self.bytes - target;
            let mut freed = 0;
            self.let_go(
                key,
                |e| {
                    let go = first || (e.ts_ns <= next && freed < over);
                    first = false;
                    freed += e.bytes();
                    go
                },
                Why::Evicted,
            );
        }
    }

    /// What it holds now.
    pub fn stats(&self) -> FlightStats {
        FlightStats {
            window_ns: self.window_ns,
            // One index entry per thread that holds events.
            threads: self.oldest.len(),
            events: self.events,
            thread_ends: self.thread_ends,
            bytes: self.bytes,
            ..self.stats
        }
    }

    /// Every held event, thread by thread in program order, with its gap: what a snapshot
    /// writes. A thread whose end is held ends with it.
    pub fn replay(&self, mut to: impl FnMut(&Event, Option<Gap>)) {
        for (&(pid, tid), thread) in &self.threads {
            for h in &thread.held {
                let (event, gap) = h.event(pid, tid);
                to(&event, gap);
            }
        }
    }

    /// What each held thread let go of before its first held event, by thread id.
    pub fn thread_windows(&self) -> BTreeMap<u32, ThreadWindow> {
        self.threads
            .iter()
            .filter(|(_, t)| !t.held.is_empty())
            .map(|(&(_, tid), t)| {
                (
                    tid,
                    ThreadWindow {
                        expired: t.expired,
                        evicted: t.evicted,
                    },
                )
            })
            .collect()
    }

    /// Whether thread `tid` of `pid` has ended (its end is held).
    pub fn ended(&self, pid: u32, tid: u32) -> bool {
        self.threads
            .get(&(pid, tid))
            .and_then(|t| t.held.back())
            .is_some_and(|h| h.kind == event_kind::THREAD_EXIT)
    }
}

#[cfg(test)]
mod tests;
