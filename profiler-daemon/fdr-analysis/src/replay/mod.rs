//! Reading a recorded session back: its layout ([`layout`]), each thread's calls replayed in
//! order ([`thread`]), and the functions named ([`crate::symbolize`]).
//!
//! A function id in a trace is packed: the top 4 of its 28 bits are the XRay object id (0 the
//! executable, 1 to 15 the shared objects the process had instrumented), the low 24 bits the
//! id in that object's instrumentation map. Each process has an [`ObjectTable`] from XRay
//! object id to the session's objects, which are loaded once per distinct file and build-id.
//!
//! Everything streams: one file at a time, record by record, so memory does not grow with the
//! number of events. Bad parts of a session are reported and skipped, never fatal: a missing
//! or replaced object leaves its functions named by their packed id, a corrupt file
//! contributes what comes before the corruption.
pub mod layout;
mod loading;
mod objects;
pub mod thread;

use crate::symbolize::{FunctionInfo, NameSource, ObjectSymbols, Symbolizer};
use anyhow::Result;
pub use layout::{Layout, ObjectEntry, ProcessEntry, ThreadEntry};
pub use objects::{FunctionKey, ObjectTable, SessionObject, FUNCTION_ID_MASK, NO_OBJECT};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
pub use thread::{Call, CallEnd, Outcome, TraceEvent, Visitor};

/// A session opened for reading.
pub struct Session {
    /// What the directory holds.
    pub layout: Layout,
    /// The objects functions belong to: one per distinct (file, recorded build-id).
    pub objects: Vec<SessionObject>,
    /// Object table of each process of `layout.processes`.
    pub process_objects: Vec<ObjectTable>,
    /// Problems found, one line each (the layout's too).
    pub warnings: Vec<String>,
}

/// Names functions of a session, caching each answer.
pub struct Namer {
    objects: Vec<Option<Arc<ObjectSymbols>>>,
    cache: HashMap<FunctionKey, Arc<FunctionInfo>>,
}

impl Namer {
    /// The function `key`, symbolized, its `id` the packed id of the trace; `#id` when its
    /// object is unknown or not usable.
    pub fn function(&mut self, key: FunctionKey) -> Arc<FunctionInfo> {
        if let Some(f) = self.cache.get(&key) {
            return f.clone();
        }
        let info = match self.object(key.object) {
            Some(obj) => {
                let info = obj.function(key.function_id());
                if info.id != key.id {
                    // Symbolized by its id within the object; shown by the trace's id.
                    let mut f = FunctionInfo::clone(&info);
                    f.id = key.id;
                    if f.source == NameSource::Unknown {
                        f.name = format!("#{}", key.id);
                    }
                    Arc::new(f)
                } else {
                    info
                }
            }
            None => Arc::new(FunctionInfo::unknown(key.id)),
        };
        self.cache.insert(key, info.clone());
        info
    }

    /// The object of index `object`, if usable.
    pub fn object(&self, object: u32) -> Option<&Arc<ObjectSymbols>> {
        self.objects.get(object as usize).and_then(Option::as_ref)
    }
}

/// Where a thread of the session is.
#[derive(Clone, Copy, Debug)]
pub struct ThreadRef<'a> {
    /// Index into `layout.processes`.
    pub process_index: usize,
    /// The process.
    pub process: &'a ProcessEntry,
    /// The thread.
    pub thread: &'a ThreadEntry,
    /// The process's objects.
    pub objects: ObjectTable,
}

impl ThreadRef<'_> {
    /// The function a trace record's (packed) function id names, in this thread's process.
    pub fn function(&self, id: u32) -> FunctionKey {
        self.objects.function(id)
    }
}

