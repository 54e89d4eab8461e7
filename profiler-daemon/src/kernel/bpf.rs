//! Loading the eBPF object, creating its per-CPU ring buffers, and placing the probes of an
//! [`AttachPlan`].
pub use crate::kernel::books::{KernelBooks, PodThreadState};
use crate::kernel::uprobe_multi::{self, MultiLink, MultiProgram};
use crate::plan::{AttachPlan, Probe};
use anyhow::{anyhow, bail, Context as _, Result};
use aya::maps::{ArrayOfMaps, HashMap as BpfHashMap, Map, MapData, PerCpuArray, RingBuf};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use aya::programs::{RawTracePoint, UProbe};
use aya::{Ebpf, EbpfLoader};
pub use fdr_session::schema::ProgramCost;
use profiler_common::{
    cookie_flags, event_kind, globals, Cookie, RepairState, SledKind, ARMED_MAP, COUNTERS_MAP,
    EXITED_THREADS_MAP, FLOOR_PROGRAM, FLOOR_RETURN_PROGRAM, FOLLOWED_MAP, FOLLOW_FORK_PROGRAM,
    PROCESS_START_PROGRAM, REPAIRS_MAP, REPAIR_RELEASE_PROGRAM, RETURN_PROGRAM, RINGS_MAP,
    SLED_PROGRAM, STARTED_MAP, THREAD_BOOKS_PROGRAM, THREAD_EXIT_PROGRAM, UNWIND_STOP_PROGRAM,
};
use std::num::NonZeroU32;
use std::path::Path;

/// The eBPF object built by `build.rs` from the `profiler-ebpf` crate (public for
/// `uprobe_multi::MultiProgram::load` and its tests).
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));

/// A loader for [`EBPF_OBJECT`]: the per-thread state is task storage, which aya 0.14 creates
/// but has no type for (it must be told to accept such maps).
pub fn object_loader() -> EbpfLoader<'static> {
    let mut loader = EbpfLoader::new();
    loader.allow_unsupported_maps();
    loader
}

/// `BPF_MAP_TYPE_RINGBUF` (uapi value).
const BPF_MAP_TYPE_RINGBUF: u32 = 27;

/// What to load.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Bytes per per-CPU ring buffer (a power of two, at least a page).
    pub ring_bytes: u32,
    /// Argument registers recorded at LOG_ARGS_ENTRY sleds.
    pub nargs: u8,
    /// Payload bytes kept per custom/typed event.
    pub max_event_bytes: u32,
    /// Attach empty programs instead (the benchmark's floor); nothing is recorded.
    pub floor: bool,
    /// Benchmark only: `profiler_common::ablate` bits.
    pub ablate: u32,
    /// Place every probe as its own perf event even where `uprobe_multi` links exist (the
    /// fallback path, for tests and benchmarks).
    pub perf_events_only: bool,
    /// `--exits repair`: where the kernel keeps a thread's return-probe instances and its
    /// signal handlers.
    pub repair: Option<crate::kernel::btf::RepairOffsets>,
    /// Show the programs' reports of rare anomalies (aya-log; see [`Tracer::show_kernel_log`]).
    /// Off, the programs skip them.
    pub kernel_log: bool,
    /// `--follow-forks`: only the processes named by [`Tracer::follow`] and those they fork
    /// are recorded (the probes are then placed for every process, [`Scope::AllProcesses`]).
    pub follow_forks: bool,
}

