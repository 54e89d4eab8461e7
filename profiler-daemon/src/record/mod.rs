//! The recording command: plan, load, attach, drain until the end, finalize, summarize.
//!
//! It drives the stages below it in turn: [`objects`] plans and attaches the objects of what
//! is traced (and those a process maps later), the kernel stage's intake feeds the session, and
//! at the end `fdr-analysis` writes the report.
mod args;
mod costs;
mod inline;
mod live;
pub mod objects;
mod outputs;

mod repaired;
mod stuck;
mod target;

pub use args::RecordArgs;

use crate::kernel::bpf::{KernelBooks, LoadOptions, Scope, Tracer};
use crate::kernel::caps::Cap;
use crate::kernel::intake::{Intake, DRAIN_BUDGET};
use crate::plan::discovery::Discovery;
use crate::plan::exits::{ExitMode, ExitPolicy, Exits};
use crate::plan::objects as planned;
use crate::plan::select::FunctionFilter;
use crate::repair::keeper as repair;
use crate::session::output::OutputDir;
use crate::session::pipeline::{default_workers, locked, EventPipeline};
use crate::session::summary::RepairsByThread;
use crate::session::{IntakeLosses, Session};
use crate::traced::launch::{self, ChildExit, HeldChild};
use crate::traced::process::{self, TracedProcess};
use anyhow::{bail, Context as _, Result};
use fdr_analysis::symbolize::Symbolizer;
use std::num::NonZeroU32;
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use stuck::{stuck_note, stuck_thread, STUCK_CHECK_INTERVAL};
use target::{sleep_until, target_exited, Target};

/// How often the ring buffers are drained. Events are written without waking the daemon, so
/// this bounds how full a buffer gets: at ~0.5 µs per probe hit and 48 bytes per event, 25 ms
/// is ~2.4 MiB per busy CPU against an 8 MiB buffer (a half-full buffer wakes us early). Each
/// tick costs the daemon ~50 µs whatever it drains (measured idle: 10 ms ticks took 5 ms of
/// CPU a second, 25 ms ones 2.3 ms); events reach the files at the flush every second anyway.
const DRAIN_INTERVAL: Duration = Duration::from_millis(25);
/// How often files are made complete on disk (header size patched, buffers flushed).
const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// How often a traced process's mappings are read again for objects it loaded (`dlopen`): a
/// new object is probed within this much of being mapped. Reading `/proc/PID/maps` costs tens
/// of microseconds; only files not seen before are opened.
const RESCAN_INTERVAL: Duration = Duration::from_millis(200);

/// SIGINT and SIGTERM blocked from the start of a session until its event loop handles them.
/// One that comes while the probes are being placed stays pending, and ends the session as
/// soon as it starts, rather than killing the daemon half-attached or being lost: a background
/// job of a non-interactive shell inherits SIGINT ignored, and the kernel discards an ignored
/// signal unless it is blocked.
struct HeldStopSignals {
    /// The mask before: the launched command gets it back.
    previous: libc::sigset_t,
}

impl HeldStopSignals {
    fn hold() -> HeldStopSignals {
        // SAFETY: sigset_t is plain data; the calls get valid pointers.
        unsafe {
            let mut stops: libc::sigset_t = std::mem::zeroed();
            let mut previous: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut stops);
            libc::sigaddset(&mut stops, libc::SIGINT);
            libc::sigaddset(&mut stops, libc::SIGTERM);
            libc::pthread_sigmask(libc::SIG_BLOCK, &stops, &mut previous);
            HeldStopSignals { previous }
        }
    }

    fn previous(&self) -> &libc::sigset_t {
        &self.previous
    }

    /// Puts the mask back (the handlers must be in place).
    fn release(self) {
        // SAFETY: a valid mask, from hold().
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.previous, std::ptr::null_mut()) };
    }
}

