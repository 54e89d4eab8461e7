//! `--attach BIN --exits repair`: every process that runs the executable, each traced by a
//! repair keeper of its own (see [`super::repair`]) before any frame of it is hooked.
//!
//! Every probe of such a session is per process, entries included: the kernel hooks a
//! frame's return address for a return probe whenever any probe at that offset fires, even
//! in a process the return probe's own filter leaves out (`handler_chain()` in
//! kernel/events/uprobes.c), and a hooked frame in a process no keeper traces turns its next
//! exception into `std::terminate`. The only probe for every process is `process_start`, at
//! the executable's entry point: it names each process that starts running it. Each one, and
//! each one already running when the session starts, is then handled as `--pid` handles its
//! process: its keeper seizes every thread, the throw and catch probes go in, then its return
//! probes, then its entry and exit sleds. What it ran before that (a few milliseconds after
//! it started) is not traced; a process that cannot be traced (gone already, another
//! tracer) is named and counted, never half-traced. When a process exits, its probes go; when
//! the session ends, each keeper lets its process go as under `--pid`.
use super::repair::{self, Keeper, Tracee};
use crate::kernel::bpf::{Attachment, KernelBooks, Scope, Tracer};
use crate::plan::exits::ExitPolicy;
use crate::plan::AttachPlan;
use crate::session::Session;
use crate::traced::mappings::{self, FileId};
use anyhow::{bail, Context as _, Result};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

/// The processes of an `--attach --exits repair` session.
pub struct RepairedProcesses {
    /// The traced executable (its file), and its plan(s), exits decided once for all.
    executable: Option<FileId>,
    plans: Vec<AttachPlan>,
    /// Whether the plans' objects are in the session's manifest yet (with the count of
    /// probes the first traced process got).
    objects_added: bool,
    live: Vec<Process>,
    /// Processes traced so far, and those that could not be, with why.
    traced: u64,
    not_traced: Vec<(u32, String)>,
}

/// One traced process: its keeper and every probe placed for it.
struct Process {
    pid: u32,
    keeper: Keeper,
    /// Its entry and exit sleds and catch probes.
    probes: Attachment,
    /// Its return probes, one set per plan; `None` once its exits are observed by their sleds
    /// (see [`RepairedProcesses::exit_sleds_if_stuck`]).
    returns: Option<Vec<Attachment>>,
    /// The throw and catch stops (the keeper holds them too, until it lets the process go).
    unwind_stops: Attachment,
}

impl RepairedProcesses {
    /// Places the `process_start` probe at `executable`'s entry point and traces the
    /// processes already running it. Call it once the probes are armed.
    pub fn start(
        tracer: &mut Tracer,
        session: &mut Session,
        executable: &Path,
        plans: Vec<AttachPlan>,
        policy: ExitPolicy,
    ) -> Result<RepairedProcesses> {
        let entry = xray_object::elf::ElfImage::open(executable)
            .map_err(anyhow::Error::from)
            .and_then(|elf| {
                elf.entry_file_offset()
                    .context("it has no entry point in its file (not an executable?)")
            })
            .with_context(|| format!("--exits repair --attach: {}", executable.display()))?;
        tracer
            .attach_process_start(executable, entry)
            .context("--exits repair --attach: probing the executable's entry point")?;
        drop(tracer.take_attachment());
        let plans = plans
            .into_iter()
            .map(|mut plan| {
                crate::plan::exits::decide(&mut plan, policy);
                plan
            })
            .collect();
        let mut processes = RepairedProcesses {
            executable: mappings::file_id(executable),
            plans,
            objects_added: false,
            live: Vec::new(),
            traced: 0,
            not_traced: Vec::new(),
        };
        if let Some(id) = processes.executable {
            for pid in crate::traced::process::running(id) {
                processes.trace(pid, tracer, session);
            }
        }
        Ok(processes)
    }

    /// Traces the processes that started since the last call, and removes the probes of those
    /// that exited (adding what their keeper repaired to the session).
    pub fn poll(&mut self, tracer: &mut Tracer, session: &mut Session) {
        for pid in tracer.started_processes() {
            self.trace(pid, tracer, session);
        }
        let (ended, live): (Vec<Process>, Vec<Process>) = std::mem::take(&mut self.live)
            .into_iter()
            .partition(|p| p.keeper.has_ended());
        self.live = live;
        for process in ended {
            eprintln!(
                "fdr-profiled: repair: process {} exited; its probes are removed",
                process.pid
            );
            let keeper = remove_probes(process, tracer);
            match keeper.finish() {
                Ok(by_thread) => session.add_repairs(by_thread),
                Err(err) => eprintln!("fdr-profiled: warning: {err:#}"),
            }
        }
    }

    fn trace(&mut self, pid: u32, tracer: &mut Tracer, session: &mut Session) {
        if self.live.iter().any(|p| p.pid == pid) {
            return;
        }
        match self.place(pid, tracer) {
            Ok((process, placed)) => {
                eprintln!(
                    "fdr-profiled: repair: process {pid} traced, {placed} probes (its tracer: process {}, fdr-repair)",
                    process.keeper.pid()
                );
                if !self.objects_added {
                    self.objects_added = true;
                    self.add_objects(session, placed);
                }
                self.traced += 1;
                self.live.push(process);
            }
            Err(err) => {
                eprintln!("fdr-profiled: warning: repair: process {pid} is not traced: {err:#}");
                self.not_traced.push((pid, format!("{err:#}")));
            }
        }
    }