/// The loaded programs and maps. Dropping it detaches every probe.
pub struct Tracer {
    // Field order is drop order: links go before the programs they run. A slot is emptied
    // when its link is detached ([`Tracer::detach`]), so that the others keep their places.
    links: Vec<Option<MultiLink>>,
    multi: Vec<(&'static str, MultiProgram)>,
    ebpf: Ebpf,
    options: LoadOptions,
    rings: Vec<RingBuf<MapData>>,
    /// What was placed since the last [`Tracer::take_attachment`].
    attachment: Attachment,
    /// The programs' anomaly reports (`LoadOptions::kernel_log`).
    kernel_log: Option<aya_log::EbpfLogger<KernelLog>>,
    /// Whether the programs read the kernel's own count of pending return probes.
    kernel_depth: bool,
}

/// A set of placed probes that can be removed again on their own (a service target that a
/// reload removes): its `uprobe_multi` links, or its perf-event links.
#[derive(Debug, Default)]
pub struct Attachment {
    /// Slots in the tracer's list of `uprobe_multi` links.
    multi: Vec<usize>,
    /// Perf-event links, with the program they run.
    perf: Vec<(&'static str, aya::programs::uprobe::UProbeLinkId)>,
}

impl Attachment {
    /// Adds `other`'s probes to this set.
    pub fn extend(&mut self, other: Attachment) {
        self.multi.extend(other.multi);
        self.perf.extend(other.perf);
    }
}

/// Which processes the probes fire for.
#[derive(Clone, Copy, Debug)]
pub enum Scope {
    /// Every process that runs the binary, now or later.
    AllProcesses,
    /// Only this process (all of its threads).
    Process(NonZeroU32),
}

impl From<Scope> for UProbeScope {
    fn from(scope: Scope) -> UProbeScope {
        match scope {
            Scope::AllProcesses => UProbeScope::AllProcesses,
            Scope::Process(pid) => UProbeScope::OneProcess(pid),
        }
    }
}

impl Tracer {
    /// Loads the programs and creates one ring buffer of `options.ring_bytes` per possible CPU.
    pub fn load(options: LoadOptions) -> Result<Tracer> {
        let page = page_size();
        let ring_bytes = options.ring_bytes;
        if !ring_bytes.is_power_of_two() || ring_bytes < page {
            bail!(
                "--buffer-size must be a power of two of at least {page} bytes, not {ring_bytes}"
            );
        }
        raise_memlock_limit();
        let cpus =
            aya::util::nr_cpus().map_err(|(what, e)| anyhow!("cannot count CPUs ({what}): {e}"))?;
        let cpus = u32::try_from(cpus).context("too many CPUs")?;
        let nargs = u32::from(options.nargs);
        // Wake the reader when a buffer is half full: the 10 ms timer keeps up with ordinary
        // rates, this covers bursts.
        let wakeup = u64::from(ring_bytes / 2);
        let exit_code_offset = crate::kernel::btf::task_exit_code_offset().unwrap_or(0);
        let mut offsets = options.repair.unwrap_or_default();
        let follow_forks = u32::from(options.follow_forks);
        if options.follow_forks {
            offsets.task_pid = crate::kernel::btf::task_pid_offset().context(
                "--follow-forks: the kernel's BTF (/sys/kernel/btf/vmlinux) has no task_struct.pid",
            )?;
        }
        let trampoline = crate::kernel::btf::trampoline_offsets().unwrap_or_default();
        let depth = crate::kernel::btf::depth_offsets().unwrap_or_default();
        let kernel_log_level: u8 = if options.kernel_log {
            aya_log::Level::Warn as u8
        } else {
            0
        };
        let mut ebpf = object_loader()
            .override_global(globals::TASK_MM_OFFSET, &trampoline.task_mm, true)
            .override_global(globals::MM_XOL_AREA_OFFSET, &trampoline.mm_xol_area, true)
            .override_global(globals::XOL_VADDR_OFFSET, &trampoline.xol_vaddr, true)
            .override_global(globals::DEPTH_UTASK_OFFSET, &depth.utask, true)
            .override_global(globals::DEPTH_OFFSET, &depth.depth, true)
            .override_global(globals::DEPTH_LIST_OFFSET, &depth.return_instances, true)
            .override_global(globals::DEPTH_RI_STACK_OFFSET, &depth.ri_stack, true)
            .override_global(globals::UTASK_OFFSET, &offsets.utask, true)
            .override_global(
                globals::RETURN_INSTANCES_OFFSET,
                &offsets.return_instances,
                true,
            )
            .override_global(globals::RI_STACK_OFFSET, &offsets.ri_stack, true)
            .override_global(globals::RI_ORIG_OFFSET, &offsets.ri_orig, true)
            .override_global(globals::RI_NEXT_OFFSET, &offsets.ri_next, true)
            .override_global(globals::BLOCKED_OFFSET, &offsets.blocked, true)
            .override_global(globals::SIGHAND_OFFSET, &offsets.sighand, true)
            .override_global(
                globals::SIGHAND_ACTION_OFFSET,
                &offsets.sighand_action,
                true,
            )
            .override_global(globals::K_SIGACTION_SIZE, &offsets.k_sigaction_size, true)
            .override_global(globals::TASK_PID_OFFSET, &offsets.task_pid, true)
            .override_global(globals::FOLLOW_FORKS, &follow_forks, true)
            .override_global(globals::NARGS, &nargs, true)
            .override_global(globals::MAX_EVENT_BYTES, &options.max_event_bytes, true)
            .override_global(globals::WAKEUP_BYTES, &wakeup, true)
            .override_global(globals::EXIT_CODE_OFFSET, &exit_code_offset, true)
            .override_global(globals::ABLATE, &options.ablate, true)
            .override_global(KERNEL_LOG_LEVEL, &kernel_log_level, true)
            .map_max_entries(RINGS_MAP, cpus)
            .load(EBPF_OBJECT)
            .map_err(|e| anyhow!("loading the eBPF programs failed: {}", one_line(&e)))?;
        for name in [
            SLED_PROGRAM,
            RETURN_PROGRAM,
            FLOOR_PROGRAM,
            FLOOR_RETURN_PROGRAM,
            UNWIND_STOP_PROGRAM,
            PROCESS_START_PROGRAM,
        ] {
            uprobe(&mut ebpf, name)?
                .load()
                .map_err(|e| anyhow!("the kernel refused the {name} program: {}", one_line(&e)))?;
        }
        let mut rings = Vec::new();
        {
            let outer = ebpf
                .map_mut(RINGS_MAP)
                .context("the eBPF object has no ring map")?;
            let mut outer: ArrayOfMaps<&mut MapData, RingBuf<MapData>> = outer.try_into()?;
            for cpu in 0..cpus {
                let obj = aya_obj::Map::new_from_params(BPF_MAP_TYPE_RINGBUF, 0, 0, ring_bytes, 0);
                let data = MapData::create(obj, &format!("fdr_ring{cpu}"), None).map_err(|e| {
                    anyhow!(
                        "cannot create a {ring_bytes}-byte ring buffer: {}",
                        one_line(&e)
                    )
                })?;
                let ring = RingBuf::try_from(Map::RingBuf(data))?;
                outer.set(cpu, &ring, 0)?;
                rings.push(ring);
            }
        }
        // One uprobe_multi link per program places all of a file's probes in one system call
        // and one descriptor; the programs must be loaded a second time for that.
        let mut multi = Vec::new();
        if !options.perf_events_only && uprobe_multi::supported() {
            // The repair keeper must be able to hold the throw and catch probes' links.
            let repair = options
                .repair
                .is_some()
                .then_some([UNWIND_STOP_PROGRAM, PROCESS_START_PROGRAM])
                .into_iter()
                .flatten();
            for name in [
                SLED_PROGRAM,
                RETURN_PROGRAM,
                FLOOR_PROGRAM,
                FLOOR_RETURN_PROGRAM,
            ]
            .into_iter()
            .chain(repair)
            {
                let program = MultiProgram::load(&ebpf, EBPF_OBJECT, name)
                    .with_context(|| format!("loading the {name} program for uprobe_multi"))?;
                multi.push((name, program));
            }
        }
        if !options.floor {
            let exit: &mut RawTracePoint = ebpf
                .program_mut(THREAD_EXIT_PROGRAM)
                .context("the eBPF object has no thread-exit program")?
                .try_into()?;
            exit.load().map_err(|e| {
                anyhow!(
                    "the kernel refused the thread-exit program: {}",
                    one_line(&e)
                )
            })?;
            exit.attach("sched_process_exit").map_err(|e| {
                anyhow!(
                    "cannot attach to the sched_process_exit tracepoint: {}",
                    one_line(&e)
                )
            })?;
            if options.follow_forks {
                let fork: &mut RawTracePoint = ebpf
                    .program_mut(FOLLOW_FORK_PROGRAM)
                    .with_context(|| {
                        format!("the eBPF object has no {FOLLOW_FORK_PROGRAM} program")
                    })?
                    .try_into()?;
                fork.load().map_err(|e| {
                    anyhow!(
                        "the kernel refused the {FOLLOW_FORK_PROGRAM} program: {}",
                        one_line(&e)
                    )
                })?;
                fork.attach("task_newtask").map_err(|e| {
                    anyhow!(
                        "cannot attach to the task_newtask tracepoint: {}",
                        one_line(&e)
                    )
                })?;
            }
            let books: &mut aya::programs::Iter = ebpf
                .program_mut(THREAD_BOOKS_PROGRAM)
                .with_context(|| format!("the eBPF object has no {THREAD_BOOKS_PROGRAM} program"))?
                .try_into()?;
            let btf = aya::Btf::from_sys_fs().context("reading the kernel's BTF")?;
            books.load("task", &btf).map_err(|e| {
                anyhow!(
                    "the kernel refused the {THREAD_BOOKS_PROGRAM} program: {}",
                    one_line(&e)
                )
            })?;
        }
        // After the uprobe_multi loads, which take every map from `ebpf`: the logger takes
        // its ring buffer out.
        let kernel_log = if options.kernel_log {
            Some(
                aya_log::EbpfLogger::init_with_logger(&mut ebpf, KernelLog)
                    .map_err(|e| anyhow!("reading the programs' log: {}", one_line(&e)))?,
            )
        } else {
            None
        };
        Ok(Tracer {
            kernel_depth: depth.utask != 0,
            kernel_log,
            attachment: Attachment::default(),
            links: Vec::new(),
            multi,
            ebpf,
            options,
            rings,
        })
    }