impl Session {
    /// Opens `dir`. `binary` overrides the executable (XRay object 0) the manifest records,
    /// for every process; shared objects are always the recorded ones.
    pub fn open(dir: &Path, binary: Option<&Path>, symbolizer: &Symbolizer) -> Result<Session> {
        let layout = Layout::open(dir)?;
        let mut loader = loading::Loader::new(binary, symbolizer);
        let mut warnings = layout.warnings.clone();
        let process_objects = layout
            .processes
            .iter()
            .map(|p| Ok(ObjectTable(loader.process(p, &mut warnings)?)))
            .collect::<Result<_>>()?;
        // One line each, whatever the paths recorded hold.
        for w in &mut warnings {
            if w.contains(['\n', '\r']) {
                *w = w.replace(['\n', '\r'], " ");
            }
        }
        Ok(Session {
            layout,
            objects: loader.into_objects(),
            process_objects,
            warnings,
        })
    }

    /// Names the session's directory `dir` in what is made of it (reports, timelines), when it
    /// was opened by another path to the same directory (`/proc/self/fd/N`, see
    /// [`crate::outputs::write_report_in`]): its files were found already.
    pub fn show_as(&mut self, dir: &Path) {
        self.layout.dir = dir.to_path_buf();
    }

    /// Every thread, by pid then tid.
    pub fn threads(&self) -> Vec<ThreadRef<'_>> {
        let mut out = Vec::new();
        for (i, p) in self.layout.processes.iter().enumerate() {
            for t in &p.threads {
                out.push(ThreadRef {
                    process_index: i,
                    process: p,
                    thread: t,
                    objects: self.process_objects[i],
                });
            }
        }
        out
    }

    /// A namer for this session's functions (shares the loaded objects).
    pub fn namer(&self) -> Namer {
        Namer {
            objects: self.objects.iter().map(|o| o.symbols.clone()).collect(),
            cache: HashMap::new(),
        }
    }

    /// The file name of the shared object `key` belongs to, for telling people where it is
    /// from; `None` for the executable's functions (XRay object 0) and unknown objects.
    pub fn shared_object_name(&self, key: FunctionKey) -> Option<String> {
        if key.xray_object() == 0 {
            return None;
        }
        self.objects.get(key.object as usize)?.file_name()
    }

    /// The earliest timestamp of any thread (ns), from each file's first records: the zero of
    /// relative timelines.
    pub fn start_ns(&self) -> u64 {
        self.threads()
            .iter()
            .filter_map(|t| thread::first_timestamp(&t.thread.path))
            .map(|(ts, _)| ts)
            .min()
            .unwrap_or(0)
    }

    /// Wall-clock time minus trace time (ns), from the first thread file whose first buffer
    /// carries a wall-clock time: add it to a trace timestamp to get nanoseconds since the Unix
    /// epoch. `None` when no file says.
    pub fn wall_clock_offset_ns(&self) -> Option<i128> {
        self.threads().iter().find_map(|t| {
            let (ts, wall) = thread::first_timestamp(&t.thread.path)?;
            Some(i128::from(wall?) - i128::from(ts))
        })
    }
}

/// Replays one thread into `visitor`. Problems (an unreadable file, a file that breaks off,
/// a file of another thread) are added to `warnings`; `None` when nothing could be read.
pub fn replay_thread<V: Visitor>(
    t: &ThreadRef<'_>,
    visitor: &mut V,
    warnings: &mut Vec<String>,
) -> Option<Outcome> {
    let path = t.thread.path.display();
    let only = t.thread.shared_file.then_some(t.thread.tid);
    match thread::replay(&t.thread.path, only, visitor) {
        Ok(outcome) => {
            if let Some(e) = &outcome.error {
                warnings.push(format!("{path}: {e}; only the records before it are used"));
            }
            if outcome.too_deep > 0 {
                warnings.push(format!(
                    "{path}: {} calls deeper than {} levels are left out (nor are their exits matched)",
                    outcome.too_deep,
                    thread::MAX_DEPTH
                ));
            }
            if let Some(tid) = outcome.tid.filter(|&tid| tid != t.thread.tid) {
                warnings.push(format!(
                    "{path}: holds thread {tid} where thread {} was expected",
                    t.thread.tid
                ));
            }
            Some(outcome)
        }
        Err(e) => {
            warnings.push(format!("{path}: cannot read: {e}; skipped"));
            None
        }
    }
}
