//! The crash trigger: a traced process that dies of a signal (a fault, an abort, SIGKILL: the
//! exit code the kernel sets, read at each thread's end) gets a snapshot of its binary, whose
//! files end with its last calls. At most one per binary every `crash_snapshot_interval`: the
//! crashes of a crash loop in between are logged and covered by one snapshot written when the
//! interval is over (`<time>-<signal>-<pid>-<n>-crashes`), and counted.
use super::trigger::{Due, Trigger, Watch};
use profiler_common::{event_flags, event_kind, EventHeader};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Signals whose deaths trigger a snapshot: faults, aborts, and SIGKILL (the OOM killer's).
/// SIGTERM and SIGINT are how services are stopped, not crashes.
const CRASH_SIGNALS: &[(u32, &str)] = &[
    (4, "sigill"),
    (5, "sigtrap"),
    (6, "sigabrt"),
    (7, "sigbus"),
    (8, "sigfpe"),
    (9, "sigkill"),
    (11, "sigsegv"),
    (31, "sigsys"),
];

/// How long after a crash's first thread end its snapshot waits for the process's other
/// threads' last events (they die together, but their events may sit in other CPUs' buffers).
const CRASH_SETTLE: Duration = Duration::from_millis(100);

/// How long a crashed process is remembered, so that the ends of its other threads (each
/// with the same signal) count as the same crash.
const CRASH_REMEMBERED: Duration = Duration::from_secs(10);

/// The crashes of every watched binary.
#[derive(Debug, Default)]
pub struct Crashes {
    binaries: HashMap<u32, Binary>,
    /// Crashes seen, waiting [`CRASH_SETTLE`].
    settling: Vec<Crash>,
    /// Processes whose crash was seen, and when.
    crashed: HashMap<u32, Instant>,
}

/// One binary's crash snapshots.
#[derive(Debug)]
struct Binary {
    target: String,
    interval: Duration,
    /// When its last crash snapshot was due.
    last: Option<Instant>,
    /// The newest crash since, and how many crashes its snapshot is to cover.
    pending: Option<(Crash, u64)>,
    /// Crashes that got no snapshot of their own (covered by the next one).
    coalesced: u64,
}

/// A traced process that died of a signal.
#[derive(Clone, Copy, Debug)]
struct Crash {
    tag: u32,
    pid: u32,
    signal: u32,
    seen: Instant,
    /// When its thread ended (the kernel's clock): crashes seen in one drain come ring by
    /// ring, not in the order they happened.
    ts_ns: u64,
}

/// The name of a crash's signal in logs and snapshot names (`sigsegv`).
fn signal_name(signal: u32) -> &'static str {
    CRASH_SIGNALS
        .iter()
        .find(|(s, _)| *s == signal)
        .map_or("signal", |(_, n)| n)
}

impl Binary {
    /// The snapshot of `crash`, the newest of `covered`, due now.
    fn write(&mut self, crash: &Crash, covered: u64) -> Due {
        self.last = Some(Instant::now());
        let mut name = format!("{}-{}", signal_name(crash.signal), crash.pid);
        if covered > 1 {
            name.push_str(&format!("-{covered}-crashes"));
        }
        Due {
            tag: crash.tag,
            trigger: "crash",
            name,
        }
    }
}

impl Trigger for Crashes {
    fn watch(&mut self, binary: &Watch<'_>) {
        self.binaries.insert(
            binary.tag,
            Binary {
                target: binary.config.name.clone(),
                interval: binary.config.crash_snapshot_interval,
                last: None,
                pending: None,
                coalesced: 0,
            },
        );
    }

    fn forget(&mut self, tag: u32) {
        self.binaries.remove(&tag);
        self.settling.retain(|c| c.tag != tag);
    }

