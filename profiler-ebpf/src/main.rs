//! The kernel half of fdr-profiled.
//!
//! - `sled` (uprobe) is attached to every probed XRay sled. The attach cookie says which
//!   function and which kind of sled fired (and, for event sleds, which registers hold the
//!   payload), so the program never maps addresses back to ids.
//! - `sled_return` (uretprobe) is attached at the entries of the functions whose exits a return
//!   probe observes (decided per function, see `plan::exits` in the daemon).
//! - `thread_exit` (raw tracepoint `sched_process_exit`) closes a thread's books.
//! - `unwind_stop` (uprobe) is attached, with `--exits repair`, at the unwinder's raise
//!   functions and at the catch functions: it stops the thread for the daemon to repair the
//!   stack (see `profiler_common::RepairState`).
//! - `repair_release` (task iterator) copies the pending return probes of a running process's
//!   threads when `--exits repair` lets it go.
//! - `process_exec` (raw tracepoint `sched_process_exec`) names each exec of a binary whose
//!   processes are repaired one by one (`--attach`, the service), for the daemon to hold the
//!   process before its first instruction; `process_start` (uprobe at the binary's entry point)
//!   names each process that runs it, and marks it as having got that far.
//! - `floor` / `floor_return` are empty: the benchmark's measure of the kernel's own cost.
//!
//! Each event goes to the ring buffer of the CPU it happened on (no cross-CPU contention) and
//! carries a per-thread sequence number from the per-thread state in `THREADS`, so the daemon
//! can put a thread's events back in program order after it migrated, and knows exactly which
//! of its events were lost when a buffer was full. Writes do not wake the reader (a wakeup per
//! event costs several times the probe, platform.md) unless the buffer is filling up.
#![no_std]
#![no_main]

mod regs;
mod task_storage;

use aya_ebpf::{
    bindings::{
        BPF_F_MMAPABLE, BPF_F_NO_PREALLOC, BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP,
        BPF_RB_NO_WAKEUP,
    },
    btf_maps::{ArrayOfMaps, RingBuf},
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_ringbuf_output,
        bpf_ringbuf_query, bpf_ringbuf_reserve, bpf_ringbuf_submit, generated::bpf_probe_read_user,
        generated::bpf_send_signal_thread, generated::bpf_seq_write,
    },
    macros::{btf_map, map, raw_tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, Queue, RingBuf as LegacyRingBuf},
    programs::{ProbeContext, RawTracePointContext, RetProbeContext},
    EbpfContext,
};
use aya_log_ebpf::{error, warn};
use core::ffi::c_void;
use profiler_common::{
    ablate, counter, event_flags, event_kind, repair_state, ArgsEvent, Cookie, EventHeader,
    EventPayload, RepairState, SledKind, StopKey, StopTime, ThreadState, MAX_ARGS, MAX_EVENT_BYTES,
    MAX_REPAIR_FRAMES, MAX_RETURN_PROBE_DEPTH, STOP_SIGNALS, STUCK_BEYOND_RETURN_LIMIT,
};
use task_storage::TaskStorage;

/// One ring buffer per CPU, created and inserted by the daemon (`--buffer-size` each). The
/// template here only fixes the inner map's type; its size does not constrain the real ones.
#[btf_map]
static RINGS: ArrayOfMaps<RingBuf<u8, 4096>, 4096> = ArrayOfMaps::new();

/// Per-thread sequence numbers, loss and return-probe bookkeeping, in the thread's own task
/// storage (no lookup by id on the event path). Created at a thread's first event, removed
/// when it exits (`thread_exit`).
#[btf_map(name = "THREADS")]
static THREADS: TaskStorage<ThreadState> = TaskStorage::new();

/// The state of threads whose exit record found the buffer full, by thread id, for the daemon
/// to collect (their trailing losses).
#[map(name = "EXITED_THREADS")]
static EXITED_THREADS: HashMap<u32, ThreadState> =
    HashMap::with_max_entries(1 << 14, BPF_F_NO_PREALLOC);

/// 1 once every probe of the session's first objects is in place. Probes are placed one link
/// at a time, exit probes first; before the daemon arms them, nothing is recorded, so no trace
/// starts from a half-attached state: the only exits without an entry are those of frames open
/// at the moment of arming.
#[map(name = "ARMED")]
static ARMED: Array<u32> = Array::with_max_entries(1, 0);

fn armed() -> bool {
    ARMED.get(0).is_some_and(|v| *v != 0)
}

/// Per-CPU counters of losses that belong to no thread (see `profiler_common::counter`).
#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Where a custom event's payload is assembled before it is copied into a ring buffer.
const SCRATCH_BYTES: usize =
    EventHeader::SIZE + core::mem::size_of::<EventPayload>() + MAX_EVENT_BYTES as usize;
#[map(name = "SCRATCH")]
static SCRATCH: PerCpuArray<[u64; SCRATCH_BYTES / 8]> = PerCpuArray::with_max_entries(1, 0);

// Settings the daemon writes into the object before loading it.
#[unsafe(no_mangle)]
static CFG_NARGS: u32 = 1;
#[unsafe(no_mangle)]
static CFG_MAX_EVENT_BYTES: u32 = 4096;
#[unsafe(no_mangle)]
static CFG_WAKEUP_BYTES: u64 = 4 << 20;
/// Rings per CPU, by thread id (see [`profiler_common::ring_index`]).
#[unsafe(no_mangle)]
static CFG_RINGS_PER_CPU: u32 = 1;
/// Offset of `exit_code` in `struct task_struct`, found by the daemon in the kernel's BTF; 0
/// when unknown.
#[unsafe(no_mangle)]
static CFG_EXIT_CODE_OFFSET: u32 = 0;
/// Where the thread's return-probe trampoline is (`task_struct.mm`,
/// `mm_struct.uprobes_state.xol_area`, `xol_area.vaddr`, from the kernel's BTF); 0 when
/// unknown. See [`chained`].
#[unsafe(no_mangle)]
static CFG_TASK_MM_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFG_MM_XOL_AREA_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFG_XOL_VADDR_OFFSET: u32 = 0;

/// Where the kernel counts a thread's pending return probes (`task_struct.utask`,
/// `uprobe_task.depth`, `uprobe_task.return_instances`, `return_instance.stack`, from its BTF):
/// at an entry the programs read the kernel's own count, not only theirs, which misses the
/// frames the kernel hooked before recording began. 0: unknown (their own count is used).
#[unsafe(no_mangle)]
static CFG_DEPTH_UTASK_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFG_DEPTH_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFG_DEPTH_LIST_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFG_DEPTH_RI_STACK_OFFSET: u32 = 0;

