//! Snapshots asked for from outside: `SIGUSR1` (every flight-recorder binary) and
//! `fdr-profiled snapshot [TARGET]` (every one, or the target's).
use super::trigger::{Due, Trigger, Watch};

/// The binaries watched, and the snapshots asked for since the last look.
#[derive(Debug, Default)]
pub struct OnDemand {
    /// (tag, target name), in the order they were watched.
    binaries: Vec<(u32, String)>,
    asked: Vec<(u32, &'static str)>,
}

impl OnDemand {
    /// Asks for a snapshot of every binary of `target` (every target when `None`), named
    /// after `why` (`sigusr1`, `request`).
    pub fn fire(&mut self, target: Option<&str>, why: &'static str) {
        for (tag, name) in &self.binaries {
            if target.is_none_or(|t| t == name) {
                self.asked.push((*tag, why));
            }
        }
    }
}

impl Trigger for OnDemand {
    fn watch(&mut self, binary: &Watch<'_>) {
        self.binaries.push((binary.tag, binary.config.name.clone()));
    }

    fn forget(&mut self, tag: u32) {
        self.binaries.retain(|&(t, _)| t != tag);
        self.asked.retain(|&(t, _)| t != tag);
    }

    fn due(&mut self, _all: bool) -> Vec<Due> {
        self.asked
            .drain(..)
            .map(|(tag, why)| Due {
                tag,
                trigger: why,
                name: why.to_owned(),
            })
            .collect()
    }
}
