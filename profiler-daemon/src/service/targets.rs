//! What the service traces: its targets, each binary their patterns match (probed for every
//! process that runs it, with the libraries those map), the tags that tell their events apart,
//! and the periodic look for binaries installed or replaced since.
use super::inline::InlineBinary;
use super::repaired::Repaired;
use crate::kernel::bpf::{Attachment, Scope, Tracer};
use crate::plan::exits::{self, ExitMode, ExitPolicy, Exits, ExitsChoice};
use crate::plan::select::FunctionFilter;
use crate::plan::AttachPlan;
use crate::service::config::{Mode, ServiceConfig, TargetConfig, TargetEngine};
use crate::service::export::BinaryExport;
use crate::service::libraries::{self, Libraries, TAG_SHIFT};
use crate::service::retention::Retention;
use crate::service::segments::{SegmentSpec, Segments};
use crate::session::flight::FlightRecorder;
use crate::session::output::name_part;
use anyhow::{bail, Context as _, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One configured target, attached.
pub(super) struct Target {
    pub(super) config: TargetConfig,
    /// A reload removed it: its probes are gone, its last events are being drained.
    pub(super) removed: bool,
    /// The binaries its pattern matched.
    pub(super) binaries: Vec<Watched>,
    /// Its probes, to remove them when a reload removes the target (one attachment per
    /// binary attached after the others, by [`look_at_targets`]).
    pub(super) attachments: Vec<Attachment>,
    /// Files its pattern matches that are not attached, as [`look_at_targets`] last saw
    /// them: one is attached once it is seen unchanged (not being written any more).
    pub(super) unattached: HashMap<PathBuf, FileState>,
    /// Files that could not be attached (said once): tried again only once they change.
    pub(super) refused: std::collections::HashSet<FileState>,
}

/// One binary of a target, attached.
pub(super) struct Watched {
    /// The file, held open: its plan's `binary` is this descriptor (`/proc/self/fd/N`).
    pub(super) _file: std::fs::File,
    /// The path it was found at, and the name its snapshots and segments carry when the
    /// target has several binaries (a file replaced on disk: its name and inode).
    pub(super) path: PathBuf,
    pub(super) label: String,
    /// The plan its probes came from (for the snapshots' manifests), the probes placed, and
    /// when they were in place.
    pub(super) plan: AttachPlan,
    pub(super) probes: usize,
    pub(super) attached_ns: u64,
    /// The tag in its probes' function ids.
    pub(super) tag: u32,
    pub(super) exits: ExitsChoice,
    pub(super) recorder: FlightRecorder,
    /// Record mode: where its events are written instead of held.
    pub(super) segments: Option<Segments>,
    /// The instrumented shared objects its processes map, probed per process.
    pub(super) libraries: Libraries,
    /// Snapshots of it that could not be written (`min_free`, or an error).
    pub(super) snapshots_not_written: std::cell::Cell<u64>,
    /// `exits = "repair"`: its processes, each traced by a keeper and probed on its own.
    pub(super) repaired: Option<Repaired>,
    /// `engine = "inline"`: its processes, each patched by an engine of its own (no probe).
    pub(super) inline: Option<InlineBinary>,
    /// `[export]`: its calls by interval, for the profiles pushed.
    pub(super) export: Option<BinaryExport>,
    /// Its calls by function, and what their probes cost over the last status period.
    pub(super) calls: super::calls::FunctionCalls,
    /// `max_overhead`: its functions' probes, each removable, and the budget that removes
    /// them (`None`: no budget, or one it cannot have; see [`budget_for`]).
    pub(super) budget: Option<crate::budget::watch::Budgeting>,
}

/// The budget of a binary of `config` about to be attached, where it has one and can have
/// it: not under repair (each process has probes of its own there: not yet budgeted), and
/// with the kernel's call counters and the measured cost of a probe.
fn budget_for(
    tracer: &Tracer,
    config: &TargetConfig,
    repairs: bool,
) -> Option<crate::budget::probes::BudgetedProbes> {
    let limit = config.max_overhead?;
    let why_not = if repairs {
        "its stack is repaired at throws (each process probed on its own): every function is traced"
    } else if tracer.call_counts().is_none() {
        "the programs were loaded without call counters: restart the service"
    } else {
        match tracer.trap_costs() {
            Some(traps) => {
                return Some(crate::budget::probes::BudgetedProbes::new(
                    limit,
                    traps,
                    crate::session::monotonic_ns(),
                ))
            }
            None => "what a probe costs could not be measured",
        }
    };
    tracing::info!(
        fdr_target = %config.name,
        "target {}: max_overhead {}% not applied: {why_not}",
        config.name,
        limit * 100.0
    );
    None
}

/// Most binaries the service traces at once (tags 1 to 255).
pub(super) const MAX_TAGS: u32 = 255;

/// The binaries' tags: 1 to [`MAX_TAGS`], those of removed targets given out again.
#[derive(Debug, Default)]
pub(super) struct Tags {
    pub(super) next: u32,
    pub(super) free: Vec<u32>,
}

impl Tags {
    /// A tag, or `None` when all are taken.
    pub(super) fn next(&mut self) -> Option<u32> {
        self.take().ok()
    }

    pub(super) fn take(&mut self) -> Result<u32> {
        if let Some(tag) = self.free.pop() {
            return Ok(tag);
        }
        if self.next == MAX_TAGS {
            bail!("more than {MAX_TAGS} binaries to trace");
        }
        self.next += 1;
        Ok(self.next)
    }

    pub(super) fn give_back(&mut self, tag: u32) {
        self.free.push(tag);
    }
}

/// Plans and attaches every binary `config`'s pattern matches now.
pub(super) fn attach_target(
    tracer: &mut Tracer,
    service: &ServiceConfig,
    retention: &Retention,
    config: &TargetConfig,
    tags: &mut Tags,
) -> Result<Target> {
    // What an earlier target left unclaimed is not this one's.
    drop(tracer.take_attachment());
    // The programs' limits are loaded once, for the targets of the first configuration.
    let loaded = *tracer.options();
    if config.args > loaded.nargs || config.max_event_bytes > loaded.max_event_bytes {
        tracing::warn!(
            fdr_target = %config.name,
            "target {}: args = {} and max_event_bytes = {} exceed what the running service loaded ({} and {}): it records that much; restart the service to raise them",
            config.name,
            config.args,
            config.max_event_bytes,
            loaded.nargs,
            loaded.max_event_bytes
        );
    }
    let mut binaries = Vec::new();
    let mut attachments = Vec::new();
    let mut refused = std::collections::HashSet::new();
    for path in matching_files(&config.binary) {
        let attached = attach_binary(tracer, service, retention, config, &path, tags);
        let attachment = tracer.take_attachment();
        match attached {
            Ok(Some(w)) => {
                binaries.push(w);
                attachments.push(attachment);
            }
            // A file that cannot be traced (anyone who can write to a glob's directory can
            // put one there) is said once and left out, as when it appears later: the others
            // are traced. Not looked at again until it changes.
            Ok(None) => {
                tracer.detach(attachment);
                refused.extend(FileState::of(&path));
            }
            Err(err) => {
                tracer.detach(attachment);
                tracing::warn!(fdr_target = %config.name, "{err:#}: not traced");
                refused.extend(FileState::of(&path));
            }
        }
    }
    if binaries.is_empty() {
        tracing::warn!(
            "target {}: no instrumented file matches {}",
            config.name,
            config.binary
        );
    }
    let mut target = Target {
        config: config.clone(),
        removed: false,
        binaries,
        attachments,
        unattached: HashMap::new(),
        refused,
    };
    target.name_binaries();
    // The processes already running: their libraries are probed now (later ones are looked
    // at when their first event arrives).
    for w in &mut target.binaries {
        w.watch_running(tracer, tags);
    }
    Ok(target)
}

/// Plans and attaches one binary of a target (the file at `path`), for every process that
/// runs it; `None` when none of its functions is selected (said). Its probes are left in the
/// tracer's attachment, for the caller to take.
fn attach_binary(
    tracer: &mut Tracer,
    service: &ServiceConfig,
    retention: &Retention,
    config: &TargetConfig,
    path: &Path,
    tags: &mut Tags,
) -> Result<Option<Watched>> {
    let filter = FunctionFilter::new(&config.functions, &config.exclude)?;
    // Opened once, a link at the path refused, its type checked on the descriptor; then read,
    // planned and probed through that descriptor (`/proc/self/fd/N`), never by its path again:
    // the probes are on the very file that was checked, whatever is put at the path meanwhile.
    let held = xray_object::elf::open_regular_file(path, xray_object::elf::Follow::NoLinks)
        .with_context(|| format!("target {}", config.name))?;
    let file = {
        use std::os::unix::fs::MetadataExt as _;
        let meta = held
            .metadata()
            .with_context(|| format!("target {}: {}", config.name, path.display()))?;
        Some((meta.dev(), meta.ino()))
    };
    let through = {
        use std::os::fd::AsRawFd as _;
        PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd()))
    };
    let mut plan = AttachPlan::for_binary(&through)
        .with_context(|| format!("target {}: {}", config.name, path.display()))?;
    plan.binary = through;
    plan.display_path = path.display().to_string();
    plan.exe_name = crate::traced::file_name(&plan.display_path).to_owned();
    if filter.retain(&mut plan) == 0 {
        tracing::warn!(
            "target {}: {}: no function selected",
            config.name,
            path.display()
        );
        return Ok(None);
    }
    let tag = tags.take()?;
    // The libraries it needs are found from its path ($ORIGIN); it is read through the
    // descriptor.
    let mut image = exits::static_image(path);
    image[0] = plan.binary.clone();
    // `auto` repairs the stack where it can (the repair programs loaded, see `runtime`), as
    // `--attach` does; else it decides per function. Not under a budget: a repaired stack's
    // probes are per process, which a budget cannot drop yet (see `budget_for`), and an
    // always-on target is kept cheap by its budget, which per-function's probes, shared by
    // every process and each function's removable, allow.
    let inline = config.engine == TargetEngine::Inline;
    let auto_repair =
        (config.exits == ExitMode::Auto && !inline && tracer.options().repair.is_some())
            .then(|| crate::repair::auto_repairs(&image, true))
            .flatten();
    let budget_not_repair = auto_repair.is_some() && config.max_overhead.is_some();
    let auto_repair = auto_repair.filter(|_| config.max_overhead.is_none());
    let repairs = config.exits == ExitMode::Repair || auto_repair.is_some();
    let (policy, choice) = match &auto_repair {
        Some((unwinder, symbol)) => {
            let (policy, mut choice) = exits::choose(ExitMode::Repair, &image);
            choice.reason = crate::repair::auto_reason(unwinder, symbol);
            (policy, choice)
        }
        None if inline => {
            let (policy, mut choice) = exits::choose(ExitMode::Sleds, &image);
            choice.reason =
                "engine = \"inline\": a patched exit sled costs what an entry does".into();
            (policy, choice)
        }
        None => {
            let (policy, mut choice) = exits::choose(config.exits, &image);
            if budget_not_repair {
                choice.reason = format!(
                    "{}; not repaired under max_overhead (a repaired stack's probes are per \
                     process, which the budget cannot drop yet): max_overhead = \"none\" repairs",
                    choice.reason
                );
            }
            (policy, choice)
        }
    };
    exits::decide(&mut plan, policy);
    let mut tagged = plan.clone();
    for probe in &mut tagged.probes {
        probe.cookie.function_id |= tag << TAG_SHIFT;
    }
    let mut budget = budget_for(tracer, config, repairs);
    let mut inline_binary = None;
    // Under repair every probe is per process (see `repair::processes`).
    let placed = if inline {
        let name = format!("target {} ({})", config.name, plan.display_path);
        let sleds = tagged.probes.len();
        InlineBinary::start(tracer, name, &plan.binary, tagged, tag, config.ring_size).map(|i| {
            inline_binary = Some(i);
            (sleds, None)
        })
    } else if repairs {
        if tracer.options().repair.is_none() {
            tags.give_back(tag);
            bail!(
                "target {}: exits = \"repair\" needs the repair programs, which the running service did not load (no target asked for it when it started): restart the service",
                config.name
            );
        }
        let name = format!("target {} ({})", config.name, plan.display_path);
        let probes = tagged.probes.len();
        Repaired::new(tracer, name, &plan.binary, tagged, tag).map(|r| (probes, Some(r)))
    } else if let Some(budget) = &mut budget {
        let id_of = |id: u32| {
            let id = super::libraries::untagged(id);
            (id, plan.names.name(id))
        };
        budget
            .attach(tracer, &tagged, Scope::AllProcesses, &id_of)
            .map(|n| (n, None))
    } else {
        tracer
            .attach(&tagged, Scope::AllProcesses)
            .map(|n| (n, None))
    };
    let (probes, repaired) = match placed {
        Ok(placed) => placed,
        Err(err) => {
            tags.give_back(tag);
            return Err(err);
        }
    };
    for point in crate::plan::catches::catch_points(&plan.binary) {
        if repaired.is_some() || inline {
            // Each process's own, once traced; none under the inline engine (a kernel event
            // cannot be put in order with the engine's).
            break;
        }
        if let Err(err) = tracer.attach_catch(&plan.binary, point.file_offset, Scope::AllProcesses)
        {
            tracing::warn!("{}: catches not probed ({err:#})", plan.binary.display());
        }
    }
    tracing::info!(
        fdr_target = %config.name,
        fdr_binary = %plan.display_path,
        fdr_probes = probes,
        "target {}: {} {probes} {} to {} functions in {}",
        config.name,
        if inline { "inline engine:" } else { "attached" },
        if inline { "sleds to patch in each process" } else { "probes" },
        plan.functions,
        plan.display_path
    );
    let attached_ns = crate::session::monotonic_ns();
    let segments = (config.mode == Mode::Record).then(|| {
        Segments::new(
            SegmentSpec {
                target: config.name.clone(),
                suffix: String::new(),
                plan: plan.clone(),
                probes,
                attached_ns,
                libraries: Vec::new(),
                exits: choice.clone(),
                version: config.fdr_version,
                max_bytes: config.segment_bytes,
                max_age: config.segment_age,
            },
            retention.clone(),
        )
    });
    let libraries = Libraries::new(
        format!("target {} ({})", config.name, plan.display_path),
        file,
        filter,
        policy,
        !repairs && config.exits == ExitMode::Auto && policy == ExitPolicy::All(Exits::Return),
    );
    let budget = budget.map(|probes| {
        crate::budget::watch::Budgeting::new(probes, Scope::AllProcesses, plan.binary.clone())
    });
    Ok(Some(Watched {
        repaired,
        inline: inline_binary,
        _file: held,
        path: path.to_path_buf(),
        label: plan.exe_name.clone(),
        snapshots_not_written: std::cell::Cell::new(0),
        libraries,
        segments,
        plan,
        probes,
        attached_ns,
        tag,
        exits: choice,
        recorder: FlightRecorder::new(config.window, config.max_memory),
        calls: super::calls::FunctionCalls::default(),
        budget,
        export: service
            .export
            .as_ref()
            .map(|e| BinaryExport::new(e.interval)),
    }))
}

