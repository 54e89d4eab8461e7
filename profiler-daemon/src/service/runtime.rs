//! The running service: every configured target attached (every process that runs its binary,
//! now or later), each target's events held by a flight recorder (and a snapshot written on
//! `SIGUSR1`, a request, a crash or a slow call), or, in record mode, written into rotated
//! segments ([`crate::service::segments`]).
//!
//! One eBPF tracer serves all targets. Every target's executable is XRay object 0 in its
//! files, so the probes of each binary carry a tag of their own in the top bits of the
//! function id (1 to 255): an event says which binary it comes from, even when its process has
//! exited by the time the event is read, and the tag is taken off before it is held. A thread's
//! end and its catches carry no function id: they go where the thread's last event went. A
//! target whose pattern matches several binaries keeps one recorder per binary, and its
//! snapshots one directory per binary.
use super::repaired::Repaired;
use crate::kernel::bpf::{Attachment, KernelBooks, LoadOptions, Scope, Tracer};
use crate::kernel::caps::Cap;
use crate::kernel::intake::{Event, Intake, DRAIN_BUDGET};
use crate::plan::exits::{self, ExitMode, ExitPolicy, Exits, ExitsChoice};
use crate::plan::select::FunctionFilter;
use crate::plan::AttachPlan;
use crate::service::config::{Mode, ServiceConfig, TargetConfig};
use crate::service::control;
use crate::service::export::{BinaryExport, BinaryLabels, Exporter};
use crate::service::libraries::{self, Libraries, TAG_SHIFT};
use crate::service::output::OutputRoot;
use crate::service::retention::{Retention, Writing};
use crate::service::segments::{SegmentSpec, Segments};
use crate::service::triggers::{Due, Triggers, Watch};
use crate::session::flight::FlightRecorder;
use crate::session::order::{Gap, Sequencer};
use crate::session::output::{name_part, OutputDir};
use crate::session::{Executable, IntakeLosses, Session};
use anyhow::{bail, Context as _, Result};
use fdr_analysis::symbolize::Symbolizer;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

/// How often the ring buffers are drained (as a recording does).
const DRAIN_INTERVAL: Duration = Duration::from_millis(10);
/// How often every thread's window is aged, not only the threads that run.
const EXPIRE_INTERVAL: Duration = Duration::from_millis(500);

/// One configured target, attached.
struct Target {
    config: TargetConfig,
    /// A reload removed it: its probes are gone, its last events are being drained.
    removed: bool,
    /// The binaries its pattern matched.
    binaries: Vec<Watched>,
    /// Its probes, to remove them when a reload removes the target (one attachment per
    /// binary attached after the others, by [`look_at_targets`]).
    attachments: Vec<Attachment>,
    /// Files its pattern matches that are not attached, as [`look_at_targets`] last saw
    /// them: one is attached once it is seen unchanged (not being written any more).
    unattached: HashMap<PathBuf, FileState>,
    /// Files that could not be attached (said once): tried again only once they change.
    refused: std::collections::HashSet<FileState>,
}

/// One binary of a target, attached.
struct Watched {
    /// The file, held open: its plan's `binary` is this descriptor (`/proc/self/fd/N`).
    _file: std::fs::File,
    /// The path it was found at, and the name its snapshots and segments carry when the
    /// target has several binaries (a file replaced on disk: its name and inode).
    path: PathBuf,
    label: String,
    /// The plan its probes came from (for the snapshots' manifests), the probes placed, and
    /// when they were in place.
    plan: AttachPlan,
    probes: usize,
    attached_ns: u64,
    /// The tag in its probes' function ids.
    tag: u32,
    exits: ExitsChoice,
    recorder: FlightRecorder,
    /// Record mode: where its events are written instead of held.
    segments: Option<Segments>,
    /// The instrumented shared objects its processes map, probed per process.
    libraries: Libraries,
    /// Snapshots of it that could not be written (`min_free`, or an error).
    snapshots_not_written: std::cell::Cell<u64>,
    /// `exits = "repair"`: its processes, each traced by a keeper and probed on its own.
    repaired: Option<Repaired>,
    /// `[export]`: its calls by interval, for the profiles pushed.
    export: Option<BinaryExport>,
}