/// `--exits repair`: offsets in the kernel's structures (from its BTF), and the stop signal.
/// `CFG_UTASK_OFFSET` 0: repair is off.
#[unsafe(no_mangle)]
static CFG_UTASK_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFG_RETURN_INSTANCES_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFG_RI_STACK_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFG_RI_ORIG_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFG_RI_NEXT_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFG_RI_FUNC_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFG_BLOCKED_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFG_SIGHAND_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFG_SIGHAND_ACTION_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFG_K_SIGACTION_SIZE: u32 = 0;
/// `task_struct.pid`, for `repair_release` and `follow_fork`.
#[unsafe(no_mangle)]
static CFG_TASK_PID_OFFSET: u32 = 0;
/// 1 under `--follow-forks`: the probes fire in every process running the traced objects, and
/// only the threads of the processes in `FOLLOWED` are recorded.
#[unsafe(no_mangle)]
static CFG_FOLLOW_FORKS: u32 = 0;

/// Slots per CPU of `CALLS` (see `profiler_common::CALLS_MAP`); 0: calls are not counted.
#[unsafe(no_mangle)]
static CFG_CALL_SLOTS: u32 = 0;

/// Each budgeted function's calls, per CPU (row `cpu`, column the cookie's call slot): what
/// the daemon's overhead budget reads, in place, every second. Plain (not per-CPU) so that
/// the daemon can map it; each CPU writes only its own row.
#[map(name = "CALLS")]
static CALLS: Array<u64> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Counts a call of the function at an entry sled whose cookie has a call slot: every trap
/// costs the program, recorded or not, so this comes before any other decision.
#[inline(always)]
fn count_call(cookie: &Cookie, cpu: u32) {
    let slots = setting(&CFG_CALL_SLOTS);
    let slot = u32::from(cookie.call_slot());
    if slots == 0 || slot == 0 || slot >= slots {
        return;
    }
    if cookie.kind != SledKind::Entry as u8 && cookie.kind != SledKind::LogArgsEntry as u8 {
        return;
    }
    if let Some(p) = CALLS.get_ptr_mut(cpu.wrapping_mul(slots).wrapping_add(slot)) {
        // SAFETY: a valid map value; only this CPU's programs write its row (a program
        // preempted between the load and the store by another on the same CPU loses one
        // count: rare, and an estimate's error, not a trace's).
        unsafe { *p += 1 };
    }
}

/// `--follow-forks`: the processes (tgids) recorded: the traced one (put there by the daemon)
/// and those forked by a recorded one (`follow_fork`). A process whose entry is missing is not
/// recorded: its threads get no state, and nothing is counted for them.
#[map(name = "FOLLOWED")]
static FOLLOWED: HashMap<u32, u32> = HashMap::with_max_entries(1 << 16, BPF_F_NO_PREALLOC);

/// `--exits repair --attach`: the processes that started running a traced binary, pushed by
/// `process_start` as `(binary << 32) | pid` (the binary: the probe's cookie's function id),
/// for the daemon to trace each before it probes it. A push to a full queue is counted
/// (`counter::PROCESSES_UNSEEN`).
#[map(name = "STARTED")]
static STARTED: Queue<u64> = Queue::with_max_entries(1024, 0);

/// `--exits repair`: each stopped thread's [`RepairState`], by thread id (written here at a
/// throw, read and updated by the daemon, removed by the daemon after the catch).
#[map(name = "REPAIRS")]
static REPAIRS: HashMap<u32, RepairState> = HashMap::with_max_entries(1 << 14, 0);

/// `--exits repair`: the time threads spent stopped for their repair, by process and hooked
/// function; written by the repair keepers only (declared here for the daemon to create it).
#[map(name = "STOP_TIMES")]
static STOP_TIMES: HashMap<StopKey, StopTime> = HashMap::with_max_entries(1 << 16, 0);

/// `--exits repair`: the functions whose live frames the repair keepers leave unhooked at a
/// catch; written by the daemon only (declared here for it to create the map).
#[map(name = "UNHOOK")]
static UNHOOK: HashMap<StopKey, u8> = HashMap::with_max_entries(1 << 16, 0);

/// Where a [`RepairState`] is assembled (it is larger than a program's stack).
#[map(name = "REPAIR_SCRATCH")]
static REPAIR_SCRATCH: PerCpuArray<RepairState> = PerCpuArray::with_max_entries(1, 0);

/// Benchmark only (`profiler_common::ablate`): parts of the work to skip, to measure what
/// each costs. Zero in every real session.
#[unsafe(no_mangle)]
static CFG_ABLATE: u32 = 0;

/// Stand-in per-CPU batch for the `ablate::WRITE_PER_CPU` measurement: a count, then 64
/// slots of 128 bytes.
#[map(name = "ABLATE_BATCH")]
static BATCH: PerCpuArray<[u64; 1 + 64 * 16]> = PerCpuArray::with_max_entries(1, 0);

/// Stand-in thread state for the `ablate::STATE` measurement.
#[map(name = "ABLATE_STATE")]
static ABLATE_STATE: PerCpuArray<ThreadState> = PerCpuArray::with_max_entries(1, 0);

fn ablated(part: u32) -> bool {
    setting(&CFG_ABLATE) & part != 0
}

fn setting<T: Copy>(v: &T) -> T {
    // SAFETY: a plain read of a global; volatile so the compiler does not fold the default in.
    unsafe { core::ptr::read_volatile(v) }
}

fn count(index: u32, n: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot: no other writer can race with this update.
        unsafe { *slot += n };
    }
}

/// The thread's state; created (zeroed) at its first event when `create`. `None` if the thread
/// has none and none is to be created, or it could not be created.
#[inline(always)]
fn thread_state(create: bool) -> Option<&'static mut ThreadState> {
    if ablated(ablate::STATE) {
        // SAFETY: per-CPU slot, valid for the program's run.
        return ABLATE_STATE.get_ptr_mut(0).map(|s| unsafe { &mut *s });
    }
    let s = THREADS.current(create)?;
    if s.tid == 0 {
        // Its first event: the ids are kept in the state, which saves a helper call on every
        // later one.
        let pid_tgid = bpf_get_current_pid_tgid();
        s.tid = pid_tgid as u32;
        s.pid = (pid_tgid >> 32) as u32;
    }
    Some(s)
}