impl Watched {
    /// The functions of its executable and libraries whose exits a return probe observes,
    /// by packed function id (object id and XRay id, without the service's tag).
    pub(super) fn return_probed(&self) -> std::collections::HashSet<u32> {
        let of = |object_id: u32, plan: &AttachPlan| {
            plan.probes
                .iter()
                .filter(|p| p.carries_return_probe())
                .map(move |p| {
                    crate::plan::packed_id(
                        object_id,
                        super::libraries::untagged(p.cookie.function_id),
                    )
                })
                .collect::<Vec<u32>>()
        };
        let mut ids: std::collections::HashSet<u32> = of(0, &self.plan).into_iter().collect();
        for library in &self.libraries.objects {
            ids.extend(of(library.object_id, &library.plan));
        }
        ids
    }

    /// The name of its function `id` (packed: object id and XRay id).
    pub(super) fn function_name(&self, id: u32) -> String {
        let object_id = id >> crate::plan::OBJECT_ID_SHIFT;
        if object_id == 0 {
            return self.plan.names.name(id);
        }
        self.libraries
            .objects
            .iter()
            .find(|l| l.object_id == object_id)
            .map_or_else(|| format!("#{id}"), |l| l.plan.names.name(id))
    }
}

impl Target {
    /// With several binaries, each one's snapshots and segments are named after it.
    pub(super) fn name_binaries(&mut self) {
        if self.binaries.len() > 1 {
            for w in &mut self.binaries {
                if let Some(segments) = &mut w.segments {
                    segments.set_suffix(format!("-{}", name_part(&w.label)));
                }
            }
        }
    }
}