    /// Places the plan's probes: for a function marked `RETURN_PROBED` (see `plan::exits`), a
    /// return probe at its entry instead of probes on its exit sleds. Exit-side probes go first:
    /// a process keeps running while probes are placed one at a time, and this order can only
    /// produce exits without entries (dropped and counted), never entries without exits.
    /// Returns how many probes were placed.
    pub fn attach(&mut self, plan: &AttachPlan, scope: Scope) -> Result<usize> {
        let (placed, returns) = self.attach_keeping_returns(plan, scope)?;
        self.attachment.extend(returns);
        Ok(placed)
    }

    /// [`Tracer::attach`], keeping the return probes apart: returns how many probes were placed
    /// and the return probes' links (not in [`Tracer::take_attachment`]'s set), which
    /// [`Tracer::exit_sleds_instead`] can remove.
    pub fn attach_keeping_returns(
        &mut self,
        plan: &AttachPlan,
        scope: Scope,
    ) -> Result<(usize, Attachment)> {
        let scope = UProbeScope::from(scope);
        let (sled_prog, return_prog) = if self.options.floor {
            (FLOOR_PROGRAM, FLOOR_RETURN_PROGRAM)
        } else {
            (SLED_PROGRAM, RETURN_PROGRAM)
        };
        let mut sleds = Vec::new();
        let mut returns = Vec::new();
        for probe in &plan.probes {
            let kind = SledKind::from_u8(probe.cookie.kind);
            match (kind, probe.cookie.return_probed()) {
                (Some(SledKind::Exit), true) => {}
                (Some(k), true) if k.is_entry() => {
                    sleds.push(*probe);
                    returns.push(Probe {
                        file_offset: probe.file_offset,
                        cookie: Cookie::new(probe.cookie.function_id, SledKind::Exit)
                            .with_flags(cookie_flags::RETURN_PROBED),
                    });
                }
                (Some(_), _) => sleds.push(*probe),
                (None, _) => {}
            }
        }
        sleds.sort_by_key(|p| SledKind::from_u8(p.cookie.kind).is_some_and(SledKind::is_entry));
        let before = self.take_attachment();
        let placed_returns = self.place(return_prog, &returns, &plan.binary, scope);
        let return_links = std::mem::replace(&mut self.attachment, before);
        let placed =
            placed_returns.and_then(|()| self.place(sled_prog, &sleds, &plan.binary, scope));
        if let Err(err) = placed {
            // What was placed stays in the set a failed attach is removed with.
            self.attachment.extend(return_links);
            return Err(err);
        }
        Ok((sleds.len() + returns.len(), return_links))
    }

