//! Every process that runs one executable, each traced by a repair keeper of its own (see
//! [`super::keeper`]) before any frame of it is hooked: `--attach BIN --exits repair`, and the
//! service's targets with `exits = "repair"`.
//!
//! Every probe of such a process is its own, entries included: the kernel hooks a frame's
//! return address for a return probe whenever any probe at that offset fires, even in a
//! process the return probe's own filter leaves out (`handler_chain()` in
//! kernel/events/uprobes.c), and a hooked frame in a process no keeper traces turns its next
//! exception into `std::terminate`. The only probe for every process is `process_start`, at
//! the executable's entry point: it names each process that starts running it (the caller
//! takes the names with `Tracer::started_processes` and hands over those with this
//! executable's tag). Each one, and each one already running, is handled as `--pid` handles its
//! process: its keeper seizes every thread, the throw and catch stops go in, then its return
//! probes, then its entry and exit sleds. What it ran before that (a few milliseconds after
//! it started) is not traced; a process that cannot be traced (gone already, another tracer)
//! is never half-traced. When a process exits its probes go; at the end each keeper lets its
//! process go as under `--pid`.
use super::hold::ExecHold;
use super::keeper::{self, Keeper, KeeperReport, Tracee};
use crate::kernel::bpf::{Attachment, Scope, Tracer};
use crate::kernel::uprobe_multi::MultiLink;
use crate::plan::AttachPlan;
use crate::traced::mappings::{self, FileId};
use anyhow::{bail, Context as _, Result};
use profiler_common::event_kind;
use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

/// The traced processes of one executable.
pub struct RepairedProcesses {
    /// Where the probes of processes that exited are removed, off the caller's loop (see
    /// `Tracer::detach_later`).
    closer: Closer,
    /// The executable (its file), and its plans, exits decided.
    executable: Option<FileId>,
    /// The throw and catch points of the objects the processes map.
    points: keeper::PointCache,
    /// What `Tracer::started_processes` names the processes that start it with.
    tag: u32,
    plans: Vec<AttachPlan>,
    live: Vec<Process>,
    /// What holds the processes that exec the executable until their keeper has them (see
    /// `repair::hold`), or why nothing does.
    hold: Result<std::sync::Arc<ExecHold>, String>,
    /// The objects a process maps from its start (the executable and the libraries it needs,
    /// as our own environment finds them); the first is the executable.
    image: Vec<PathBuf>,
    /// Processes traced so far (those of them not `live` any more have ended); how many of
    /// them from their exec (see `repair::hold`), and how many that started while the session
    /// ran only from their entry point (their first calls not recorded).
    traced: u64,
    traced_at_exec: u64,
    traced_late: u64,
    /// The latest processes traced (at most [`RECENT_KEPT`]): `process_start` names each as it
    /// runs its entry point, maybe after it ended.
    recent: VecDeque<u32>,
    /// Processes that could not be traced: how many, and the latest with why (at most
    /// [`NOT_TRACED_KEPT`]: a service runs for months, and short processes come and go).
    not_traced: u64,
    not_traced_latest: VecDeque<(u32, String)>,
}

/// How many of the processes traced last are remembered (see `RepairedProcesses::recent`).
const RECENT_KEPT: usize = 256;

/// How many of the processes that could not be traced are remembered with why.
pub const NOT_TRACED_KEPT: usize = 16;

/// One traced process: its keeper and every probe placed for it.
struct Process {
    pid: u32,
    keeper: Keeper,
    /// Its entry and exit sleds and catch probes.
    probes: Attachment,
    /// Its return probes, one set per plan; `None` once its exits are observed by their sleds
    /// (see [`RepairedProcesses::exit_sleds_instead`]).
    returns: Option<Vec<Attachment>>,
    /// The throw and catch stops (the keeper holds them too, until it lets the process go).
    unwind_stops: Attachment,
    /// Held at its exec: the objects its throw and catch stops were placed in before its
    /// loader mapped any, until what it mapped is checked against them (see
    /// [`RepairedProcesses::check_loaded`]).
    stops_in: Option<Vec<PathBuf>>,
}