/// Runs the service until SIGTERM or SIGINT, listening for `status` and `snapshot` requests on
/// `socket`.
pub fn run(config_path: &Path, socket: &Path) -> Result<u8> {
    // Before anything else (see `crate::kernel::caps`). CAP_SYS_PTRACE is not required: without
    // it the libraries of other users' processes are not traced, which is said per process.
    crate::kernel::caps::require_for_probes(&[Cap::Bpf, Cap::Perfmon], "the service")?;
    let mut config = ServiceConfig::load(config_path)?;
    let mut tracer = Tracer::load(LoadOptions {
        ring_bytes: profiler_common::DEFAULT_RING_BYTES,
        nargs: config.targets.iter().map(|t| t.args).max().unwrap_or(1),
        max_event_bytes: config
            .targets
            .iter()
            .map(|t| t.max_event_bytes)
            .max()
            .unwrap_or(0),
        floor: false,
        ablate: 0,
        follow_forks: false,
        perf_events_only: false,
        // Loaded for every target of the first configuration that asks for it.
        repair: config
            .targets
            .iter()
            .any(|t| t.exits == ExitMode::Repair)
            .then(crate::kernel::btf::repair_offsets)
            .transpose()
            .map_err(|why| anyhow::anyhow!("exits = \"repair\": {why}"))?,
        // The programs' rare anomalies go to the journal with the service's other warnings.
        kernel_log: true,
    })?;
    // The kernel side's own loss accounts: threads whose end record found a full buffer, and
    // events of no thread (see `crate::kernel::bpf::KernelBooks`).
    let books = tracer.take_books()?;
    // Resolved once through directories only root can change, and held from now on (see
    // `service::output`).
    let retention = Retention::new(
        Rc::new(OutputRoot::open(&config.output)?),
        config.max_disk,
        config.min_free,
    );
    let mut targets = Vec::new();
    let mut tags = Tags::default();
    for t in &config.targets {
        targets.push(attach_target(
            &mut tracer,
            &config,
            &retention,
            t,
            &mut tags,
        )?);
    }
    if targets.iter().all(|t| t.binaries.is_empty()) {
        bail!("no target's binary exists: nothing to trace");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the event loop")?;
    // The socket and the ring buffers are registered with the runtime; both are in place
    // before the service says it is ready.
    let (intake, listener) = {
        let _context = runtime.enter();
        (Intake::new(tracer.take_rings())?, control::bind(socket)?)
    };
    tracer.set_armed(true)?;
    tracing::info!(
        fdr_targets = targets.len(),
        fdr_output = %config.output.display(),
        "ready: {} target{}, output {}",
        targets.len(),
        if targets.len() == 1 { "" } else { "s" },
        config.output.display()
    );
    let exporter = config.export.as_ref().map(Exporter::start).transpose()?;
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
    let mut service = Service {
        path: config_path.to_path_buf(),
        config: &mut config,
        tracer: &mut tracer,
        targets: &mut targets,
        tags: &mut tags,
        exporter,
        books,
        exited: Vec::new(),
        retention,
        triggers: Triggers::new(),
        watched: HashMap::new(),
    };
    let result = runtime.block_on(serve(&mut service, intake, listener));
    let _ = std::fs::remove_file(socket);
    if result.is_err() {
        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    }
    if let Err(err) = tracer.set_armed(false) {
        tracing::warn!("{err:#}");
    }
    drop(tracer);
    result.map(|()| 0)
}

/// Most binaries the service traces at once (tags 1 to 255).
const MAX_TAGS: u32 = 255;

/// The binaries' tags: 1 to [`MAX_TAGS`], those of removed targets given out again.
#[derive(Debug, Default)]
struct Tags {
    next: u32,
    free: Vec<u32>,
}

impl Tags {
    /// A tag, or `None` when all are taken.
    fn next(&mut self) -> Option<u32> {
        self.take().ok()
    }

    fn take(&mut self) -> Result<u32> {
        if let Some(tag) = self.free.pop() {
            return Ok(tag);
        }
        if self.next == MAX_TAGS {
            bail!("more than {MAX_TAGS} binaries to trace");
        }
        self.next += 1;
        Ok(self.next)
    }

    fn give_back(&mut self, tag: u32) {
        self.free.push(tag);
    }
}

/// What the event loop works on, and what a reload changes.
struct Service<'a> {
    /// The configuration file, read again on SIGHUP.
    path: PathBuf,
    config: &'a mut ServiceConfig,
    tracer: &'a mut Tracer,
    targets: &'a mut Vec<Target>,
    tags: &'a mut Tags,
    /// `[export]`'s endpoints, when configured.
    exporter: Option<Exporter>,
    /// The kernel side's loss accounts.
    books: KernelBooks,
    /// Threads that ended with their buffer full (their end record lost), taken from the
    /// kernel's books and not ended yet: their last events may still be in the buffers.
    exited: Vec<(u32, profiler_common::ThreadState)>,
    /// The output root held open, with the configuration's limits: where snapshots go, and
    /// segments of targets attached from now on.
    retention: Retention,
    /// What makes snapshots due.
    triggers: Triggers,
    /// The binaries the triggers watch (by tag), with how many of their libraries they know.
    watched: HashMap<u32, usize>,
}

