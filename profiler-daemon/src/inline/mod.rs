//! `--engine inline`: tracing a running process (or a launched command, from its entry point)
//! at in-process cost, by patching its XRay sleds from outside to call a handler put into it,
//! as XRay's own runtime would patch them, instead of placing a uprobe (a kernel trap) on each.
//!
//! - [`handler`]: the handler, assembled with fdr-profiled and copied into the process: it
//!   writes one record per hit into the calling thread's slot of memory shared with
//!   fdr-profiled, with no system call and no lock;
//! - [`patch`]: the bytes a sled gets, and what it must hold first;
//! - [`remote`]: the process held still from outside (ptrace), its memory written, system
//!   calls made in it;
//! - [`keeper`]: the process, forked from fdr-profiled, that patches the process and puts it
//!   back as it was at the end, whatever happens to fdr-profiled;
//! - [`buffers`]: the shared memory, read by fdr-profiled into the events the kernel side
//!   would have made, which go down the same pipeline (`session::pipeline`);
//! - [`glibc`]: where a thread's id is, for the handler;
//! - [`processes`]: the engines of every process that runs an executable, those that start
//!   held from their exec.
//!
//! uprobes stay the default: they change nothing in the process's memory, and what runs there
//! is verified by the kernel. This engine is for code too hot for them.
pub mod buffers;
pub mod glibc;
pub mod handler;
pub mod keeper;
pub mod patch;
pub mod processes;
pub mod remote;

use crate::kernel::intake::Event;
use crate::plan::AttachPlan;
use anyhow::{Context as _, Result};
use buffers::{Layout, SharedBuffers, TscClock};
pub use keeper::Target;
use keeper::{InlineKeeper, Patched, Restored};
use profiler_common::ThreadState;

/// Threads that can be traced at once (a slot each); more find none and their hits are
/// counted, not recorded. Fewer with larger rings (see [`slots_for`]).
pub const SLOTS: u64 = 1024;

/// Bytes of address space the slots may take in the process (reserved, not used: only the
/// pages a thread writes are ever touched).
const SLOTS_SPACE: u64 = 64 << 30;

/// Slots for rings of `ring_bytes`: [`SLOTS`], or fewer so that they fit [`SLOTS_SPACE`] (at
/// least 16).
pub fn slots_for(ring_bytes: u64) -> u64 {
    (SLOTS_SPACE / ring_bytes.max(1)).clamp(16, SLOTS)
}

/// `plans` with each object read through a descriptor of fdr-profiled's (the service holds
/// its binaries open, `/proc/self/fd/N`) named through fdr-profiled's pid instead: the keeper
/// is a process of its own, whose `/proc/self` is not fdr-profiled's.
fn named_for_keeper(plans: &[AttachPlan]) -> Vec<AttachPlan> {
    let own = format!("/proc/{}/", std::process::id());
    plans
        .iter()
        .map(|plan| {
            let mut plan = plan.clone();
            if let Ok(rest) = plan.binary.strip_prefix("/proc/self/") {
                plan.binary = std::path::Path::new(&own).join(rest);
            }
            plan
        })
        .collect()
}

/// Drains between two looks at which slots' threads are gone.
const CHECK_EVERY: u32 = 8;

/// The inline engine tracing one process.
pub struct Engine {
    /// The process patched.
    pid: u32,
    keeper: Option<InlineKeeper>,
    buffers: SharedBuffers,
    clock: TscClock,
    patched: Patched,
    drains: u32,
    /// Threads found gone, not handed to the pipeline yet.
    ended: Vec<(u32, ThreadState)>,
}

/// What the engine did, for the summary.
#[derive(Clone, Debug)]
pub struct EngineReport {
    pub patched: Patched,
    /// Threads that can be traced at once.
    pub slots: u64,
    pub restored: Option<Restored>,
    /// Hits of threads that found no slot.
    pub no_slot: u64,
}