/// The ring buffer of this CPU for thread `tid`, as the map pointer the ring-buffer helpers
/// take.
#[inline(always)]
fn ring(cpu: u32, tid: u32) -> Option<*mut c_void> {
    let index = profiler_common::ring_index(cpu, tid, setting(&CFG_RINGS_PER_CPU));
    RINGS.get(index).map(|r| r as *const _ as *mut c_void)
}

/// Submit flags: no wakeup, unless (checked every 64th event of a thread, the query being
/// a helper call) the buffer is more than the configured amount full.
fn submit_flags(ring: *mut c_void, seq: u64) -> u64 {
    if seq & 63 == 0 {
        // SAFETY: `ring` is a ring-buffer map pointer from RINGS.
        let avail = unsafe { bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA as u64) };
        if avail > setting(&CFG_WAKEUP_BYTES) {
            return BPF_RB_FORCE_WAKEUP as u64;
        }
    }
    BPF_RB_NO_WAKEUP as u64
}

/// Return-probed functions: forgets the pending return probes of frames that are gone, as the kernel
/// does before it hijacks a new frame (`AT_ENTRY`: slots at or below `slot` are dead, except
/// the top one when a tail call chains the new frame to it) or when a return probe fires
/// (slots below the returning frame's are dead). The tail bits of forgotten positions need no
/// clearing: a position's bit is cleared when a frame takes it.
fn drop_dead_returns<const AT_ENTRY: bool>(state: &mut ThreadState, slot: u64) {
    let mut n = state.returns_pending;
    for _ in 0..MAX_RETURN_PROBE_DEPTH {
        if n == 0 {
            break;
        }
        // Read back through memory: otherwise LLVM turns the masked index into a pointer
        // walked downwards, which the verifier cannot bound.
        let top = (n - 1) & 63;
        // SAFETY: a plain read of a local.
        let top = unsafe { core::ptr::read_volatile(&top) } & 63;
        let top_slot = state.return_slots[top as usize];
        if top_slot > slot {
            break;
        }
        if top_slot == slot
            && (!AT_ENTRY || (state.tail_exited[0] & (1u64 << top) != 0 && chained(slot)))
        {
            break;
        }
        n -= 1;
    }
    state.returns_pending = n;
}

/// At an entry whose slot is the top pending frame's, which made a tail call: whether this is
/// that tail call's callee (the slot still holds the trampoline the kernel put there for the
/// tail caller), as the kernel decides it, or a new call made after an exception or `longjmp`
/// left both (the slot holds a fresh return address; the old frame is dead). Without the
/// offsets, a tail call is assumed.
fn chained(slot: u64) -> bool {
    match trampoline() {
        Some(trampoline) => returns_to(slot, trampoline) != Some(false),
        None => true,
    }
}

/// The address of this thread's return-probe trampoline (`task->mm->uprobes_state.xol_area
/// ->vaddr`), where the kernel's offsets are known and the area exists.
#[inline(always)]
fn trampoline() -> Option<u64> {
    let (mm_at, xol_at, vaddr_at) = (
        setting(&CFG_TASK_MM_OFFSET),
        setting(&CFG_MM_XOL_AREA_OFFSET),
        setting(&CFG_XOL_VADDR_OFFSET),
    );
    if mm_at == 0 || mm_at >= 65536 || xol_at >= 65536 || vaddr_at >= 4096 {
        return None;
    }
    // SAFETY: plain helper calls; every read is checked by the helper.
    unsafe {
        let task = bpf_get_current_task() as *const u8;
        let mm = bpf_probe_read_kernel(task.add(mm_at as usize) as *const u64).ok()?;
        let xol = bpf_probe_read_kernel((mm + u64::from(xol_at)) as *const u64).ok()?;
        if xol == 0 {
            return None;
        }
        bpf_probe_read_kernel((xol + u64::from(vaddr_at)) as *const u64).ok()
    }
}

/// Whether the return address at `slot` of the thread's stack is `address`; `None` where it
/// cannot be read.
#[inline(always)]
fn returns_to(slot: u64, address: u64) -> Option<bool> {
    let mut word = 0u64;
    // SAFETY: the helper checks the read.
    if unsafe { bpf_probe_read_user((&raw mut word).cast(), 8, slot as *const c_void) } != 0 {
        return None;
    }
    Some(word == address)
}

/// The kernel's own account of the current thread's pending return probes, as an entry at
/// `slot` finds it (before the kernel hooks this one): their number, and whether the newest is
/// gone (its slot at or below `slot`: an exception or `longjmp` left it, the kernel's own
/// test). `None` when its layout is unknown or the thread has none yet.
#[inline(always)]
fn kernel_returns(slot: u64) -> Option<(u32, bool)> {
    let utask_at = setting(&CFG_DEPTH_UTASK_OFFSET);
    if utask_at == 0 || utask_at >= 65536 {
        return None;
    }
    // SAFETY: kernel reads are checked by the helper.
    unsafe {
        let task = bpf_get_current_task() as *const u8;
        let utask = bpf_probe_read_kernel(task.add(utask_at as usize) as *const u64).ok()?;
        if utask == 0 {
            return None;
        }
        let depth_at = u64::from(setting(&CFG_DEPTH_OFFSET) & 0xffff);
        let depth = bpf_probe_read_kernel((utask + depth_at) as *const u32).ok()?;
        if depth < MAX_RETURN_PROBE_DEPTH {
            return Some((depth, false));
        }
        let list_at = u64::from(setting(&CFG_DEPTH_LIST_OFFSET) & 0xffff);
        let top = bpf_probe_read_kernel((utask + list_at) as *const u64).ok()?;
        if top == 0 {
            return Some((depth, false));
        }
        let stack_at = u64::from(setting(&CFG_DEPTH_RI_STACK_OFFSET) & 0xffff);
        let stack = bpf_probe_read_kernel((top + stack_at) as *const u64).ok()?;
        Some((depth, stack <= slot))
    }
}