/// The capabilities this command line needs, and what to call it in the error (see
/// [`crate::kernel::caps`]): `CAP_BPF` and `CAP_PERFMON` for the programs and `uprobe_multi`
/// links, `CAP_SYS_ADMIN` instead for one perf event per probe, `CAP_SYS_PTRACE` to read a
/// running process (`--pid`).
fn needed_caps(cli: &RecordArgs) -> (Vec<Cap>, String) {
    let mut caps = Vec::new();
    let mut what = String::from("recording");
    if cli.no_uprobe_multi {
        caps.push(Cap::SysAdmin);
        what.push_str(" with --no-uprobe-multi");
    } else {
        caps.extend([Cap::Bpf, Cap::Perfmon]);
    }
    if cli.pid.is_some() {
        caps.push(Cap::SysPtrace);
        what.push_str(if cli.no_uprobe_multi {
            " and --pid"
        } else {
            " with --pid"
        });
    }
    if cli.engine == args::Engine::Inline && !caps.contains(&Cap::SysAdmin) {
        // The shared memory is mapped through /proc/PID/map_files.
        caps.push(Cap::SysAdmin);
        what.push_str(" and --engine inline");
    }
    (caps, what)
}

/// Runs a recording session as the command line says; returns the process exit code.
pub fn run(cli: &RecordArgs) -> Result<u8> {
    // Before anything else: without the capabilities nothing below can work, and one line
    // saying which are missing beats an error from wherever the kernel first refuses.
    let (caps, what) = needed_caps(cli);
    crate::kernel::caps::require_for_probes(&caps, &what)?;
    live::check(cli)?;
    let held_signals = HeldStopSignals::hold();
    let process = cli.pid.map(TracedProcess::find).transpose()?;
    let program = match (&process, &cli.attach, cli.command.first()) {
        (None, None, Some(cmd)) => Some(launch::resolve_program(cmd)?),
        _ => None,
    };
    let mut planned = match (&process, &cli.attach, &program) {
        (Some(process), _, _) => planned::for_process(process)?,
        (None, Some(bin), _) => planned::for_binary(bin)?,
        (None, None, Some(program)) => planned::for_command(program)?,
        (None, None, None) => bail!("nothing to trace: give --attach BIN, --pid PID or -- COMMAND"),
    };
    let filter = crate::plan::select::FunctionFilter::new(&cli.functions, &cli.exclude)?;
    planned.select(&filter)?;
    if cli.follow_forks && cli.exits == ExitMode::Repair {
        bail!("--follow-forks cannot be used with --exits repair (the repair keeper traces one process)");
    }
    let inline = cli.engine == args::Engine::Inline;
    if inline {
        inline::refused(cli)?;
    }
    let repair = match inline {
        true => None,
        false => repair_wanted(cli, cli.attach.is_some(), &planned.image)?,
    };
    let (mut policy, mut exits_choice) = match &repair {
        // Patched exit sleds cost what an entry does: every exit is observed there.
        _ if inline => inline::exits(&planned.image),
        Some(wanted) => wanted.choice(),
        None => crate::plan::exits::choose(cli.exits, &planned.image),
    };
    // Each worker reads rings of its own: the programs write each CPU's events to one ring
    // per worker, by thread.
    let workers = match cli.workers {
        Some(n) => usize::from(n),
        None => default_workers(crate::kernel::bpf::possible_cpus()?),
    };
    // Loading validates --buffer-size too; only then is anything created on disk.
    let mut tracer = Tracer::load(LoadOptions {
        // Under the inline engine the process's hits never go through the kernel's rings:
        // --buffer-size sizes its own (per thread), not these (a large one here would take
        // that much memory per CPU for nothing).
        ring_bytes: match inline {
            true => profiler_common::DEFAULT_RING_BYTES,
            false => cli.buffer_size,
        },
        rings_per_cpu: u32::try_from(workers).context("--workers")?,
        nargs: cli.args,
        max_event_bytes: cli.max_event_bytes,
        floor: cli.floor,
        ablate: cli.ablate,
        perf_events_only: cli.no_uprobe_multi,
        // --attach --engine inline holds each new process from its exec as repair does.
        repair: repair
            .as_ref()
            .map(|r| r.offsets)
            .or(inline::hold_offsets(cli)?),
        kernel_log: cli.verbose,
        follow_forks: cli.follow_forks,
        call_slots: match cli.max_overhead {
            Some(_) => crate::kernel::bpf::call_slots_for(crate::kernel::bpf::possible_cpus()?),
            None => 0,
        },
    })?;
    let out = OutputDir::create_root(&cli.out_dir())?;

    // Fork before any thread exists (the runtime starts below): see launch.rs.
    let mut target = match (&process, &program) {
        // The pidfd is taken before attaching, so an exit during the attach is not missed.
        (Some(process), _) => Target::Pid(process.pid, process::open_pidfd(process.pid)?, None),
        (None, Some(program)) => {
            let child = HeldChild::spawn(program, &cli.command, held_signals.previous())?;
            planned.watch_child(child.pid(), program);
            Target::Launch(child, None)
        }
        (None, None) => Target::Attach,
    };
    let scope = match &target {
        Target::Attach => Scope::AllProcesses,
        Target::Launch(child, _) => {
            Scope::Process(NonZeroU32::new(child.pid()).context("fork returned pid 0")?)
        }
        Target::Pid(pid, ..) => Scope::Process(NonZeroU32::new(*pid).context("pid 0")?),
    };
    // --follow-forks: the kernel filters probes by one process only; the programs filter by
    // the set of followed processes instead (see `Tracer::follow`).
    let scope = match scope {
        Scope::Process(pid) if cli.follow_forks => {
            if let Err(err) = tracer.follow(pid.get()) {
                if let Target::Launch(child, _) = target {
                    launch::reap(child);
                }
                return Err(err);
            }
            Scope::AllProcesses
        }
        scope => scope,
    };
    // The repair keeper must trace the process before its first frame is hooked: forked now,
    // before any probe is placed and before the runtime starts a thread.
    if let Some(wanted) = repair
        .as_ref()
        .filter(|_| !matches!(target, Target::Attach))
    {
        if let Err(err) = start_keeper(&mut tracer, &planned, scope, &mut target) {
            match (&target, wanted.asked) {
                // A running process that cannot be traced (a debugger has it) is traced all the
                // same, with what is safe without a tracer.
                (Target::Pid(..), _) | (Target::Launch(..), false) => {
                    (policy, exits_choice) =
                        crate::plan::exits::choose(ExitMode::PerFunction, &planned.image);
                    exits_choice.reason = format!("{} (no repair: {err:#})", exits_choice.reason);
                    errln!("fdr-profiled: warning: --exits repair is not possible here ({err:#}); each function's exits are chosen from its code instead");
                }
                (Target::Launch(..), true) | (Target::Attach, _) => {
                    if let Target::Launch(child, _) = target {
                        launch::reap(child);
                    }
                    return Err(err);
                }
            }
        }
    }
    // Whether the keeper repairs this session's stack (it may have declined above).
    let repairing = match &target {
        Target::Launch(_, keeper) | Target::Pid(_, _, keeper) => keeper.is_some(),
        Target::Attach => repair.is_some(),
    };
    if let Some(discovery) = &mut planned.discovery {
        // Under repair every frame may be hooked: the throws of an object loaded later go
        // through the unwinder already probed.
        if !repairing
            && matches!(cli.exits, ExitMode::Auto | ExitMode::PerFunction)
            && policy == ExitPolicy::All(Exits::Return)
        {
            discovery.guard_unwinding();
        }
    }
    // What a probe hit costs, measured on probes of the daemon's own before the session's
    // are placed (after every fork above: it starts a thread).
    let traps = if cli.floor || inline {
        None
    } else {
        costs::measure_traps(&mut tracer)
    };
    let budget = match cli.max_overhead {
        None => Ok(None),
        Some(_) if cli.floor => Err(anyhow::anyhow!("--max-overhead does nothing with --floor")),
        Some(_) if repairing && matches!(target, Target::Attach) => Err(anyhow::anyhow!(
            "--max-overhead: not with --exits repair under --attach yet (each process has probes of its own there): use --exits per-function"
        )),
        Some(limit) => match traps {
            Some(traps) => Ok(Some(crate::budget::probes::BudgetedProbes::new(
                limit,
                traps,
                crate::session::monotonic_ns(),
            ))),
            None => Err(anyhow::anyhow!(
                "--max-overhead: what a probe costs could not be measured on this host"
            )),
        },
    };
    let mut budget = match budget {
        Ok(budget) => budget,
        Err(err) => {
            if let Target::Launch(child, _) = target {
                launch::reap(child);
            }
            return Err(err);
        }
    };
    let mut session = Session::new(
        out,
        planned.executable.clone(),
        cli.fdr_version,
        exits_choice.clone(),
    );
    let undecodable: usize = planned
        .plans
        .iter()
        .map(|p| p.undecodable_event_sleds)
        .sum();
    // Wherever return probes are placed they are kept apart: a thread stuck at the kernel's
    // limit of pending return probes makes the session observe exits by their sleds instead
    // (under repair only where its keeper cannot make the thread pass through the trampoline;
    // elsewhere, a `longjmp` from past the limit to a frame entered before tracing).
    // (Not under a budget: its functions' probes come and go one by one.)
    let mut return_probes =
        (policy != ExitPolicy::All(Exits::Sleds) && budget.is_none()).then(Vec::new);
    let mut repaired = None;
    let mut engine = None;
    let placed = if inline {
        let plans = std::mem::take(&mut planned.plans);
        let ring_bytes = u64::from(cli.buffer_size);
        let executable = PathBuf::from(&planned.executable.path);
        inline::start(
            &mut target,
            &mut tracer,
            &executable,
            plans,
            ring_bytes,
            &mut session,
        )
        .map(|started| engine = Some(started))
        .and_then(|()| tracer.set_armed(true))
    } else if repairing && matches!(target, Target::Attach) {
        // Each process gets its probes once its keeper traces it (see `repaired`).
        return_probes = None;
        tracer.set_armed(true).and_then(|()| {
            repaired = Some(repaired::AttachRepair::start(
                &mut tracer,
                &mut session,
                std::path::Path::new(&planned.executable.path),
                std::mem::take(&mut planned.plans),
                policy,
            )?);
            Ok(())
        })
    } else {
        std::mem::take(&mut planned.plans)
            .into_iter()
            .try_for_each(|plan| {
                objects::attach(
                    &mut tracer,
                    &mut session,
                    plan,
                    policy,
                    scope,
                    objects::Placing::of(return_probes.as_mut(), budget.as_mut()),
                )
                .map(drop)
            })
            .and_then(|()| {
                // When every process running a binary is traced, only the executable's own catch
                // functions are probed: a probe in a shared library would fire in every process
                // using it.
                let objects = match scope {
                    Scope::AllProcesses => &planned.image[..planned.image.len().min(1)],
                    Scope::Process(_) => &planned.image[..],
                };
                attach_catches(&mut tracer, objects, scope);
                // Every probe is in place: only now does anything get recorded.
                tracer.set_armed(true)
            })
    };
    if let Err(err) = placed {
        if let Target::Launch(child, _) = target {
            launch::reap(child);
        }
        return Err(err);
    }
    errln!("fdr-profiled: recording: every probe is in place");
    let methods = session.exit_methods();
    errln!(
        "fdr-profiled: exits: {} ({})",
        match policy {
            ExitPolicy::All(Exits::Sleds) => "exit sleds".to_owned(),
            ExitPolicy::All(Exits::Return) => "return probes".to_owned(),
            ExitPolicy::PerFunction => format!(
                "per function: {} return probes, {} exit sleds",
                methods.return_probe_functions, methods.exit_sled_functions
            ),
        },
        exits_choice.reason
    );
    if undecodable > 0 {
        errln!(
            "fdr-profiled: warning: {undecodable} custom/typed event sleds have an instruction pattern this \
             version cannot decode; their events are not recorded"
        );
    }
    let rings = tracer.take_rings();
    let rings_per_cpu = tracer.options().rings_per_cpu as usize;
    let books = tracer.take_books()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the event loop")?;
    runtime.block_on(async {
        let intake = Intake::new(rings, rings_per_cpu)?;
        let probing = Probing {
            discovery: planned.discovery,
            inline: engine,
            filter,
            policy,
            scope,
            tracer,
            return_probes,
            repaired,
            traps,
            budget: budget.map(|probes| {
                crate::budget::watch::Budgeting::new(
                    probes,
                    scope,
                    planned.executable.path.clone().into(),
                )
            }),
        };
        record(cli, target, intake, books, session, probing, held_signals).await
    })
}

