//! What a trigger is (see the module above), and what it says.
use crate::plan::AttachPlan;
use crate::service::config::TargetConfig;
use profiler_common::EventHeader;

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
