//! What makes the service write a snapshot of a flight-recorder target's binary: SIGUSR1 and
//! `fdr-profiled snapshot` ([`on_demand`]), a process dying of a signal ([`crash`]), a call
//! slower than the target's threshold ([`slow`]).
//!
//! A trigger is a [`Trigger`]: it is told which binaries it watches (by their tag, with their
//! target's configuration), sees every event of theirs in each thread's program order, and
//! says which snapshots are due. The event loop writes them (`service::snapshot`) and knows
//! nothing of why. A new trigger is one new file and one line in [`Triggers::new`].
use crate::plan::AttachPlan;
use crate::service::config::TargetConfig;
use profiler_common::EventHeader;

pub mod crash;
pub mod on_demand;
pub mod slow;

/// A binary of a flight-recorder target, as the triggers watch it.
pub struct Watch<'a> {
    /// Its tag: how the triggers name it (unique while it is traced).
    pub tag: u32,
    /// Its target's configuration.
    pub config: &'a TargetConfig,
    /// Its executable's plan (function ids without the service's tag).
    pub plan: &'a AttachPlan,
}

/// A snapshot a trigger wants written: of binary `tag`, into `<UTC time>-<name>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Due {
    pub tag: u32,
    /// The trigger's name (`sigusr1`, `request`, `crash`, `slow`).
    pub trigger: &'static str,
    /// What the directory is named after (`sigsegv-1234`, `slow-parse`).
    pub name: String,
}

/// One way a snapshot comes to be due.
pub trait Trigger {
    /// Watches binary `binary` from now on.
    fn watch(&mut self, binary: &Watch<'_>);
    /// A shared object found in the processes of binary `tag` (its function ids packed with its
    /// object id).
    fn watch_object(&mut self, _tag: u32, _plan: &AttachPlan) {}
    /// Stops watching binary `tag` (its target removed).
    fn forget(&mut self, tag: u32);
    /// The next event of one thread of binary `tag` (function ids with their object id, not
    /// the service's tag).
    fn observe(&mut self, _tag: u32, _event: &EventHeader) {}
    /// The snapshots due now; with `all`, every one pending too (before a reload or the end).
    fn due(&mut self, all: bool) -> Vec<Due>;
    /// What `status --json` says of binary `tag`, added to its object.
    fn status(&self, _tag: u32, _out: &mut serde_json::Map<String, serde_json::Value>) {}
}

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
            watching: vec![
                Box::new(crash::Crashes::default()),
                Box::new(slow::SlowCalls::default()),
            ],
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
