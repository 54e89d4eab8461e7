//! What a session directory holds: processes, their instrumented objects (the executable and
//! shared objects), their threads' FDR files.
//!
//! `session.json` is read leniently: unknown fields are ignored and missing ones take
//! defaults, so manifests of older and newer versions both load. A manifest without a process's
//! `objects` list (older daemons) has one object, XRay object 0, the process's `binary`. Each
//! entry of `objects` is checked on its own: a bad one (not an object, an id outside 0..=15, an
//! id listed twice) is a warning and is left out, the rest still load. Without a manifest (a
//! daemon killed before the end writes none) the layout is found from the names the daemon
//! gives: `<exe>-<pid>/tid-<tid>.fdr`; the binary must then be given by the caller.
//!
//! A single FDR file is a session too: compiler-rt's own runtime writes every thread of a
//! process into one file. Its threads are found from its buffers (`NewBuffer`, `Pid`), each
//! read from that file alone ([`ThreadEntry::shared_file`]).
use serde::Deserialize;
use std::path::{Component, Path, PathBuf};

/// `session.json` as far as reading a session needs it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Manifest {
    processes: Vec<ManifestProcess>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ManifestProcess {
    pid: u32,
    binary: String,
    binary_deleted: bool,
    build_id: Option<String>,
    dir: String,
    threads: Vec<ManifestThread>,
    /// Kept as raw values so that one malformed entry does not make the whole manifest
    /// unreadable.
    objects: Option<Vec<serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
struct ManifestObject {
    object_id: i64,
    #[serde(default)]
    path: String,
    #[serde(default)]
    deleted: bool,
    #[serde(default)]
    build_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ManifestThread {
    tid: u32,
    file: String,
    frames_unwound: u64,
    frames_closed_by_loss: u64,
    frames_beyond_return_limit: u64,
}

/// Highest XRay object id: FDR function records carry 28 bits, the top 4 of them the object.
pub const MAX_OBJECT_ID: u8 = 15;

/// One instrumented object of a process (the executable or a shared object) as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectEntry {
    /// XRay object id: the top 4 bits of the 28-bit function ids of its functions in the trace
    /// (0 for the executable).
    pub id: u8,
    /// The file as the process mapped it; `None` when nothing names it.
    pub path: Option<PathBuf>,
    /// Its build-id at recording time, when recorded.
    pub build_id: Option<String>,
    /// The recorded path named another file (or none) already during the recording.
    pub deleted: bool,
}

/// One traced process.
#[derive(Clone, Debug)]
pub struct ProcessEntry {
    /// Process id.
    pub pid: u32,
    /// The binary as recorded (or as given by the caller); `None` when nothing names it.
    pub binary: Option<PathBuf>,
    /// Short name for people: the executable's file name.
    pub name: String,
    /// Its instrumented objects, by XRay object id, each id at most once.
    pub objects: Vec<ObjectEntry>,
    /// Its threads' files.
    pub threads: Vec<ThreadEntry>,
}

/// One thread's FDR file.
#[derive(Clone, Debug)]
pub struct ThreadEntry {
    /// Thread id.
    pub tid: u32,
    /// The file.
    pub path: PathBuf,
    /// Calls the recorder closed with an exit of its own making, where they were proven gone
    /// (an exception caught, a `longjmp`, a lost exit, the kernel's return-probe limit), as
    /// the manifest counts them; 0 without a manifest. They read as calls in the file.
    pub closed_by_recorder: u64,
    /// The file holds other threads' buffers too (a trace written by XRay's own runtime):
    /// only this thread's are read.
    pub shared_file: bool,
}

/// A session directory's contents.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The directory.
    pub dir: PathBuf,
    /// Processes by pid.
    pub processes: Vec<ProcessEntry>,
    /// Problems found (missing files, no manifest), one line each.
    pub warnings: Vec<String>,
}