impl Watched {
    /// Probes the libraries of the processes already running the binary (later ones are
    /// looked at when their first event arrives).
    pub(super) fn watch_running(&mut self, tracer: &mut Tracer, tags: &mut Tags) {
        if let Some(repaired) = &mut self.repaired {
            for pid in repaired.running() {
                repaired.trace(pid, tracer, crate::repair::processes::Found::Running);
            }
        }
        let Some(executable) = self
            .libraries
            .executable()
            .filter(|_| self.inline.is_none())
        else {
            return;
        };
        for pid in crate::traced::process::running(executable) {
            let changes = self.libraries.watch(pid, tracer, &mut || tags.next());
            self.take_libraries(&changes);
        }
    }

    /// Makes the libraries `changes` registered part of what this binary writes and watches.
    pub(super) fn take_libraries(&mut self, changes: &libraries::Changes) {
        for &i in &changes.new_libraries {
            let library = &self.libraries.objects[i];
            let plan = &library.plan;
            if let Some(segments) = &mut self.segments {
                segments.add_library(plan.clone(), library.probes, library.attached_ns);
            }
        }
    }
}

/// How often (in status periods) the targets' patterns are matched again by
/// [`look_at_targets`].
pub(super) const LOOK_AT_TARGETS_EVERY: u32 = 2;