/// What one sled hit does to the thread's pending return probes (only for the sleds of
/// functions whose exits a return probe observes: the kernel counts only their frames);
/// returns the header's flags. `slot` is the frame's return-address slot.
fn account_call(state: &mut ThreadState, cookie: &Cookie, slot: u64) -> u8 {
    let kind = cookie.kind;
    if !cookie.return_probed() {
        // An exit sled of a frame that also has a pending return probe (exit sleds placed
        // instead of return probes, while the return probes still go): the sled reports the
        // exit, and the return probe must not report it again.
        if kind == SledKind::Exit as u8 && state.returns_pending > 0 {
            let top = (state.returns_pending - 1) & 63;
            // SAFETY: a plain read of a local (see `drop_dead_returns`).
            let top = unsafe { core::ptr::read_volatile(&top) } & 63;
            if state.return_slots[top as usize] == slot {
                state.tail_exited[0] |= 1u64 << top;
            }
        }
        return 0;
    }
    if kind == SledKind::Entry as u8 || kind == SledKind::LogArgsEntry as u8 {
        state.cleanup_pending = 0;
        // The kernel checks its depth limit before it drops dead instances. Its own count
        // when it can be read (it knows the frames hooked before recording began), else ours.
        let kernel = kernel_returns(slot);
        let at_limit = match kernel {
            Some((depth, _)) => depth >= MAX_RETURN_PROBE_DEPTH,
            None => state.returns_pending >= MAX_RETURN_PROBE_DEPTH,
        };
        if at_limit {
            state.beyond_return_depth += 1;
            // Stuck, or only deep? In a deep recursion the innermost pending frame is live,
            // above the new one; after an exception or longjmp left it, the new frame's slot is
            // at or above its slot (the kernel's own test of a dead instance).
            let top = state.returns_pending.wrapping_sub(1) & 63;
            // SAFETY: a plain read of a local (see `drop_dead_returns`).
            let top = unsafe { core::ptr::read_volatile(&top) } & 63;
            let dead = match kernel {
                Some((_, dead)) => dead,
                None => state.return_slots[top as usize] <= slot,
            };
            if dead {
                state.stuck_calls += 1;
                if state.stuck_calls == STUCK_BEYOND_RETURN_LIMIT + 1 {
                    count(counter::BEYOND_RETURN_LIMIT, 1);
                }
            }
            return event_flags::NO_RETURN;
        }
        drop_dead_returns::<true>(state, slot);
        if state.returns_pending >= MAX_RETURN_PROBE_DEPTH {
            // The kernel hooks this frame (its count is below the limit) while ours is full:
            // ours kept frames the kernel dropped. Ours is made the kernel's size again.
            state.returns_pending = MAX_RETURN_PROBE_DEPTH - 1;
        }
        let at = state.returns_pending & 63;
        // SAFETY: a plain read of a local (see `drop_dead_returns`).
        let at = unsafe { core::ptr::read_volatile(&at) } & 63;
        state.tail_exited[0] &= !(1u64 << at);
        state.return_slots[at as usize] = slot;
        state.returns_pending += 1;
    } else if kind == SledKind::Tail as u8 {
        // The tail-calling frame is the top pending one; its return probe fires after the
        // tail callee's and must not report a second exit.
        if state.beyond_return_depth > 0 {
            state.beyond_return_depth -= 1;
        } else if state.returns_pending > 0 {
            state.tail_exited[0] |= 1u64 << ((state.returns_pending - 1) & 63);
        }
        // Its exit is counted with the return probes' (the summary's methods).
        return event_flags::BY_RETURN_PROBE;
    }
    0
}

/// Books a written or lost event in the thread's state.
fn settle(state: &mut ThreadState, written: bool) {
    state.seq += 1;
    if written {
        state.gap_lost = 0;
    } else {
        state.lost += 1;
        state.gap_lost += 1;
    }
}

/// The stack pointer at the probe.
fn stack_pointer(ctx: *mut c_void) -> u64 {
    regs::sp(ctx)
}

fn header(state: &ThreadState, cookie: &Cookie, cpu: u32, sp: u64) -> EventHeader {
    EventHeader {
        // SAFETY: plain helper call.
        ts_ns: if ablated(ablate::CLOCK) {
            0
        } else {
            unsafe { bpf_ktime_get_ns() }
        },
        seq: state.seq,
        pid: state.pid,
        tid: state.tid,
        function_id: cookie.function_id,
        kind: cookie.kind,
        flags: 0,
        cpu: cpu as u16,
        gap_lost: state.gap_lost,
        payload_len: 0,
        sp,
    }
}

/// Writes a fixed-size record `T` (whose first field is the header) to the ring.
fn write<T: Copy>(ring: *mut c_void, rec: &T, seq: u64) -> bool {
    if ablated(ablate::WRITE) {
        return true;
    }
    if ablated(ablate::WRITE_PER_CPU) {
        let Some(slot) = BATCH.get_ptr_mut(0) else {
            return false;
        };
        // SAFETY: per-CPU slot of 8 KiB; the index keeps a T (at most 128 bytes) inside it.
        unsafe {
            let b = &mut *slot;
            let at = (b[0] & 63) as usize;
            b[0] += 1;
            core::ptr::write_unaligned((b.as_mut_ptr().add(1 + at * 16)) as *mut T, *rec);
        }
        return true;
    }
    let flags = submit_flags(ring, seq);
    if ablated(ablate::WRITE_BY_COPY) {
        // SAFETY: `rec` is a T on the stack; the helper copies size_of::<T>() bytes of it.
        return unsafe {
            bpf_ringbuf_output(
                ring,
                rec as *const T as *mut c_void,
                core::mem::size_of::<T>() as u64,
                flags,
            )
        } == 0;
    }
    // SAFETY: reserve returns null or room for a T; T is plain data at most 8-byte aligned.
    unsafe {
        let p = bpf_ringbuf_reserve(ring, core::mem::size_of::<T>() as u64, 0) as *mut T;
        if p.is_null() {
            return false;
        }
        core::ptr::write(p, *rec);
        bpf_ringbuf_submit(p as *mut c_void, flags);
    }
    true
}