    /// The keeper first, then the throw and catch probes, the return probes, the sleds.
    fn place(&self, pid: u32, tracer: &mut Tracer) -> Result<(Process, usize)> {
        let nz = NonZeroU32::new(pid).context("pid 0")?;
        let scope = Scope::Process(nz);
        if self.executable.is_none() || mappings::executable_id(pid) != self.executable {
            bail!("it exited, or runs another program now");
        }
        let image: Vec<PathBuf> = crate::plan::exits::mapped_image(pid);
        drop(tracer.take_attachment());
        let (unwind_stops, stops) = repair::attach(tracer, &image, scope)?;
        let keeper = tracer
            .take_repairs()
            .and_then(|repairs| Keeper::start(Tracee::Running(pid), repairs, &stops));
        let keeper = match keeper {
            Ok(keeper) => keeper,
            Err(err) => {
                tracer.detach(unwind_stops);
                return Err(err);
            }
        };
        // Traced: now its frames may be hooked.
        let mut returns = Vec::new();
        let mut placed = 0;
        let attached = self.plans.iter().try_for_each(|plan| {
            let (n, links) = tracer.attach_keeping_returns(plan, scope)?;
            placed += n;
            returns.push(links);
            Ok::<_, anyhow::Error>(())
        });
        super::attach_catches(tracer, &image, scope);
        let probes = tracer.take_attachment();
        let process = Process {
            pid,
            keeper,
            probes,
            returns: Some(returns),
            unwind_stops,
        };
        if let Err(err) = attached {
            let mut keeper = remove_probes(process, tracer);
            if keeper.release() {
                let _ = keeper.finish();
            }
            return Err(err);
        }
        Ok((process, placed))
    }

    fn add_objects(&self, session: &mut Session, placed: usize) {
        let attached_ns = crate::session::monotonic_ns();
        let total: usize = self
            .plans
            .iter()
            .map(|p| p.probes.len())
            .sum::<usize>()
            .max(1);
        for plan in &self.plans {
            // The probes of one process, shared out by the plans' sizes.
            let probes = placed * plan.probes.len() / total;
            session.add_object(plan.clone(), probes, attached_ns);
        }
    }

    /// Under repair, a thread stuck at the kernel's limit of pending return probes makes its
    /// process's exits observed by their sleds from then on (see `record::exit_sleds_if_stuck`).
    pub fn exit_sleds_if_stuck(
        &mut self,
        books: &KernelBooks,
        tracer: &mut Tracer,
        session: &mut Session,
    ) {
        for process in &mut self.live {
            if process.returns.is_none() {
                continue;
            }
            let Some((tid, calls)) = super::stuck_thread(books, session, Some(process.pid)) else {
                continue;
            };
            let Some(scope) = NonZeroU32::new(process.pid).map(Scope::Process) else {
                continue;
            };
            let mut placed = 0;
            for (plan, links) in self
                .plans
                .iter()
                .zip(process.returns.take().unwrap_or_default())
            {
                match tracer.exit_sleds_instead(plan, links, scope) {
                    Ok(n) => placed += n,
                    Err(err) => eprintln!(
                        "fdr-profiled: warning: process {}: {}: exit sleds not placed ({err:#}); its calls keep ending at the next event that proves them gone",
                        process.pid, plan.display_path
                    ),
                }
            }
            process.probes.extend(tracer.take_attachment());
            let note = super::stuck_note(&format!("process {}: ", process.pid), tid, calls);
            eprintln!(
                "fdr-profiled: exits: {placed} exit sleds placed instead of return probes: {note}"
            );
            session.note_exits(&note);
        }
    }

    /// At the end of the session (recording disarmed): removes every process's probes, then
    /// has each keeper let its process go, as under `--pid`; says which processes were and were
    /// not traced. `unseen`: processes the start queue had no room for.
    pub fn finish(mut self, tracer: &mut Tracer, session: &mut Session, unseen: u64) {
        for process in std::mem::take(&mut self.live) {
            let pid = process.pid;
            let mut keeper = remove_probes(process, tracer);
            if keeper.release() {
                match keeper.finish() {
                    Ok(by_thread) => session.add_repairs(by_thread),
                    Err(err) => eprintln!("fdr-profiled: warning: {err:#}"),
                }
            } else {
                eprintln!(
                    "fdr-profiled: warning: repair: the keeper of process {pid} (process {}) has not let it go within {:?}: it goes on by itself, and its repairs are not in this summary",
                    keeper.pid(),
                    repair::RELEASE_WAIT
                );
            }
        }
        let mut note = format!("{} processes traced", self.traced);
        if !self.not_traced.is_empty() {
            let named: Vec<String> = self
                .not_traced
                .iter()
                .map(|(pid, why)| format!("{pid} ({why})"))
                .collect();
            note.push_str(&format!(
                "; {} not traced: {}",
                self.not_traced.len(),
                named.join(", ")
            ));
        }
        if unseen > 0 {
            note.push_str(&format!(
                "; {unseen} started while the queue that names them was full, not traced"
            ));
        }
        eprintln!("fdr-profiled: repair: {note}");
        session.note_exits(&format!(
            "repair of every process running the executable: {note}"
        ));
        if !self.objects_added {
            self.add_objects(session, 0);
        }
    }
}

/// Removes the probes placed for `process` (the keeper keeps its own handles on the throw and
/// catch stops until it lets the process go); returns its keeper.
fn remove_probes(process: Process, tracer: &mut Tracer) -> Keeper {
    tracer.detach(process.probes);
    for links in process.returns.unwrap_or_default() {
        tracer.detach(links);
    }
    tracer.detach(process.unwind_stops);
    process.keeper
}