/// Plans and attaches every binary `config`'s pattern matches now.
fn attach_target(
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
    let (policy, choice) = exits::choose(config.exits, &image);
    exits::decide(&mut plan, policy);
    let mut tagged = plan.clone();
    for probe in &mut tagged.probes {
        probe.cookie.function_id |= tag << TAG_SHIFT;
    }
    // Under repair every probe is per process (see `repair::processes`).
    let placed = if config.exits == ExitMode::Repair {
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
        if repaired.is_some() {
            // Each process's own, once traced.
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
        "target {}: attached {probes} probes to {} functions in {}",
        config.name, plan.functions, plan.display_path
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
        config.exits == ExitMode::Auto && policy == ExitPolicy::All(Exits::Return),
    );
    Ok(Some(Watched {
        repaired,
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
        export: service
            .export
            .as_ref()
            .map(|e| BinaryExport::new(e.interval)),
    }))
}

impl Target {
    /// With several binaries, each one's snapshots and segments are named after it.
    fn name_binaries(&mut self) {
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
    fn watch_running(&mut self, tracer: &mut Tracer, tags: &mut Tags) {
        if let Some(repaired) = &mut self.repaired {
            for pid in repaired.running() {
                repaired.trace(pid, tracer);
            }
        }
        let Some(executable) = self.libraries.executable() else {
            return;
        };
        for pid in crate::traced::process::running(executable) {
            let changes = self.libraries.watch(pid, tracer, &mut || tags.next());
            self.take_libraries(&changes);
        }
    }

    /// Makes the libraries `changes` registered part of what this binary writes and watches.
    fn take_libraries(&mut self, changes: &libraries::Changes) {
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
const LOOK_AT_TARGETS_EVERY: u32 = 2;

/// A file as [`look_at_targets`] sees it: device and inode, size and modification time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FileState {
    id: crate::traced::mappings::FileId,
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl FileState {
    fn of(path: &Path) -> Option<FileState> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(path).ok()?;
        Some(FileState {
            id: (meta.dev(), meta.ino()),
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

/// Matches every target's pattern again: a file that matches now and is not attached (a
/// binary installed since, or one replaced on disk: a new inode at the same path, as a package
/// upgrade leaves it) is attached as a reload attaches a target's binaries, once it is seen
/// unchanged twice in a row (a file still being copied in is not read half written). The
/// probes of a file replaced stay, with what was recorded of it, for the processes still
/// running it, until the target is removed or changed by a reload or the service stops.
fn look_at_targets(svc: &mut Service<'_>, router: &mut Router) {
    let mut added = false;
    for target in svc.targets.iter_mut().filter(|t| !t.removed) {
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
            added |= target.add_binary(
                svc.tracer,
                svc.config,
                &svc.retention,
                &path,
                state,
                svc.tags,
            );
        }
        target.unattached = unattached;
    }
    if added {
        router.retarget(svc.targets);
    }
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

/// Looks at the processes the router saw for the first time (their libraries probed), or at
/// every process again (`rescan`: libraries loaded since, processes gone); routes the tags of
/// libraries found.
fn look_at_processes(svc: &mut Service<'_>, router: &mut Router, rescan: bool) {
    let new = std::mem::take(&mut router.new_processes);
    if new.is_empty() && !rescan {
        return;
    }
    let mut found = false;
    let tags = &mut *svc.tags;
    for (t, target) in svc.targets.iter_mut().enumerate() {
        if target.removed {
            continue;
        }
        for (b, w) in target.binaries.iter_mut().enumerate() {
            let mut changes = libraries::Changes::default();
            if rescan {
                changes = w.libraries.rescan(svc.tracer, &mut || tags.next());
            }
            for &(_, _, pid) in new.iter().filter(|&&(nt, nb, _)| (nt, nb) == (t, b)) {
                let more = w.libraries.watch(pid, svc.tracer, &mut || tags.next());
                changes.new_libraries.extend(more.new_libraries);
            }
            found |= !changes.new_libraries.is_empty();
            w.take_libraries(&changes);
        }
    }
    if found {
        router.retarget(svc.targets);
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

/// The path of events, from the kernel's rings to the targets: each thread's events put in
/// program order and routed to their binary.
struct Pipeline {
    intake: Intake,
    order: Sequencer,
    router: Router,
}

impl Pipeline {
    /// Drains at most `budget` records of each ring (every one with `u64::MAX`); whether
    /// every ring was emptied.
    fn drain(&mut self, targets: &mut [Target], triggers: &mut Triggers, budget: u64) -> bool {
        let (order, router) = (&mut self.order, &mut self.router);
        let (_, emptied) = self.intake.drain_some(budget, |event| {
            order.push(event, &mut |e, g| router.route(targets, triggers, e, g))
        });
        emptied
    }

    /// Ends the threads whose kernel-side books are `books` (see `Sequencer::end_threads`).
    fn end_threads(
        &mut self,
        books: &[(u32, profiler_common::ThreadState)],
        targets: &mut [Target],
        triggers: &mut Triggers,
    ) {
        let router = &mut self.router;
        self.order
            .end_threads(books, &mut |e, g| router.route(targets, triggers, e, g));
    }
}

/// Writes the snapshots `due` (each binary's window as it is now); returns each one written,
/// with the trigger that wanted it.
fn write_due(svc: &mut Service<'_>, due: Vec<Due>) -> Vec<(&'static str, PathBuf)> {
    if due.is_empty() {
        return Vec::new();
    }
    let stamp = utc_stamp();
    let mut written = Vec::new();
    for d in due {
        let Some((t, b)) = svc.targets.iter().enumerate().find_map(|(t, target)| {
            let b = target.binaries.iter().position(|w| w.tag == d.tag)?;
            Some((t, b))
        }) else {
            continue;
        };
        svc.targets[t].binaries[b].recorder.expire();
        let target = &svc.targets[t];
        if let Some(dir) =
            snapshot_binary(&svc.retention, target, &target.binaries[b], &stamp, &d.name)
        {
            written.push((d.trigger, dir));
        }
    }
    written
}

/// Makes the triggers watch every binary of the flight-recorder targets (and the libraries
/// found in their processes), and forget those gone.
fn sync_triggers(svc: &mut Service<'_>) {
    let mut live = std::collections::HashSet::new();
    for target in svc.targets.iter().filter(|t| !t.removed) {
        for w in target.binaries.iter().filter(|w| w.segments.is_none()) {
            live.insert(w.tag);
            let known = match svc.watched.get(&w.tag) {
                Some(&n) => n,
                None => {
                    svc.triggers.watch(&Watch {
                        tag: w.tag,
                        config: &target.config,
                        plan: &w.plan,
                    });
                    0
                }
            };
            for library in &w.libraries.objects[known..] {
                svc.triggers.watch_object(w.tag, &library.plan);
            }
            svc.watched.insert(w.tag, w.libraries.objects.len());
        }
    }
    let gone: Vec<u32> = svc
        .watched
        .keys()
        .copied()
        .filter(|tag| !live.contains(tag))
        .collect();
    for tag in gone {
        svc.triggers.forget(tag);
        svc.watched.remove(&tag);
    }
}

/// The event loop: drain, route to the targets' recorders, write the snapshots the triggers
/// want, answer the control socket, reload on SIGHUP.
async fn serve(
    svc: &mut Service<'_>,
    intake: Intake,
    listener: tokio::net::UnixListener,
) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigusr1 =
        signal(SignalKind::user_defined1()).context("installing the SIGUSR1 handler")?;
    let mut drain = tokio::time::interval(DRAIN_INTERVAL);
    drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut expire = tokio::time::interval(EXPIRE_INTERVAL);
    let mut rescan = tokio::time::interval(libraries::RESCAN_INTERVAL);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut events = Pipeline {
        intake,
        order: Sequencer::default(),
        router: Router::new(svc.targets),
    };
    sync_triggers(svc);
    let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    // systemd's watchdog, when the unit sets WatchdogSec: a ping at half its period.
    let mut watchdog_usec = 0;
    let watchdog = sd_notify::watchdog_enabled(false, &mut watchdog_usec);
    let mut ping = tokio::time::interval(Duration::from_micros(watchdog_usec.max(2) / 2));
    let mut status = tokio::time::interval(STATUS_INTERVAL);
    // A tick the loop could not take on time comes late, never as a burst of ticks a moment
    // apart: the events per second are taken over the time since the last one.
    status.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_status = (std::time::Instant::now(), 0u64);
    // Events per second over the last status period.
    let mut rate = 0.0;
    let mut last_snapshot: Option<PathBuf> = None;
    let mut statuses = 0u32;
    loop {
        tokio::select! {
            _ = drain.tick() => {
                events.drain(svc.targets, &mut svc.triggers, DRAIN_BUDGET);
                svc.tracer.show_kernel_log();
                look_at_repaired(svc);
                look_at_processes(svc, &mut events.router, false);
                let due = svc.triggers.due(false);
                if let Some((_, dir)) = write_due(svc, due).pop() {
                    last_snapshot = Some(dir);
                }
            }
            woken = events.intake.wakeup() => {
                woken?;
                events.drain(svc.targets, &mut svc.triggers, DRAIN_BUDGET);
                look_at_processes(svc, &mut events.router, false);
            }
            _ = rescan.tick() => look_at_processes(svc, &mut events.router, true),
            _ = expire.tick() => {
                for w in svc.targets.iter_mut().flat_map(|t| t.binaries.iter_mut()) {
                    w.recorder.expire();
                }
                export_tick(svc, false);
            }
            _ = sigusr1.recv() => {
                events.drain(svc.targets, &mut svc.triggers, DRAIN_BUDGET);
                svc.triggers.on_demand.fire(None, "sigusr1");
                let due = svc.triggers.due(false);
                if let Some((_, dir)) = write_due(svc, due).pop() {
                    last_snapshot = Some(dir);
                }
            }
            accepted = listener.accept() => {
                let Ok((mut stream, _)) = accepted else { continue };
                let answer = match control::read_request(&mut stream).await {
                    Err(why) => serde_json::json!({ "error": why }),
                    Ok(control::Request::Status) => {
                        status_json(svc, &events.router, rate, last_snapshot.as_deref())
                    }
                    Ok(control::Request::Snapshot(name)) => {
                        if name.as_ref().is_some_and(|n| !svc.targets.iter().any(|t| &t.config.name == n)) {
                            serde_json::json!({ "error": format!("no target named {:?}", name.unwrap_or_default()) })
                        } else {
                            events.drain(svc.targets, &mut svc.triggers, DRAIN_BUDGET);
                            svc.triggers.on_demand.fire(name.as_deref(), "request");
                            let due = svc.triggers.due(false);
                            let written: Vec<PathBuf> = write_due(svc, due)
                                .into_iter()
                                .filter(|(trigger, _)| *trigger == "request")
                                .map(|(_, dir)| dir)
                                .collect();
                            last_snapshot = written.last().cloned().or(last_snapshot);
                            serde_json::json!({ "snapshots": written })
                        }
                    }
                };
                control::reply(&mut stream, &answer).await;
            }
            _ = ping.tick(), if watchdog => {
                let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Watchdog]);
            }
            _ = status.tick() => {
                // Threads that ended with a full buffer: ended once a drain has emptied every
                // buffer (their last events are in them before their books are taken), so
                // that their trailing losses are counted in them.
                svc.exited.extend(svc.books.take_exited());
                if !svc.exited.is_empty()
                    && events.drain(svc.targets, &mut svc.triggers, DRAIN_BUDGET)
                {
                    let exited = std::mem::take(&mut svc.exited);
                    events.end_threads(&exited, svc.targets, &mut svc.triggers);
                }
                for w in svc.targets.iter_mut().flat_map(|t| t.binaries.iter_mut()) {
                    if let Some(segments) = &mut w.segments {
                        segments.tick();
                    }
                }
                let (at, seen) = last_status;
                // The first tick comes at once: events routed before the loop's first turn (a
                // process traced as the service became ready) would be taken over a few
                // milliseconds (64,465 events/s for 2,007 events, seen under load); they count
                // in the next tick's period instead. Later ticks come a period apart or more.
                if at.elapsed() >= STATUS_INTERVAL / 2 {
                    rate = (events.router.events - seen) as f64 / at.elapsed().as_secs_f64();
                    last_status = (std::time::Instant::now(), events.router.events);
                }
                let text = status_line(svc.targets, &events.router, svc.books.unattributed_lost(), rate);
                let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Status(&text)]);
                statuses = statuses.wrapping_add(1);
                if statuses.is_multiple_of(LOOK_AT_TARGETS_EVERY) {
                    look_at_targets(svc, &mut events.router);
                    sync_triggers(svc);
                }
            }
            _ = sighup.recv() => {
                let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Reloading]);
                // What is due is written with the targets as they are.
                events.drain(svc.targets, &mut svc.triggers, u64::MAX);
                let due = svc.triggers.due(true);
                write_due(svc, due);
                // Removed targets stay in place (marked) until their last events are in, so
                // that every tag still routes where it did; added ones come after them. While
                // probes are removed the rings are drained on (and the watchdog fed).
                let mut fed = std::time::Instant::now();
                reload(svc, &mut |targets, triggers| {
                    events.drain(targets, triggers, DRAIN_BUDGET);
                    if watchdog && fed.elapsed() >= Duration::from_micros(watchdog_usec / 2) {
                        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Watchdog]);
                        fed = std::time::Instant::now();
                    }
                });
                events.router.retarget(svc.targets);
                events.drain(svc.targets, &mut svc.triggers, u64::MAX);
                std::mem::take(&mut events.router.new_processes);
                finish_removed(svc);
                events.router.retarget(svc.targets);
                sync_triggers(svc);
                let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
        }
    }
    stop(svc, &mut events);
    Ok(())
}

/// Queues the profiles of every binary's intervals that are over (all of them when `all`).
fn export_tick(svc: &mut Service<'_>, all: bool) {
    let Some(exporter) = svc.exporter.as_mut() else {
        return;
    };
    for target in svc.targets.iter_mut() {
        for w in &mut target.binaries {
            let Some(export) = w.export.as_mut() else {
                continue;
            };
            let plan = &w.plan;
            let libraries = &w.libraries;
            let objects = |object_id: u32| -> Option<PathBuf> {
                match object_id {
                    0 => Some(plan.binary.clone()),
                    id => libraries
                        .objects
                        .iter()
                        .find(|l| l.object_id == id)
                        .map(|l| l.plan.binary.clone()),
                }
            };
            let labels = BinaryLabels {
                service_name: &target.config.name,
                binary: &plan.display_path,
                build_id: plan.build_id.as_deref().unwrap_or(""),
                objects: &objects,
            };
            exporter.tick(export, &labels, all);
        }
    }
}

/// The end (SIGTERM, SIGINT): no event after now, every event before it into the open
/// segments, and those closed within the configured `stop_timeout` (past it, without their
/// reports), so that the service is done before systemd's `TimeoutStopSec` kills it.
fn stop(svc: &mut Service<'_>, events: &mut Pipeline) {
    let started = std::time::Instant::now();
    let deadline = started + svc.config.stop_timeout;
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    // Disarmed first, the last drain ends even while traced programs keep calling.
    if let Err(err) = svc.tracer.set_armed(false) {
        tracing::warn!("{err:#}");
    }
    events.drain(svc.targets, &mut svc.triggers, u64::MAX);
    // Threads whose end record was lost, and the live threads' losses at their very end.
    svc.exited.extend(svc.books.take_exited());
    let exited = std::mem::take(&mut svc.exited);
    events.end_threads(&exited, svc.targets, &mut svc.triggers);
    let (router, triggers, targets) = (&mut events.router, &mut svc.triggers, &mut *svc.targets);
    events.order.finish(&svc.books.threads(), &mut |e, g| {
        router.route(targets, triggers, e, g)
    });
    // Snapshots due and not written yet (crashes seen), written now.
    let due = svc.triggers.due(true);
    write_due(svc, due);
    // The last intervals' profiles (the current one cut short) are pushed while the rest is
    // finished, for at most a quarter of stop_timeout.
    export_tick(svc, true);
    let exported = svc
        .exporter
        .take()
        .map(|e| e.finish(svc.config.stop_timeout / 4));
    // Repaired processes are let go, with no frame left hooked.
    for w in svc.targets.iter_mut().flat_map(|t| t.binaries.iter_mut()) {
        if let Some(repaired) = w.repaired.take() {
            repaired.finish(svc.tracer);
        }
    }
    let mut closed = 0;
    for w in svc.targets.iter_mut().flat_map(|t| t.binaries.iter_mut()) {
        if let Some(segments) = &mut w.segments {
            if segments.current().is_some() {
                segments.close_by(Some(deadline));
                closed += 1;
            }
        }
    }
    if let Some(line) = exported {
        tracing::info!("{line}");
    }
    let took = started.elapsed();
    if took > svc.config.stop_timeout {
        tracing::warn!(
            "stopped in {:.3} s, past stop_timeout ({:?}): {closed} segments closed, the last without their reports",
            took.as_secs_f64(),
            svc.config.stop_timeout
        );
    } else {
        tracing::info!(
            "stopped in {:.3} s: {closed} segments closed",
            took.as_secs_f64()
        );
    }
}

/// Reads the configuration again: targets whose settings did not change keep running (no
/// gap), removed and changed ones have their probes removed and are marked `removed` (their
/// last events are then drained and [`finish_removed`] closes them), added and changed ones
/// are attached after them. A file with an error changes nothing.
///
/// Removing uprobes can take the kernel as long as another traced process keeps calling
/// traced functions (seen on 6.18; an idle one does not delay it): it is done on a thread of
/// its own while `drain` is called here every [`DRAIN_INTERVAL`], so that the kept targets'
/// events are read on and none is lost to a full ring.
fn reload(svc: &mut Service<'_>, drain: &mut dyn FnMut(&mut [Target], &mut Triggers)) {
    let new = match ServiceConfig::load(&svc.path) {
        Ok(new) => new,
        Err(err) => {
            tracing::error!(
                fdr_config = %svc.path.display(),
                "reload refused, the running configuration stays: {err}"
            );
            return;
        }
    };
    let mut new = new;
    // The output: a path that changed is resolved and held now (refused whole if it cannot
    // be); the same path must still lead to the directory held (said if it does not).
    let root = if new.output == svc.config.output {
        let _ = svc.retention.root().verify();
        svc.retention.root().clone()
    } else {
        match OutputRoot::open(&new.output) {
            Ok(root) => Rc::new(root),
            Err(err) => {
                tracing::error!(
                    fdr_config = %svc.path.display(),
                    "reload refused, the running configuration stays: {err:#}"
                );
                return;
            }
        }
    };
    svc.retention = Retention::new(root, new.max_disk, new.min_free);
    if new.export != svc.config.export {
        tracing::warn!(
            fdr_config = %svc.path.display(),
            "reload: [export] changed: the running export stays until the service is restarted"
        );
        new.export = svc.config.export.clone();
    }
    let mut removed = 0;
    let mut attachments = Vec::new();
    for target in svc.targets.iter_mut() {
        if !new.targets.contains(&target.config) {
            target.removed = true;
            removed += 1;
            attachments.append(&mut target.attachments);
            for w in &mut target.binaries {
                attachments.extend(w.libraries.take_attachments());
                if let Some(repaired) = w.repaired.take() {
                    repaired.finish(svc.tracer);
                }
            }
        }
    }
    if !attachments.is_empty() {
        let started = std::time::Instant::now();
        detach_draining(svc.tracer, attachments, &mut || {
            drain(svc.targets, &mut svc.triggers)
        });
        tracing::debug!(
            "reload: probes removed in {:.3} s",
            started.elapsed().as_secs_f64()
        );
    }
    let kept = svc.targets.len() - removed;
    let mut added = 0;
    for t in &new.targets {
        if svc.targets.iter().any(|k| !k.removed && &k.config == t) {
            continue;
        }
        match attach_target(svc.tracer, &new, &svc.retention, t, svc.tags) {
            Ok(target) => {
                svc.targets.push(target);
                added += 1;
            }
            Err(err) => {
                let partial = svc.tracer.take_attachment();
                svc.tracer.detach(partial);
                tracing::error!(
                    fdr_target = %t.name,
                    "reload: target {}: not traced: {err:#}",
                    t.name
                );
            }
        }
    }
    tracing::info!(
        fdr_config = %svc.path.display(),
        "reloaded {}: {kept} targets kept, {added} added, {removed} removed",
        svc.path.display(),
    );
    *svc.config = new;
}

/// Removes the probes of `attachments` on a thread of its own, calling `drain` on this one
/// meanwhile (see [`reload`]).
fn detach_draining(tracer: &mut Tracer, attachments: Vec<Attachment>, drain: &mut dyn FnMut()) {
    let work = std::sync::Mutex::new(Some((tracer, attachments)));
    let detach = || {
        let taken = work
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some((tracer, attachments)) = taken {
            for attachment in attachments {
                tracer.detach(attachment);
            }
        }
    };
    std::thread::scope(|scope| {
        match std::thread::Builder::new()
            .name("detach".into())
            .spawn_scoped(scope, detach)
        {
            Ok(detaching) => {
                while !detaching.is_finished() {
                    drain();
                    std::thread::sleep(DRAIN_INTERVAL);
                }
            }
            // No thread to spare: removed here, without draining meanwhile.
            Err(err) => {
                tracing::warn!("reload: no thread to remove probes on ({err}): removing them here");
                detach();
            }
        }
    });
}

/// Closes what removed targets were writing, frees their tags and drops them.
fn finish_removed(svc: &mut Service<'_>) {
    for mut target in std::mem::take(svc.targets) {
        if !target.removed {
            svc.targets.push(target);
            continue;
        }
        for w in &mut target.binaries {
            if let Some(segments) = &mut w.segments {
                segments.close();
            }
            svc.tags.give_back(w.tag);
            w.libraries.tags().for_each(|tag| svc.tags.give_back(tag));
        }
    }
}

/// How often the service tells systemd how it is doing.
const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// The `STATUS=` line: targets, events, what the recorders hold, losses.
fn status_line(targets: &[Target], router: &Router, unattributed: u64, rate: f64) -> String {
    let binaries: usize = targets.iter().map(|t| t.binaries.len()).sum();
    let (mut held, mut bytes, mut evicted) = (0, 0, 0);
    for w in targets.iter().flat_map(|t| &t.binaries) {
        let s = w.recorder.stats();
        held += s.events;
        bytes += s.bytes;
        evicted += s.evicted;
    }
    format!(
        "{} targets ({binaries} binaries); {} events, {rate:.0}/s; holding {held} events in {:.1} MiB; lost {}, evicted {evicted}, not written {}, snapshots not written {}",
        targets.len(),
        router.events,
        bytes as f64 / f64::from(1 << 20),
        router.lost + router.unrouted + unattributed,
        not_written(targets),
        targets
            .iter()
            .flat_map(|t| &t.binaries)
            .map(|w| w.snapshots_not_written.get())
            .sum::<u64>(),
    )
}

/// Events of record-mode targets not written because writing had stopped (`min_free`).
fn not_written(targets: &[Target]) -> u64 {
    targets
        .iter()
        .flat_map(|t| &t.binaries)
        .filter_map(|w| w.segments.as_ref())
        .map(|g| g.not_written)
        .sum()
}

/// Where each event goes.
#[derive(Default)]
struct Router {
    /// By tag: the (target, binary, object id) it marks.
    of_tag: HashMap<u32, (usize, usize, u32)>,
    /// By thread: the tag of its last function event, and its pid.
    of_tid: HashMap<u32, (u32, u32)>,
    /// Events of no known binary (never expected).
    unrouted: u64,
    /// Events routed, and events the kernel lost (the threads' gaps).
    events: u64,
    lost: u64,
    /// (target, binary, pid) of the processes whose threads were seen for the first time
    /// since the last drain: their libraries are looked at (see [`look_at_processes`]).
    new_processes: Vec<(usize, usize, u32)>,
}

impl Router {
    fn new(targets: &[Target]) -> Router {
        let mut router = Router::default();
        router.retarget(targets);
        router
    }

    /// Where each tag goes now (after a reload added or removed targets).
    fn retarget(&mut self, targets: &[Target]) {
        self.of_tag.clear();
        for (t, target) in targets.iter().enumerate() {
            for (b, w) in target.binaries.iter().enumerate() {
                self.of_tag.insert(w.tag, (t, b, 0));
                for library in &w.libraries.objects {
                    self.of_tag.insert(library.tag, (t, b, library.object_id));
                }
            }
        }
    }

    /// Routes an event to its binary's recorder (or segment, or export), its function id
    /// made the binary's own; the triggers of a flight-recorder binary see it too.
    fn route(
        &mut self,
        targets: &mut [Target],
        triggers: &mut Triggers,
        event: &mut Event,
        gap: Option<Gap>,
    ) {
        self.lost += gap.map_or(0, |g| g.lost);
        let h = &mut event.header;
        let function_event = profiler_common::SledKind::from_u8(h.kind).is_some();
        let (t, b) = if function_event {
            let tag = h.function_id >> TAG_SHIFT;
            let Some(&(t, b, object_id)) = self.of_tag.get(&tag) else {
                self.unrouted += 1;
                return;
            };
            h.function_id = crate::plan::packed_id(object_id, libraries::untagged(h.function_id));
            if self.of_tid.insert(h.tid, (tag, h.pid)).is_none()
                && !self.new_processes.contains(&(t, b, h.pid))
            {
                self.new_processes.push((t, b, h.pid));
            }
            (t, b)
        } else {
            let Some((t, b, pid)) = self.of_tid.get(&h.tid).and_then(|&(tag, pid)| {
                let &(t, b, _) = self.of_tag.get(&tag)?;
                Some((t, b, pid))
            }) else {
                self.unrouted += 1;
                return;
            };
            if h.pid == 0 {
                h.pid = pid;
            }
            if h.kind == profiler_common::event_kind::THREAD_EXIT {
                self.of_tid.remove(&h.tid);
            }
            (t, b)
        };
        self.events += 1;
        let w = &mut targets[t].binaries[b];
        if let Some(export) = &mut w.export {
            export.stacks.observe(&event.header);
        }
        if let Some(segments) = &mut w.segments {
            segments.record(event, gap);
            return;
        }
        triggers.observe(w.tag, &event.header);
        w.recorder.push(event, gap);
    }
}

/// The service's state for `fdr-profiled status`; `rate` is the events per second of the
/// last status period.
fn status_json(
    svc: &Service<'_>,
    router: &Router,
    rate: f64,
    last_snapshot: Option<&Path>,
) -> serde_json::Value {
    let (config, retention, targets) = (&*svc.config, &svc.retention, &*svc.targets);
    let unattributed = svc.books.unattributed_lost();
    let exporter = svc.exporter.as_ref();
    let not_written = not_written(targets);
    let snapshots_not_written: u64 = targets
        .iter()
        .flat_map(|t| &t.binaries)
        .map(|w| w.snapshots_not_written.get())
        .sum();
    let disk_used = retention.disk_used();
    let targets: Vec<serde_json::Value> = targets
        .iter()
        .map(|t| {
            let binaries: Vec<serde_json::Value> = t
                .binaries
                .iter()
                .map(|w| {
                    let s = w.recorder.stats();
                    let mut binary = serde_json::json!({
                        "path": w.plan.display_path,
                        "processes": w.libraries.processes().into_iter().map(|(pid, libraries)| serde_json::json!({
                            "pid": pid,
                            "libraries": libraries,
                        })).collect::<Vec<_>>(),
                        "libraries": w.libraries.objects.iter().map(|l| serde_json::json!({
                            "object_id": l.object_id,
                            "path": l.plan.display_path,
                            "functions": l.plan.functions,
                            "probes_per_process": l.probes,
                        })).collect::<Vec<_>>(),
                        "mode": if w.segments.is_some() { "record" } else { "flight-recorder" },
                        "segment": w.segments.as_ref().and_then(|g| g.current()),
                        "segments_closed": w.segments.as_ref().map_or(0, |g| g.closed),
                        "not_written": w.segments.as_ref().map_or(0, |g| g.not_written),
                        "snapshots_not_written": w.snapshots_not_written.get(),

                        "threads": s.threads,
                        "events": s.events,
                        "bytes": s.bytes,
                        "expired": s.expired,
                        "evicted": s.evicted,
                        "seen": s.seen,
                        "lost": s.lost,
                        "threads_expired": s.threads_expired,
                        "threads_evicted": s.threads_evicted,
                        "window_ns": s.window_ns,
                        "repair": w.repaired.as_ref().map(Repaired::status),
                        "export_calls_not_kept": w.export.as_ref().map(|e| e.stacks.calls_not_kept),
                    });
                    if let serde_json::Value::Object(map) = &mut binary {
                        svc.triggers.status(w.tag, map);
                    }
                    binary
                })
                .collect();
            serde_json::json!({
                "name": t.config.name,
                "pattern": t.config.binary,
                "binaries": binaries,
            })
        })
        .collect();
    serde_json::json!({
        "output": retention.root().path(),
        "output_refused": retention.root().refused(),
        "output_refusals": retention.root().refusals(),
        "events": router.events,
        "events_per_second": rate.round() as u64,
        "lost": router.lost + router.unrouted + unattributed,
        "not_written": not_written,
        "snapshots_not_written": snapshots_not_written,
        "disk_used": disk_used,
        "max_disk": (config.max_disk != u64::MAX).then_some(config.max_disk),
        "last_snapshot": last_snapshot,
        "export": exporter.map(Exporter::status),
        "targets": targets,
    })
}

/// Now in UTC, for directory names: `20261124T132237.514Z`.
fn utc_stamp() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now())
        .to_string()
        .replace([':', '-'], "")
}