/// How a process to trace was found.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Running the executable when the session (or the target) started.
    Running,
    /// Held since its exec (see `repair::hold`): let go for its keeper to seize it, which
    /// keeps it stopped until its probes are in place.
    AtExec,
    /// Held too, but only after it had reached its entry point (a busy host ran it before
    /// the holder could stop it): its first calls are not recorded.
    AtExecLate,
    /// Named at its entry point only (not held at its exec): traced from where it is then,
    /// its first calls not recorded.
    AtEntry,
}

/// A process just traced: its keeper's pid and how many probes it got.
pub struct Traced {
    pub keeper: u32,
    pub probes: usize,
    /// How it was found: [`Found::AtExecLate`] where it was held but had reached its entry
    /// point by the time its keeper stopped it.
    pub found: Found,
}

/// What a keeper reported about its process at the end.
pub enum Ended {
    /// Its report.
    Report(Result<KeeperReport>),
    /// It had not let the process go within [`keeper::RELEASE_WAIT`]: it goes on by itself.
    NotLetGo { keeper: u32 },
}

impl RepairedProcesses {
    /// Places the `process_start` probe at `executable`'s entry point, for the processes that
    /// start running it (named with `tag`); `plans` are its objects' plans, their exits
    /// decided.
    pub fn new(
        tracer: &mut Tracer,
        executable: &Path,
        plans: Vec<AttachPlan>,
        tag: u32,
    ) -> Result<RepairedProcesses> {
        let entry = xray_object::elf::ElfImage::open(executable)
            .map_err(anyhow::Error::from)
            .and_then(|elf| {
                elf.entry_file_offset()
                    .context("it has no entry point in its file (not an executable?)")
            })
            .with_context(|| format!("--exits repair: {}", executable.display()))?;
        tracer
            .attach_process_start(executable, entry, tag)
            .context("--exits repair: probing the executable's entry point")?;
        drop(tracer.take_attachment());
        // The objects each process maps from its start, read now.
        let mut points = keeper::PointCache::default();
        let image = crate::plan::exits::static_image(executable);
        for object in &image {
            points.points(object);
        }
        let hold = super::hold::shared(tracer, executable, tag).map_err(|e| format!("{e:#}"));
        Ok(RepairedProcesses {
            closer: Closer::default(),
            hold,
            points,
            image,
            traced_at_exec: 0,
            traced_late: 0,
            recent: VecDeque::new(),
            executable: mappings::file_id(executable),
            tag,
            plans,
            live: Vec::new(),
            traced: 0,
            not_traced: 0,
            not_traced_latest: VecDeque::new(),
        })
    }

    /// The tag of the processes that start running the executable.
    pub fn tag(&self) -> u32 {
        self.tag
    }

    /// The plans every process gets.
    pub fn plans(&self) -> &[AttachPlan] {
        &self.plans
    }

    /// Whether process `pid` runs the executable now.
    pub fn runs_it(&self, pid: u32) -> bool {
        self.executable.is_some() && mappings::executable_id(pid) == self.executable
    }

    /// The processes running the executable now.
    pub fn running(&self) -> Vec<u32> {
        self.executable
            .map(crate::traced::process::running)
            .unwrap_or_default()
    }