    fn observe(&mut self, tag: u32, h: &EventHeader) {
        if h.kind != event_kind::THREAD_EXIT || h.flags & event_flags::EXIT_CODE == 0 {
            return;
        }
        let signal = h.function_id & 0x7f;
        if !CRASH_SIGNALS.iter().any(|(s, _)| *s == signal) || !self.binaries.contains_key(&tag) {
            return;
        }
        let now = Instant::now();
        self.crashed
            .retain(|_, seen| now.duration_since(*seen) < CRASH_REMEMBERED);
        if self.crashed.insert(h.pid, now).is_none() {
            self.settling.push(Crash {
                tag,
                pid: h.pid,
                signal,
                seen: now,
                ts_ns: h.ts_ns,
            });
        }
    }

    fn due(&mut self, all: bool) -> Vec<Due> {
        let (ready, waiting): (Vec<Crash>, Vec<Crash>) = self
            .settling
            .drain(..)
            .partition(|c| all || c.seen.elapsed() >= CRASH_SETTLE);
        self.settling = waiting;
        let mut due = Vec::new();
        for crash in ready {
            let Some(b) = self.binaries.get_mut(&crash.tag) else {
                continue;
            };
            let name = signal_name(crash.signal).to_uppercase();
            tracing::info!(
                fdr_target = %b.target,
                fdr_pid = crash.pid,
                fdr_signal = name,
                "target {}: process {} died of {name}",
                b.target,
                crash.pid,
            );
            if b.last.is_some_and(|at| at.elapsed() < b.interval) {
                let covered = b.pending.as_ref().map_or(0, |(_, n)| *n) + 1;
                if covered > 1 {
                    b.coalesced += 1;
                } else {
                    tracing::info!(
                        fdr_target = %b.target,
                        "target {}: the snapshot of this crash, and of those until then, is written {:.1} s from now (crash_snapshot_interval = {:?})",
                        b.target,
                        b.interval
                            .saturating_sub(b.last.map_or(Duration::ZERO, |at| at.elapsed()))
                            .as_secs_f64(),
                        b.interval
                    );
                }
                // The snapshot is named after the newest crash it covers.
                let newest = match b.pending {
                    Some((pending, _)) if pending.ts_ns > crash.ts_ns => pending,
                    _ => crash,
                };
                b.pending = Some((newest, covered));
                continue;
            }
            due.push(b.write(&crash, 1));
        }
        for b in self.binaries.values_mut() {
            if !(all || b.last.is_none_or(|at| at.elapsed() >= b.interval)) {
                continue;
            }
            if let Some((crash, covered)) = b.pending.take() {
                due.push(b.write(&crash, covered));
            }
        }
        due
    }

    fn status(&self, tag: u32, out: &mut serde_json::Map<String, serde_json::Value>) {
        if let Some(b) = self.binaries.get(&tag) {
            out.insert("crash_snapshots_coalesced".into(), b.coalesced.into());
            out.insert(
                "crash_snapshot_pending".into(),
                b.pending
                    .as_ref()
                    .map_or(serde_json::Value::Null, |(_, n)| (*n).into()),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segfault(pid: u32, ts_ns: u64) -> EventHeader {
        EventHeader {
            kind: event_kind::THREAD_EXIT,
            flags: event_flags::EXIT_CODE,
            function_id: 11,
            pid,
            tid: pid,
            ts_ns,
            ..EventHeader::default()
        }
    }

    /// A crash loop's snapshot is named after its newest crash, whatever order the crashes'
    /// ends were drained in (ring by ring, not by time).
    #[test]
    fn a_coalesced_snapshot_names_the_newest_crash() {
        let mut crashes = Crashes::default();
        crashes.binaries.insert(
            1,
            Binary {
                target: "t".into(),
                interval: Duration::from_secs(3600),
                last: None,
                pending: None,
                coalesced: 0,
            },
        );
        crashes.observe(1, &segfault(100, 10));
        let names = |due: Vec<Due>| due.into_iter().map(|d| d.name).collect::<Vec<_>>();
        assert_eq!(names(crashes.due(true)), ["sigsegv-100"]);
        // Within the interval: covered by one snapshot, the newest crash drained first.
        crashes.observe(1, &segfault(300, 30));
        crashes.observe(1, &segfault(200, 20));
        assert_eq!(names(crashes.due(true)), ["sigsegv-300-2-crashes"]);
    }
}