/// What every probe starts with: the attach cookie, the CPU, the thread, and the thread's
/// state (`None`, counted, when it could not be created). A catch does not start a thread's
/// books: it only matters to threads that ran traced code.
// Inlined: the BTF of a function of its own would describe its `Option` in a layout the
// kernel refuses (a union member at a non-zero offset), and the task iterator makes the
// object's BTF a must.
#[inline(always)]
fn probe_hit(ctx: *mut c_void) -> Option<(Cookie, u32, &'static mut ThreadState)> {
    // SAFETY: plain helper calls on the kernel's context.
    let (cookie, cpu) = unsafe {
        (
            Cookie::decode(bpf_get_attach_cookie(ctx)),
            bpf_get_smp_processor_id(),
        )
    };
    count_call(&cookie, cpu);
    let create = cookie.kind != event_kind::CATCH;
    // `--follow-forks`: a thread with no state yet gets one only if its process is followed;
    // the others run code of a traced object without being traced (the probes cannot be
    // limited to a set of processes that grows by itself).
    let create =
        create && (setting(&CFG_FOLLOW_FORKS) == 0 || thread_state(false).is_some() || followed());
    let Some(state) = thread_state(create) else {
        if create {
            count(counter::NO_THREAD_STATE, 1);
            // Rare (the kernel could not allocate the state, or another BPF program held the
            // storage lock on this CPU): never on the path of an event that is recorded.
            warn!(
                &(),
                "thread {} has no per-thread state: its event is lost (counted unattributed)",
                bpf_get_current_pid_tgid() as u32
            );
        }
        return None;
    };
    Some((cookie, cpu, state))
}

#[uprobe]
pub fn sled(ctx: ProbeContext) -> u32 {
    if !armed() {
        return 0;
    }
    let Some((cookie, cpu, state)) = probe_hit(ctx.as_ptr()) else {
        return 0;
    };
    let sp = stack_pointer(ctx.as_ptr());
    let flags = account_call(state, &cookie, sp);
    let mut h = header(state, &cookie, cpu, sp);
    h.flags = flags;
    let written = match ring(cpu, state.tid) {
        None => false,
        Some(ring) => {
            if cookie.kind == SledKind::CustomEvent as u8
                || cookie.kind == SledKind::TypedEvent as u8
            {
                write_event(&ctx, ring, h, &cookie)
            } else if cookie.kind == SledKind::LogArgsEntry as u8 {
                let n = setting(&CFG_NARGS).min(MAX_ARGS as u32);
                h.payload_len = n * 8;
                let rec = ArgsEvent {
                    header: h,
                    args: regs::args(&ctx),
                };
                write(ring, &rec, h.seq)
            } else {
                write(ring, &h, h.seq)
            }
        }
    };
    settle(state, written);
    0
}

/// A custom or typed event: type, pointer and size are in the registers the cookie names;
/// the payload is copied (up to the configured maximum) from the program's memory.
fn write_event(ctx: &ProbeContext, ring: *mut c_void, mut h: EventHeader, cookie: &Cookie) -> bool {
    let Some(buf) = SCRATCH.get_ptr_mut(0) else {
        return false;
    };
    let typed = cookie.kind == SledKind::TypedEvent as u8;
    let (event_type, ptr, size) = if typed {
        (
            regs::read(ctx, cookie.regs[0]),
            regs::read(ctx, cookie.regs[1]),
            regs::read(ctx, cookie.regs[2]),
        )
    } else {
        (
            0,
            regs::read(ctx, cookie.regs[0]),
            regs::read(ctx, cookie.regs[1]),
        )
    };
    let max = setting(&CFG_MAX_EVENT_BYTES) as u64;
    let mut n = if size < max { size } else { max };
    if n > MAX_EVENT_BYTES as u64 {
        n = MAX_EVENT_BYTES as u64;
    }
    const PAYLOAD_AT: usize = EventHeader::SIZE + core::mem::size_of::<EventPayload>();
    // SAFETY: `buf` is this CPU's scratch slot, SCRATCH_BYTES long; n <= MAX_EVENT_BYTES keeps
    // the copy inside it.
    unsafe {
        let base = buf as *mut u8;
        if n > 0
            && bpf_probe_read_user(
                base.add(PAYLOAD_AT) as *mut c_void,
                n as u32,
                ptr as *const c_void,
            ) != 0
        {
            h.flags |= event_flags::UNREADABLE;
            warn!(
                &(),
                "thread {}: the payload of a custom event ({} bytes at {:x}) could not be read: written without it",
                h.tid,
                n,
                ptr
            );
            n = 0;
        }
        h.payload_len = (core::mem::size_of::<EventPayload>() as u64 + n) as u32;
        core::ptr::write(base as *mut EventHeader, h);
        core::ptr::write(
            base.add(EventHeader::SIZE) as *mut EventPayload,
            EventPayload { size, event_type },
        );
        let len = (PAYLOAD_AT as u64 + n) & 0xffff;
        if len > SCRATCH_BYTES as u64 {
            error!(
                &(),
                "thread {}: a custom event record of {} bytes is larger than the {} the programs allow: lost (counted)",
                h.tid,
                len,
                SCRATCH_BYTES
            );
            return false;
        }
        bpf_ringbuf_output(ring, base as *mut c_void, len, submit_flags(ring, h.seq)) == 0
    }
}

#[uretprobe]
pub fn sled_return(ctx: RetProbeContext) -> u32 {
    if !armed() {
        return 0;
    }
    let Some((cookie, cpu, state)) = probe_hit(ctx.as_ptr()) else {
        return 0;
    };
    // The return probe fires after the function returned (on x86-64, `ret` popped its slot).
    let slot = regs::return_slot(ctx.as_ptr());
    if state.cleanup_pending != 0 {
        state.cleanup_pending = 0;
        if cleanup_return(slot) {
            // The repair keeper made the thread pass through the trampoline to drop the
            // kernel's instances of frames an exception left (`repair_state::CLEANUP`): the
            // kernel dropped those below `slot` and this one. No frame returned.
            drop_dead_returns::<false>(state, slot);
            if state.returns_pending > 0 {
                let top = (state.returns_pending - 1) & 63;
                // SAFETY: a plain read of a local (see `drop_dead_returns`).
                let top = unsafe { core::ptr::read_volatile(&top) } & 63;
                if state.return_slots[top as usize] == slot {
                    state.returns_pending -= 1;
                }
            }
            return 0;
        }
    }
    // Frames entered beyond the kernel's return-probe depth have no return probe: any return
    // probe firing means they are gone.
    state.beyond_return_depth = 0;
    state.stuck_calls = 0;
    // The kernel skipped the instances of frames below this one (a non-local exit left them).
    drop_dead_returns::<false>(state, slot);
    // The frames pending below this one are gone; the top one left must be this frame. If it
    // is not (none left, or the top one is an outer frame still running), this call's entry
    // made no event: entered before recording began, or while its function's probes were
    // being placed or removed one link at a time (a budget's drop or re-admission), when the
    // return probe is there without the entry's. Its return is no event of the trace, and
    // takes no other frame's place.
    let top = state.returns_pending.wrapping_sub(1) & 63;
    // SAFETY: a plain read of a local (see `drop_dead_returns`).
    let top = unsafe { core::ptr::read_volatile(&top) } & 63;
    if state.returns_pending == 0 || state.return_slots[top as usize] != slot {
        count(counter::RETURNS_BEFORE_TRACING, 1);
        return 0;
    }
    state.returns_pending -= 1;
    let bit = 1u64 << (state.returns_pending & 63);
    if state.tail_exited[0] & bit != 0 {
        state.tail_exited[0] &= !bit;
        return 0;
    }
    let cookie = Cookie {
        kind: SledKind::Exit as u8,
        ..cookie
    };
    let mut h = header(state, &cookie, cpu, slot);
    h.flags = event_flags::BY_RETURN_PROBE;
    let written = ring(cpu, state.tid).is_some_and(|ring| write(ring, &h, h.seq));
    settle(state, written);
    0
}