    /// Observes the exits of `plan`'s return-probed functions by their exit sleds from now on:
    /// places those sleds' probes, then removes `returns` (the plan's return probes, from
    /// [`Tracer::attach_keeping_returns`]). Frames hooked before go on returning through the
    /// kernel's trampoline, unseen; their exit sleds report them.
    pub fn exit_sleds_instead(
        &mut self,
        plan: &AttachPlan,
        returns: Attachment,
        scope: Scope,
    ) -> Result<usize> {
        let exits: Vec<Probe> = plan
            .probes
            .iter()
            .filter(|p| p.cookie.kind == SledKind::Exit as u8 && p.cookie.return_probed())
            .map(|p| Probe {
                file_offset: p.file_offset,
                cookie: Cookie {
                    flags: p.cookie.flags & !cookie_flags::RETURN_PROBED,
                    ..p.cookie
                },
            })
            .collect();
        let program = if self.options.floor {
            FLOOR_PROGRAM
        } else {
            SLED_PROGRAM
        };
        self.place(program, &exits, &plan.binary, UProbeScope::from(scope))?;
        self.detach(returns);
        Ok(exits.len())
    }

    /// Places the catch probe (see `plan::catches`) at `file_offset` of `object`, for the
    /// threads that have traced state.
    pub fn attach_catch(&mut self, object: &Path, file_offset: u64, scope: Scope) -> Result<()> {
        if self.options.floor {
            return Ok(());
        }
        let scope = UProbeScope::from(scope);
        let probe = Probe {
            file_offset,
            cookie: Cookie {
                function_id: 0,
                kind: event_kind::CATCH,
                regs: [0; 3],
                flags: 0,
            },
        };
        self.place(SLED_PROGRAM, &[probe], object, scope)
    }

