//! What a session directory holds: processes, their instrumented objects (the executable and
//! shared objects), their threads' FDR files.
//!
//! `session.json` is read with the types the recorder writes it with ([`fdr_session::schema`]),
//! leniently where that is safe: unknown fields are ignored and missing optional ones take
//! defaults, so manifests of older and newer versions both load. What no manifest can lack
//! (`processes`, each process's `pid`, each thread's `tid` and `file`) is required, and a
//! manifest that is not valid JSON, lacks them, is a symbolic link or not a regular file, or is
//! larger than [`MAX_MANIFEST_SIZE`](fdr_session::manifest::MAX_MANIFEST_SIZE) is an error, not
//! an empty session.
//!
//! The manifest may have been written by anyone, and the reader may be root: it only names
//! files, and those are refused unless safe to read. Thread files must be plain relative paths
//! inside the session directory, reached through no symbolic link. Object paths (`binary`,
//! `objects[].path`) must be absolute (a recorder writes nothing else); the files they name are
//! then opened by the symbolizer only if they are regular files, with the ELF magic checked
//! before anything else is read, and nothing of a refused file is ever printed, only its path
//! and why ([`xray_object::elf::ElfImage::open`]). A manifest without a process's
//! `objects` list (older daemons) has one object, XRay object 0, the process's `binary`. Each
//! entry of `objects` is checked on its own: a bad one (not an object, an id outside 0..=15, an
//! id listed twice) is a warning and is left out, the rest still load. Without a manifest (a
//! daemon killed before the end writes none) the layout is found from the names the daemon
//! gives: `<exe>-<pid>/tid-<tid>.fdr`; the binary must then be given by the caller.
//!
//! A single FDR file is a session too: compiler-rt's own runtime writes every thread of a
//! process into one file. Its threads are found from its buffers (`NewBuffer`, `Pid`), each
//! read from that file alone ([`ThreadEntry::shared_file`]).
use fdr_session::schema::{ObjectReport, ProbeCosts, SessionReport};
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

/// `session.json` as a reader takes it: the recorder's own types ([`fdr_session::schema`]),
/// with each process's `objects` kept as raw values (absent in manifests of older versions),
/// so that one malformed entry does not make the whole manifest unreadable.
type Manifest = SessionReport<Option<Vec<serde_json::Value>>>;

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
    /// What the recorder measured a probe hit to cost, when it did.
    pub costs: Option<RecordedCosts>,
    /// `--max-overhead`: what the budget dropped and re-admitted (`session.json`'s `budget`).
    pub budget: Option<fdr_session::schema::BudgetReport>,
}

/// What the recorder measured a probe hit to cost (`session.json`'s `probe_costs`), and how
/// each function's exits were observed, by trace function id: what a call of it cost.
#[derive(Clone, Debug)]
pub struct RecordedCosts {
    pub costs: ProbeCosts,
    pub exit_of: HashMap<u32, String>,
}

