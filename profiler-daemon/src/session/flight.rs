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
use profiler_common::{event_kind, EventHeader, MAX_ARGS};
use std::collections::{BTreeMap, VecDeque};
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

/// What the recorder holds and has let go of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FlightStats {
    /// The window asked for, in nanoseconds.
    pub window_ns: u64,
    /// Threads with events held.
    pub threads: usize,
    /// Events held.
    pub events: u64,
    /// Bytes they take.
    pub bytes: u64,
    /// Events that aged out of the window (the normal course).
    pub expired: u64,
    /// Events dropped before they aged out, to stay under the memory cap: a snapshot covers
    /// less than the window while this grows.
    pub evicted: u64,
}

/// The recent events of every thread, by (pid, tid).
#[derive(Debug)]
pub struct FlightRecorder {
    window_ns: u64,
    max_bytes: u64,
    threads: BTreeMap<(u32, u32), VecDeque<Held>>,
    bytes: u64,
    events: u64,
    newest_ns: u64,
    expired: u64,
    evicted: u64,
}

impl FlightRecorder {
    /// Keeps at least `window` of every thread's events, within `max_bytes`.
    pub fn new(window: Duration, max_bytes: u64) -> FlightRecorder {
        FlightRecorder {
            window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            max_bytes,
            threads: BTreeMap::new(),
            bytes: 0,
            events: 0,
            newest_ns: 0,
            expired: 0,
            evicted: 0,
        }
    }

    /// Holds a thread's next event (in its program order); `gap` says how many of its events
    /// were lost right before it. A thread's end is held too (a snapshot then closes its file),
    /// and its events stay until they age out: a process that crashed keeps its last calls.
    pub fn push(&mut self, event: &Event, gap: Option<Gap>) {
        let h = &event.header;
        let held = Held::of(event, gap);
        self.newest_ns = self.newest_ns.max(h.ts_ns);
        self.bytes += held.bytes();
        self.events += 1;
        let events = self.threads.entry((h.pid, h.tid)).or_default();
        events.push_back(held);
        // Amortized: this thread's front, every push; all threads in `expire`.
        let horizon = self.newest_ns.saturating_sub(self.window_ns);
        while events.front().is_some_and(|e| e.ts_ns < horizon) {
            let gone = events.pop_front().expect("a front");
            self.bytes -= gone.bytes();
            self.events -= 1;
            self.expired += 1;
        }
        if self.bytes > self.max_bytes {
            self.evict();
        }
    }

    /// Lets go of every event older than the window, in every thread (call it now and then:
    /// [`FlightRecorder::push`] only looks at the thread it adds to).
    pub fn expire(&mut self) {
        let horizon = self.newest_ns.saturating_sub(self.window_ns);
        let (mut bytes, mut events, mut expired) = (0, 0, 0);
        self.threads.retain(|_, held| {
            while held.front().is_some_and(|e| e.ts_ns < horizon) {
                let gone = held.pop_front().expect("a front");
                bytes += gone.bytes();
                events += 1;
                expired += 1;
            }
            !held.is_empty()
        });
        self.bytes -= bytes;
        self.events -= events;
        self.expired += expired;
    }

    /// Drops the oldest events of all threads until the recorder holds at most 7/8 of its cap
    /// (a batch, so that the scan for the oldest is not done for every event).
    fn evict(&mut self) {
        let target = self.max_bytes - self.max_bytes / 8;
        while self.bytes > target {
            let Some(oldest) = self
                .threads
                .iter()
                .filter_map(|(k, v)| Some((v.front()?.ts_ns, *k)))
                .min()
                .map(|(_, k)| k)
            else {
                break;
            };
            let held = self.threads.get_mut(&oldest).expect("the oldest thread");
            let gone = held.pop_front().expect("a front");
            self.bytes -= gone.bytes();
            self.events -= 1;
            self.evicted += 1;
            if held.is_empty() {
                self.threads.remove(&oldest);
            }
        }
    }

    /// What it holds now.
    pub fn stats(&self) -> FlightStats {
        FlightStats {
            window_ns: self.window_ns,
            threads: self.threads.len(),
            events: self.events,
            bytes: self.bytes,
            expired: self.expired,
            evicted: self.evicted,
        }
    }

    /// Every held event, thread by thread in program order, with its gap: what a snapshot
    /// writes. A thread whose end is held ends with it.
    pub fn replay(&self, mut to: impl FnMut(&Event, Option<Gap>)) {
        for (&(pid, tid), held) in &self.threads {
            for h in held {
                let (event, gap) = h.event(pid, tid);
                to(&event, gap);
            }
        }
    }

    /// Whether thread `tid` of `pid` has ended (its end is held).
    pub fn ended(&self, pid: u32, tid: u32) -> bool {
        self.threads
            .get(&(pid, tid))
            .and_then(|h| h.back())
            .is_some_and(|h| h.kind == event_kind::THREAD_EXIT)
    }
}

#[cfg(test)]
mod tests;