    /// What was loaded (fixed for the tracer's life).
    pub fn options(&self) -> &LoadOptions {
        &self.options
    }

    /// `--exits repair`: places the `unwind_stop` probe at `file_offset` of `object`, as a throw
    /// point (`event_kind::THROW`) or a catch point (`event_kind::CATCH`); returns its cookie.
    pub fn attach_unwind_stop(
        &mut self,
        object: &Path,
        file_offset: u64,
        kind: u8,
        scope: Scope,
    ) -> Result<u64> {
        let probe = Probe {
            file_offset,
            cookie: Cookie {
                function_id: 0,
                kind,
                regs: [0; 3],
                flags: 0,
            },
        };
        self.place(
            UNWIND_STOP_PROGRAM,
            &[probe],
            object,
            UProbeScope::from(scope),
        )?;
        Ok(probe.cookie.encode())
    }

    /// `--exits repair`: the table of stopped threads' [`RepairState`], for a repair keeper
    /// (each keeper gets its own handle on the one table), and its file descriptor.
    pub fn take_repairs(
        &mut self,
    ) -> Result<(BpfHashMap<MapData, u32, PodRepairState>, std::os::fd::RawFd)> {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        let map = self
            .ebpf
            .map(REPAIRS_MAP)
            .context("the eBPF object has no repairs map")?;
        let aya::maps::Map::HashMap(data) = map else {
            bail!("the repairs map is not a hash map");
        };
        let fd = data
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .context("duplicating the repairs map's descriptor")?;
        let data = MapData::from_fd(fd)?;
        let raw = data.fd().as_fd().as_raw_fd();
        Ok((BpfHashMap::try_from(aya::maps::Map::HashMap(data))?, raw))
    }