/// When a thread is stuck at the kernel's limit of pending return probes (see
/// [`stuck::STUCK_BEYOND_RETURN_LIMIT`]: a `longjmp` from past it to a frame entered before
/// tracing, or, under repair, an exception where the keeper cannot make the thread pass
/// through the trampoline), its calls would have no exit of their own for the rest of the
/// session: the whole process's exits are observed by their sleds from then on (exact, at the
/// cost of a single-stepped `ret` each), and the manifest says when and why. The frames hooked
/// before still return through the trampoline (and under repair are still repaired).
fn exit_sleds_if_stuck(books: &KernelBooks, probing: &mut Probing, session: &mut Session) {
    let Some((tid, calls)) = stuck_thread(books, session, None) else {
        return;
    };
    let Some(kept) = probing.return_probes.take() else {
        return;
    };
    let mut placed = 0;
    for object in kept {
        match probing
            .tracer
            .exit_sleds_instead(&object.plan, object.links, probing.scope)
        {
            Ok(n) => placed += n,
            Err(err) => errln!(
                "fdr-profiled: warning: {}: exit sleds not placed ({err:#}); its calls keep ending at the next event that proves them gone",
                object.plan.display_path
            ),
        }
    }
    probing.policy = ExitPolicy::All(Exits::Sleds);
    session.exit_sleds_instead();
    let note = stuck_note("", tid, calls);
    errln!("fdr-profiled: exits: {placed} exit sleds placed instead of return probes: {note}");
    session.note_exits(&note);
}