/// `--follow-forks`: whether the current thread's process is one recorded.
#[inline(always)]
fn followed() -> bool {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: a plain lookup; the value is not kept.
    unsafe { FOLLOWED.get(&tgid).is_some() }
}

/// `CLONE_THREAD` (uapi): the new task is a thread of its creator's process.
const CLONE_THREAD: u64 = 0x0001_0000;

/// `--follow-forks`: a new task (`task_newtask(task, clone_flags)`, run by its creator before
/// the new task first runs): a new process forked by a followed one is followed too, from its
/// first instruction. A thread needs nothing (its process is already followed or not).
#[raw_tracepoint(tracepoint = "task_newtask")]
pub fn follow_fork(ctx: RawTracePointContext) -> i32 {
    if setting(&CFG_FOLLOW_FORKS) == 0 {
        return 0;
    }
    // The tracepoint's arguments are (struct task_struct *task, unsigned long clone_flags).
    let (task, flags) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1));
    if flags & CLONE_THREAD != 0 || !followed() {
        return 0;
    }
    let pid_at = setting(&CFG_TASK_PID_OFFSET);
    if pid_at == 0 || pid_at >= 65536 {
        return 0;
    }
    // SAFETY: plain helper call; the read is checked by the helper.
    let Ok(child) = (unsafe {
        bpf_probe_read_kernel((task as *const u8).wrapping_add(pid_at as usize) as *const u32)
    }) else {
        return 0;
    };
    if FOLLOWED.insert(&child, &1, 0).is_err() {
        warn!(
            &ctx,
            "process {} not followed: the map of followed processes is full", child
        );
    }
    0
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn thread_exit(_ctx: RawTracePointContext) -> i32 {
    if setting(&CFG_FOLLOW_FORKS) != 0 {
        let pid_tgid = bpf_get_current_pid_tgid();
        if pid_tgid as u32 == (pid_tgid >> 32) as u32 {
            // A followed process's main thread ends: its id may be given to an unrelated
            // process next.
            let _ = FOLLOWED.remove(&((pid_tgid >> 32) as u32));
        }
    }
    let Some(state) = THREADS.current(false) else {
        return 0;
    };
    // SAFETY: plain helper call.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let cookie = Cookie {
        function_id: 0,
        kind: event_kind::THREAD_EXIT,
        regs: [0; 3],
        flags: 0,
    };
    let mut h = header(state, &cookie, cpu, 0);
    // The exit code is set before this tracepoint fires (do_exit): how the thread died.
    let offset = setting(&CFG_EXIT_CODE_OFFSET);
    if offset != 0 && offset < 65536 {
        // SAFETY: plain helper calls; the read is checked by the helper.
        let code = unsafe {
            let task = bpf_get_current_task() as *const u8;
            bpf_probe_read_kernel(task.add(offset as usize) as *const u32)
        };
        if let Ok(code) = code {
            h.function_id = code;
            h.flags |= event_flags::EXIT_CODE;
        }
    }
    let written = ring(cpu, state.tid).is_some_and(|ring| write(ring, &h, h.seq));
    if !written {
        // Leave the books for the daemon to collect (their trailing losses).
        count(counter::EXIT_RECORDS_LOST, 1);
        state.exited = 1;
        if EXITED_THREADS
            .insert(&state.tid, &*state, BPF_NOEXIST as u64)
            .is_err()
        {
            count(
                counter::TRAILING_LOST_UNATTRIBUTED,
                u64::from(state.gap_lost),
            );
        }
    }
    THREADS.remove_current();
    0
}

/// The books of every thread that has state (a task iterator over every task, run by the
/// daemon when it needs the live threads' trailing losses or return-probe depth): writes
/// `ThreadState` of each, in the iterator's output.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub fn thread_books(ctx: *mut c_void) -> i32 {
    // The context is `struct bpf_iter__task { struct bpf_iter_meta *meta; struct task_struct
    // *task; }`, `meta` starting with the `struct seq_file *` the output goes to. Plain loads:
    // the verifier types them (trusted pointers), as the storage helper requires.
    // SAFETY: the context of a task iterator has this layout.
    let (meta, task) = unsafe {
        let fields = ctx as *const *mut u64;
        (*fields, *fields.add(1))
    };
    if meta.is_null() || task.is_null() {
        return 0;
    }
    let Some(state) = THREADS.of(task as *mut _) else {
        return 0;
    };
    // SAFETY: `meta` points at a live bpf_iter_meta, whose first field is the seq_file.
    unsafe {
        let seq = *meta as *mut _;
        bpf_seq_write(
            seq,
            (state as *const ThreadState).cast(),
            core::mem::size_of::<ThreadState>() as u32,
        );
    }
    0
}

/// Whether the return probe firing now at `slot` is the repair keeper's pass through the
/// trampoline (see `repair_state::CLEANUP`), not a frame's return.
#[inline(always)]
fn cleanup_return(slot: u64) -> bool {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: a plain lookup; the value is read at once.
    unsafe {
        REPAIRS
            .get(&tid)
            .is_some_and(|r| r.state == repair_state::CLEANUP && r.sp == slot)
    }
}

