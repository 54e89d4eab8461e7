//! The recording command: plan, load, attach, drain until the end, finalize, summarize.
use crate::bpf::{Scope, Tracer};
use crate::cli::RecordArgs;
use crate::intake::Intake;
use crate::launch::{self, ChildExit, HeldChild};
use crate::output::OutputDir;
use crate::plan::AttachPlan;
use crate::process::{self, TracedProcess};
use crate::session::Session;
use anyhow::{bail, Context as _, Result};
use std::num::NonZeroU32;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// How often the ring buffer is drained. Events are written without waking the daemon, so this
/// bounds how full the buffer gets: at ~1 µs per probe hit and 40 bytes per event, 10 ms is
/// ~400 KiB per busy CPU against an 8 MiB buffer.
const DRAIN_INTERVAL: Duration = Duration::from_millis(10);
/// How often files are made complete on disk (header size patched, buffers flushed).
const FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// What to trace.
enum Target {
    /// Every process running the binary.
    Attach,
    /// A command we launched, parked until the probes are in place.
    Launch(HeldChild),
    /// A running process, and a pidfd that tells when it exits.
    Pid(u32, OwnedFd),
}

/// Runs a recording session as the command line says; returns the process exit code.
pub fn run(cli: &RecordArgs) -> Result<u8> {
    // Reading the binary first gives the most precise error for bad input, root or not.
    let process = cli.pid.map(TracedProcess::find).transpose()?;
    let plan = match (&process, &cli.attach, cli.command.first()) {
        (Some(process), _, _) => AttachPlan::for_process(process)?,
        (None, Some(bin), _) => AttachPlan::for_binary(bin)?,
        (None, None, Some(cmd)) => AttachPlan::for_binary(&launch::resolve_program(cmd)?)?,
        (None, None, None) => bail!("nothing to trace: give --attach BIN, --pid PID or -- COMMAND"),
    };
    if plan.probes.is_empty() {
        bail!(
            "{}: the instrumentation map has no function sleds",
            plan.display_path
        );
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("must run as root: placing uprobes and loading BPF programs needs CAP_SYS_ADMIN (or CAP_BPF and CAP_PERFMON)");
    }
    // Loading validates --buffer-size too; only then is anything created on disk.
    let mut tracer = Tracer::load(cli.buffer_size)?;
    let out = OutputDir::create_root(&cli.out_dir())?;

    // Fork before any thread exists (the runtime starts below): see launch.rs.
    let target = match &process {
        // The pidfd is taken before attaching, so an exit during the attach is not missed.
        Some(process) => Target::Pid(process.pid, process::open_pidfd(process.pid)?),
        None if cli.attach.is_some() => Target::Attach,
        None => Target::Launch(HeldChild::spawn(&plan.binary, &cli.command)?),
    };
    let scope = match &target {
        Target::Attach => Scope::AllProcesses,
        Target::Launch(child) => {
            Scope::Process(NonZeroU32::new(child.pid()).context("fork returned pid 0")?)
        }
        Target::Pid(pid, _) => Scope::Process(NonZeroU32::new(*pid).context("pid 0")?),
    };
    let placed = match tracer.attach(&plan, scope) {
        Ok(n) => n,
        Err(err) => {
            if let Target::Launch(child) = target {
                launch::reap(child);
            }
            return Err(err);
        }
    };
    eprintln!(
        "fdr-profiled: attached {placed} probes to {} functions in {}",
        plan.functions, plan.display_path
    );
    let intake = Intake::new(tracer.take_events()?, tracer.take_lost_counter()?);
    let session = Session::new(out, plan, cli.fdr_version);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the event loop")?;
    runtime.block_on(record(cli, target, intake, session, tracer))
}

async fn record(
    cli: &RecordArgs,
    target: Target,
    mut intake: Intake,
    mut session: Session,
    tracer: Tracer,
) -> Result<u8> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;

    let (exit_tx, mut exit_rx) = tokio::sync::oneshot::channel::<Result<ChildExit>>();
    let mut pidfd = None;
    let launched = match target {
        Target::Attach => {
            drop(exit_tx);
            false
        }
        Target::Pid(_, fd) => {
            drop(exit_tx);
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
        Target::Launch(child) => {
            let pid = child.release()?;
            std::thread::Builder::new()
                .name("wait-child".into())
                .spawn(move || {
                    let _ = exit_tx.send(launch::wait_blocking(pid));
                })
                .context("starting the child-wait thread")?;
            true
        }
    };

    let deadline = cli.duration.map(|d| tokio::time::Instant::now() + d);
    let mut drain = tokio::time::interval(DRAIN_INTERVAL);
    drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_flush = Instant::now();
    let mut child_exit = None;
    loop {
        tokio::select! {
            _ = drain.tick() => {
                intake.drain(|event| session.record(event));
                if last_flush.elapsed() >= FLUSH_INTERVAL {
                    session.flush();
                    last_flush = Instant::now();
                }
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = sleep_until(deadline) => break,
            exited = target_exited(pidfd.as_ref()) => {
                exited?;
                break;
            }
            status = &mut exit_rx, if launched => {
                child_exit = Some(status.context("the child-wait thread died")??);
                break;
            }
        }
    }
    // Every probe hit happened before the child exited or before now: one more drain gets all
    // of them. Detach first so nothing arrives after the last drain.
    drop(tracer);
    intake.drain(|event| session.record(event));
    let lost = intake.lost_in_kernel().unwrap_or_else(|err| {
        eprintln!("fdr-profiled: warning: cannot read the lost-events counter: {err}");
        0
    });
    let out_dir = session.out_dir().to_path_buf();
    let report = session.finish(lost + intake.malformed())?;
    eprint!("{}", report.render(&out_dir, cli.top));
    Ok(match child_exit {
        Some(exit) => u8::try_from(exit.shell_code()).unwrap_or(u8::MAX),
        None => 0,
    })
}

/// Resolves when the process traced by `--pid` exits; never without one.
async fn target_exited(pidfd: Option<&tokio::io::unix::AsyncFd<OwnedFd>>) -> Result<()> {
    match pidfd {
        Some(fd) => process::exited(fd).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