    /// `--exits repair`: the `repair_release` task iterator program (loaded at the first
    /// call), for the repair keeper to run over the threads of each process it lets go (see
    /// `kernel::task_iter` and `profiler_common::repair_state::RELEASE`).
    pub fn release_program_fd(&mut self) -> Result<std::os::fd::RawFd> {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        let program: &mut aya::programs::Iter = self
            .ebpf
            .program_mut(REPAIR_RELEASE_PROGRAM)
            .with_context(|| format!("the eBPF object has no {REPAIR_RELEASE_PROGRAM} program"))?
            .try_into()?;
        if program.fd().is_err() {
            let btf = aya::Btf::from_sys_fs().context("reading the kernel's BTF")?;
            program.load("task", &btf).map_err(|e| {
                anyhow!(
                    "the kernel refused the {REPAIR_RELEASE_PROGRAM} program: {}",
                    one_line(&e)
                )
            })?;
        }
        Ok(program.fd()?.as_fd().as_raw_fd())
    }

    /// `--exits repair`: the `unwind_stop` program as loaded for `uprobe_multi` links, for the
    /// repair keeper to place the throw and catch stops of the processes the traced one forks.
    pub fn unwind_stop_program_fd(&self) -> Result<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd as _;
        self.multi
            .iter()
            .find(|(name, _)| *name == UNWIND_STOP_PROGRAM)
            .map(|(_, program)| program.fd().as_raw_fd())
            .context("the unwind_stop program is not loaded for uprobe_multi links")
    }

    /// `--exits repair --attach`: places the `process_start` probe at `file_offset` of the
    /// traced executable (its entry point), for every process; [`Tracer::started_processes`]
    /// names them with `tag`.
    pub fn attach_process_start(
        &mut self,
        binary: &Path,
        file_offset: u64,
        tag: u32,
    ) -> Result<()> {
        let probe = Probe {
            file_offset,
            cookie: Cookie {
                function_id: tag,
                kind: 0,
                regs: [0; 3],
                flags: 0,
            },
        };
        self.place(
            PROCESS_START_PROGRAM,
            &[probe],
            binary,
            UProbeScope::AllProcesses,
        )
    }

    /// The processes that started running a traced executable since the last call, as
    /// `(tag, pid)` (see [`Tracer::attach_process_start`]), oldest first.
    pub fn started_processes(&mut self) -> Vec<(u32, u32)> {
        let Some(map) = self.ebpf.map_mut(STARTED_MAP) else {
            return Vec::new();
        };
        let Ok(mut queue) = aya::maps::Queue::<_, u64>::try_from(map) else {
            return Vec::new();
        };
        std::iter::from_fn(|| queue.pop(0).ok())
            .take(4096)
            .map(|v| ((v >> 32) as u32, v as u32))
            .collect()
    }

    /// Whether probes are placed with `uprobe_multi` links (else one perf event each).
    pub fn uses_uprobe_multi(&self) -> bool {
        !self.multi.is_empty()
    }

    fn place(
        &mut self,
        program: &'static str,
        probes: &[Probe],
        binary: &Path,
        scope: UProbeScope,
    ) -> Result<()> {
        if probes.is_empty() {
            return Ok(());
        }
        if let Some((_, multi)) = self.multi.iter().find(|(name, _)| *name == program) {
            let offsets: Vec<u64> = probes.iter().map(|p| p.file_offset).collect();
            let cookies: Vec<u64> = probes.iter().map(|p| p.cookie.encode()).collect();
            let pid = match scope {
                UProbeScope::OneProcess(pid) => Some(pid),
                _ => None,
            };
            let link = uprobe_multi::attach(
                multi.fd(),
                binary,
                &offsets,
                &cookies,
                pid,
                multi.is_return(),
            )
            .map_err(|e| {
                anyhow!(
                    "cannot place {} uprobes in {}: {e}",
                    probes.len(),
                    binary.display()
                )
            })?;
            self.attachment.multi.push(self.links.len());
            self.links.push(Some(link));
            return Ok(());
        }
        crate::kernel::rlimit::reserve_open_files(probes.len())?;
        let program_name = program;
        let program = uprobe(&mut self.ebpf, program)?;
        for probe in probes {
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(probe.file_offset),
                cookie: Some(probe.cookie.encode()),
            };
            let id = program.attach(point, binary, scope).map_err(|e| {
                anyhow!(
                    "cannot place a uprobe at offset {:#x} of {}: {}",
                    probe.file_offset,
                    binary.display(),
                    one_line(&e)
                )
            })?;
            self.attachment.perf.push((program_name, id));
        }
        Ok(())
    }