/// `--exits repair`, at a throw (cookie kind `THROW`): copies the thread's pending return-probe
/// instances into `REPAIRS` and stops the thread; at a catch (kind `CATCH`): stops the thread
/// again if the daemon restored frames of it. See `profiler_common::RepairState`.
#[uprobe]
pub fn unwind_stop(ctx: ProbeContext) -> u32 {
    if setting(&CFG_UTASK_OFFSET) == 0 {
        return 0;
    }
    // SAFETY: plain helper calls.
    let cookie = Cookie::decode(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) });
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: plain helper call.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    if cookie.kind == event_kind::CATCH {
        if let Some(r) = REPAIRS.get_ptr_mut(&tid) {
            // SAFETY: map value pointer, valid for this run; only this thread's probes and
            // the daemon (while this thread is stopped) touch its entry.
            unsafe {
                if (*r).state == repair_state::RESTORED {
                    (*r).state = repair_state::CATCHING;
                    (*r).sp = stack_pointer(ctx.as_ptr());
                    (*r).at_ns = bpf_ktime_get_ns();
                    (*r).process = (bpf_get_current_pid_tgid() >> 32) as u32;
                    // The kernel's instances now, for the keeper to drop those of the frames
                    // the exception left when the kernel is at its limit.
                    copy_return_instances(task, &mut *r);
                    (*r).signal = stop_signal(task);
                    if let Some(state) = thread_state(false) {
                        state.cleanup_pending = 1;
                    }
                    send_signal((*r).signal);
                }
            }
        }
        return 0;
    }
    if cookie.kind != event_kind::THROW {
        return 0;
    }
    let Some(scratch) = REPAIR_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU slot, valid for the program's run.
    let r = unsafe { &mut *scratch };
    r.state = repair_state::THROWN;
    r.sp = stack_pointer(ctx.as_ptr());
    // SAFETY: plain helper call.
    r.at_ns = unsafe { bpf_ktime_get_ns() };
    r.process = (bpf_get_current_pid_tgid() >> 32) as u32;
    let frames = copy_return_instances(task, r);
    if frames == 0 || !live_frame_hooked(r, frames) {
        return 0;
    }
    r.signal = stop_signal(task);
    if REPAIRS.insert(&tid, &*r, 0).is_err() {
        error!(
            &(),
            "thread {}: no room to record a throw's {} hooked frames: the stack is not repaired",
            tid,
            r.frames
        );
        return 0;
    }
    send_signal(r.signal);
    0
}

/// Whether one of the `frames` instances copied into `r` is of a frame the exception can
/// unwind through that still returns to the trampoline: its slot at or above the throw's
/// stack pointer, holding the trampoline's address. Otherwise nothing needs repairing (the
/// instances are of frames gone, left by earlier exceptions, whose probes may have been
/// removed since: the kernel drops them only as it passes through its trampoline) and the
/// thread is not stopped. Where the trampoline or a slot cannot be read, it is assumed hooked.
fn live_frame_hooked(r: &RepairState, frames: usize) -> bool {
    let Some(trampoline) = trampoline() else {
        return true;
    };
    for i in 0..MAX_REPAIR_FRAMES {
        if i >= frames {
            break;
        }
        let slot = r.slots[i];
        if slot >= r.sp && returns_to(slot, trampoline) != Some(false) {
            return true;
        }
    }
    false
}

/// Copies the pending return-probe instances of `task` (`task->utask->return_instances`,
/// newest first: slot and original address of each) into `r`; returns how many. Inlined:
/// the BTF of a function of its own would describe `Option`s in a layout the kernel refuses.
#[inline(always)]
fn copy_return_instances(task: *const u8, r: &mut RepairState) -> usize {
    r.frames = 0;
    let utask_offset = setting(&CFG_UTASK_OFFSET);
    if utask_offset == 0 || utask_offset >= 65536 {
        return 0;
    }
    // SAFETY: kernel reads are checked by the helper.
    unsafe {
        let Ok(utask) = bpf_probe_read_kernel(task.add(utask_offset as usize) as *const u64) else {
            return 0;
        };
        if utask == 0 {
            return 0;
        }
        let list_at = utask + u64::from(setting(&CFG_RETURN_INSTANCES_OFFSET) & 0xffff);
        let Ok(mut ri) = bpf_probe_read_kernel(list_at as *const u64) else {
            return 0;
        };
        let stack_at = u64::from(setting(&CFG_RI_STACK_OFFSET) & 0xffff);
        let orig_at = u64::from(setting(&CFG_RI_ORIG_OFFSET) & 0xffff);
        let next_at = u64::from(setting(&CFG_RI_NEXT_OFFSET) & 0xffff);
        let func_at = u64::from(setting(&CFG_RI_FUNC_OFFSET) & 0xffff);
        let mut n = 0usize;
        for i in 0..MAX_REPAIR_FRAMES {
            if ri == 0 {
                break;
            }
            let (Ok(stack), Ok(orig), Ok(next)) = (
                bpf_probe_read_kernel((ri + stack_at) as *const u64),
                bpf_probe_read_kernel((ri + orig_at) as *const u64),
                bpf_probe_read_kernel((ri + next_at) as *const u64),
            ) else {
                break;
            };
            r.slots[i] = stack;
            r.origs[i] = orig;
            r.funcs[i] = bpf_probe_read_kernel((ri + func_at) as *const u64).unwrap_or(0);
            n = i + 1;
            ri = next;
        }
        r.frames = n as u32;
        n
    }
}

/// `--exits repair` of a running process, when it is let go (a task iterator, run once by the
/// repair keeper while every thread of the process is stopped): copies each thread's pending
/// return-probe instances into `REPAIRS` with state `RELEASE`, for the keeper to put the
/// original addresses back into the live frames still hooked. The iterator's link names the
/// process (the kernel visits only its threads), so that keepers of several processes can let
/// theirs go at once.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub fn repair_release(ctx: *mut c_void) -> i32 {
    let pid_at = setting(&CFG_TASK_PID_OFFSET);
    if pid_at == 0 || pid_at >= 65536 {
        return 0;
    }
    // The context is `struct bpf_iter__task { struct bpf_iter_meta *meta; struct task_struct
    // *task; }`; the task is read as a plain address (NULL at the end of the iteration).
    // SAFETY: kernel reads are checked by the helper.
    let Ok(task) = (unsafe { bpf_probe_read_kernel((ctx as *const u64).wrapping_add(1)) }) else {
        return 0;
    };
    if task == 0 {
        return 0;
    }
    let task = task as *const u8;
    // SAFETY: kernel reads are checked by the helper.
    let Ok(tid) =
        (unsafe { bpf_probe_read_kernel(task.wrapping_add(pid_at as usize) as *const u32) })
    else {
        return 0;
    };
    let Some(scratch) = REPAIR_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU slot, valid for the program's run.
    let r = unsafe { &mut *scratch };
    r.state = repair_state::RELEASE;
    r.signal = 0;
    r.at_ns = 0;
    r.sp = 0;
    if copy_return_instances(task, r) > 0 {
        let _ = REPAIRS.insert(&tid, &*r, 0);
    }
    0
}

