//! What `fdr-profiled top` shows of the service: every routed call matched to its exit
//! ([`CallMatcher`]) and summed by function, for as long as someone asks. Matching costs the
//! event loop a lookup per event, so it starts at the first `top` request and stops when no
//! request came for [`IDLE`]: a service nobody watches pays nothing for it.
use super::targets::Target;
use crate::session::live::{CallMatcher, LiveFunction, LiveView};
use crate::session::monotonic_ns;
use profiler_common::EventHeader;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long matching goes on after the last request.
pub const IDLE: Duration = Duration::from_secs(30);

/// The calls of every target's binaries since the first request.
pub(super) struct LiveCalls {
    matcher: CallMatcher,
    /// By (target, binary, packed function id).
    functions: HashMap<(usize, usize, u32), LiveFunction>,
    asked: Instant,
}

impl LiveCalls {
    pub(super) fn new() -> LiveCalls {
        LiveCalls {
            matcher: CallMatcher::new(None),
            functions: HashMap::new(),
            asked: Instant::now(),
        }
    }

    /// An event of binary `b` of target `t`, its function id the binary's own (packed).
    #[inline]
    pub(super) fn observe(&mut self, t: usize, b: usize, h: &EventHeader) {
        if let Some(call) = self.matcher.observe(h) {
            (self.functions.entry((t, b, call.function_id)).or_default()).ended(call.duration_ns);
        }
    }

    /// Whether no one asked for a while.
    pub(super) fn idle(&self) -> bool {
        self.asked.elapsed() >= IDLE
    }

    /// The sums now, each function named as its binary names it, under its target's name.
    pub(super) fn view(&mut self, targets: &[Target], events: u64, lost: u64) -> LiveView {
        self.asked = Instant::now();
        let mut functions: Vec<LiveFunction> = (self.functions.iter())
            .filter_map(|(&(t, b, id), f)| {
                let target = targets.get(t)?;
                let binary = target.binaries.get(b)?;
                Some(LiveFunction {
                    group: target.config.name.clone(),
                    name: binary.function_name(id),
                    ..f.clone()
                })
            })
            .collect();
        functions.sort_by(|a, b| (&a.group, &a.name).cmp(&(&b.group, &b.name)));
        LiveView {
            at_ns: monotonic_ns(),
            events,
            lost,
            functions,
        }
    }
}
