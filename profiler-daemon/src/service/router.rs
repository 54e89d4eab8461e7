//! Where each event goes: the binary (and the object of it) its tag names, its function id made
//! that object's own XRay id; a thread's end and its catches go where the thread's last event
//! went. A flight-recorder binary's triggers see every event of it.
use super::live::LiveCalls;
use super::targets::Target;
use crate::kernel::intake::Event;
use crate::service::libraries::{self, TAG_SHIFT};
use crate::service::triggers::Triggers;
use crate::session::order::Gap;
use std::collections::HashMap;

/// Where each event goes.
#[derive(Default)]
pub(super) struct Router {
    /// By tag: the (target, binary, object id) it marks.
    pub(super) of_tag: HashMap<u32, (usize, usize, u32)>,
    /// By thread: the tag of its last function event, and its pid.
    pub(super) of_tid: HashMap<u32, (u32, u32)>,
    /// Events of no known binary (never expected).
    pub(super) unrouted: u64,
    /// Events routed, and events the kernel lost (the threads' gaps).
    pub(super) events: u64,
    pub(super) lost: u64,
    /// (target, binary, pid) of the processes whose threads were seen for the first time
    /// since the last drain: their libraries are looked at (see [`look_at_processes`]).
    pub(super) new_processes: Vec<(usize, usize, u32)>,
    /// Every call matched and summed while `top` asks (see [`LiveCalls`]).
    live: Option<LiveCalls>,
}

impl Router {
    pub(super) fn new(targets: &[Target]) -> Router {
        let mut router = Router::default();
        router.retarget(targets);
        router
    }

    /// Where each tag goes now (after a reload added or removed targets).
    pub(super) fn retarget(&mut self, targets: &[Target]) {
        self.of_tag.clear();
        // Its sums are by target and binary index, which a reload changes.
        self.live = None;
        for (t, target) in targets.iter().enumerate() {
            for (b, w) in target.binaries.iter().enumerate() {
                self.of_tag.insert(w.tag, (t, b, 0));
                for library in &w.libraries.objects {
                    self.of_tag.insert(library.tag, (t, b, library.object_id));
                }
            }
        }
    }

    /// Routes an event to its binary's recorder (or segment, or export), its function id
    /// made the binary's own; the triggers of a flight-recorder binary see it too.
    pub(super) fn route(
        &mut self,
        targets: &mut [Target],
        triggers: &mut Triggers,
        event: &mut Event,
        gap: Option<Gap>,
    ) {
        self.lost += gap.map_or(0, |g| g.lost);
        let h = &mut event.header;
        let sled = profiler_common::SledKind::from_u8(h.kind);
        let function_event = sled.is_some();
        // A call's entry, for its function's count: (object id, function id).
        let mut entered = None;
        let thread_end = h.kind == profiler_common::event_kind::THREAD_EXIT;
        let (t, b) = if function_event {
            let tag = h.function_id >> TAG_SHIFT;
            let Some(&(t, b, object_id)) = self.of_tag.get(&tag) else {
                self.unrouted += 1;
                return;
            };
            let function_id = libraries::untagged(h.function_id);
            if sled.is_some_and(profiler_common::SledKind::is_entry) {
                entered = Some((object_id, function_id));
            }
            h.function_id = crate::plan::packed_id(object_id, function_id);
            if self.of_tid.insert(h.tid, (tag, h.pid)).is_none()
                && !self.new_processes.contains(&(t, b, h.pid))
            {
                self.new_processes.push((t, b, h.pid));
            }
            (t, b)
        } else {
            let Some((t, b, pid)) = self.of_tid.get(&h.tid).and_then(|&(tag, pid)| {
                let &(t, b, _) = self.of_tag.get(&tag)?;
                Some((t, b, pid))
            }) else {
                self.unrouted += 1;
                return;
            };
            if h.pid == 0 {
                h.pid = pid;
            }
            if thread_end {
                self.of_tid.remove(&h.tid);
            }
            (t, b)
        };
        // A thread's end is not an event (the recorders and sessions count it as none).
        self.events += u64::from(!thread_end);
        if let Some(live) = &mut self.live {
            live.observe(t, b, &event.header);
        }
        let w = &mut targets[t].binaries[b];
        if let Some((object_id, function_id)) = entered {
            w.calls.entered(object_id, function_id);
        }
        if let Some(export) = &mut w.export {
            export.stacks.observe(&event.header);
        }
        if let Some(segments) = &mut w.segments {
            segments.record(event, gap);
            return;
        }
        triggers.observe(w.tag, &event.header);
        w.recorder.push(event, gap);
    }

    /// The `top` request's answer: every call since the first request, by function; calls
    /// are matched from now on if they were not.
    pub(super) fn top(&mut self, targets: &[Target]) -> serde_json::Value {
        let (events, lost) = (self.events, self.lost);
        let live = self.live.get_or_insert_with(LiveCalls::new);
        serde_json::json!({ "top": live.view(targets, events, lost) })
    }

    /// Stops matching calls once no `top` asked for a while.
    pub(super) fn forget_live_if_idle(&mut self) {
        if self.live.as_ref().is_some_and(LiveCalls::idle) {
            self.live = None;
        }
    }
}