    /// The processes traced now.
    pub fn live(&self) -> impl Iterator<Item = u32> + '_ {
        self.live.iter().map(|p| p.pid)
    }

    /// Processes traced so far.
    pub fn traced(&self) -> u64 {
        self.traced
    }

    /// Processes traced from their exec, and processes that started meanwhile traced only
    /// once they had run their entry point (not held in time, or not at all).
    pub fn traced_from(&self) -> (u64, u64) {
        (self.traced_at_exec, self.traced_late)
    }

    /// Why the processes that start running the executable are not held at their exec (this
    /// kernel's BTF lacks what `process_exec` reads...): each is then traced from its entry
    /// point, its first calls not recorded.
    pub fn hold_error(&self) -> Option<&str> {
        self.hold.as_ref().err().map(String::as_str)
    }

    /// Traces the processes that started since the last call: those held since their exec,
    /// and those of `started` (named at their entry point by `Tracer::started_processes`, read
    /// just before) that no holder had. Returns each with what came of it.
    pub fn trace_started(
        &mut self,
        started: &[u32],
        tracer: &mut Tracer,
    ) -> Vec<(u32, Result<Option<Traced>>)> {
        let hold = self.hold.as_ref().ok().cloned();
        let mut done = Vec::new();
        // Those held first: a process held reaches its entry point once traced, and is named
        // there too (`trace` then has nothing to do).
        for (pid, late) in hold.as_ref().map(|h| h.held(self.tag)).unwrap_or_default() {
            let Some(image) = self.loader_image(pid) else {
                // Where its loader will find its libraries is not known (`LD_AUDIT`, or its
                // environment unreadable): traced once it has mapped them, from its entry
                // point, counted late.
                if let Some(hold) = &hold {
                    hold.let_go(pid);
                }
                continue;
            };
            let found = if late {
                Found::AtExecLate
            } else {
                Found::AtExec
            };
            done.push((pid, self.trace_as(pid, tracer, found, Some(image))));
        }
        for &pid in started {
            if self.recent.contains(&pid) {
                // Traced already (it may have ended since): named at its entry point as it ran.
                continue;
            }
            if self.hold.as_ref().is_ok_and(|h| h.holds(pid)) {
                // Still held, being stopped: taken from the holder at the next call.
                continue;
            }
            let traced = self.trace(pid, tracer, Found::AtEntry);
            if !matches!(traced, Ok(None)) {
                done.push((pid, traced));
            }
        }
        done.extend(self.check_loaded(tracer));
        done
    }

    /// For each process held at its exec that has run its entry point since, its loader done:
    /// whether every object it mapped that can throw or catch has its stops. One that has not
    /// (its loader found a library elsewhere than foreseen) is let go at once, no frame left
    /// hooked, before an exception could find a hooked frame there with no keeper stop; said
    /// as an error.
    fn check_loaded(&mut self, tracer: &mut Tracer) -> Vec<(u32, Result<Option<Traced>>)> {
        let Ok(hold) = self.hold.as_ref().cloned() else {
            return Vec::new();
        };
        let mut let_go = Vec::new();
        for process in &mut self.live {
            let Some(stops_in) = &process.stops_in else {
                continue;
            };
            if !hold.entered(process.pid) {
                continue;
            }
            // Compared as files: the loader's paths are not ours (symbolic links).
            let covered: Vec<_> = stops_in
                .iter()
                .filter_map(|o| mappings::file_id(o))
                .collect();
            let mapped = crate::plan::exits::mapped_image(process.pid);
            let uncovered = mapped
                .into_iter()
                .filter(|o| mappings::file_id(o).is_none_or(|id| !covered.contains(&id)))
                .find(|o| !self.points.points(o).is_empty());
            process.stops_in = None;
            if let Some(object) = uncovered {
                let_go.push((process.pid, object));
            }
        }
        let mut said = Vec::new();
        for (pid, object) in let_go {
            let Some(at) = self.live.iter().position(|p| p.pid == pid) else {
                continue;
            };
            let process = self.live.remove(at);
            let mut keeper = remove_probes(process, tracer);
            if keeper.release() {
                let _ = keeper.finish();
            }
            said.push((
                pid,
                Err(anyhow::anyhow!(
                    "its loader mapped {}, which its throw and catch stops were not placed in: let go, not traced any more",
                    object.display()
                )),
            ));
        }
        said
    }

    /// Processes traced that ended since (exited, or let go at an exec).
    pub fn ended_count(&self) -> u64 {
        self.traced - self.live.len() as u64
    }

    /// Processes that could not be traced: how many, and the latest of them with why (at most
    /// [`NOT_TRACED_KEPT`], oldest first).
    pub fn not_traced(&self) -> (u64, &VecDeque<(u32, String)>) {
        (self.not_traced, &self.not_traced_latest)
    }

    /// Traces `pid`: its keeper first, then the throw and catch stops, its return probes, its
    /// sleds. `None` when it is traced already; an error (nothing of it placed, counted) when
    /// it cannot be.
    pub fn trace(&mut self, pid: u32, tracer: &mut Tracer, found: Found) -> Result<Option<Traced>> {
        self.trace_as(pid, tracer, found, None)
    }

    /// [`RepairedProcesses::trace`]; `held_image`, for a process held at its exec: the objects
    /// its loader will map ([`RepairedProcesses::loader_image`]).
    fn trace_as(
        &mut self,
        pid: u32,
        tracer: &mut Tracer,
        found: Found,
        held_image: Option<Vec<PathBuf>>,
    ) -> Result<Option<Traced>> {
        let hold = self.hold.as_ref().ok().cloned();
        let held = hold.as_deref().filter(|_| held_image.is_some());
        let traced = self.place(pid, tracer, held, held_image, found);
        if let Some(hold) = held {
            // Whatever happened, it is not held any more (a no-op when its keeper has it).
            hold.let_go(pid);
        }
        match &traced {
            Ok(Some(traced)) => {
                self.traced += 1;
                self.remember(pid);
                match traced.found {
                    Found::AtExec => self.traced_at_exec += 1,
                    Found::AtEntry | Found::AtExecLate => self.traced_late += 1,
                    Found::Running => {}
                }
            }
            Ok(None) => {}
            Err(err) => {
                if held.is_some() {
                    // Named at its entry point too, maybe: said once.
                    self.remember(pid);
                }
                self.not_traced += 1;
                if self.not_traced_latest.len() == NOT_TRACED_KEPT {
                    self.not_traced_latest.pop_front();
                }
                self.not_traced_latest.push_back((pid, format!("{err:#}")));
            }
        }
        traced
    }

    /// Keeps `pid` among the latest processes traced (see [`RepairedProcesses::recent`]).
    fn remember(&mut self, pid: u32) {
        if self.recent.len() == RECENT_KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back(pid);
    }

    /// The objects process `pid`, held at its exec, will map from its start: the executable's
    /// libraries as its dynamic loader will find them with its environment's `LD_LIBRARY_PATH`
    /// and `LD_PRELOAD`. `None` when that is not known: its environment cannot be read, or it
    /// sets `LD_AUDIT` (audit libraries may map anything).
    fn loader_image(&self, pid: u32) -> Option<Vec<PathBuf>> {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let var = |name: &str| {
            environ.split(|&b| b == 0).find_map(|entry| {
                let value = entry.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
                Some(String::from_utf8_lossy(value).into_owned())
            })
        };
        if var("LD_AUDIT").is_some_and(|v| !v.is_empty()) {
            return None;
        }
        let (ld_library_path, preload) = (var("LD_LIBRARY_PATH"), var("LD_PRELOAD"));
        let executable = self.image.first()?;
        // Preloads named without a slash are looked for as the loader does; only paths are
        // taken here, the others are found like any library the executable needs.
        let preload: Vec<PathBuf> = preload
            .unwrap_or_default()
            .split([' ', ':'])
            .filter(|p| p.contains('/'))
            .map(PathBuf::from)
            .collect();
        Some(crate::plan::exits::image_with(
            executable,
            &ld_library_path.unwrap_or_default(),
            &preload,
        ))
    }

    fn place(
        &mut self,
        pid: u32,
        tracer: &mut Tracer,
        held: Option<&ExecHold>,
        held_image: Option<Vec<PathBuf>>,
        mut found: Found,
    ) -> Result<Option<Traced>> {
        if self.live.iter().any(|p| p.pid == pid) {
            return Ok(None);
        }
        let nz = NonZeroU32::new(pid).context("pid 0")?;
        let scope = Scope::Process(nz);
        if !self.runs_it(pid) {
            bail!("it exited, or runs another program now");
        }
        // Held at its exec, it has mapped none of its libraries yet: their probes go in by
        // path, and the kernel places them when it maps them.
        let image: Vec<PathBuf> = match held_image {
            Some(image) => image,
            None => crate::plan::exits::mapped_image(pid),
        };
        drop(tracer.take_attachment());
        let (unwind_stops, stops) = keeper::attach(tracer, &image, scope, &mut self.points)
            .map_err(|err| {
                if self.runs_it(pid) {
                    err
                } else {
                    anyhow::anyhow!("it exited while it was being traced")
                }
            })?;
        let tracee = match held {
            Some(hold) => Tracee::Held(pid, hold.handover_fd()),
            None => Tracee::Running(pid),
        };
        let keeper = tracer.take_repairs().and_then(|repairs| {
            Keeper::start(tracee, repairs, &stops, || {
                if let Some(hold) = held {
                    hold.let_go(pid);
                }
            })
        });
        let keeper = match keeper {
            Ok(keeper) => keeper,
            Err(err) => {
                tracer.detach(unwind_stops);
                // A process that ended meanwhile is said so, not with the errno of the look at
                // its threads that found it gone.
                if !self.runs_it(pid) {
                    bail!("it exited before it could be traced");
                }
                return Err(err);
            }
        };
        // Held, let go, stopped again by its keeper: it may have run to its entry point
        // meanwhile (a busy host).
        if found == Found::AtExec && held.is_some_and(|hold| hold.entered(pid)) {
            found = Found::AtExecLate;
        }
        // Traced: now its frames may be hooked.
        let mut returns = Vec::new();
        let mut placed = 0;
        let attached = self.plans.iter().try_for_each(|plan| {
            let (n, links) = tracer.attach_keeping_returns(plan, scope)?;
            placed += n;
            returns.push(links);
            Ok::<_, anyhow::Error>(())
        });
        for object in &image {
            let points = self.points.points(object);
            for (point, _) in points.iter().filter(|(_, k)| *k == event_kind::CATCH) {
                // Without it, frames an exception leaves close at the thread's next event.
                let _ = tracer.attach_catch(object, point.file_offset, scope);
            }
        }
        let probes = tracer.take_attachment();
        let mut keeper = keeper;
        // Every probe in place: a held process runs its first instruction now.
        keeper.go();
        let process = Process {
            pid,
            keeper,
            probes,
            returns: Some(returns),
            unwind_stops,
            stops_in: held.map(|_| image),
        };
        if let Err(err) = attached {
            let mut keeper = remove_probes(process, tracer);
            if keeper.release() {
                let _ = keeper.finish();
            }
            return Err(err);
        }
        let traced = Traced {
            keeper: process.keeper.pid(),
            probes: placed,
            found,
        };
        self.live.push(process);
        Ok(Some(traced))
    }

    /// The processes that exited since the last call, or that their keeper is letting go by
    /// itself (an exec that raised their privileges, see [`KeeperReport::let_go`]), their
    /// probes removed, with their keepers' reports. A process let go has its probes removed
    /// here, before its keeper is asked to release it (it waits for that, the process held
    /// at its exec), so that none is in place when its new program runs.
    pub fn ended(&mut self, tracer: &mut Tracer) -> Vec<(u32, Result<KeeperReport>)> {
        let (ended, live): (Vec<Process>, Vec<Process>) = std::mem::take(&mut self.live)
            .into_iter()
            .partition(|p| p.keeper.has_ended());
        self.live = live;
        ended
            .into_iter()
            .map(|mut process| {
                let pid = process.pid;
                if process.keeper.let_go().is_some() {
                    let mut keeper = remove_probes(process, tracer);
                    keeper.release();
                    return (pid, keeper.finish());
                }
                let (keeper, links) = remove_probes_later(process, tracer);
                self.closer.close(links);
                (pid, keeper.finish())
            })
            .collect()
    }

    /// The traced processes whose exits are still observed by return probes.
    pub fn with_return_probes(&self) -> Vec<u32> {
        self.live
            .iter()
            .filter(|p| p.returns.is_some())
            .map(|p| p.pid)
            .collect()
    }

    /// Observes the exits of process `pid` by their sleds from now on (a thread of it stuck at
    /// the kernel's limit of pending return probes); returns how many exit sleds were placed,
    /// and a warning for each object whose sleds could not be.
    pub fn exit_sleds_instead(&mut self, pid: u32, tracer: &mut Tracer) -> (usize, Vec<String>) {
        let (mut placed, mut warnings) = (0, Vec::new());
        let Some(process) = self.live.iter_mut().find(|p| p.pid == pid) else {
            return (placed, warnings);
        };
        let Some(scope) = NonZeroU32::new(pid).map(Scope::Process) else {
            return (placed, warnings);
        };
        let returns = process.returns.take().unwrap_or_default();
        for (plan, links) in self.plans.iter().zip(returns) {
            match tracer.exit_sleds_instead(plan, links, scope) {
                Ok(n) => placed += n,
                Err(err) => warnings.push(format!(
                    "process {pid}: {}: exit sleds not placed ({err:#}); its calls keep ending at the next event that proves them gone",
                    plan.display_path
                )),
            }
        }
        process.probes.extend(tracer.take_attachment());
        (placed, warnings)
    }

    /// At the end (recording disarmed): removes every process's probes, then has each keeper
    /// let its process go, as under `--pid`.
    pub fn finish(&mut self, tracer: &mut Tracer) -> Vec<(u32, Ended)> {
        std::mem::take(&mut self.live)
            .into_iter()
            .map(|process| {
                let pid = process.pid;
                let mut keeper = remove_probes(process, tracer);
                let ended = if keeper.release() {
                    Ended::Report(keeper.finish())
                } else {
                    Ended::NotLetGo {
                        keeper: keeper.pid(),
                    }
                };
                (pid, ended)
            })
            .collect()
    }
}