impl Engine {
    /// Patches `target`'s sleds of `plans` (every thread stopped for the while; a launched
    /// command or a held process at its entry point) and maps the memory its handler writes,
    /// `ring_bytes` per thread; its times read with `clock` (measured now if `None`). Forks
    /// the keeper (see [`InlineKeeper::start`], which calls `let_go` for a held process).
    pub fn start(
        target: Target,
        plans: &[AttachPlan],
        ring_bytes: u64,
        clock: Option<TscClock>,
        let_go: impl FnOnce(),
    ) -> Result<Engine> {
        // The handler and the sleds' bytes are x86-64 code.
        if let Err(err) = crate::arch::unsupported("the inline engine") {
            let_go();
            return Err(err);
        }
        let pid = target.pid();
        let layout = Layout::new(slots_for(ring_bytes), ring_bytes)?;
        // Before any hit: the handler's times are TSC ticks.
        let clock =
            clock.unwrap_or_else(|| TscClock::measure(std::time::Duration::from_millis(20)));
        let plans = named_for_keeper(plans);
        let (keeper, patched) = InlineKeeper::start(target, &plans, layout, let_go)?;
        let buffers = match SharedBuffers::map(pid, patched.shared_at, layout) {
            Ok(buffers) => buffers,
            Err(err) => {
                let _ = keeper.finish();
                return Err(err);
            }
        };
        Ok(Engine {
            pid,
            keeper: Some(keeper),
            buffers,
            clock,
            patched,
            drains: 0,
            ended: Vec::new(),
        })
    }

    /// Lets a launched command go from its entry point (see [`InlineKeeper::go`]).
    pub fn go(&mut self) -> Result<()> {
        self.keeper.as_mut().context("the keeper has ended")?.go()
    }

    /// Patches the sleds of `plans`, objects the process mapped since the start (`dlopen`):
    /// returns the sleds patched and those left as they were.
    pub fn patch_more(&mut self, plans: &[AttachPlan]) -> Result<(usize, usize)> {
        let objects = plans
            .iter()
            .map(|plan| patch::object_sleds(self.pid, plan))
            .collect::<Result<Vec<_>>>()?;
        self.keeper
            .as_mut()
            .context("the keeper has ended")?
            .patch_more(&objects)
    }

    /// The process patched.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// How its TSC times are read (for the engines of other processes of the session).
    pub fn clock(&self) -> TscClock {
        self.clock
    }

    /// Whether its process has ended.
    pub fn process_gone(&self) -> bool {
        keeper::gone(self.pid)
    }

    /// What the keeper patched.
    pub fn patched(&self) -> &Patched {
        &self.patched
    }

    /// Hands the events written since the last drain to `sink` (each thread's ring at most
    /// once around: one busy thread fills it in tens of milliseconds). Threads found gone are
    /// kept for [`Engine::take_ended`].
    pub fn drain(&mut self, sink: &mut dyn FnMut(&mut Event)) {
        self.drains = self.drains.wrapping_add(1);
        let check = self.drains.is_multiple_of(CHECK_EVERY);
        self.buffers
            .drain(&self.clock, check, sink, &mut self.ended);
    }

    /// The threads found gone since the last call, with their books (their last number and
    /// trailing losses), all their events drained.
    pub fn take_ended(&mut self) -> Vec<(u32, ThreadState)> {
        std::mem::take(&mut self.ended)
    }

    /// Ends the session: the keeper puts every sled back; then every event left is handed
    /// to `sink`. Returns the books of the threads not ended yet, and what was done.
    pub fn finish(
        mut self,
        sink: &mut dyn FnMut(&mut Event),
    ) -> (Vec<(u32, ThreadState)>, EngineReport, Option<anyhow::Error>) {
        let (restored, error) = match self.keeper.take().map(InlineKeeper::finish) {
            Some(Ok(restored)) => (Some(restored), None),
            Some(Err(err)) => (None, Some(err)),
            None => (None, None),
        };
        self.buffers
            .drain(&self.clock, false, sink, &mut self.ended);
        let mut books = std::mem::take(&mut self.ended);
        books.extend(self.buffers.books());
        let report = EngineReport {
            patched: self.patched.clone(),
            slots: self.buffers.slots(),
            restored,
            no_slot: self.buffers.no_slot(),
        };
        (books, report, error)
    }
}
