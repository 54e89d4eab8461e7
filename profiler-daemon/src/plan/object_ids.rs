//! XRay object ids, handed out here and nowhere else: 0 for the executable, 1, 2, ... for
//! shared objects in the order they are traced, at most [`MAX_OBJECT_ID`], since a trace's
//! function ids carry only 4 bits of object id (`--pid` and a launched command number a
//! process's objects so, the service a binary's).
use crate::plan::MAX_OBJECT_ID;

/// The object id of the executable.
pub const EXECUTABLE: u32 = 0;

/// The ids of one trace's shared objects.
#[derive(Clone, Copy, Debug)]
pub struct ObjectIds {
    next: u32,
}

impl Default for ObjectIds {
    fn default() -> Self {
        ObjectIds { next: 1 }
    }
}

impl ObjectIds {
    /// The id the next shared object traced gets (taken by [`ObjectIds::used`] once it is
    /// traced: an object that turns out not to be traced leaves it to the next); `None` when
    /// every id is used (see [`too_many`]).
    pub fn next_shared(&self) -> Option<u32> {
        (self.next <= MAX_OBJECT_ID).then_some(self.next)
    }

    /// `id` is taken (its object traced, or probed before this count began): shared objects
    /// found later get higher ones.
    pub fn used(&mut self, id: u32) {
        self.next = self.next.max(id + 1);
    }
}

/// Why a shared object is not traced when every id is used; `per`: what the ids number
/// (`process`, `binary`).
pub fn too_many(per: &str) -> String {
    format!(
        "a trace holds at most {MAX_OBJECT_ID} instrumented shared objects per {per} (FDR function ids have 28 bits)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_run_from_one_to_the_limit_and_skip_what_was_taken() {
        let mut ids = ObjectIds::default();
        assert_eq!(ids.next_shared(), Some(1));
        // Not traced after all: the next one gets the same id.
        assert_eq!(ids.next_shared(), Some(1));
        ids.used(1);
        ids.used(EXECUTABLE);
        assert_eq!(ids.next_shared(), Some(2));
        ids.used(5);
        assert_eq!(ids.next_shared(), Some(6));
        ids.used(MAX_OBJECT_ID);
        assert_eq!(ids.next_shared(), None);
        assert!(too_many("process").contains("at most 15 instrumented shared objects per process"));
    }
}
