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
use super::inline::InlineBinary;
use super::router::Router;
use super::snapshot::{snapshot_binary, utc_stamp};
use super::status::{self, status_json, status_line};
use super::targets::{attach_target, look_at_targets, Tags, Target, LOOK_AT_TARGETS_EVERY};
use crate::kernel::bpf::{Attachment, KernelBooks, LoadOptions, Tracer};
use crate::kernel::caps::Cap;
use crate::kernel::intake::{Intake, DRAIN_BUDGET};
use crate::plan::exits::ExitMode;
use crate::service::config::{ServiceConfig, TargetEngine};
use crate::service::control;
use crate::service::export::{BinaryLabels, Exporter};
use crate::service::libraries;
use crate::service::output::OutputRoot;
use crate::service::retention::Retention;
use crate::service::triggers::{Due, Triggers, Watch};
use crate::session::pipeline::EventPipeline;
use anyhow::{bail, Context as _, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

/// How often the ring buffers are drained (as a recording does).
const DRAIN_INTERVAL: Duration = Duration::from_millis(10);
/// How often every thread's window is aged, not only the threads that run.
const EXPIRE_INTERVAL: Duration = Duration::from_millis(500);

/// Runs the service until SIGTERM or SIGINT, listening for `status` and `snapshot` requests on
/// `socket`.
pub fn run(config_path: &Path, socket: &Path) -> Result<u8> {
    // Before anything else (see `crate::kernel::caps`). CAP_SYS_PTRACE is not required: without
    // it the libraries of other users' processes are not traced, which is said per process.
    crate::kernel::caps::require_for_probes(&[Cap::Bpf, Cap::Perfmon], "the service")?;
    let mut config = ServiceConfig::load(config_path)?;
    let mut tracer = Tracer::load(LoadOptions {
        ring_bytes: profiler_common::DEFAULT_RING_BYTES,
        // One pipeline thread reads every ring (see `session::pipeline`).
        rings_per_cpu: 1,
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
        // Every target has a budget unless it says otherwise (`max_overhead`).
        call_slots: crate::kernel::bpf::call_slots_for(crate::kernel::bpf::possible_cpus()?),
        perf_events_only: false,
        // Loaded for every target of the first configuration that asks for it, or may choose
        // it (`auto`, where this kernel allows it); the inline engine's hold on the processes
        // that start is theirs too.
        repair: if config.targets.iter().any(|t| t.exits == ExitMode::Repair) {
            Some(crate::repair::offsets_for("exits = \"repair\"")?)
        } else if config
            .targets
            .iter()
            .any(|t| t.exits == ExitMode::Auto || t.engine == TargetEngine::Inline)
        {
            crate::kernel::btf::repair_offsets().ok()
        } else {
            None
        },
        // The programs' rare anomalies go to the journal with the service's other warnings.
        kernel_log: true,
    })?;
    // The kernel side's own loss accounts: threads whose end record found a full buffer, and
    // events of no thread (see `crate::kernel::bpf::KernelBooks`).
    let books = tracer.take_books()?;
    // What a probe hit costs, measured before any target's probes are placed.
    let costs = super::calls::ServiceCosts::measure(&mut tracer);
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
    let (intake, listener, signals) = {
        let _context = runtime.enter();
        (
            Intake::new(tracer.take_rings(), 1)?,
            control::bind(socket)?,
            Signals::install()?,
        )
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
        retention,
        triggers: Triggers::new(),
        watched: HashMap::new(),
        costs,
    };
    let result = runtime.block_on(serve(&mut service, intake, listener, signals));
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
    /// The output root held open, with the configuration's limits: where snapshots go, and
    /// segments of targets attached from now on.
    retention: Retention,
    /// What makes snapshots due.
    triggers: Triggers,
    /// The binaries the triggers watch (by tag), with how many of their libraries they know.
    watched: HashMap<u32, usize>,
    /// What a probe hit costs (`None` where it could not be measured).
    costs: Option<super::calls::ServiceCosts>,
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
            if w.inline.is_some() {
                // Only the executable's sleds are patched (see `super::inline`).
                continue;
            }
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

/// The path of events, from the kernel's rings to the targets: the pipeline `record` uses,
/// on this thread alone, each thread's events routed to their binary.
struct Pipeline {
    events: EventPipeline,
    router: Router,
}

impl Pipeline {
    /// Drains at most `budget` records of each ring (every one with `u64::MAX`); whether
    /// every ring was emptied.
    fn drain(&mut self, targets: &mut [Target], triggers: &mut Triggers, budget: u64) -> bool {
        self.drain_inline(targets, triggers);
        self.router.forget_live_if_idle();
        let router = &mut self.router;
        self.events
            .drain(budget, &mut |e, g| router.route(targets, triggers, e, g))
    }

    /// `engine = "inline"`: each binary's processes' shared memory drained down the same
    /// route (each taken out of its binary meanwhile: the route reaches every binary).
    fn drain_inline(&mut self, targets: &mut [Target], triggers: &mut Triggers) {
        for (t, b) in inline_binaries(targets) {
            let Some(mut inline) = targets[t].binaries[b].inline.take() else {
                continue;
            };
            let router = &mut self.router;
            inline.drain(&mut self.events, &mut |e, g| {
                router.route(targets, triggers, e, g)
            });
            targets[t].binaries[b].inline = Some(inline);
        }
    }

    /// Puts the processes of `inline` back as they were, their last events routed.
    fn finish_inline(
        &mut self,
        inline: Vec<InlineBinary>,
        targets: &mut [Target],
        triggers: &mut Triggers,
    ) {
        let router = &mut self.router;
        for i in inline {
            i.finish(&mut self.events, &mut |e, g| {
                router.route(targets, triggers, e, g)
            });
        }
    }

    /// Ends the threads that exited with their ring full (`exited`, their books just taken),
    /// once a drain has emptied every ring (see `EventPipeline::end_exited`).
    fn end_exited(
        &mut self,
        exited: Vec<(u32, profiler_common::ThreadState)>,
        targets: &mut [Target],
        triggers: &mut Triggers,
    ) {
        let router = &mut self.router;
        self.events.end_exited(exited, DRAIN_BUDGET, &mut |e, g| {
            router.route(targets, triggers, e, g)
        });
    }
}

/// Where the binaries traced by the inline engine are: (target, binary).
fn inline_binaries(targets: &[Target]) -> Vec<(usize, usize)> {
    let mut at = Vec::new();
    for (t, target) in targets.iter().enumerate() {
        for (b, w) in target.binaries.iter().enumerate() {
            if w.inline.is_some() {
                at.push((t, b));
            }
        }
    }
    at
}

/// Takes the inline engines of the binaries of `targets` (all, or only those of removed
/// targets).
fn take_inline(targets: &mut [Target], only_removed: bool) -> Vec<InlineBinary> {
    targets
        .iter_mut()
        .filter(|t| t.removed || !only_removed)
        .flat_map(|t| t.binaries.iter_mut())
        .filter_map(|w| w.inline.take())
        .collect()
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
/// The signals the service answers. Their handlers are installed before it says it is ready:
/// a SIGHUP sent as soon as it said so ended it before (the signal's default action).
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers (in the event loop's runtime context).
    fn install() -> Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        let one = |kind: SignalKind, name: &str| {
            signal(kind).with_context(|| format!("installing the {name} handler"))
        };
        Ok(Signals {
            int: one(SignalKind::interrupt(), "SIGINT")?,
            term: one(SignalKind::terminate(), "SIGTERM")?,
            usr1: one(SignalKind::user_defined1(), "SIGUSR1")?,
            hup: one(SignalKind::hangup(), "SIGHUP")?,
        })
    }
}

async fn serve(
    svc: &mut Service<'_>,
    intake: Intake,
    listener: tokio::net::UnixListener,
    signals: Signals,
) -> Result<()> {
    let Signals {
        int: mut sigint,
        term: mut sigterm,
        usr1: mut sigusr1,
        hup: mut sighup,
    } = signals;
    let mut drain = tokio::time::interval(DRAIN_INTERVAL);
    drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut expire = tokio::time::interval(EXPIRE_INTERVAL);
    let mut rescan = tokio::time::interval(libraries::RESCAN_INTERVAL);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut events = Pipeline {
        events: EventPipeline::alone(intake)?,
        router: Router::new(svc.targets),
    };
    sync_triggers(svc);
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
            woken = events.events.wakeup() => {
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
                        status_json(&status::View {
                            config: svc.config,
                            retention: &svc.retention,
                            targets: svc.targets,
                            router: &events.router,
                            triggers: &svc.triggers,
                            unattributed: svc.books.unattributed_lost(),
                            malformed: events.events.malformed(),
                            rate,
                            last_snapshot: last_snapshot.as_deref(),
                            exporter: svc.exporter.as_ref(),
                            costs: svc.costs.as_ref().map(|c| &c.costs),
                        })
                    }
                    Ok(control::Request::Top) => {
                        events.drain(svc.targets, &mut svc.triggers, DRAIN_BUDGET);
                        events.router.top(svc.targets)
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
                // Threads that ended with a full buffer: their trailing losses are counted in
                // them.
                events.end_exited(svc.books.take_exited(), svc.targets, &mut svc.triggers);
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
                    let period = at.elapsed().as_secs_f64();
                    rate = (events.router.events - seen) as f64 / period;
                    last_status = (std::time::Instant::now(), events.router.events);
                    for t in svc.targets.iter_mut().filter(|t| !t.removed) {
                        for w in &mut t.binaries {
                            let Some(budget) = &mut w.budget else { continue };
                            let (changes, lines) = budget.tick(svc.tracer);
                            if let Some(segments) = &mut w.segments {
                                for c in changes.iter().filter(|c| c.action == "dropped") {
                                    segments.dropped(c.function_id, c.at_ns);
                                }
                            }
                            for line in lines {
                                tracing::info!(
                                    fdr_target = %t.config.name,
                                    fdr_binary = %w.plan.display_path,
                                    "target {}: {}: budget: {line}",
                                    t.config.name,
                                    w.plan.display_path
                                );
                            }
                        }
                    }
                    if let Some(costs) = &mut svc.costs {
                        costs.tick(svc.tracer);
                        for w in svc.targets.iter_mut().flat_map(|t| t.binaries.iter_mut()) {
                            let return_probed = w.return_probed();
                            // The inline engine's calls trap nowhere: counted, no trap's
                            // cost charged to them (see `status::probes_json`).
                            let charged = match w.inline {
                                Some(_) => fdr_session::schema::ProbeCosts::default(),
                                None => costs.costs,
                            };
                            w.calls.tick(period, &charged, &return_probed);
                        }
                    }
                }
                // Records that could not be read count among the losses.
                let lost_elsewhere = svc.books.unattributed_lost() + events.events.malformed();
                let text = status_line(svc.targets, &events.router, lost_elsewhere, rate, svc.costs.is_some());
                let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Status(&text)]);
                statuses = statuses.wrapping_add(1);
                if statuses.is_multiple_of(LOOK_AT_TARGETS_EVERY)
                    && look_at_targets(svc.targets, svc.tracer, svc.config, &svc.retention, svc.tags)
                {
                    events.router.retarget(svc.targets);
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
                // The removed targets' patched processes put back, their last events routed
                // while their tags still lead to them.
                let inline = take_inline(svc.targets, true);
                events.finish_inline(inline, svc.targets, &mut svc.triggers);
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
    // Processes patched by the inline engine put back as they were, their last events in.
    let inline = take_inline(svc.targets, false);
    events.finish_inline(inline, svc.targets, &mut svc.triggers);
    // Every event in, threads whose end record was lost ended, and the live threads' losses
    // at their very end.
    let (router, triggers, targets) = (&mut events.router, &mut svc.triggers, &mut *svc.targets);
    events.events.finish(&svc.books.threads(), &mut |e, g| {
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
                if let Some(budget) = &mut w.budget {
                    attachments.extend(budget.probes.take_sets());
                }
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
        let mine: Vec<u32> = started
            .iter()
            .filter(|&&(t, _)| t == tag)
            .map(|&(_, pid)| pid)
            .collect();
        r.trace_started(&mine, svc.tracer);
        r.reap(svc.tracer);
    }
}