    /// Everything placed since the last call (by [`Tracer::attach`] and
    /// [`Tracer::attach_catch`]): what [`Tracer::detach`] removes.
    pub fn take_attachment(&mut self) -> Attachment {
        std::mem::take(&mut self.attachment)
    }

    /// The file descriptors of `attachment`'s links, for a process that must keep its probes
    /// in place after ours ends (`repair::keeper::Keeper`). None for perf-event links: aya
    /// keeps those to itself.
    pub fn link_fds(&self, attachment: &Attachment) -> Result<Vec<std::os::fd::RawFd>> {
        if !attachment.perf.is_empty() {
            bail!("the probes are perf-event links");
        }
        Ok(attachment
            .multi
            .iter()
            .filter_map(|&slot| self.links.get(slot)?.as_ref())
            .flat_map(|link| link.raw_fds())
            .collect())
    }

    /// Removes the probes of `attachment`, leaving every other probe in place.
    pub fn detach(&mut self, attachment: Attachment) {
        drop(self.detach_later(attachment));
    }

    /// [`Tracer::detach`], handing back the `uprobe_multi` links instead of closing them: the
    /// probes go when the links are dropped. The kernel takes its time removing uprobes (a
    /// grace period per link: about 50 ms each measured here), which an event loop must not
    /// wait for; drop them on another thread. Perf-event links are removed here.
    #[must_use = "the probes stay in place until the links are dropped"]
    pub fn detach_later(&mut self, attachment: Attachment) -> Vec<MultiLink> {
        let links = attachment
            .multi
            .into_iter()
            .filter_map(|slot| self.links.get_mut(slot)?.take())
            .collect();
        for (program, id) in attachment.perf {
            if let Ok(p) = uprobe(&mut self.ebpf, program) {
                let _ = p.detach(id);
            }
        }
        links
    }

    /// Starts (`true`) or stops recording: the programs ignore every hit while disarmed (see
    /// `profiler-ebpf`'s `ARMED`). Arm once every probe of the session's first objects is in
    /// place; disarm before detaching, which also goes one link at a time: otherwise the last
    /// moments would have entries whose exit probes are already gone.
    pub fn set_armed(&mut self, armed: bool) -> Result<()> {
        let map = self
            .ebpf
            .map_mut(ARMED_MAP)
            .context("the eBPF object has no ARMED map")?;
        let mut flag: aya::maps::Array<_, u32> = aya::maps::Array::try_from(map)?;
        flag.set(0, u32::from(armed), 0)
            .context("setting the probes' ARMED flag")?;
        Ok(())
    }