/// Writes `w`'s window into `OUTPUT/<target>/<stamp>-<trigger>[-<binary>]/`, saying where;
/// returns that directory when it was written.
fn snapshot_binary(
    retention: &Retention,
    target: &Target,
    w: &Watched,
    stamp: &str,
    trigger: &str,
) -> Option<PathBuf> {
    let mut name = format!("{stamp}-{trigger}");
    if target.binaries.len() > 1 {
        name = format!("{name}-{}", name_part(&w.label));
    }
    let shown = retention
        .root()
        .path()
        .join(&target.config.name)
        .join(&name);
    if let Err(why) = retention.room() {
        w.snapshots_not_written
            .set(w.snapshots_not_written.get() + 1);
        tracing::error!(
            fdr_target = %target.config.name,
            fdr_trigger = trigger,
            "target {}: snapshot not written: {why}",
            target.config.name
        );
        return None;
    }
    let written = retention
        .root()
        .create_session(&target.config.name, &name)
        .and_then(|out| {
            let dir = out.path().to_path_buf();
            let _writing = Writing::start(&dir);
            snapshot(out, target, w).map(|()| dir)
        });
    match written {
        Ok(dir) => {
            // Retention first: the snapshot line says everything is done.
            for gone in retention.enforce(&dir) {
                tracing::info!(
                    fdr_deleted = %gone.dir.display(),
                    fdr_bytes = gone.bytes,
                    "deleted {} ({} bytes) to stay under max_disk",
                    gone.dir.display(),
                    gone.bytes
                );
            }
            tracing::info!(
                fdr_target = %target.config.name,
                fdr_snapshot = %dir.display(),
                fdr_trigger = trigger,
                "target {}: snapshot {}",
                target.config.name,
                dir.display()
            );
            Some(dir)
        }
        Err(err) => {
            w.snapshots_not_written
                .set(w.snapshots_not_written.get() + 1);
            tracing::error!(
                fdr_target = %target.config.name,
                fdr_snapshot = %shown.display(),
                "target {}: snapshot {} failed: {err:#}",
                target.config.name,
                shown.display()
            );
            None
        }
    }
}

