//! The slow-call trigger (`trigger_slower_than` on `trigger_functions`): each watched thread's
//! open calls of the chosen functions, matched to their exits by stack slot as the session
//! matches them, so that a call longer than the threshold is seen the moment it returns. Every
//! slow call is logged; a binary gets at most one snapshot per window (a storm of slow calls
//! writes one, not thousands), named `slow-<function>`.
use super::trigger::{Due, Trigger, Watch};
use crate::plan::select::FunctionFilter;
use crate::plan::{AttachPlan, FunctionNames};
use crate::session::live::{CallMatcher, EndedCall};
use profiler_common::EventHeader;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// The slow calls of every watched binary whose target has a threshold.
#[derive(Debug, Default)]
pub struct SlowCalls {
    binaries: HashMap<u32, Binary>,
}

#[derive(Debug)]
struct Binary {
    target: String,
    /// Its target's window: at most one snapshot per window.
    window: Duration,
    /// `trigger_functions`.
    chosen: FunctionFilter,
    /// The names of its functions (its executable's and its libraries').
    names: FunctionNames,
    calls: OpenCalls,
    /// When its last slow-call snapshot was due.
    last: Option<Instant>,
    /// The snapshot due, named after the slow function.
    due: Option<String>,
}

impl SlowCalls {
    fn chosen_ids(chosen: &FunctionFilter, plan: &AttachPlan) -> Vec<u32> {
        plan.probes
            .iter()
            .map(|p| p.cookie.function_id)
            .filter(|&id| chosen.selects(&plan.names.name(id)))
            .collect()
    }
}

impl Trigger for SlowCalls {
    fn watch(&mut self, binary: &Watch<'_>) {
        let Some(threshold) = binary.config.trigger_slower_than else {
            return;
        };
        let chosen = FunctionFilter::new(&binary.config.trigger_functions, &[])
            .expect("patterns checked with the configuration");
        let ids = SlowCalls::chosen_ids(&chosen, binary.plan);
        self.binaries.insert(
            binary.tag,
            Binary {
                target: binary.config.name.clone(),
                window: binary.config.window,
                names: binary.plan.names.clone(),
                calls: OpenCalls::new(
                    u64::try_from(threshold.as_nanos()).unwrap_or(u64::MAX),
                    ids.into_iter().collect(),
                ),
                chosen,
                last: None,
                due: None,
            },
        );
    }

    fn watch_object(&mut self, tag: u32, plan: &AttachPlan) {
        if let Some(b) = self.binaries.get_mut(&tag) {
            b.calls.watch_more(SlowCalls::chosen_ids(&b.chosen, plan));
            b.names.extend(plan.names.clone());
        }
    }

    fn forget(&mut self, tag: u32) {
        self.binaries.remove(&tag);
    }

    fn observe(&mut self, tag: u32, event: &EventHeader) {
        let Some(b) = self.binaries.get_mut(&tag) else {
            return;
        };
        let Some(slow) = b.calls.observe(event) else {
            return;
        };
        let name = b.names.name(slow.function_id);
        tracing::info!(
            fdr_target = %b.target,
            fdr_function = %name,
            fdr_duration_ns = slow.duration_ns,
            fdr_pid = slow.pid,
            fdr_tid = slow.tid,
            "target {}: {name} took {:.3} ms in thread {} of process {}",
            b.target,
            slow.duration_ns as f64 / 1e6,
            slow.tid,
            slow.pid
        );
        if b.last.is_some_and(|at| at.elapsed() < b.window) {
            return;
        }
        b.last = Some(Instant::now());
        let short: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .take(48)
            .collect();
        b.due = Some(format!("slow-{short}"));
    }

    fn due(&mut self, _all: bool) -> Vec<Due> {
        self.binaries
            .iter_mut()
            .filter_map(|(&tag, b)| {
                Some(Due {
                    tag,
                    trigger: "slow",
                    name: b.due.take()?,
                })
            })
            .collect()
    }
}

/// The chosen functions' calls, matched to their exits, and the threshold of a slow one.
#[derive(Debug)]
pub struct OpenCalls {
    threshold_ns: u64,
    matcher: CallMatcher,
}

impl OpenCalls {
    /// Watches `functions` (trace ids) for calls of at least `threshold_ns`.
    pub fn new(threshold_ns: u64, functions: HashSet<u32>) -> OpenCalls {
        OpenCalls {
            threshold_ns,
            matcher: CallMatcher::new(Some(functions)),
        }
    }

    /// Watches `functions` too (those of a library found later).
    pub fn watch_more(&mut self, functions: impl IntoIterator<Item = u32>) {
        self.matcher.watch_more(functions);
    }

    /// Takes a thread's next event (in program order, its function id without the service's
    /// tag); returns the call it ends when that call was slow.
    pub fn observe(&mut self, h: &EventHeader) -> Option<EndedCall> {
        self.matcher
            .observe(h)
            .filter(|call| call.duration_ns >= self.threshold_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::SledKind;

    use crate::session::live::test_event as ev;

    #[test]
    fn a_chosen_call_over_the_threshold_is_reported_when_it_returns() {
        let mut w = OpenCalls::new(1_000, [7].into());
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
}
