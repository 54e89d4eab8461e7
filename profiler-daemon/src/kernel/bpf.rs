//! Loading the eBPF object and creating its per-CPU ring buffers: the [`Tracer`], which holds
//! the programs and maps, and the sets of probes it places ([`Attachment`]). Placing and
//! removing probes is `attach`'s job; what the stack repair asks of the programs, `repair`'s.
mod attach;
mod calibrate;
mod calls;
pub mod repair;

pub use crate::kernel::books::{KernelBooks, PodThreadState};
use crate::kernel::uprobe_multi::{self, MultiLink, MultiProgram};
use anyhow::{anyhow, bail, Context as _, Result};
use aya::maps::{ArrayOfMaps, HashMap as BpfHashMap, Map, MapData, PerCpuArray, RingBuf};
use aya::programs::uprobe::UProbeScope;
use aya::programs::{RawTracePoint, UProbe};
use aya::{Ebpf, EbpfLoader};
pub use calls::{call_slots_for, CallCounts, MAX_CALL_SLOTS};
pub use fdr_session::schema::ProgramCost;
use profiler_common::{
    globals, RepairState, ARMED_MAP, CALLS_MAP, COUNTERS_MAP, EXITED_THREADS_MAP, FLOOR_PROGRAM,
    FLOOR_RETURN_PROGRAM, FOLLOW_FORK_PROGRAM, PROCESS_START_PROGRAM, RETURN_PROGRAM, RINGS_MAP,
    SLED_PROGRAM, THREAD_BOOKS_PROGRAM, THREAD_EXIT_PROGRAM, UNWIND_STOP_PROGRAM,
};
use std::num::NonZeroU32;

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

/// The CPUs the kernel may run programs on (one set of rings each).
pub fn possible_cpus() -> Result<usize> {
    aya::util::nr_cpus().map_err(|(what, e)| anyhow!("cannot count CPUs ({what}): {e}"))
}

/// What to load.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Bytes of ring buffer per CPU (a power of two, at least a page), shared by its
    /// `rings_per_cpu` rings.
    pub ring_bytes: u32,
    /// Rings per CPU, each written by the threads of one remainder of their id
    /// (`profiler_common::ring_index`): one per pipeline worker, so that each worker reads
    /// only its own threads' records. 1: one ring per CPU.
    pub rings_per_cpu: u32,
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
    /// Count the calls of budgeted functions in this many slots per CPU (see
    /// [`Tracer::call_counts`]; [`call_slots_for`]); 0: no counting.
    pub call_slots: u32,
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
    /// The calls of budgeted functions (`LoadOptions::call_slots`).
    calls: Option<CallCounts>,
    /// What a probe hit costs, once [`Tracer::measure_trap_costs`] measured it.
    trap_costs: Option<fdr_session::schema::TrapCosts>,
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