/// The signal that stops the current thread for its repair: the first of
/// [`STOP_SIGNALS`] that it neither blocks nor catches (its handler is `SIG_DFL` or
/// `SIG_IGN`, so the signal is harmless if its tracer is gone), else `SIGSTOP`. The tracer
/// suppresses whichever it is.
fn stop_signal(task: *const u8) -> u32 {
    const SIGSTOP: u32 = 19;
    let blocked_offset = setting(&CFG_BLOCKED_OFFSET);
    let sighand_offset = setting(&CFG_SIGHAND_OFFSET);
    let action_offset = u64::from(setting(&CFG_SIGHAND_ACTION_OFFSET) & 0xffff);
    let action_size = u64::from(setting(&CFG_K_SIGACTION_SIZE) & 0xff);
    if blocked_offset == 0
        || blocked_offset >= 65536
        || sighand_offset == 0
        || sighand_offset >= 65536
        || action_size == 0
    {
        return SIGSTOP;
    }
    // SAFETY: kernel reads checked by the helper.
    let (Ok(blocked), Ok(sighand)) = (unsafe {
        (
            bpf_probe_read_kernel(task.add(blocked_offset as usize) as *const u64),
            bpf_probe_read_kernel(task.add(sighand_offset as usize) as *const u64),
        )
    }) else {
        return SIGSTOP;
    };
    if sighand == 0 {
        return SIGSTOP;
    }
    for signal in STOP_SIGNALS {
        let bit = 1u64 << (signal - 1);
        let at = sighand + action_offset + u64::from(signal - 1) * action_size;
        // SAFETY: kernel read checked by the helper.
        let handler = unsafe { bpf_probe_read_kernel(at as *const u64) };
        // SIG_DFL is 0, SIG_IGN 1: anything else is the program's handler.
        if blocked & bit == 0 && handler.is_ok_and(|h| h <= 1) {
            return signal;
        }
    }
    SIGSTOP
}

fn send_signal(signal: u32) {
    // SAFETY: plain helper call.
    unsafe { bpf_send_signal_thread(signal) };
}

/// `--exits repair --attach`: at the traced binary's entry point, once per process that starts
/// running it: names the process to the daemon, which traces it and probes it (see
/// [`STARTED`]).
#[uprobe]
pub fn process_start(ctx: ProbeContext) -> u32 {
    let pid = bpf_get_current_pid_tgid() >> 32;
    // SAFETY: plain helper call.
    let binary = Cookie::decode(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }).function_id;
    // For `repair::hold` to tell whether a process ran this far before it was stopped.
    let _ = ENTERED.insert(&(pid as u32), &1, 0);
    if STARTED.push(&((u64::from(binary) << 32) | pid), 0).is_err() {
        count(counter::PROCESSES_UNSEEN, 1);
        warn!(
            &(),
            "process {} started running a traced binary while the start queue was full: not traced (counted)",
            pid
        );
    }
    0
}

/// `--exits repair --attach`: the binaries whose execs `process_exec` reports, by inode number
/// (the daemon checks the device when it reads the report), each to its tag.
#[map(name = "EXEC_WATCHED")]
static EXEC_WATCHED: HashMap<u64, u32> = HashMap::with_max_entries(256, 0);

/// Where `process_exec` reports `(tag << 32) | pid`: waking the daemon at once, since the
/// process runs its dynamic loader meanwhile and must be held before its first instruction.
#[map(name = "EXECS")]
static EXECS: LegacyRingBuf = LegacyRingBuf::with_byte_size(16 * 1024, 0);

/// The processes that ran their entry point (`process_start`) since their latest exec of a
/// watched binary: `repair::hold` tells from it whether it stopped a process in time.
#[map(name = "ENTERED")]
static ENTERED: LruHashMap<u32, u8> = LruHashMap::with_max_entries(4096, 0);

#[unsafe(no_mangle)]
static CFG_BPRM_FILE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFG_FILE_INODE_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static CFG_INODE_INO_OFFSET: u32 = 0;

/// At every exec, once the new program is loaded and before it runs (raw tracepoint
/// `sched_process_exec`: `(struct task_struct *, pid_t old_pid, struct linux_binprm *)`):
/// reports the process when the file it execs is a watched binary. A full ring only means the
/// process is named later, by `process_start` at its entry point.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn process_exec(ctx: RawTracePointContext) -> i32 {
    let file_at = setting(&CFG_BPRM_FILE_OFFSET);
    if file_at == 0 {
        return 0;
    }
    let bprm = ctx.arg::<u64>(2);
    // SAFETY: bpf_probe_read_kernel checks every address.
    let ino = unsafe {
        let Ok(file) = bpf_probe_read_kernel((bprm + u64::from(file_at)) as *const u64) else {
            return 0;
        };
        let Ok(inode) = bpf_probe_read_kernel(
            (file + u64::from(setting(&CFG_FILE_INODE_OFFSET))) as *const u64,
        ) else {
            return 0;
        };
        let Ok(ino) = bpf_probe_read_kernel(
            (inode + u64::from(setting(&CFG_INODE_INO_OFFSET))) as *const u64,
        ) else {
            return 0;
        };
        ino
    };
    // SAFETY: a lookup in our own map; the value is copied at once.
    let Some(tag) = (unsafe { EXEC_WATCHED.get(&ino) }).copied() else {
        return 0;
    };
    let pid = bpf_get_current_pid_tgid() >> 32;
    // A process that execs the binary again starts again.
    let _ = ENTERED.remove(&(pid as u32));
    let report: u64 = (u64::from(tag) << 32) | pid;
    let _ = EXECS.output::<u64>(&report, BPF_RB_FORCE_WAKEUP as u64);
    0
}

#[uprobe]
pub fn floor(_ctx: ProbeContext) -> u32 {
    0
}

#[uretprobe]
pub fn floor_return(_ctx: RetProbeContext) -> u32 {
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
