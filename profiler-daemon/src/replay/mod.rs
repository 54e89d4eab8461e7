//! Reading a recorded session back: its layout ([`layout`]), each thread's calls replayed in
//! order ([`thread`]), and the functions named ([`crate::symbolize`]).
//!
//! Everything streams: one file at a time, record by record, so memory does not grow with the
//! number of events. Bad parts of a session are reported and skipped, never fatal: a missing
//! or replaced binary leaves its functions named by id, a corrupt file contributes what comes
//! before the corruption.
pub mod layout;
pub mod thread;

use crate::symbolize::{FunctionInfo, ObjectSymbols, Symbolizer};
use anyhow::Result;
pub use layout::{Layout, ProcessEntry, ThreadEntry};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
pub use thread::{Call, CallEnd, Outcome, TraceEvent, Visitor};

/// A function across the session: the object it belongs to and its XRay id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FunctionKey {
    /// Index into [`Session::objects`].
    pub object: u32,
    /// XRay function id.
    pub id: u32,
}

/// A session opened for reading.
pub struct Session {
    /// What the directory holds.
    pub layout: Layout,
    /// The objects functions belong to (one per distinct binary; `None` when it could not be
    /// used — missing, replaced, unreadable — and its functions are named by id).
    pub objects: Vec<Option<Arc<ObjectSymbols>>>,
    /// Object index of each process of `layout.processes`.
    pub process_object: Vec<u32>,
    /// Problems found, one line each (the layout's too).
    pub warnings: Vec<String>,
}

/// Names functions of a session, caching each answer.
pub struct Namer {
    objects: Vec<Option<Arc<ObjectSymbols>>>,
    cache: HashMap<FunctionKey, Arc<FunctionInfo>>,
}

impl Namer {
    /// The function `key`, symbolized; `#id` when its object is not usable.
    pub fn function(&mut self, key: FunctionKey) -> Arc<FunctionInfo> {
        if let Some(f) = self.cache.get(&key) {
            return f.clone();
        }
        let info = match self
            .objects
            .get(key.object as usize)
            .and_then(Option::as_ref)
        {
            Some(obj) => obj.function(key.id),
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
    /// Index of the process's object in [`Session::objects`].
    pub object: u32,
}

impl Session {
    /// Opens `dir`. `binary` overrides the binary the manifest records (for every process).
    pub fn open(dir: &Path, binary: Option<&Path>, symbolizer: &Symbolizer) -> Result<Session> {
        let layout = Layout::open(dir)?;
        let mut warnings = layout.warnings.clone();
        let mut objects: Vec<Option<Arc<ObjectSymbols>>> = Vec::new();
        let mut by_binary: HashMap<Option<PathBuf>, u32> = HashMap::new();
        let mut process_object = Vec::new();
        for p in &layout.processes {
            let path = binary.map(Path::to_path_buf).or_else(|| p.binary.clone());
            let index = *by_binary.entry(path.clone()).or_insert_with(|| {
                objects.push(load_object(
                    p,
                    path.as_deref(),
                    binary.is_some(),
                    symbolizer,
                    &mut warnings,
                ));
                (objects.len() - 1) as u32
            });
            // Another process of the same binary may have recorded another build.
            if let (Some(obj), Some(recorded)) = (&objects[index as usize], &p.build_id) {
                if obj.build_id.as_deref() != Some(recorded.as_str()) {
                    warnings.push(format!(
                        "{} (pid {}): recorded build-id {recorded} is not {}'s; its functions are shown by id",
                        p.name,
                        p.pid,
                        obj.path.display()
                    ));
                    objects.push(None);
                    process_object.push((objects.len() - 1) as u32);
                    continue;
                }
            }
            process_object.push(index);
        }
        Ok(Session {
            layout,
            objects,
            process_object,
            warnings,
        })
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
                    object: self.process_object[i],
                });
            }
        }
        out
    }

    /// A namer for this session's functions (shares the loaded objects).
    pub fn namer(&self) -> Namer {
        Namer {
            objects: self.objects.clone(),
            cache: HashMap::new(),
        }
    }

    /// The earliest timestamp of any thread (ns), from each file's first records: the zero of
    /// relative timelines.
    pub fn start_ns(&self) -> u64 {
        self.threads()
            .iter()
            .filter_map(|t| thread::first_timestamp(&t.thread.path))
            .min()
            .unwrap_or(0)
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
    match thread::replay(&t.thread.path, visitor) {
        Ok(outcome) => {
            if let Some(e) = &outcome.error {
                warnings.push(format!("{path}: {e}; only the records before it are used"));
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

fn load_object(
    p: &ProcessEntry,
    path: Option<&Path>,
    given: bool,
    symbolizer: &Symbolizer,
    warnings: &mut Vec<String>,
) -> Option<Arc<ObjectSymbols>> {
    let Some(path) = path else {
        warnings.push(format!(
            "{} (pid {}): no binary is recorded; its functions are shown by id (give --binary)",
            p.name, p.pid
        ));
        return None;
    };
    if p.binary_deleted && p.build_id.is_none() && !given {
        warnings.push(format!(
            "{} (pid {}): {} was replaced on disk during the recording and no build-id was recorded to check it; its functions are shown by id (give --binary with the original)",
            p.name,
            p.pid,
            path.display()
        ));
        return None;
    }
    match symbolizer.object(path, p.build_id.as_deref()) {
        Ok(obj) => {
            if p.build_id.is_none() {
                warnings.push(format!(
                    "{} (pid {}): no build-id was recorded, so nothing shows that {} is the binary that ran; names assume it is",
                    p.name,
                    p.pid,
                    path.display()
                ));
            }
            for refused in &obj.refused_debug_files {
                warnings.push(format!("debug file refused: {refused}"));
            }
            Some(obj)
        }
        Err(e) => {
            warnings.push(format!(
                "{} (pid {}): {e:#}; its functions are shown by id",
                p.name, p.pid
            ));
            None
        }
    }
}
