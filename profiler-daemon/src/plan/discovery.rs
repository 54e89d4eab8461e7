//! Finding a running process's instrumented objects: at attach time, and again on every rescan
//! so that objects it loads later with `dlopen` get probed too.
//!
//! Every file the process maps is looked at once (by device and inode, so a library mapped
//! again after `dlclose` is not probed twice: its uprobes follow the inode into the new
//! mapping). The executable is XRay object 0; shared objects get the next ids in the order
//! they are found ([`ObjectIds`]).
use crate::plan::object_ids::{self, ObjectIds};
use crate::plan::AttachPlan;
use crate::traced::mappings::{self, FileId, MappedObject, MapsKey};
use anyhow::Result;
use std::collections::{HashMap, HashSet};

/// What became of one mapped file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// Probed as this object id.
    Object(u32),
    /// Not instrumented, or not traced (see the warning printed then).
    Skipped,
}

/// The objects of one process, as far as they have been looked at.
#[derive(Debug)]
pub struct Discovery {
    pid: u32,
    executable: Option<FileId>,
    seen: HashMap<FileId, Seen>,
    /// The same files as `/proc/PID/maps` names them, not looked at again.
    known: HashSet<MapsKey>,
    /// Objects whose load address is known (probed from the mappings, or located since).
    located: HashSet<u32>,
    ids: ObjectIds,
    guard_unwinding: bool,
}

/// What one scan found.
#[derive(Debug, Default)]
pub struct Found {
    /// Plans for the instrumented objects not seen before, the executable first.
    pub plans: Vec<AttachPlan>,
    /// Objects found but not traced, one line each (why).
    pub warnings: Vec<String>,
    /// Files mapped that were not seen before (instrumented or not).
    pub new_files: usize,
    /// Objects probed before they were mapped (by path, for a launched command), now found
    /// mapped: their object ids and load addresses.
    pub located: Vec<(u32, u64)>,
}

impl Discovery {
    /// Starts looking at `pid`, whose executable is the file `executable` (found through
    /// `/proc/PID/exe`, or known from the command line for a process we launched).
    pub fn new(pid: u32, executable: Option<FileId>) -> Discovery {
        Discovery {
            pid,
            executable,
            seen: HashMap::new(),
            known: HashSet::new(),
            located: HashSet::new(),
            ids: ObjectIds::default(),
            guard_unwinding: false,
        }
    }

    /// The session chose return probes because nothing in the process could unwind: an object
    /// loaded later that brings an unwinding personality routine is then not probed (an
    /// exception through a return-probed frame kills the program, see `exits`).
    pub fn guard_unwinding(&mut self) {
        self.guard_unwinding = true;
    }

    /// Records that `file` was already probed as `object_id` (planned from the command line).
    pub fn already_probed(&mut self, file: FileId, object_id: u32) {
        self.seen.insert(file, Seen::Object(object_id));
        self.ids.used(object_id);
    }

    /// Reads the process's mappings and plans every instrumented object not seen before.
    pub fn scan(&mut self) -> Result<Found> {
        let mapped = mappings::mapped_objects_except(self.pid, &self.known)?;
        self.known.extend(mapped.iter().map(|m| m.maps_key.clone()));
        Ok(self.plan_new(mapped))
    }

    fn plan_new(&mut self, mapped: Vec<MappedObject>) -> Found {
        let mut found = Found::default();
        for m in &mapped {
            if let Some(Seen::Object(id)) = self.seen.get(&m.file_id) {
                if self.located.insert(*id) {
                    found.located.push((*id, m.load_address));
                }
            }
        }
        let mut fresh: Vec<MappedObject> = mapped
            .into_iter()
            .filter(|m| !self.seen.contains_key(&m.file_id))
            .collect();
        found.new_files = fresh.len();
        let unwinding = if self.guard_unwinding {
            fresh.iter().find_map(|m| {
                crate::plan::exits::personality_in(&m.open_path)
                    .map(|symbol| (m.path.clone(), symbol))
            })
        } else {
            None
        };
        // The executable first, so that it is object 0 whatever the address order.
        fresh.sort_by_key(|m| Some(m.file_id) != self.executable);
        for m in fresh {
            self.seen.insert(m.file_id, Seen::Skipped);
            if !mappings::has_instrumentation_map(&m.open_path) {
                continue;
            }
            if let Some((path, symbol)) = &unwinding {
                found.warnings.push(format!(
                    "{}: not traced: the session uses return probes and {path} (loaded with it) has {symbol}; an exception through a return-probed frame would kill the program (use --exits sleds)",
                    m.path
                ));
                continue;
            }
            let is_executable = Some(m.file_id) == self.executable;
            let object_id = if is_executable {
                object_ids::EXECUTABLE
            } else {
                match self.ids.next_shared() {
                    Some(id) => id,
                    None => {
                        let why = object_ids::too_many("process");
                        found
                            .warnings
                            .push(format!("{}: not traced: {why}", m.path));
                        continue;
                    }
                }
            };
            let mut plan = match AttachPlan::for_object(&m.open_path, object_id) {
                Ok(plan) => plan,
                Err(err) => {
                    found
                        .warnings
                        .push(format!("{}: not traced: {err:#}", m.path));
                    continue;
                }
            };
            self.ids.used(object_id);
            self.seen.insert(m.file_id, Seen::Object(object_id));
            self.located.insert(object_id);
            plan.display_path = m.path.clone();
            plan.deleted = m.deleted;
            plan.load_address = m.load_address;
            plan.exe_name = crate::traced::file_name(&m.path).to_owned();
            found.plans.push(plan);
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_uninstrumented_process_has_nothing_to_plan_and_is_scanned_once() {
        // This test binary maps files, none of them instrumented.
        let me = std::process::id();
        let mut discovery = Discovery::new(me, mappings::executable_id(me));
        let first = discovery.scan().expect("scan ourselves");
        assert!(first.plans.is_empty());
        assert!(first.new_files > 0);
        let again = discovery.scan().expect("scan ourselves again");
        assert_eq!(
            again.new_files, 0,
            "files already looked at are not read again"
        );
    }
}
