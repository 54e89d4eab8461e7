//! What makes the service write a snapshot of a flight-recorder target's binary: SIGUSR1 and
//! `fdr-profiled snapshot` ([`on_demand`]), a process dying of a signal ([`crash`]), a call
//! slower than the target's threshold ([`slow`]).
//!
//! A trigger is a [`Trigger`]: it is told which binaries it watches (by their tag, with their
//! target's configuration), sees every event of theirs in each thread's program order, and
//! says which snapshots are due. The event loop writes them (`service::snapshot`) and knows
//! nothing of why. A new trigger is one new file and one line in `watching_triggers!` below.
use crate::plan::AttachPlan;
use profiler_common::EventHeader;

pub mod on_demand;
mod trigger;

/// Declares the triggers that watch events, one line each: `module::Type`, the file
/// `module.rs` of this folder holding `Type` (a [`Trigger`] and `Default`). The event loop
/// gets one of each, in this order.
macro_rules! watching_triggers {
    ($($module:ident::$trigger:ident),* $(,)?) => {
        $(pub mod $module;)*

        /// One of each trigger that watches events.
        fn watching() -> Vec<Box<dyn Trigger>> {
            vec![$(Box::new($module::$trigger::default())),*]
        }
    };
}

watching_triggers! {
    crash::Crashes,
    slow::SlowCalls,
}

pub use trigger::{Due, Trigger, Watch};

/// Every trigger of the service.
pub struct Triggers {
    /// SIGUSR1 and `fdr-profiled snapshot`: fired from outside.
    pub on_demand: on_demand::OnDemand,
    /// Those that watch the events.
    watching: Vec<Box<dyn Trigger>>,
}

impl Default for Triggers {
    fn default() -> Triggers {
        Triggers::new()
    }
}

impl Triggers {
    /// The service's triggers.
    pub fn new() -> Triggers {
        Triggers {
            on_demand: on_demand::OnDemand::default(),
            watching: watching(),
        }
    }

    fn all(&mut self) -> impl Iterator<Item = &mut dyn Trigger> {
        std::iter::once(&mut self.on_demand as &mut dyn Trigger).chain(
            self.watching
                .iter_mut()
                .map(|t| t.as_mut() as &mut dyn Trigger),
        )
    }

    /// See [`Trigger::watch`].
    pub fn watch(&mut self, binary: &Watch<'_>) {
        self.all().for_each(|t| t.watch(binary));
    }

    /// See [`Trigger::watch_object`].
    pub fn watch_object(&mut self, tag: u32, plan: &AttachPlan) {
        self.all().for_each(|t| t.watch_object(tag, plan));
    }

    /// See [`Trigger::forget`].
    pub fn forget(&mut self, tag: u32) {
        self.all().for_each(|t| t.forget(tag));
    }

    /// See [`Trigger::observe`].
    #[inline]
    pub fn observe(&mut self, tag: u32, event: &EventHeader) {
        for t in &mut self.watching {
            t.observe(tag, event);
        }
    }

    /// See [`Trigger::due`]: every trigger's, in order.
    pub fn due(&mut self, all: bool) -> Vec<Due> {
        self.all().flat_map(|t| t.due(all)).collect()
    }

    /// See [`Trigger::status`].
    pub fn status(&self, tag: u32, out: &mut serde_json::Map<String, serde_json::Value>) {
        self.on_demand.status(tag, out);
        for t in &self.watching {
            t.status(tag, out);
        }
    }
}