/// A file as [`look_at_targets`] sees it: device and inode, size and modification time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct FileState {
    pub(super) id: crate::traced::mappings::FileId,
    pub(super) len: u64,
    pub(super) modified: Option<std::time::SystemTime>,
}

impl FileState {
    pub(super) fn of(path: &Path) -> Option<FileState> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(path).ok()?;
        Some(FileState {
            id: (meta.dev(), meta.ino()),
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

/// Matches every target's pattern again (whether a binary was added, for the router to
/// retarget): a file that matches now and is not attached (a
/// binary installed since, or one replaced on disk: a new inode at the same path, as a package
/// upgrade leaves it) is attached as a reload attaches a target's binaries, once it is seen
/// unchanged twice in a row (a file still being copied in is not read half written). The
/// probes of a file replaced stay, with what was recorded of it, for the processes still
/// running it, until the target is removed or changed by a reload or the service stops.
pub(super) fn look_at_targets(
    targets: &mut [Target],
    tracer: &mut Tracer,
    config: &ServiceConfig,
    retention: &Retention,
    tags: &mut Tags,
) -> bool {
    let mut added = false;
    for target in targets.iter_mut().filter(|t| !t.removed) {
        let mut unattached = HashMap::new();
        for path in matching_files(&target.config.binary) {
            let Some(state) = FileState::of(&path) else {
                continue;
            };
            if target
                .binaries
                .iter()
                .any(|w| w.libraries.executable() == Some(state.id))
                || target.refused.contains(&state)
            {
                continue;
            }
            if target.unattached.get(&path) != Some(&state) {
                unattached.insert(path, state);
                continue;
            }
            added |= target.add_binary(tracer, config, retention, &path, state, tags);
        }
        target.unattached = unattached;
    }
    added
}

impl Target {
    /// Attaches the file at `path` (seen as `state`), which [`look_at_targets`] found matching
    /// and not attached; says so, and whether it was replaced. Whether it was attached (a file
    /// that cannot be is said once, and tried again only once it changes).
    fn add_binary(
        &mut self,
        tracer: &mut Tracer,
        service: &ServiceConfig,
        retention: &Retention,
        path: &Path,
        state: FileState,
        tags: &mut Tags,
    ) -> bool {
        drop(tracer.take_attachment());
        let attached = attach_binary(tracer, service, retention, &self.config, path, tags);
        let attachment = tracer.take_attachment();
        let mut w = match attached {
            Ok(Some(w)) => w,
            Ok(None) => {
                tracer.detach(attachment);
                self.refused.insert(state);
                return false;
            }
            Err(err) => {
                tracer.detach(attachment);
                tracing::warn!(fdr_target = %self.config.name, "{err:#}: not traced");
                self.refused.insert(state);
                return false;
            }
        };
        self.attachments.push(attachment);
        let (dev, ino) = state.id;
        let mut replaced = Vec::new();
        for old in &mut self.binaries {
            if old.path == path && old.label == old.plan.exe_name {
                let (_, old_ino) = old.libraries.executable().unwrap_or_default();
                old.label = format!("{}-replaced-{old_ino}", old.plan.exe_name);
                replaced.push(old.libraries.executable());
            }
        }
        if replaced.is_empty() {
            tracing::info!(
                fdr_target = %self.config.name,
                fdr_binary = %path.display(),
                "target {}: {} now matches {}: traced (device {dev}, inode {ino})",
                self.config.name,
                path.display(),
                self.config.binary
            );
        }
        for old in replaced {
            let (_, old_ino) = old.unwrap_or_default();
            let running = old.map(crate::traced::process::running).unwrap_or_default();
            tracing::info!(
                fdr_target = %self.config.name,
                fdr_binary = %path.display(),
                "target {}: {} was replaced on disk (inode {old_ino}, now {ino}): the new file is traced; the old one's probes stay, for the {} processes still running it, until the target changes or the service stops",
                self.config.name,
                path.display(),
                running.len()
            );
        }
        w.watch_running(tracer, tags);
        self.binaries.push(w);
        self.name_binaries();
        true
    }
}

/// The regular files a target's pattern names: the path itself, or every match of a glob.
fn matching_files(pattern: &str) -> Vec<PathBuf> {
    let is_glob = pattern.contains(['*', '?', '[', '{']);
    if !is_glob {
        // The path as configured may be a link (an alternatives link, say): resolved here,
        // once, so that the file is then opened without following any.
        return std::fs::canonicalize(pattern)
            .into_iter()
            .filter(|p| p.is_file())
            .collect();
    }
    let Ok(glob) = globset::Glob::new(pattern) else {
        return Vec::new();
    };
    let matcher = glob.compile_matcher();
    // Walk from the longest directory prefix without a wildcard, a few levels deep.
    let fixed: PathBuf = Path::new(pattern)
        .components()
        .take_while(|c| {
            !c.as_os_str()
                .to_string_lossy()
                .contains(['*', '?', '[', '{'])
        })
        .collect();
    let mut found = Vec::new();
    let mut dirs = vec![(fixed, 0)];
    while let Some((dir, depth)) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() && depth < 8 {
                dirs.push((path.clone(), depth + 1));
            }
            if kind.is_file() && matcher.is_match(&path) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}