/// `--exits repair`, as asked for or as `auto` chose it, with what it needs of the kernel.
struct RepairWanted {
    offsets: crate::kernel::btf::RepairOffsets,
    /// `--exits repair` given (an error when impossible); else `auto` chose it (a fallback).
    asked: bool,
    /// `auto`: the object that can unwind, and its personality routine.
    unwinder: Option<(PathBuf, &'static str)>,
}

impl RepairWanted {
    fn choice(&self) -> (ExitPolicy, crate::plan::exits::ExitsChoice) {
        let (policy, mut choice) = crate::plan::exits::choose(ExitMode::Repair, &[]);
        if let Some((path, symbol)) = &self.unwinder {
            choice.reason = crate::repair::auto_reason(path, symbol);
        }
        (policy, choice)
    }
}

/// Whether the session repairs the stack (see `repair::keeper`): `--exits repair`, or `auto`
/// for an image that can unwind (return probes at their cost, made safe for exceptions, where
/// per-function would put exit sleds on every function an exception can leave), where this
/// kernel allows it (see `repair::auto_repairs`; under `--attach` it must also let each new
/// process be held from its exec) and the session does not follow forks (one keeper per
/// process).
fn repair_wanted(
    cli: &RecordArgs,
    attach: bool,
    image: &[PathBuf],
) -> Result<Option<RepairWanted>> {
    match cli.exits {
        ExitMode::Repair => Ok(Some(RepairWanted {
            offsets: crate::repair::offsets_for("--exits repair")?,
            asked: true,
            unwinder: None,
        })),
        ExitMode::Auto if !cli.floor && !cli.no_uprobe_multi && !cli.follow_forks => {
            let Some(unwinder) = crate::repair::auto_repairs(image, attach) else {
                return Ok(None);
            };
            // Under --attach each repaired process has probes of its own, which a budget
            // cannot drop yet: per-function's are shared, each function's removable.
            if attach && cli.max_overhead.is_some() {
                errln!("fdr-profiled: exits: not repaired under --attach with --max-overhead (each repaired process has probes of its own, which the budget cannot drop yet): per-function");
                return Ok(None);
            }
            Ok(crate::kernel::btf::repair_offsets()
                .ok()
                .map(|offsets| RepairWanted {
                    offsets,
                    asked: false,
                    unwinder: Some(unwinder),
                }))
        }
        _ => Ok(None),
    }
}

/// Places the throw and catch probes of `--exits repair` and starts its keeper, the ptrace
/// tracer of `target` (see `repair::keeper::Keeper`).
fn start_keeper(
    tracer: &mut Tracer,
    planned: &planned::Planned,
    scope: Scope,
    target: &mut Target,
) -> Result<()> {
    let (placed, stops) = repair::attach(
        tracer,
        &planned.image,
        scope,
        &mut repair::PointCache::default(),
    )?;
    let mut start = || -> Result<repair::Keeper> {
        let tracee = match target {
            Target::Launch(child, _) => repair::Tracee::Launched(child.pid()),
            Target::Pid(pid, ..) => repair::Tracee::Running(*pid),
            Target::Attach => bail!("--exits repair traces each process of --attach apart"),
        };
        repair::Keeper::start(tracee, tracer.take_repairs()?, &stops, || {})
    };
    match start() {
        Ok(keeper) => {
            if let Target::Launch(_, slot) | Target::Pid(_, _, slot) = target {
                *slot = Some(keeper);
            }
            Ok(())
        }
        Err(err) => {
            // Without a tracer, the throw probes must not stop any thread.
            tracer.detach(placed);
            Err(err)
        }
    }
}

/// Probes where exceptions and panics are caught (see `plan::catches`) in `objects`.
fn attach_catches(tracer: &mut Tracer, objects: &[PathBuf], scope: Scope) {
    for object in objects {
        for point in crate::plan::catches::catch_points(object) {
            match tracer.attach_catch(object, point.file_offset, scope) {
                Ok(()) => errln!(
                    "fdr-profiled: catches: probed {} in {}",
                    point.name,
                    object.display()
                ),
                Err(err) => errln!(
                    "fdr-profiled: warning: {}: catches not probed ({err:#}); frames an \
                     exception leaves are closed at the thread's next traced event instead",
                    object.display()
                ),
            }
        }
    }
}

/// What places probes while recording: the tracer, and the objects still to be found.
struct Probing {
    discovery: Option<Discovery>,
    /// `--engine inline`: the process's sleds patched, its events in shared memory.
    inline: Option<inline::Inline>,
    filter: FunctionFilter,
    policy: ExitPolicy,
    scope: Scope,
    tracer: Tracer,
    /// Under repair: every object's return probes, until exits are observed by their sleds
    /// instead (see [`exit_sleds_instead`]).
    return_probes: Option<Vec<objects::ReturnProbes>>,
    /// `--attach --exits repair`: the processes traced, each with probes of its own.
    repaired: Option<repaired::AttachRepair>,
    /// What a probe hit cost, measured before the session's probes were placed.
    traps: Option<crate::session::summary::TrapCosts>,
    /// `--max-overhead`.
    budget: Option<crate::budget::watch::Budgeting>,
}

async fn record(
    cli: &RecordArgs,
    target: Target,
    intake: Intake,
    mut books: KernelBooks,
    mut session: Session,
    mut probing: Probing,
    held_signals: HeldStopSignals,
) -> Result<u8> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    // Handled from here on: one that came meanwhile is delivered now.
    held_signals.release();
    let kernel_stats = cli
        .kernel_stats
        .then(crate::kernel::bpf::RunTimeStats::enable)
        .transpose()?;
    let mut cost_sampling = probing
        .traps
        .map(|traps| costs::CostSampling::start(traps, kernel_stats.is_some()));