impl Layout {
    /// Reads `dir`: its `session.json`, or its `<exe>-<pid>/tid-<tid>.fdr` files when it has no
    /// usable manifest.
    pub fn open(dir: &Path) -> anyhow::Result<Layout> {
        if dir.is_file() {
            return Layout::of_file(dir);
        }
        if !dir.is_dir() {
            anyhow::bail!(
                "{} is neither a session directory nor an FDR file",
                dir.display()
            );
        }
        let mut layout = Layout {
            dir: dir.to_path_buf(),
            processes: Vec::new(),
            warnings: Vec::new(),
        };
        let manifest_path = dir.join(crate::manifest::MANIFEST);
        match std::fs::read(&manifest_path) {
            Ok(bytes) => match serde_json::from_slice::<Manifest>(&bytes) {
                Ok(m) => layout.read_manifest(m),
                Err(e) => {
                    layout.warnings.push(format!(
                        "{} is not a valid manifest ({e}); reading the directory instead",
                        manifest_path.display()
                    ));
                    layout.scan()?;
                }
            },
            Err(_) => {
                layout.warnings.push(format!(
                    "{} has no {} (a session stopped before its end writes none); reading the directory instead",
                    dir.display(),
                    crate::manifest::MANIFEST
                ));
                layout.scan()?;
            }
        }
        layout.processes.sort_by_key(|p| p.pid);
        for p in &mut layout.processes {
            p.threads.sort_by_key(|t| t.tid);
        }
        Ok(layout)
    }

    fn read_manifest(&mut self, m: Manifest) {
        for p in m.processes {
            let mut threads = Vec::new();
            for t in p.threads {
                let Some(rel) = inside(&t.file) else {
                    self.warnings.push(format!(
                        "session.json: thread {} names the file {:?}, outside the session directory; skipped",
                        t.tid, t.file
                    ));
                    continue;
                };
                let path = self.dir.join(rel);
                if !path.is_file() {
                    self.warnings.push(format!(
                        "{}: listed in session.json but missing; skipped",
                        path.display()
                    ));
                    continue;
                }
                threads.push(ThreadEntry {
                    tid: t.tid,
                    path,
                    shared_file: false,
                    closed_by_recorder: t
                        .frames_unwound
                        .saturating_add(t.frames_closed_by_loss)
                        .saturating_add(t.frames_beyond_return_limit),
                });
            }
            let binary = (!p.binary.is_empty()).then(|| PathBuf::from(&p.binary));
            let name = exe_name(binary.as_deref(), &p.dir, p.pid);
            let build_id = p.build_id.filter(|b| !b.is_empty());
            let objects = match p.objects {
                Some(list) => self.read_objects(p.pid, list),
                None => vec![ObjectEntry {
                    id: 0,
                    path: binary.clone(),
                    build_id,
                    deleted: p.binary_deleted,
                }],
            };
            self.processes.push(ProcessEntry {
                pid: p.pid,
                binary,
                name,
                objects,
                threads,
            });
        }
    }

    /// The valid entries of a process's `objects`, sorted by id; the others are warned about.
    fn read_objects(&mut self, pid: u32, list: Vec<serde_json::Value>) -> Vec<ObjectEntry> {
        let mut objects: Vec<ObjectEntry> = Vec::new();
        for (n, value) in list.into_iter().enumerate() {
            let o = match serde_json::from_value::<ManifestObject>(value) {
                Ok(o) => o,
                Err(e) => {
                    self.warnings.push(format!(
                        "session.json: pid {pid}: objects[{n}] is not a valid object ({e}); ignored"
                    ));
                    continue;
                }
            };
            let Some(id) = u8::try_from(o.object_id)
                .ok()
                .filter(|&id| id <= MAX_OBJECT_ID)
            else {
                self.warnings.push(format!(
                    "session.json: pid {pid}: objects[{n}] has object_id {}, outside 0..={MAX_OBJECT_ID}; ignored",
                    o.object_id
                ));
                continue;
            };
            if objects.iter().any(|seen| seen.id == id) {
                self.warnings.push(format!(
                    "session.json: pid {pid}: object {id} is listed twice; the second ({:?}) is ignored",
                    o.path
                ));
                continue;
            }
            objects.push(ObjectEntry {
                id,
                path: (!o.path.is_empty()).then(|| PathBuf::from(o.path)),
                build_id: o.build_id.filter(|b| !b.is_empty()),
                deleted: o.deleted,
            });
        }
        objects.sort_by_key(|o| o.id);
        objects
    }