/// Writes one binary's window as a session into `out` (new, empty), its report too.
fn snapshot(out: OutputDir, target: &Target, w: &Watched) -> Result<()> {
    let held = out.try_clone()?;
    let executable = Executable {
        name: w.plan.exe_name.clone(),
        path: w.plan.display_path.clone(),
        deleted: false,
    };
    let mut session = Session::new(out, executable, target.config.fdr_version, w.exits.clone());
    session.add_object(w.plan.clone(), w.probes, w.attached_ns);
    for library in &w.libraries.objects {
        session.add_object(library.plan.clone(), library.probes, library.attached_ns);
    }
    w.recorder.replay(|event, gap| session.record(event, gap));
    session.set_window(w.recorder.stats(), w.recorder.thread_windows());
    session.finish(IntakeLosses::default())?;
    if let Err(err) = fdr_analysis::outputs::write_report_in(&held, &Symbolizer::default()) {
        tracing::warn!("{}: no report: {err:#}", held.path().display());
    }
    Ok(())
}

/// `exits = "repair"`: traces the processes that started running a binary of a repaired
/// target since the last look, and removes the probes of those that exited.
fn look_at_repaired(svc: &mut Service<'_>) {
    // No target repairs: nothing to look at (and no map read every drain).
    if svc.tracer.options().repair.is_none() {
        return;
    }
    let started = svc.tracer.started_processes();
    let repaired = svc
        .targets
        .iter_mut()
        .filter(|t| !t.removed)
        .flat_map(|t| t.binaries.iter_mut())
        .filter_map(|w| w.repaired.as_mut());
    for r in repaired {
        let tag = r.tag();
        for &(_, pid) in started.iter().filter(|&&(t, _)| t == tag) {
            r.trace(pid, svc.tracer);
        }
        r.reap(svc.tracer);
    }
}