/// Removes the probes placed for `process` (the keeper keeps its own handles on the throw and
/// catch stops until it lets the process go); returns its keeper.
fn remove_probes(process: Process, tracer: &mut Tracer) -> Keeper {
    let (keeper, links) = remove_probes_later(process, tracer);
    drop(links);
    keeper
}

/// [`remove_probes`], handing back the links whose drop removes the probes.
fn remove_probes_later(process: Process, tracer: &mut Tracer) -> (Keeper, Vec<MultiLink>) {
    let mut links = tracer.detach_later(process.probes);
    for returns in process.returns.unwrap_or_default() {
        links.extend(tracer.detach_later(returns));
    }
    links.extend(tracer.detach_later(process.unwind_stops));
    (process.keeper, links)
}

/// A thread of its own that drops links, started at the first use: closing a `uprobe_multi`
/// link waits for the kernel to remove its uprobes. Only closes descriptors (a keeper forked
/// meanwhile closes its copies at its start).
#[derive(Default)]
struct Closer(Option<std::sync::mpsc::Sender<Vec<MultiLink>>>);

impl Closer {
    fn close(&mut self, links: Vec<MultiLink>) {
        if links.is_empty() {
            return;
        }
        if self.0.is_none() {
            let (send, receive) = std::sync::mpsc::channel::<Vec<MultiLink>>();
            let started = std::thread::Builder::new()
                .name("probe-closer".into())
                .spawn(move || receive.into_iter().for_each(drop));
            if started.is_ok() {
                self.0 = Some(send);
            }
        }
        match &self.0 {
            Some(send) => {
                if let Err(unsent) = send.send(links) {
                    drop(unsent.0);
                }
            }
            // No thread to spare: closed here.
            None => drop(links),
        }
    }
}
