//! The instrumented shared objects of a target's processes, probed process by process as
//! `--pid` probes them.
//!
//! A target's executable is probed once for every process that runs it (its probes follow the
//! inode). A shared object is not: the same `libfoo.so` may be mapped by programs nobody asked
//! to trace, so its probes are placed for each process of the target that maps it, and only
//! for that process. A process is looked at as soon as the service sees its first event (or at
//! start, for processes already running), then its mappings are read again every
//! [`RESCAN_INTERVAL`] for objects it loads later (`dlopen`); its probes are removed when it is
//! gone.
//!
//! Across all processes of one binary, a shared object file keeps one XRay object id (handed
//! out by [`ObjectIds`], as for `--pid`) and one service tag, so that the snapshots and
//! segments of the binary, which hold all its processes, name each function once. The calls a
//! process makes into a library before the service has looked at that process are not
//! recorded: a library's coverage of a process starts when its probes are in place (at most
//! one rescan after it is mapped, or after the process's first traced call).
use crate::kernel::bpf::{Attachment, Scope, Tracer};
use crate::plan::exits::{self, ExitPolicy};
use crate::plan::object_ids::ObjectIds;
use crate::plan::select::FunctionFilter;
use crate::plan::{AttachPlan, OBJECT_ID_SHIFT};
use crate::traced::mappings::{self, FileId, MappedObject, MapsKey};
use anyhow::{Context as _, Result};
use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;
use std::time::Duration;

/// How often each traced process's mappings are read again for objects it loaded.
pub const RESCAN_INTERVAL: Duration = Duration::from_millis(200);

/// One instrumented shared object of a binary's processes.
pub struct Library {
    /// Its XRay object id in the binary's traces.
    pub object_id: u32,
    /// The service tag in its probes' function ids.
    pub tag: u32,
    /// Its plan, as the binary's snapshots and segments name it (ids packed with the object
    /// id, no tag). `binary` is a descriptor the service holds open (`/proc/self/fd/N`), so
    /// the file stays reachable when the process that mapped it is gone.
    pub plan: AttachPlan,
    /// The same plan with the tag in its probes' function ids: what is placed.
    tagged: AttachPlan,
    /// Keeps `plan.binary` valid.
    _file: std::fs::File,
    /// Probes placed per process.
    pub probes: usize,
    /// When it was first probed (CLOCK_MONOTONIC).
    pub attached_ns: u64,
}

/// One process of the binary, looked at.
struct Process {
    /// When it started: a pid reused by another process is told apart.
    started: u64,
    /// Its mapped files already looked at.
    known: HashSet<MapsKey>,
    /// The probes placed for it.
    attachments: Vec<Attachment>,
    /// Its mappings cannot be read (permission denied): said once, not read again.
    denied: bool,
}

/// The shared objects of one binary's processes, and the processes looked at.
pub struct Libraries {
    /// Who the libraries are probed for, in messages: `target NAME (BINARY)`.
    owner: String,
    /// The binary itself (probed for every process already): never a library.
    executable: Option<FileId>,
    filter: FunctionFilter,
    policy: ExitPolicy,
    /// `auto` chose return probes for the binary because nothing in its image could unwind:
    /// a library that brings an unwinding personality routine is then not probed (an
    /// exception through a return-probed frame would kill the program).
    guard_unwinding: bool,
    /// By object id - 1.
    pub objects: Vec<Library>,
    ids: ObjectIds,
    by_file: HashMap<FileId, usize>,
    /// Files looked at and not probed (not instrumented, or refused with a warning).
    skipped: HashSet<FileId>,
    processes: HashMap<u32, Process>,
}

/// What a look at processes changed.
#[derive(Debug, Default)]
pub struct Changes {
    /// Libraries registered (indices into [`Libraries::objects`]): their tags must be routed,
    /// their objects added to the open sessions.
    pub new_libraries: Vec<usize>,
}

impl Libraries {
    /// For the binary `executable`, whose functions `filter` selects and whose exits follow
    /// `policy`.
    pub fn new(
        owner: String,
        executable: Option<FileId>,
        filter: FunctionFilter,
        policy: ExitPolicy,
        guard_unwinding: bool,
    ) -> Libraries {
        Libraries {
            owner,
            executable,
            filter,
            policy,
            guard_unwinding,
            objects: Vec::new(),
            ids: ObjectIds::default(),
            by_file: HashMap::new(),
            skipped: HashSet::new(),
            processes: HashMap::new(),
        }
    }

    /// The binary's file identity.
    pub fn executable(&self) -> Option<FileId> {
        self.executable
    }