/// What `process_exec` and `process_start` tell `repair::hold`.
pub struct ExecReports {
    /// Each exec of a watched binary: `(tag << 32) | pid`.
    pub execs: RingBuf<MapData>,
    /// The processes that ran the binary's entry point since their exec.
    pub entered: aya::maps::HashMap<MapData, u32, u8>,
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
    /// Loads the programs and creates `options.rings_per_cpu` ring buffers per possible CPU,
    /// sharing `options.ring_bytes` (rings in CPU order: see [`Tracer::take_rings`]).
    pub fn load(options: LoadOptions) -> Result<Tracer> {
        let page = page_size();
        let per_cpu = options.ring_bytes;
        if !per_cpu.is_power_of_two() || per_cpu < page {
            bail!("--buffer-size must be a power of two of at least {page} bytes, not {per_cpu}");
        }
        let split = options.rings_per_cpu;
        if !(1..=64).contains(&split) {
            bail!("{split} rings per CPU: must be 1 to 64");
        }
        let ring_bytes =
            profiler_common::ring_bytes(per_cpu.into(), split.into(), page.into()) as u32;
        raise_memlock_limit();
        let cpus = u32::try_from(possible_cpus()?).context("too many CPUs")?;
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
        // Repair holds new processes from their exec (see `repair::hold`).
        let exec = options
            .repair
            .and_then(|_| crate::kernel::btf::exec_offsets())
            .unwrap_or_default();
        // The kernel's BTF, parsed once for these offsets, is not kept.
        crate::kernel::btf::forget();
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
            .override_global(globals::RI_FUNC_OFFSET, &offsets.ri_func, true)
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
            .override_global(globals::BPRM_FILE_OFFSET, &exec[0], true)
            .override_global(globals::FILE_INODE_OFFSET, &exec[1], true)
            .override_global(globals::INODE_INO_OFFSET, &exec[2], true)
            .override_global(globals::NARGS, &nargs, true)
            .override_global(globals::MAX_EVENT_BYTES, &options.max_event_bytes, true)
            .override_global(globals::WAKEUP_BYTES, &wakeup, true)
            .override_global(globals::RINGS_PER_CPU, &split, true)
            .override_global(globals::EXIT_CODE_OFFSET, &exit_code_offset, true)
            .override_global(globals::ABLATE, &options.ablate, true)
            .override_global(KERNEL_LOG_LEVEL, &kernel_log_level, true)
            .override_global(globals::CALL_SLOTS, &options.call_slots, true)
            .map_max_entries(RINGS_MAP, cpus * split)
            .map_max_entries(CALLS_MAP, (options.call_slots * cpus).max(1))
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
            for index in 0..cpus * split {
                let obj = aya_obj::Map::new_from_params(BPF_MAP_TYPE_RINGBUF, 0, 0, ring_bytes, 0);
                let data =
                    MapData::create(obj, &format!("fdr_ring{index}"), None).map_err(|e| {
                        anyhow!(
                            "cannot create a {ring_bytes}-byte ring buffer: {}",
                            one_line(&e)
                        )
                    })?;
                let ring = RingBuf::try_from(Map::RingBuf(data))?;
                outer.set(index, &ring, 0)?;
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
        let mut tracer = Tracer {
            kernel_depth: depth.utask != 0,
            kernel_log,
            attachment: Attachment::default(),
            links: Vec::new(),
            multi,
            ebpf,
            options,
            rings,
            calls: None,
            trap_costs: None,
        };
        if options.call_slots > 0 {
            tracer.calls = Some(CallCounts::map(&tracer.ebpf, options.call_slots, cpus)?);
        }
        Ok(tracer)
    }

    /// What a probe hit costs, where [`Tracer::measure_trap_costs`] measured it.
    pub fn trap_costs(&self) -> Option<fdr_session::schema::TrapCosts> {
        self.trap_costs
    }

    /// The calls of budgeted functions, where `LoadOptions::call_slots` asked for them.
    pub fn call_counts(&self) -> Option<&CallCounts> {
        self.calls.as_ref()
    }

    /// What was loaded (fixed for the tracer's life).
    pub fn options(&self) -> &LoadOptions {
        &self.options
    }

    /// Whether probes are placed with `uprobe_multi` links (else one perf event each).
    pub fn uses_uprobe_multi(&self) -> bool {
        !self.multi.is_empty()
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

    /// Writes the anomalies the programs reported since the last call (`LoadOptions::kernel_log`)
    /// to standard error. Cheap when there are none (a look at the log's ring, no system call).
    pub fn show_kernel_log(&mut self) {
        if let Some(log) = &mut self.kernel_log {
            log.flush();
        }
    }

    /// Takes the ring buffers out (the reader owns them from then on): `rings_per_cpu` for
    /// each CPU in turn, as `profiler_common::ring_index` numbers them.
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

/// The mean time (ns) of one run of the recording program at a sled, and at a return probe,
/// from the kernel's statistics `costs` ([`Tracer::program_costs`]); `None` for one that did
/// not run while they were on.
pub fn recording_program_ns(costs: &[ProgramCost]) -> (Option<f64>, Option<f64>) {
    let mean = |name: &str| {
        costs
            .iter()
            .find(|p| p.program == name && p.runs > 0)
            .map(ProgramCost::ns_per_run)
    };
    (
        mean(profiler_common::SLED_PROGRAM),
        mean(profiler_common::RETURN_PROGRAM),
    )
}

/// [`RepairState`] as aya reads and writes it in a map.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct PodRepairState(pub RepairState);
// SAFETY: RepairState is #[repr(C)] plain data without padding; any bit pattern is valid.
unsafe impl aya::Pod for PodRepairState {}

/// [`profiler_common::StopKey`] and [`profiler_common::StopTime`] as aya reads and writes them.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct PodStopKey(pub profiler_common::StopKey);
// SAFETY: #[repr(C)] plain data without padding; any bit pattern is valid.
unsafe impl aya::Pod for PodStopKey {}
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct PodStopTime(pub profiler_common::StopTime);
// SAFETY: #[repr(C)] plain data without padding; any bit pattern is valid.
unsafe impl aya::Pod for PodStopTime {}

/// Errors from aya and the verifier can span many lines; our errors are one line.
pub(super) fn one_line(err: &dyn std::error::Error) -> String {
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