    let (exit_tx, mut exit_rx) =
        tokio::sync::oneshot::channel::<Result<(ChildExit, Option<RepairsByThread>)>>();
    let mut pidfd = None;
    let mut pid_keeper = None;
    let launched = match target {
        Target::Attach => {
            drop(exit_tx);
            false
        }
        Target::Pid(_, fd, keeper) => {
            drop(exit_tx);
            if let Some(keeper) = &keeper {
                errln!(
                    "fdr-profiled: repair: the process's tracer is process {} (fdr-repair) until the session ends",
                    keeper.pid()
                );
            }
            pid_keeper = keeper;
            // SAFETY: `fd` is an OwnedFd moved into the AsyncFd, so it stays open and refers to the
            // same pidfd for the AsyncFd's whole life.
            let registered = unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            };
            pidfd = Some(
                registered
                    .map_err(|e| e.into_parts().1)
                    .context("watching the traced process")?,
            );
            false
        }
        Target::Launch(child, keeper) => {
            if let Some(engine) = &mut probing.inline {
                // Its keeper holds it at its entry point until now.
                engine.go()?;
            }
            let pid = child.release()?;
            if let Some(keeper) = &keeper {
                errln!(
                    "fdr-profiled: repair: the command's tracer is process {} (fdr-repair)",
                    keeper.pid()
                );
            }
            std::thread::Builder::new()
                .name("wait-child".into())
                .spawn(move || {
                    // The keeper, the command's tracer, lets its exit through to us once it
                    // has seen it; the keeper ends right after, with its report.
                    let done = launch::wait_blocking(pid).and_then(|exit| {
                        let report = keeper.map(repair::Keeper::finish).transpose()?;
                        if let Some(why) = report.as_ref().and_then(|r| r.let_go.as_deref()) {
                            errln!("fdr-profiled: repair: {why}");
                        }
                        Ok((exit, report.map(|r| r.repairs)))
                    });
                    let _ = exit_tx.send(done);
                })
                .context("starting the child-wait thread")?;
            true
        }
    };

    let deadline = cli.duration.map(|d| tokio::time::Instant::now() + d);
    // The handler cannot wake us: its threads' rings are drained more often.
    let mut drain = tokio::time::interval(match probing.inline {
        Some(_) => inline::DRAIN_INTERVAL,
        None => DRAIN_INTERVAL,
    });
    drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_flush = Instant::now();
    let mut last_stuck_check = Instant::now();
    let mut child_exit = None;
    // One worker per ring of a CPU: each reads its own (see `Tracer::load`).
    let workers = intake.rings_per_cpu();
    // This thread is worker 0: its part of the files is locked for each call of the pipeline
    // (the session locks every part to flush them between).
    let mut live = live::Live::start(cli, &mut session)?;
    let mut parts = session.parts(workers);
    let own = parts.remove(0);
    let mut events = EventPipeline::new(intake, parts)?;
    let mut rescan = tokio::time::interval(RESCAN_INTERVAL);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = drain.tick() => {
                events.drain(DRAIN_BUDGET, &mut locked(&own));
                if let Some(engine) = &mut probing.inline {
                    inline::drain(engine, &mut events, &own, &mut session);
                }
                probing.tracer.show_kernel_log();
                live::tick(live.as_mut(), &session);
                if let Some(sampling) = &mut cost_sampling {
                    sampling.tick(&probing.tracer);
                }
                if let Some(budget) = &mut probing.budget {
                    let (changes, lines) = budget.tick(&mut probing.tracer);
                    for c in changes.iter().filter(|c| c.action == "dropped") {
                        session.dropped(c.function_id, c.at_ns);
                    }
                    for line in lines {
                        errln!("fdr-profiled: budget: {line}");
                    }
                }
                // The keeper lets the process go by itself (it exec'd a program that raised
                // its privileges): it waits, the process held at its exec, for the session
                // to end and remove its probes first.
                if pid_keeper.as_mut().is_some_and(|k| k.let_go().is_some()) {
                    break;
                }
                if last_flush.elapsed() >= FLUSH_INTERVAL {
                    // Threads that exited with a full buffer: their books are in the table.
                    events.end_exited(books.take_exited(), DRAIN_BUDGET, &mut locked(&own));
                    session.flush();
                    last_flush = Instant::now();
                }
                if let Some(repaired) = &mut probing.repaired {
                    repaired.poll(&mut probing.tracer, &mut session);
                }
                if last_stuck_check.elapsed() >= STUCK_CHECK_INTERVAL {
                    if probing.return_probes.is_some() {
                        exit_sleds_if_stuck(&books, &mut probing, &mut session);
                    }
                    if let Some(repaired) = &mut probing.repaired {
                        repaired.exit_sleds_if_stuck(&books, &mut probing.tracer, &mut session);
                    }
                    last_stuck_check = Instant::now();
                }
            }
            woken = events.wakeup() => {
                woken?;
                events.drain(DRAIN_BUDGET, &mut locked(&own));
            }
            _ = rescan.tick(), if probing.discovery.is_some() => {
                if let (Some(discovery), Some(engine)) = (&mut probing.discovery, &mut probing.inline) {
                    inline::rescan(discovery, &probing.filter, engine, &mut session);
                } else if let Some(discovery) = &mut probing.discovery {
                    objects::rescan(discovery, &probing.filter, probing.policy, &mut probing.tracer, &mut session, probing.scope, objects::Placing::of(probing.return_probes.as_mut(), probing.budget.as_mut().map(|b| &mut b.probes)));
                }
            }
            _ = sigint.recv() => break,
            _ = live::quit_asked(live.as_ref()) => break,
            _ = sigterm.recv() => break,
            _ = sleep_until(deadline) => break,
            exited = target_exited(pidfd.as_ref()) => {
                exited?;
                break;
            }
            status = &mut exit_rx, if launched => {
                let (exit, stats) = status.context("the child-wait thread died")??;
                child_exit = Some(exit);
                if let Some(by_thread) = stats {
                    session.set_repairs(by_thread);
                }
                break;
            }
        }
    }
    drop(live);
    // Every probe hit happened before the child exited or before now: one more drain gets all
    // of them. Disarm, then detach, so that nothing arrives after the last drain and nothing
    // is recorded while the probes go one link at a time; the kernel's books are kept to
    // account for the live threads' last events.
    probing.tracer.show_kernel_log();
    let programs = if kernel_stats.is_some() || cost_sampling.is_some() {
        probing.tracer.program_costs()
    } else {
        Vec::new()
    };
    if let Some(sampling) = cost_sampling.take() {
        session.set_probe_costs(sampling.finish(&programs));
    }
    if kernel_stats.is_some() {
        session.set_kernel_programs(programs);
    }
    if let Some(budget) = &probing.budget {
        session.set_budget(budget.probes.report());
    }
    if let Err(err) = probing.tracer.set_armed(false) {
        errln!("fdr-profiled: warning: {err:#}");
    }
    let mut threads = books.threads();
    if let Some(engine) = probing.inline.take() {
        threads.extend(inline::finish(engine, &mut events, &own, &mut session));
    }
    events.finish(&threads, &mut locked(&own));
    let losses = IntakeLosses {
        unattributed_lost: books.unattributed_lost(),
        returns_before_tracing: books.counter(profiler_common::counter::RETURNS_BEFORE_TRACING),
        malformed: events.malformed(),
    };
    // Its workers end: the session's files are the session's alone again.
    drop(events);
    if let Some(repaired) = probing.repaired.take() {
        let unseen = books.counter(profiler_common::counter::PROCESSES_UNSEEN);
        repaired.finish(&mut probing.tracer, &mut session, unseen);
    }
    if let Some(mut keeper) = pid_keeper {
        // Our probes go first (the keeper holds only the throw and catch probes): then no new
        // frame is hooked, and the keeper puts back the return addresses of those still
        // hooked before it detaches.
        drop(probing);
        if keeper.release() {
            match keeper.finish() {
                Ok(report) => {
                    if let Some(why) = report.let_go {
                        errln!("fdr-profiled: repair: {why}; the session ends");
                        session.add_note(why);
                    }
                    session.set_repairs(report.repairs)
                }
                Err(err) => errln!("fdr-profiled: warning: {err:#}"),
            }
        } else {
            errln!(
                "fdr-profiled: warning: repair: the keeper (process {}) has not let the process go within {:?}: a thread could not be stopped yet; it goes on by itself, and its repairs are not in this summary",
                keeper.pid(),
                repair::RELEASE_WAIT
            );
        }
    }
    let out_dir = session.out_dir().to_path_buf();
    // The report is read and written through the directory held, not its path.
    let out = session.out().try_clone();
    let object_files = session.take_object_files();
    let (report, manifest_error) = session.finish_keeping_report(losses)?;
    err!(
        "{}",
        crate::session::summary::render(&report, &out_dir, cli.top)
    );
    if let Some(err) = &manifest_error {
        errln!("fdr-profiled: error: {err:#}");
    }
    if !cli.no_report && !cli.floor && manifest_error.is_none() {
        let mut symbolizer = Symbolizer::default();
        for (build_id, file) in &object_files {
            let fd = file.as_raw_fd();
            symbolizer =
                symbolizer.with_file(build_id.clone(), format!("/proc/self/fd/{fd}").into());
        }
        match out {
            Ok(out) => outputs::write_outputs(&out, report.events, &symbolizer),
            Err(err) => errln!("fdr-profiled: warning: could not write the report: {err:#}"),
        }
    }
    if cli.exits == ExitMode::Repair && launched && child_exit.is_none() {
        errln!("fdr-profiled: repair: the command still runs; its keeper stays its tracer and repairs the frames hooked before now until it exits");
    }
    let code = match child_exit {
        Some(exit) => u8::try_from(exit.shell_code()).unwrap_or(u8::MAX),
        None => 0,
    };
    // Events no file could be created for (`events_ignored`) were not stored either.
    let unstored =
        report.events_dropped_write_errors + report.records_not_stored + report.events_ignored;
    if unstored > 0 || manifest_error.is_some() {
        errln!(
            "fdr-profiled: error: the trace is incomplete: {unstored} events or records could not be written{}{}; exit status {WRITE_ERROR_STATUS}",
            if manifest_error.is_some() { ", nor session.json" } else { "" },
            if launched { format!(" (the command's exit status was {code})") } else { String::new() },
        );
        return Ok(WRITE_ERROR_STATUS);
    }
    Ok(code)
}

/// The exit status of a recording whose output could not all be written (the disk full):
/// `EX_IOERR` of sysexits.h. The files written before stay valid; the summary counts what was
/// not stored. It replaces a launched command's own status, which the error line gives.
pub const WRITE_ERROR_STATUS: u8 = 74;