    /// The processes looked at and still there, each with how many of its libraries are
    /// probed, by pid.
    pub fn processes(&self) -> Vec<(u32, usize)> {
        let mut all: Vec<(u32, usize)> = self
            .processes
            .iter()
            .map(|(&pid, p)| (pid, p.attachments.len()))
            .collect();
        all.sort_unstable();
        all
    }

    /// Starts looking at process `pid` (a process of the binary, seen for the first time):
    /// probes the instrumented libraries it maps. Nothing happens for a process already
    /// looked at.
    pub fn watch(
        &mut self,
        pid: u32,
        tracer: &mut Tracer,
        take_tag: &mut dyn FnMut() -> Option<u32>,
    ) -> Changes {
        let mut changes = Changes::default();
        let Some(started) = crate::traced::process::start_time(pid) else {
            return changes;
        };
        if self
            .processes
            .get(&pid)
            .is_some_and(|p| p.started == started)
        {
            return changes;
        }
        // The pid of a process gone, given to this one: its probes named the old process.
        if let Some(old) = self.processes.remove(&pid) {
            old.attachments.into_iter().for_each(|a| tracer.detach(a));
        }
        // Its files are opened through /proc/PID/root (or map_files): for another user's
        // process that needs CAP_SYS_PTRACE. (Its maps may still be readable: CAP_PERFMON is
        // enough for those on 6.18.)
        let root = format!("/proc/{pid}/root");
        let denied = match std::fs::metadata(&root) {
            Err(err) if err.kind() == std::io::ErrorKind::PermissionDenied => {
                self.warn_denied(pid, &format!("{root}: {err}"));
                true
            }
            _ => false,
        };
        self.processes.insert(
            pid,
            Process {
                started,
                known: HashSet::new(),
                attachments: Vec::new(),
                denied,
            },
        );
        self.scan(pid, tracer, take_tag, &mut changes);
        changes
    }

    /// Reads every process's mappings again: probes the libraries they loaded since, and
    /// removes the probes of processes that are gone.
    pub fn rescan(
        &mut self,
        tracer: &mut Tracer,
        take_tag: &mut dyn FnMut() -> Option<u32>,
    ) -> Changes {
        let mut changes = Changes::default();
        let pids: Vec<u32> = self.processes.keys().copied().collect();
        for pid in pids {
            self.scan(pid, tracer, take_tag, &mut changes);
        }
        changes
    }

    /// Takes the probes of every process out, for the caller to remove (the target is
    /// removed).
    pub fn take_attachments(&mut self) -> Vec<Attachment> {
        self.processes
            .drain()
            .flat_map(|(_, p)| p.attachments)
            .collect()
    }