    /// What the kernel counted for each of the recording programs (by name, both loads of a
    /// program together) while run-time statistics were on (see [`RunTimeStats`]); programs
    /// that did not run are left out.
    pub fn program_costs(&self) -> Vec<ProgramCost> {
        use std::os::fd::AsFd as _;
        let mut costs: Vec<ProgramCost> = Vec::new();
        let mut add = |name: &str, fd: std::os::fd::BorrowedFd<'_>| {
            let Ok((runs, run_ns)) = crate::kernel::sys::program_run_stats(fd) else {
                return;
            };
            match costs.iter_mut().find(|c| c.program == name) {
                Some(c) => {
                    c.runs += runs;
                    c.run_ns += run_ns;
                }
                None => costs.push(ProgramCost {
                    program: name.to_owned(),
                    runs,
                    run_ns,
                }),
            }
        };
        for (name, program) in &self.multi {
            add(name, program.fd());
        }
        for name in [
            SLED_PROGRAM,
            RETURN_PROGRAM,
            FLOOR_PROGRAM,
            FLOOR_RETURN_PROGRAM,
            THREAD_EXIT_PROGRAM,
        ] {
            if let Some(fd) = self.ebpf.program(name).and_then(|p| p.fd().ok()) {
                add(name, fd.as_fd());
            }
        }
        costs.retain(|c| c.runs > 0);
        costs
    }

    /// `--follow-forks`: records process `pid` (and, from now on, the processes it forks).
    pub fn follow(&mut self, pid: u32) -> Result<()> {
        let mut followed: BpfHashMap<_, u32, u32> = self
            .ebpf
            .map_mut(FOLLOWED_MAP)
            .with_context(|| format!("the eBPF object has no {FOLLOWED_MAP} map"))?
            .try_into()?;
        followed
            .insert(pid, 1, 0)
            .with_context(|| format!("following process {pid}"))
    }

    /// Writes the anomalies the programs reported since the last call (`LoadOptions::kernel_log`)
    /// to standard error. Cheap when there are none (a look at the log's ring, no system call).
    pub fn show_kernel_log(&mut self) {
        if let Some(log) = &mut self.kernel_log {
            log.flush();
        }
    }

    /// Takes the per-CPU ring buffers out (the reader owns them from then on).
    pub fn take_rings(&mut self) -> Vec<RingBuf<MapData>> {
        std::mem::take(&mut self.rings)
    }

    /// Takes the loss counters and the per-thread books out (read after detaching).
    pub fn take_books(&mut self) -> Result<KernelBooks> {
        use std::os::fd::AsFd as _;
        let counters = self
            .ebpf
            .take_map(COUNTERS_MAP)
            .context("the eBPF object has no counters map")?;
        let exited = self
            .ebpf
            .take_map(EXITED_THREADS_MAP)
            .context("the eBPF object has no exited-threads map")?;
        // Not loaded for the floor, which records nothing.
        let live = self
            .ebpf
            .program(THREAD_BOOKS_PROGRAM)
            .and_then(|program| program.fd().ok())
            .map(|fd| fd.as_fd().try_clone_to_owned())
            .transpose()
            .context("duplicating the thread-books program's descriptor")?;
        Ok(KernelBooks::new(
            self.kernel_depth,
            PerCpuArray::try_from(counters)?,
            BpfHashMap::try_from(exited)?,
            live,
        ))
    }
}

fn uprobe<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe> {
    Ok(ebpf
        .program_mut(name)
        .with_context(|| format!("the eBPF object has no {name} program"))?
        .try_into()?)
}

/// aya-log's global in the eBPF object: the most verbose level the programs report at (0: none).
const KERNEL_LOG_LEVEL: &str = "AYA_LOG_LEVEL";

/// Where the programs' anomaly reports go: standard error, one line each.
pub struct KernelLog;

impl log::Log for KernelLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        errln!(
            "fdr-profiled: kernel: {}: {}",
            record.level().as_str().to_lowercase(),
            record.args()
        );
    }

    fn flush(&self) {}
}

/// The kernel's run-time statistics of every BPF program, on while this lives
/// (`BPF_ENABLE_STATS`): each run then also reads the clock twice, which costs every BPF
/// program of the system a little, so only the benchmarks ask for it (`--kernel-stats`).
pub struct RunTimeStats(#[allow(dead_code)] std::os::fd::OwnedFd);

impl RunTimeStats {
    /// Turns the statistics on.
    pub fn enable() -> Result<RunTimeStats> {
        aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .map(RunTimeStats)
            .map_err(|e| {
                anyhow!(
                    "cannot turn on the kernel's BPF run-time statistics: {}",
                    one_line(&e)
                )
            })
    }
}

/// [`RepairState`] as aya reads and writes it in a map.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct PodRepairState(pub RepairState);
// SAFETY: RepairState is #[repr(C)] plain data without padding; any bit pattern is valid.
unsafe impl aya::Pod for PodRepairState {}

/// Errors from aya and the verifier can span many lines; our errors are one line.
fn one_line(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn page_size() -> u32 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u32::try_from(size).unwrap_or(4096)
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; lifting it is harmless elsewhere.
fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: valid pointer to an initialised rlimit.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
}