    /// One FDR file holding any number of threads (and, from version 3 on, processes): each
    /// thread is read from it alone. The executable must be given by the caller. The file is
    /// read once, block headers only; a file that breaks off is listed as far as it reads.
    fn of_file(path: &Path) -> anyhow::Result<Layout> {
        let bytes = std::fs::read(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let mut reader = xray_fdr::reader::Reader::new(&bytes)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let mut warnings = Vec::new();
        let mut threads: std::collections::BTreeMap<u32, std::collections::BTreeSet<u32>> =
            Default::default();
        loop {
            match reader.next_step() {
                Ok(Some(step)) if !step.ignored => {
                    if matches!(
                        step.record,
                        xray_fdr::reader::RawRecord::Function { .. }
                            | xray_fdr::reader::RawRecord::CustomEvent { .. }
                            | xray_fdr::reader::RawRecord::TypedEvent { .. }
                    ) {
                        let ctx = step.context;
                        threads.entry(ctx.pid).or_default().insert(ctx.tid);
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => {
                    warnings.push(format!(
                        "{}: {e}; only the records before it are used",
                        path.display()
                    ));
                    break;
                }
            }
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let processes = threads
            .into_iter()
            .map(|(pid, tids)| ProcessEntry {
                pid,
                binary: None,
                name: name.clone(),
                objects: vec![ObjectEntry {
                    id: 0,
                    path: None,
                    build_id: None,
                    deleted: false,
                }],
                threads: tids
                    .into_iter()
                    .map(|tid| ThreadEntry {
                        tid,
                        path: path.to_path_buf(),
                        closed_by_recorder: 0,
                        shared_file: true,
                    })
                    .collect(),
            })
            .collect();
        Ok(Layout {
            dir: path.to_path_buf(),
            processes,
            warnings,
        })
    }

    fn scan(&mut self) -> anyhow::Result<()> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", self.dir.display()))?;
        for entry in entries.flatten() {
            let dir_name = entry.file_name().to_string_lossy().into_owned();
            let Some((exe, pid)) = dir_name
                .rsplit_once('-')
                .and_then(|(exe, pid)| Some((exe, pid.parse::<u32>().ok()?)))
            else {
                continue;
            };
            if !entry.path().is_dir() {
                continue;
            }
            let mut threads = Vec::new();
            for file in std::fs::read_dir(entry.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = file.file_name().to_string_lossy().into_owned();
                let tid = name
                    .strip_prefix("tid-")
                    .and_then(|n| n.strip_suffix(".fdr"))
                    .and_then(|n| n.parse::<u32>().ok());
                if let Some(tid) = tid {
                    threads.push(ThreadEntry {
                        tid,
                        path: file.path(),
                        closed_by_recorder: 0,
                        shared_file: false,
                    });
                }
            }
            self.processes.push(ProcessEntry {
                pid,
                binary: None,
                name: exe.to_owned(),
                objects: vec![ObjectEntry {
                    id: 0,
                    path: None,
                    build_id: None,
                    deleted: false,
                }],
                threads,
            });
        }
        if self.processes.is_empty() {
            anyhow::bail!(
                "{} holds no session: no session.json and no <exe>-<pid>/tid-<tid>.fdr files",
                self.dir.display()
            );
        }
        Ok(())
    }
}

/// `file` as a relative path that stays inside the session directory.
fn inside(file: &str) -> Option<&Path> {
    let p = Path::new(file);
    let plain = !file.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    plain.then_some(p)
}

fn exe_name(binary: Option<&Path>, dir: &str, pid: u32) -> String {
    if let Some(name) = binary.and_then(Path::file_name) {
        return name.to_string_lossy().into_owned();
    }
    dir.strip_suffix(&format!("-{pid}"))
        .filter(|s| !s.is_empty())
        .unwrap_or("process")
        .to_owned()
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