    /// The tags of the libraries, to give back when the target is removed.
    pub fn tags(&self) -> impl Iterator<Item = u32> + '_ {
        self.objects.iter().map(|l| l.tag)
    }

    /// Says that the libraries of process `pid` cannot be probed, for want of permission.
    fn warn_denied(&self, pid: u32, why: &str) {
        tracing::warn!(
            fdr_pid = pid,
            "{}: process {pid}: its shared objects are not traced: {why} (the mappings and files of another user's process need CAP_SYS_PTRACE)",
            self.owner
        );
    }

    fn scan(
        &mut self,
        pid: u32,
        tracer: &mut Tracer,
        take_tag: &mut dyn FnMut() -> Option<u32>,
        changes: &mut Changes,
    ) {
        let Some(process) = self.processes.get_mut(&pid) else {
            return;
        };
        let same = crate::traced::process::start_time(pid) == Some(process.started);
        let mapped = match same {
            true if process.denied => return,
            true => match mappings::mapped_objects_except(pid, &process.known) {
                Ok(mapped) => Some(mapped),
                Err(err) if denied(&err) => {
                    // Another user's process, and no CAP_SYS_PTRACE: said once, and its
                    // mappings are not read again (it is forgotten when it is gone).
                    process.denied = true;
                    self.warn_denied(pid, &format!("{err:#}"));
                    return;
                }
                Err(_) => None,
            },
            false => None,
        };
        let Some(mapped) = mapped else {
            // Gone (or replaced by another process with its pid): its probes fire no more.
            if let Some(gone) = self.processes.remove(&pid) {
                gone.attachments.into_iter().for_each(|a| tracer.detach(a));
            }
            return;
        };
        process
            .known
            .extend(mapped.iter().map(|m| m.maps_key.clone()));
        let fresh: Vec<&MappedObject> = mapped
            .iter()
            .filter(|m| Some(m.file_id) != self.executable)
            .filter(|m| !self.skipped.contains(&m.file_id))
            .collect();
        let unwinding = if self.guard_unwinding {
            fresh
                .iter()
                .filter(|m| !self.by_file.contains_key(&m.file_id))
                .find_map(|m| exits::personality_in(&m.open_path).map(|s| (m.path.clone(), s)))
        } else {
            None
        };
        let Some(pid_nz) = NonZeroU32::new(pid) else {
            return;
        };
        for m in fresh {
            let index = match self.by_file.get(&m.file_id) {
                Some(&index) => index,
                None => match self.register(m, unwinding.as_ref(), take_tag) {
                    Some(index) => {
                        changes.new_libraries.push(index);
                        index
                    }
                    None => {
                        self.skipped.insert(m.file_id);
                        continue;
                    }
                },
            };
            let library = &mut self.objects[index];
            let placed = tracer.attach(&library.tagged, Scope::Process(pid_nz));
            let attachment = tracer.take_attachment();
            match placed {
                Ok(placed) => {
                    library.probes = placed;
                    if let Some(p) = self.processes.get_mut(&pid) {
                        p.attachments.push(attachment);
                    }
                }
                Err(err) => {
                    tracer.detach(attachment);
                    tracing::warn!("{} in process {pid}: not traced: {err:#}", m.path);
                }
            }
        }
    }

    /// Plans a library seen for the first time; `None` when it is not to be probed (said
    /// once, when there is something to say).
    fn register(
        &mut self,
        m: &MappedObject,
        unwinding: Option<&(String, &'static str)>,
        take_tag: &mut dyn FnMut() -> Option<u32>,
    ) -> Option<usize> {
        if !mappings::has_instrumentation_map(&m.open_path) {
            return None;
        }
        let warn = |why: String| tracing::warn!("{}: not traced: {why}", m.path);
        if let Some((path, symbol)) = unwinding {
            warn(format!("the target uses return probes and {path} (loaded with it) has {symbol}; an exception through a return-probed frame would kill the program (set exits = \"sleds\")"));
            return None;
        }
        let Some(object_id) = self.ids.next_shared() else {
            warn(crate::plan::object_ids::too_many("binary"));
            return None;
        };
        let (plan, file) = match self.plan(m, object_id) {
            Ok(planned) => planned,
            Err(err) => {
                warn(format!("{err:#}"));
                return None;
            }
        };
        if plan.probes.is_empty() {
            return None;
        }
        let Some(tag) = take_tag() else {
            warn("more binaries and libraries than the service's 255 tags".to_owned());
            return None;
        };
        let mut tagged = plan.clone();
        for probe in &mut tagged.probes {
            probe.cookie.function_id = untagged(probe.cookie.function_id) | (tag << TAG_SHIFT);
        }
        tracing::info!(
            "{}: probing {} functions of {} (object {object_id}) in each of its processes that maps it",
            self.owner,
            plan.functions,
            plan.display_path
        );
        self.ids.used(object_id);
        self.objects.push(Library {
            object_id,
            tag,
            plan,
            tagged,
            _file: file,
            probes: 0,
            attached_ns: crate::session::monotonic_ns(),
        });
        let index = self.objects.len() - 1;
        self.by_file.insert(m.file_id, index);
        Some(index)
    }

    fn plan(&self, m: &MappedObject, object_id: u32) -> Result<(AttachPlan, std::fs::File)> {
        let file = std::fs::File::open(&m.open_path)
            .with_context(|| format!("opening {}", m.open_path.display()))?;
        let held = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let mut plan = AttachPlan::for_object(&held, object_id)?;
        plan.binary = held;
        plan.display_path = m.path.clone();
        plan.deleted = m.deleted;
        // Each process maps it at its own address.
        plan.load_address = 0;
        plan.exe_name = crate::traced::file_name(&m.path).to_owned();
        self.filter.retain(&mut plan);
        exits::decide(&mut plan, self.policy);
        Ok((plan, file))
    }
}

/// Whether `err` is a permission refused (EACCES, EPERM).
fn denied(err: &anyhow::Error) -> bool {
    err.chain()
        .filter_map(|e| e.downcast_ref::<std::io::Error>())
        .any(|e| e.kind() == std::io::ErrorKind::PermissionDenied)
}

/// Bits of a probe's function id that hold the service's tag (where a trace has its object
/// id: the tag is replaced by the object id when an event is read).
pub const TAG_SHIFT: u32 = OBJECT_ID_SHIFT;

/// A function id without its tag or object id.
pub fn untagged(function_id: u32) -> u32 {
    function_id & ((1 << TAG_SHIFT) - 1)
}