impl RecordedCosts {
    /// What the probes cost one call of function `id` (ns), by its recorded exit method.
    pub fn per_call_ns(&self, id: u32) -> f64 {
        self.costs
            .per_call_ns(self.exit_of.get(&id).map_or("sleds", String::as_str))
    }
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
            costs: None,
            budget: None,
        };
        let manifest_path = dir.join(fdr_session::manifest::MANIFEST);
        match fdr_session::manifest::read(&manifest_path)? {
            Some(bytes) => {
                let m = parse_manifest(&manifest_path, &bytes)?;
                layout.read_manifest(m)?;
            }
            None => {
                layout.warnings.push(format!(
                    "{} has no {} (a session stopped before its end writes none); reading the directory instead",
                    dir.display(),
                    fdr_session::manifest::MANIFEST
                ));
                layout.scan()?;
            }
        }
        layout.sort();
        Ok(layout)
    }

    /// The layout `bytes`, the contents of a `session.json`, describe for a session in `dir`:
    /// what [`Layout::open`] does once it has read the manifest (thread files are looked for
    /// in `dir`). Errors as [`Layout::open`] for a manifest it refuses.
    pub fn from_manifest(dir: &Path, bytes: &[u8]) -> anyhow::Result<Layout> {
        let manifest_path = dir.join(fdr_session::manifest::MANIFEST);
        let mut layout = Layout {
            dir: dir.to_path_buf(),
            processes: Vec::new(),
            warnings: Vec::new(),
            costs: None,
            budget: None,
        };
        layout.read_manifest(parse_manifest(&manifest_path, bytes)?)?;
        layout.sort();
        Ok(layout)
    }

    fn sort(&mut self) {
        self.processes.sort_by_key(|p| p.pid);
        for p in &mut self.processes {
            p.threads.sort_by_key(|t| t.tid);
        }
    }

    fn read_manifest(&mut self, m: Manifest) -> anyhow::Result<()> {
        self.budget = m.budget.clone();
        self.costs = m.probe_costs.map(|costs| RecordedCosts {
            costs,
            exit_of: m.functions.iter().map(|f| (f.id, f.exit.clone())).collect(),
        });
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
                if let Some(link) = symlink_under(&self.dir, rel) {
                    self.warnings.push(format!(
                        "session.json: thread {}: {} is a symbolic link (or not a directory) where the recorder makes none; skipped",
                        t.tid,
                        link.display()
                    ));
                    continue;
                }
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
                        .saturating_add(t.frames_beyond_return_limit)
                        .saturating_add(t.frames_closed_by_budget),
                });
            }
            let binary = (!p.binary.is_empty()).then(|| PathBuf::from(&p.binary));
            if let Some(b) = &binary {
                absolute_object_path(p.pid, "binary", b)?;
            }
            let name = exe_name(binary.as_deref(), &p.dir, p.pid);
            let build_id = p.build_id.filter(|b| !b.is_empty());
            let objects = match p.objects {
                Some(list) => self.read_objects(p.pid, list)?,
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
        Ok(())
    }

    /// The valid entries of a process's `objects`, sorted by id; the others are warned about.
    /// A relative path is an error: no recorder writes one.
    fn read_objects(
        &mut self,
        pid: u32,
        list: Vec<serde_json::Value>,
    ) -> anyhow::Result<Vec<ObjectEntry>> {
        let mut objects: Vec<ObjectEntry> = Vec::new();
        for (n, value) in list.into_iter().enumerate() {
            // The id first, as any integer: one out of range is named as such, not as a type
            // error.
            if let Some(id) = value.get("object_id").and_then(serde_json::Value::as_i64) {
                if !(0..=i64::from(MAX_OBJECT_ID)).contains(&id) {
                    self.warnings.push(format!(
                        "session.json: pid {pid}: objects[{n}] has object_id {id}, outside 0..={MAX_OBJECT_ID}; ignored"
                    ));
                    continue;
                }
            }
            let o = match serde_json::from_value::<ObjectReport>(value) {
                Ok(o) => o,
                Err(e) => {
                    self.warnings.push(format!(
                        "session.json: pid {pid}: objects[{n}] is not a valid object ({e}); ignored"
                    ));
                    continue;
                }
            };
            let id = o.object_id as u8; // in 0..=MAX_OBJECT_ID: checked above
            if objects.iter().any(|seen| seen.id == id) {
                self.warnings.push(format!(
                    "session.json: pid {pid}: object {id} is listed twice; the second ({:?}) is ignored",
                    o.path
                ));
                continue;
            }
            let path = (!o.path.is_empty()).then(|| PathBuf::from(o.path));
            if let Some(p) = &path {
                absolute_object_path(pid, &format!("objects[{n}].path"), p)?;
            }
            objects.push(ObjectEntry {
                id,
                path,
                build_id: o.build_id.filter(|b| !b.is_empty()),
                deleted: o.deleted,
            });
        }
        objects.sort_by_key(|o| o.id);
        Ok(objects)
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
            costs: None,
            budget: None,
        })
    }

    fn scan(&mut self) -> anyhow::Result<()> {
        let sessions = sessions_in(&self.dir);
        if !sessions.is_empty() {
            let named: Vec<String> = sessions
                .iter()
                .take(SESSIONS_NAMED)
                .map(|p| p.display().to_string())
                .collect();
            let more = match sessions.len().saturating_sub(SESSIONS_NAMED) {
                0 => String::new(),
                n => format!(" and {n} more"),
            };
            anyhow::bail!(
                "{} holds {} sessions, not one ({}{more}): report one of them",
                self.dir.display(),
                sessions.len(),
                named.join(", ")
            );
        }
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
            // Not followed: a symbolic link planted in the directory could point anywhere.
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
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
                if !file.file_type().is_ok_and(|t| t.is_file()) {
                    continue;
                }
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

/// Sessions named in the error for a directory of sessions.
const SESSIONS_NAMED: usize = 4;

/// The directories in `dir` that are sessions (a `session.json` in them, a regular file: no
/// link followed), sorted: a directory of sessions (the service's output, a user's folder of
/// recordings) is not one session whose process directories they would be taken for.
fn sessions_in(dir: &Path) -> Vec<PathBuf> {
    let mut sessions: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| {
            std::fs::symlink_metadata(p.join(fdr_session::manifest::MANIFEST))
                .is_ok_and(|m| m.is_file())
        })
        .collect();
    sessions.sort();
    sessions
}

/// `bytes` as a manifest, or the one-line error saying what is wrong with it.
fn parse_manifest(path: &Path, bytes: &[u8]) -> anyhow::Result<Manifest> {
    serde_json::from_slice::<Manifest>(bytes)
        .map_err(|e| anyhow::anyhow!("{} is not a valid session manifest: {e}", path.display()))
}

/// Refuses a relative object path: the recorder writes absolute ones only, and a relative one
/// would be read from wherever the reader happens to run.
fn absolute_object_path(pid: u32, field: &str, path: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        path.is_absolute(),
        "session.json: pid {pid}: {field} {:?} is not an absolute path; refused",
        path.display().to_string()
    );
    Ok(())
}

/// The first component of `rel` under `dir` that is a symbolic link, or a directory component
/// that is not a directory; `None` when there is none (or it does not exist, which the
/// caller reports).
fn symlink_under(dir: &Path, rel: &Path) -> Option<PathBuf> {
    let mut at = dir.to_path_buf();
    let count = rel.components().count();
    for (i, c) in rel.components().enumerate() {
        at.push(c);
        let meta = std::fs::symlink_metadata(&at).ok()?;
        if meta.file_type().is_symlink() || (i + 1 < count && !meta.is_dir()) {
            return Some(at);
        }
    }
    None
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
mod tests;
