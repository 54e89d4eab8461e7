//! Types shared by the eBPF programs (`profiler-ebpf`) and the daemon (`profiler-daemon`).
//!
//! Everything here is `no_std` and `#[repr(C)]`: the kernel side writes these bytes into a BPF
//! ring buffer and the user side reads them back, so both must agree on the exact layout.
#![no_std]

/// What kind of XRay sled a probe sits on, as recorded in `xray_instr_map`.
///
/// The numeric values are LLVM's `SledEntry::FunctionKinds`.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SledKind {
    /// Function entry (`jmp +9` + nops at the function start).
    Entry = 0,
    /// Function exit (`ret` + nops).
    Exit = 1,
    /// Just before a tail call leaves the function.
    Tail = 2,
    /// Function entry of a function whose first argument XRay logs.
    LogArgsEntry = 3,
    /// `__xray_customevent` call site.
    CustomEvent = 4,
    /// `__xray_typedevent` call site.
    TypedEvent = 5,
}

impl SledKind {
    /// Whether the sled is at a function's entry (plain or logging its arguments).
    pub const fn is_entry(self) -> bool {
        matches!(self, SledKind::Entry | SledKind::LogArgsEntry)
    }

    /// Decodes the kind byte of an instrumentation-map entry; `None` for values LLVM does not define.
    pub const fn from_u8(v: u8) -> Option<SledKind> {
        Some(match v {
            0 => SledKind::Entry,
            1 => SledKind::Exit,
            2 => SledKind::Tail,
            3 => SledKind::LogArgsEntry,
            4 => SledKind::CustomEvent,
            5 => SledKind::TypedEvent,
            _ => return None,
        })
    }
}

/// The attach cookie of a sled probe: which function (XRay function id, possibly packed with an
/// object id), which kind of sled, and for event sleds which registers hold the event's values.
/// The eBPF program reads it with `bpf_get_attach_cookie`, so one program serves every sled and
/// neither side ever maps addresses back to ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cookie {
    /// XRay function id (`(object_id << 24) | function_id` for shared objects).
    pub function_id: u32,
    /// Kind of the sled the probe is on.
    pub kind: u8,
    /// For CUSTOM_EVENT / TYPED_EVENT sleds: the register numbers (x86-64's, 0 = rax .. 15 =
    /// r15; AArch64's x0 .. x30) holding, in order, the event type (typed only), the payload
    /// pointer and the payload size at the sled address, as decoded from the sled's bytes. Zero
    /// elsewhere.
    pub regs: [u8; 3],
    /// [`cookie_flags`] bits.
    pub flags: u8,
}

/// Flags of [`Cookie::flags`].
pub mod cookie_flags {
    /// The sled's function has its exits observed by a return probe at its entry (the entry
    /// sled also carries the return probe; its exit sleds are not probed). Decided per
    /// function: the eBPF programs keep the kernel's pending return probes in step only for
    /// the entries that have one.
    pub const RETURN_PROBED: u8 = 1;
}

impl Cookie {
    /// A cookie for a function or tail sled (no registers, no flags).
    pub const fn new(function_id: u32, kind: SledKind) -> Cookie {
        Cookie {
            function_id,
            kind: kind as u8,
            regs: [0; 3],
            flags: 0,
        }
    }

    /// The same cookie with `flags` set.
    pub const fn with_flags(self, flags: u8) -> Cookie {
        Cookie {
            flags: self.flags | flags,
            ..self
        }
    }

    /// Whether [`cookie_flags::RETURN_PROBED`] is set.
    pub const fn return_probed(&self) -> bool {
        self.flags & cookie_flags::RETURN_PROBED != 0
    }

    /// Packs the cookie into the 64 bits the kernel stores per attachment: bits 0..32 function
    /// id, bits 32..40 sled kind, bits 40..56 the registers (5 bits each, the third 6 wide:
    /// its top bit serves only [`Cookie::call_slot`]), and the flags in bits 56..64.
    pub const fn encode(self) -> u64 {
        (self.function_id as u64)
            | ((self.kind as u64) << 32)
            | (((self.regs[0] & 31) as u64) << 40)
            | (((self.regs[1] & 31) as u64) << 45)
            | (((self.regs[2] & 63) as u64) << 50)
            | ((self.flags as u64) << 56)
    }

    /// The same cookie counting its function's calls in slot `slot` of [`CALLS_MAP`] (a
    /// function or tail sled's cookie: event sleds use these bits for their registers).
    pub const fn with_call_slot(self, slot: u16) -> Cookie {
        Cookie {
            regs: [
                (slot & 31) as u8,
                ((slot >> 5) & 31) as u8,
                (slot >> 10) as u8,
            ],
            ..self
        }
    }

    /// Where an entry of this function is counted in [`CALLS_MAP`]; 0: not counted. Only for
    /// function sleds (see [`Cookie::with_call_slot`]).
    pub const fn call_slot(&self) -> u16 {
        (self.regs[0] as u16 & 31)
            | ((self.regs[1] as u16 & 31) << 5)
            | ((self.regs[2] as u16 & 63) << 10)
    }

    /// Inverse of [`Cookie::encode`].
    pub const fn decode(raw: u64) -> Cookie {
        Cookie {
            function_id: raw as u32,
            kind: (raw >> 32) as u8,
            regs: [
                ((raw >> 40) & 31) as u8,
                ((raw >> 45) & 31) as u8,
                ((raw >> 50) & 63) as u8,
            ],
            flags: (raw >> 56) as u8,
        }
    }
}

/// What an event record in the ring buffers reports ([`EventHeader::kind`]). Values below 16 are
/// [`SledKind`]s (the sled that fired; EXIT also for a return probe); the rest are not sleds.
pub mod event_kind {
    /// The thread exited; `seq` is the number of events it produced in all, and the gap fields
    /// describe events lost at its very end. Written by the `sched_process_exit` program. With
    /// [`super::event_flags::EXIT_CODE`], `function_id` holds the task's `exit_code` as
    /// `wait(2)` would report it (a fatal signal in the low 7 bits, an exit status above).
    pub const THREAD_EXIT: u8 = 16;
    /// An exception was caught: the thread entered the C++ runtime's `__cxa_begin_catch`, which
    /// every catch handler calls first. Every traced frame whose return-address slot is at or
    /// below [`super::EventHeader::sp`] was left by the unwinding and is dead from this moment.
    pub const CATCH: u8 = 17;
    /// Not an event: the cookie kind of the `unwind_stop` probes at the unwinder's raise
    /// functions (`_Unwind_RaiseException`, ...), see [`super::RepairState`].
    pub const THROW: u8 = 18;
}

/// Flags of [`EventHeader::flags`].
pub mod event_flags {
    /// An entry whose exit will never be reported: the kernel keeps at most
    /// [`super::MAX_RETURN_PROBE_DEPTH`] return probes pending per thread, so the frames of
    /// return-probed functions deeper than that get none (the daemon closes the frame at the
    /// first event that proves it gone, see `session::thread`).
    pub const NO_RETURN: u8 = 1;
    /// A custom/typed event whose payload could not be read from the program's memory (the
    /// payload bytes are absent).
    pub const UNREADABLE: u8 = 2;
    /// A thread's end whose `function_id` holds its exit code (see
    /// [`super::event_kind::THREAD_EXIT`]).
    pub const EXIT_CODE: u8 = 4;
    /// An exit a return probe observed (or the tail sled of a function whose exits a return
    /// probe observes), not an exit sled: the summary counts calls by the method that really
    /// observed their end.
    pub const BY_RETURN_PROBE: u8 = 8;
}

/// The fixed part of every record the eBPF programs write into the per-CPU ring buffers.
/// `payload_len` bytes follow it: [`EventHeader::nargs`] × u64 arguments for an entry that logs
/// arguments, or an [`EventPayload`] and the event bytes for custom and typed events.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventHeader {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds at the hit.
    pub ts_ns: u64,
    /// Per-thread sequence number: the thread's events, written or lost, are numbered 0, 1, 2...
    /// in program order, whichever CPU's buffer they land in.
    pub seq: u64,
    /// Process id (the kernel's tgid).
    pub pid: u32,
    /// Thread id (the kernel's pid).
    pub tid: u32,
    /// XRay function id, from the cookie.
    pub function_id: u32,
    /// A [`SledKind`] value or an [`event_kind`] constant.
    pub kind: u8,
    /// [`event_flags`] bits.
    pub flags: u8,
    /// CPU the thread ran on.
    pub cpu: u16,
    /// Events of this thread that were lost (buffer full) right before this one.
    pub gap_lost: u32,
    /// Bytes after the header.
    pub payload_len: u32,
    /// Where the stack was. For an entry, an exit (sled or return probe) and a tail exit: the
    /// address of the frame's return-address slot, which identifies the frame for as long as
    /// it lives (at an entry or exit sled that is `rsp`; a return probe fires after `ret`
    /// popped the slot, so there it is `rsp - 8`). For a custom or typed event and a catch: `rsp`.
    /// On one stack, a frame whose slot is below `rsp` (or at it, for an entry or a catch) is
    /// gone: this is how frames an exception or `longjmp` left are recognised.
    pub sp: u64,
}

impl EventHeader {
    /// Size of the header in the ring buffer.
    pub const SIZE: usize = core::mem::size_of::<EventHeader>();

    /// Reads a header from the start of a ring-buffer record; `None` if the record is too short.
    pub fn from_bytes(bytes: &[u8]) -> Option<EventHeader> {
        if bytes.len() < Self::SIZE {
            return None;
        }
        // SAFETY: length checked above; EventHeader is plain old data with no invalid bit
        // patterns; read_unaligned because ring-buffer records are only 8-byte aligned.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr() as *const EventHeader) })
    }

    /// The thread id of the record `bytes` (as [`EventHeader::from_bytes`] would read it),
    /// without reading the rest; `None` if the record is too short.
    #[inline]
    pub fn tid_of(bytes: &[u8]) -> Option<u32> {
        const AT: usize = core::mem::offset_of!(EventHeader, tid);
        if bytes.len() < Self::SIZE {
            return None;
        }
        let tid: [u8; 4] = bytes[AT..AT + 4].try_into().ok()?;
        Some(u32::from_ne_bytes(tid))
    }

    /// The header as a ring-buffer record holds it ([`EventHeader::from_bytes`] reads it back):
    /// what tests and the in-memory pipeline benchmark write in the kernel's place.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut bytes = [0u8; Self::SIZE];
        // SAFETY: EventHeader is plain old data of exactly SIZE bytes.
        unsafe { core::ptr::write_unaligned(bytes.as_mut_ptr() as *mut EventHeader, *self) };
        bytes
    }

    /// Number of u64 arguments that follow the header of an entry event.
    pub const fn nargs(&self) -> usize {
        self.payload_len as usize / 8
    }
}

/// Entry event with arguments: the header and room for all six System V integer argument
/// registers (`payload_len` says how many were captured).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArgsEvent {
    /// Common header.
    pub header: EventHeader,
    /// rdi, rsi, rdx, rcx, r8, r9.
    pub args: [u64; MAX_ARGS],
}

/// What precedes the payload bytes of a custom or typed event.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventPayload {
    /// The payload size the program passed (the bytes that follow may be fewer: truncated to
    /// the configured maximum).
    pub size: u64,
    /// The event type of a typed event (0 for custom events).
    pub event_type: u64,
}

/// Per-thread state the eBPF programs keep in [`THREADS_MAP`], attached to the thread itself
/// (task storage: no lookup by id on the event path, freed with the thread). Created zeroed at
/// the thread's first event. The daemon reads the live threads' states through the
/// [`THREAD_BOOKS_PROGRAM`] iterator, and those of threads whose exit record was lost from
/// [`EXITED_THREADS_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadState {
    /// Sequence number of the thread's next event.
    pub seq: u64,
    /// Events of the thread lost so far.
    pub lost: u64,
    /// Lost since the last written event (reported, then reset, by the next written event).
    pub gap_lost: u32,
    /// Return-probed functions only: frames with a pending return probe, as the kernel counts them
    /// (including frames a non-local exit left, until the kernel drops them too).
    pub returns_pending: u32,
    /// Return-probed functions only: entered frames beyond [`MAX_RETURN_PROBE_DEPTH`] (no return probe).
    pub beyond_return_depth: u32,
    /// 1 when the thread exited but its exit record found the buffer full: the state was
    /// moved into [`EXITED_THREADS_MAP`], where the daemon reads its trailing losses.
    pub exited: u32,
    /// Of `beyond_return_depth`: the calls entered while the innermost frame with a pending
    /// return probe was already gone (its return-address slot at or below the new frame's):
    /// the kernel holds the return probes of frames an exception or `longjmp` left, and is
    /// stuck at its limit. A deep recursion, whose pending frames are all live, adds none.
    pub stuck_calls: u32,
    /// 1 from a catch that stopped the thread for its repair until its next entry or return
    /// probe: the repair keeper may make it pass through the return trampoline once, to drop
    /// the kernel's instances of the frames the exception left (see
    /// [`repair_state::CLEANUP`]), and the return program then looks at its `RepairState`.
    pub cleanup_pending: u32,
    /// The thread's id, set at its first event.
    pub tid: u32,
    /// Its process's id, set at its first event.
    pub pid: u32,
    /// Return-probed functions only: bit `i` set when the frame with pending return probe `i` already left
    /// by a tail call (its Tail_Exit was reported, so its return probe must stay silent).
    pub tail_exited: [u64; TAIL_BITS_WORDS],
    /// Return-probed functions only: the return-address slot of each frame with a pending return probe,
    /// outermost first. The kernel drops the instances of frames a non-local exit left (their
    /// slot is at or below the stack pointer) without running their handlers; the programs
    /// drop them at the same moments, so that the count and the tail bits stay the kernel's.
    pub return_slots: [u64; MAX_RETURN_PROBE_DEPTH as usize],
}

impl Default for ThreadState {
    fn default() -> Self {
        ThreadState {
            seq: 0,
            lost: 0,
            gap_lost: 0,
            returns_pending: 0,
            beyond_return_depth: 0,
            exited: 0,
            stuck_calls: 0,
            cleanup_pending: 0,
            tid: 0,
            pid: 0,
            tail_exited: [0; TAIL_BITS_WORDS],
            return_slots: [0; MAX_RETURN_PROBE_DEPTH as usize],
        }
    }
}

/// Words of [`ThreadState::tail_exited`]; frames deeper than 64 × this are never deep enough to
/// matter, as the kernel's return-probe depth limit is lower.
pub const TAIL_BITS_WORDS: usize = 1;

/// The kernel keeps at most this many return probes pending per thread (`MAX_URETPROBE_DEPTH`
/// in kernel/events/uprobes.c); deeper entries get no return probe.
pub const MAX_RETURN_PROBE_DEPTH: u32 = 64;

/// Integer argument registers a sled can report (System V: rdi, rsi, rdx, rcx, r8, r9).
pub const MAX_ARGS: usize = 6;

/// Largest `--max-event-bytes`: the per-CPU scratch buffer a payload is copied through is
/// limited to 32 KiB by the kernel; this leaves room for the header.
pub const MAX_EVENT_BYTES: u32 = 16 << 10;
/// Default payload bytes kept per custom/typed event.
pub const DEFAULT_MAX_EVENT_BYTES: u32 = 4096;

/// A thread with this many calls beyond the kernel's limit of pending return probes
/// ([`MAX_RETURN_PROBE_DEPTH`]) made while the innermost pending frame was gone
/// ([`ThreadState::stuck_calls`]): the kernel is stuck at its limit (the return probes of frames
/// an exception left are dropped only when a traced caller returns, and none may), and the
/// daemon observes the process's exits by their sleds from then on.
pub const STUCK_BEYOND_RETURN_LIMIT: u32 = 4096;

/// Name of the array of per-CPU ring buffers (index = CPU) the programs write events into.
pub const RINGS_MAP: &str = "RINGS";
/// Name of the per-thread state map ([`ThreadState`] in task storage).
pub const THREADS_MAP: &str = "THREADS";
/// Name of the hash map of the [`ThreadState`] of threads whose exit record found the buffer
/// full, by thread id (collected and removed by the daemon).
pub const EXITED_THREADS_MAP: &str = "EXITED_THREADS";
/// Name of the task iterator that writes `(tid, ThreadState)` of every thread with state (the
/// live threads' books, read by the daemon: their trailing losses, their return-probe depth).
pub const THREAD_BOOKS_PROGRAM: &str = "thread_books";
/// Name of the one-entry array whose value is 1 once the daemon has placed its first probes
/// (see `profiler-ebpf`'s `armed`).
pub const ARMED_MAP: &str = "ARMED";
/// Name of the per-CPU counters array, indexed by the `counter` constants.
pub const COUNTERS_MAP: &str = "COUNTERS";
/// Array (mmapable, `CFG_CALL_SLOTS` entries per possible CPU, CPU-major): the calls of each
/// function given a slot ([`Cookie::with_call_slot`]), counted at its entries on each CPU in
/// its own row, for the overhead budget. One entry when no slots are configured.
pub const CALLS_MAP: &str = "CALLS";
/// Indexes into [`COUNTERS_MAP`].
pub mod counter {
    /// Events dropped because the thread's state could not be created (the kernel could not
    /// allocate it, or another BPF program held the storage lock on that CPU; not
    /// attributable).
    pub const NO_THREAD_STATE: u32 = 0;
    /// Thread-exit records that found the buffer full.
    pub const EXIT_RECORDS_LOST: u32 = 1;
    /// Events lost at the end of threads whose exit record was lost and whose state found no
    /// room in [`super::EXITED_THREADS_MAP`] (full, or a thread of the same id not yet
    /// collected).
    pub const TRAILING_LOST_UNATTRIBUTED: u32 = 2;
    /// Return probes that fired for calls whose entry made no event: entered before recording
    /// began (hooked by the kernel while the probes were being placed, or, under `--exits
    /// repair`, before the session armed them), or while a budget was placing or removing
    /// their function's probes (the return probe there without the entry's): not events of
    /// the trace.
    pub const RETURNS_BEFORE_TRACING: u32 = 3;
    /// `--exits repair --attach`: processes that started running the traced binary while the
    /// queue that names them to the daemon was full (not traced).
    pub const PROCESSES_UNSEEN: u32 = 4;
    /// Times a thread's stuck calls (see [`super::ThreadState::stuck_calls`]) reached
    /// [`super::STUCK_BEYOND_RETURN_LIMIT`]: only then does the daemon read the threads' books
    /// to find the stuck one (reading them walks every task of the system).
    pub const BEYOND_RETURN_LIMIT: u32 = 5;
    /// Number of counters.
    pub const COUNT: u32 = 6;
}
/// Name of the program attached (as a uprobe) to every sled.
pub const SLED_PROGRAM: &str = "sled";
/// Name of the program attached as a return probe at function entries (`--exits return`).
pub const RETURN_PROGRAM: &str = "sled_return";
/// Name of the empty uprobe program (benchmark floor).
pub const FLOOR_PROGRAM: &str = "floor";
/// Name of the empty return-probe program (benchmark floor).
pub const FLOOR_RETURN_PROGRAM: &str = "floor_return";
/// Name of the raw tracepoint program on `sched_process_exit`.
pub const THREAD_EXIT_PROGRAM: &str = "thread_exit";
/// Name of the program that stops a thread for `--exits repair` (see [`RepairState`]).
pub const UNWIND_STOP_PROGRAM: &str = "unwind_stop";
/// Name of the task iterator that copies a traced process's pending return-probe instances
/// when `--exits repair` lets a running process go (see [`repair_state::RELEASE`]).
pub const REPAIR_RELEASE_PROGRAM: &str = "repair_release";
/// Name of the program at the traced binary's entry point under `--exits repair --attach`.
pub const PROCESS_START_PROGRAM: &str = "process_start";
/// Name of the queue of processes that started running the traced binary (`--exits repair
/// --attach`).
pub const STARTED_MAP: &str = "STARTED";
/// Name of the program at every exec (raw tracepoint `sched_process_exec`) that names the
/// processes that exec a traced binary, for their keeper to hold them before their first
/// instruction (`--exits repair --attach`, the service's repaired targets).
pub const PROCESS_EXEC_PROGRAM: &str = "process_exec";
/// Name of the map of the inode numbers of the binaries whose execs `process_exec` reports
/// (inode number to the binary's tag).
pub const EXEC_WATCHED_MAP: &str = "EXEC_WATCHED";
/// Name of the ring buffer `process_exec` reports each exec of a watched binary into, as
/// `(tag << 32) | pid` (u64).
pub const EXECS_MAP: &str = "EXECS";
/// Name of the map of the processes that ran the watched binary's entry point since their
/// exec (pid to 1).
pub const ENTERED_MAP: &str = "ENTERED";
/// Name of the hash map of [`RepairState`] by thread id.
pub const REPAIRS_MAP: &str = "REPAIRS";
/// `--follow-forks`: name of the hash map whose keys are the processes (tgids) recorded: the
/// traced process, put there by the daemon, and every process forked by one of them, put
/// there by [`FOLLOW_FORK_PROGRAM`] before the child first runs.
pub const FOLLOWED_MAP: &str = "FOLLOWED";
/// `--follow-forks`: name of the raw tracepoint program on `task_newtask` that adds a new
/// process forked by a followed one to [`FOLLOWED_MAP`].
pub const FOLLOW_FORK_PROGRAM: &str = "follow_fork";

/// Most return-probe instances a throw reads (the kernel keeps at most
/// [`MAX_RETURN_PROBE_DEPTH`] per thread).
pub const MAX_REPAIR_FRAMES: usize = 64;

/// `--exits repair`: what a thread's stop is for. An exception must not unwind through a frame
/// whose return address the kernel replaced with its return-probe trampoline (the unwinder
/// finds no frame there and calls `std::terminate`). At a throw (the `unwind_stop` program at
/// the unwinder's raise functions) the program copies the kernel's pending return-probe
/// instances of the thread (`current->utask->return_instances`: slot and original address)
/// here and stops the thread with a signal; the daemon, its ptrace tracer, puts the original
/// addresses back into the slots that still hold the trampoline. At the catch, if the thread
/// has restored frames, the program stops it again, and the daemon puts the trampoline back
/// into the restored slots of the frames still alive, so that their returns are observed.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RepairState {
    /// [`repair_state`] value.
    pub state: u32,
    /// Instances in `slots` and `origs`.
    pub frames: u32,
    /// The signal sent to stop the thread (one of [`STOP_SIGNALS`], or `SIGSTOP`): the tracer
    /// takes only that stop as the repair's, every other signal is the program's.
    pub signal: u32,
    /// The thread's process (tgid): whose [`STOP_TIMES_MAP`] entries the stop's time goes to.
    pub process: u32,
    /// When the program stopped the thread (`bpf_ktime_get_ns`, `CLOCK_MONOTONIC`): the tracer
    /// times the stop from here to the thread's resumption, the time it cost the program.
    pub at_ns: u64,
    /// The stack pointer at the probe (at the throw, or at the catch): the slot of the probed
    /// function's own return address. The tracer reads the registers only after the probed
    /// instruction ran (a `push`, at the catch function: 8 bytes lower), so a frame that
    /// an exception left, whose slot the catch function's return address now fills, would look
    /// alive by them; by this it is dead (`slot <= sp`).
    pub sp: u64,
    /// Each instance's return-address slot (the frame's stack pointer at its entry), newest
    /// first.
    pub slots: [u64; MAX_REPAIR_FRAMES],
    /// Each instance's original return address.
    pub origs: [u64; MAX_REPAIR_FRAMES],
    /// Each instance's probed function (the address its return probe was placed at): whose
    /// frames made the thread stop, for the overhead budget.
    pub funcs: [u64; MAX_REPAIR_FRAMES],
}

/// Name of the hash map of the time threads spent stopped for their repair, by process and
/// hooked function ([`StopKey`] to [`StopTime`]): written by the repair keepers (each stop's
/// time shared among the functions whose live frames were hooked), read by the overhead budget.
pub const STOP_TIMES_MAP: &str = "STOP_TIMES";

/// Name of the hash map of the functions ([`StopKey`] to 1) whose live frames the repair
/// keepers leave unhooked at a catch (their original return address stays): functions the
/// overhead budget dropped, whose frames hooked before would otherwise go on stopping every
/// throw through them until they return (a removed return probe leaves its frames hooked).
/// Written by the daemon, read by the keepers.
pub const UNHOOK_MAP: &str = "UNHOOK";

/// A key of [`STOP_TIMES_MAP`] and [`UNHOOK_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StopKey {
    /// The process (tgid).
    pub pid: u32,
    pub reserved: u32,
    /// The function's address in it (see [`RepairState::funcs`]).
    pub func: u64,
}

/// A value of [`STOP_TIMES_MAP`]: since the process was traced.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StopTime {
    /// Stops its frames had a share of.
    pub stops: u64,
    /// Its share of their time, in nanoseconds.
    pub ns: u64,
}

/// The signals that may stop a thread for its repair, in order of preference: both are ignored
/// by default, so one still pending when the tracer is gone does the program no harm. The
/// first that the thread neither blocks nor catches is sent; `SIGSTOP` when there is none.
pub const STOP_SIGNALS: [u32; 2] = [23 /* SIGURG */, 28 /* SIGWINCH */];

/// Values of [`RepairState::state`].
pub mod repair_state {
    /// A throw stopped the thread; the daemon has not restored its frames yet.
    pub const THROWN: u32 = 1;
    /// The daemon restored frames; the catch stops the thread to hook the live ones again.
    pub const RESTORED: u32 = 2;
    /// The catch stopped the thread; the daemon has not hooked its live frames again yet.
    pub const CATCHING: u32 = 3;
    /// A running process (`--pid`) is let go: every thread is stopped, and the
    /// `repair_release` iterator copied each one's pending instances, so that the tracer puts
    /// the original return address back into every live frame still hooked before it
    /// detaches (no frame is left for an exception to find hooked without a tracer).
    pub const RELEASE: u32 = 4;
    /// At a catch, the kernel holding as many return probes for the thread as it allows, some
    /// of frames the exception left: the tracer makes the thread pass once through the return
    /// trampoline with its stack pointer just above the outermost of those (`sp` is that
    /// frame's slot), so that the kernel drops them all. The kernel runs the return handler of
    /// that outermost one: the return program stays silent for it.
    pub const CLEANUP: u32 = 5;
}

/// Default size of each per-CPU ring buffer in bytes (a power of two, as the kernel requires).
pub const DEFAULT_RING_BYTES: u32 = 8 << 20;

/// Bytes of each of a CPU's `rings_per_cpu` rings when they share `per_cpu` bytes: a power of
/// two (as the kernel requires) of at least `page` bytes; a split that is not a power of two
/// leaves the rest of `per_cpu` unused.
pub fn ring_bytes(per_cpu: u64, rings_per_cpu: u64, page: u64) -> u64 {
    let each = (per_cpu / rings_per_cpu.max(1)).max(page).max(1);
    1 << each.ilog2()
}

/// The ring an event of thread `tid` on CPU `cpu` is written to, when each CPU's events are
/// spread over `rings_per_cpu` rings by thread (`globals::RINGS_PER_CPU`): CPU `cpu`'s rings
/// are `cpu * rings_per_cpu ..`, and thread `tid` always writes to the one `tid %
/// rings_per_cpu` along, so that a reader that handles the threads with that remainder
/// finds all of theirs in its own rings, and no one else's.
#[inline(always)]
pub fn ring_index(cpu: u32, tid: u32, rings_per_cpu: u32) -> u32 {
    if rings_per_cpu <= 1 {
        cpu
    } else {
        cpu * rings_per_cpu + tid % rings_per_cpu
    }
}

/// Benchmark-only switches (`globals::ABLATE` bits) that skip one part of the per-event work,
/// so `cargo xtask bench` can show what each part costs. Never set in a real session.
pub mod ablate {
    /// Do not write to the ring buffer (count every event as written).
    pub const WRITE: u32 = 1;
    /// Use a per-CPU stand-in instead of the per-thread state table.
    pub const STATE: u32 = 2;
    /// Do not read the clock.
    pub const CLOCK: u32 = 4;
    /// Write each event with one `bpf_ringbuf_output` (a copy) instead of reserving room and
    /// writing into it.
    pub const WRITE_BY_COPY: u32 = 8;
    /// Write each event into a per-CPU array instead of the ring buffer (nothing reaches the
    /// daemon): what a write costs when events are gathered per CPU and submitted in batches,
    /// before the batch's own submission.
    pub const WRITE_PER_CPU: u32 = 16;
}

/// Names of global variables the daemon sets at load time.
pub mod globals {
    /// u32: [`super::ablate`] bits (benchmark only).
    pub const ABLATE: &str = "CFG_ABLATE";
    /// u32: how many argument registers to record at LOG_ARGS_ENTRY sleds (0..=6).
    pub const NARGS: &str = "CFG_NARGS";
    /// u32: payload bytes kept per custom/typed event.
    pub const MAX_EVENT_BYTES: &str = "CFG_MAX_EVENT_BYTES";
    /// u64: bytes waiting in a ring buffer above which a write wakes the reader.
    pub const WAKEUP_BYTES: &str = "CFG_WAKEUP_BYTES";
    /// u32: rings per CPU, each for the threads of one remainder of their id (see
    /// [`super::ring_index`]); 1: one ring per CPU.
    pub const RINGS_PER_CPU: &str = "CFG_RINGS_PER_CPU";
    /// u32: byte offset of `exit_code` in the kernel's `struct task_struct` (from its BTF);
    /// 0 when unknown, and then a thread's end carries no exit code.
    pub const EXIT_CODE_OFFSET: &str = "CFG_EXIT_CODE_OFFSET";
    /// u32: where a thread's return-probe trampoline is (`task_struct.mm`,
    /// `mm_struct.uprobes_state.xol_area`, `xol_area.vaddr`, from the kernel's BTF): whether
    /// a new frame at a tail-calling frame's slot is its tail callee. 0: assume it is.
    pub const TASK_MM_OFFSET: &str = "CFG_TASK_MM_OFFSET";
    pub const MM_XOL_AREA_OFFSET: &str = "CFG_MM_XOL_AREA_OFFSET";
    pub const XOL_VADDR_OFFSET: &str = "CFG_XOL_VADDR_OFFSET";
    /// u32: where the kernel counts a thread's pending return probes (`task_struct.utask`,
    /// `uprobe_task.depth`, `uprobe_task.return_instances`, `return_instance.stack`, from its
    /// BTF): at an entry, the programs decide with the kernel's own count whether it hooks the
    /// frame, and whether it is stuck at its limit. 0: their own count is used.
    pub const DEPTH_UTASK_OFFSET: &str = "CFG_DEPTH_UTASK_OFFSET";
    pub const DEPTH_OFFSET: &str = "CFG_DEPTH_OFFSET";
    pub const DEPTH_LIST_OFFSET: &str = "CFG_DEPTH_LIST_OFFSET";
    pub const DEPTH_RI_STACK_OFFSET: &str = "CFG_DEPTH_RI_STACK_OFFSET";
    /// u32: offsets in the kernel's structures that `unwind_stop` reads (from its BTF):
    /// `task_struct.utask`, `uprobe_task.return_instances`, `return_instance.stack`,
    /// `.orig_ret_vaddr`, `.next`, `task_struct.blocked`, `task_struct.sighand`,
    /// `sighand_struct.action` and the size of `struct k_sigaction` (whose first member is the
    /// handler). 0: `--exits repair` is off.
    pub const UTASK_OFFSET: &str = "CFG_UTASK_OFFSET";
    pub const RETURN_INSTANCES_OFFSET: &str = "CFG_RETURN_INSTANCES_OFFSET";
    pub const RI_STACK_OFFSET: &str = "CFG_RI_STACK_OFFSET";
    pub const RI_ORIG_OFFSET: &str = "CFG_RI_ORIG_OFFSET";
    pub const RI_NEXT_OFFSET: &str = "CFG_RI_NEXT_OFFSET";
    pub const RI_FUNC_OFFSET: &str = "CFG_RI_FUNC_OFFSET";
    pub const BLOCKED_OFFSET: &str = "CFG_BLOCKED_OFFSET";
    pub const SIGHAND_OFFSET: &str = "CFG_SIGHAND_OFFSET";
    pub const SIGHAND_ACTION_OFFSET: &str = "CFG_SIGHAND_ACTION_OFFSET";
    pub const K_SIGACTION_SIZE: &str = "CFG_K_SIGACTION_SIZE";
    /// u32: `task_struct.pid` (from the kernel's BTF), for `repair_release` and
    /// `follow_fork`.
    pub const TASK_PID_OFFSET: &str = "CFG_TASK_PID_OFFSET";
    /// u32s: `linux_binprm.file`, `file.f_inode`, `inode.i_ino` (`process_exec`; all zero: it
    /// reports nothing).
    pub const BPRM_FILE_OFFSET: &str = "CFG_BPRM_FILE_OFFSET";
    pub const FILE_INODE_OFFSET: &str = "CFG_FILE_INODE_OFFSET";
    pub const INODE_INO_OFFSET: &str = "CFG_INODE_INO_OFFSET";
    /// u32: 1 under `--follow-forks`: a thread gets state (is recorded) only if its process
    /// is in [`super::FOLLOWED_MAP`].
    pub const FOLLOW_FORKS: &str = "CFG_FOLLOW_FORKS";
    /// u32: slots per CPU of [`super::CALLS_MAP`]; 0: calls are not counted.
    pub const CALL_SLOTS: &str = "CFG_CALL_SLOTS";
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn cookie_round_trips() {
        let c = Cookie {
            function_id: (3 << 24) | 0x12345,
            kind: SledKind::TypedEvent as u8,
            regs: [15, 0, 9],
            flags: cookie_flags::RETURN_PROBED,
        };
        assert_eq!(Cookie::decode(c.encode()), c);
        // AArch64's registers go up to x30.
        let c = Cookie {
            function_id: 4,
            kind: SledKind::CustomEvent as u8,
            regs: [20, 30, 29],
            flags: cookie_flags::RETURN_PROBED,
        };
        assert_eq!(Cookie::decode(c.encode()), c);
        assert!(Cookie::decode(c.encode()).return_probed());
        assert!(!Cookie::new(1, SledKind::Entry).return_probed());
        assert_eq!((c.encode() >> 32) as u8, SledKind::CustomEvent as u8);
        assert_eq!(
            Cookie::decode(Cookie::new(7, SledKind::Tail).encode()).kind,
            2
        );
        for slot in [0, 1, 15, 16, 0x1234, 0xffff] {
            let c = Cookie::new(9, SledKind::Entry)
                .with_flags(cookie_flags::RETURN_PROBED)
                .with_call_slot(slot);
            let back = Cookie::decode(c.encode());
            assert_eq!(back.call_slot(), slot);
            assert_eq!((back.function_id, back.kind), (9, 0));
            assert!(back.return_probed());
        }
    }

    #[test]
    fn layouts_have_no_padding() {
        assert_eq!(EventHeader::SIZE, 48);
        assert_eq!(core::mem::size_of::<ArgsEvent>(), 96);
        assert_eq!(core::mem::size_of::<EventPayload>(), 16);
        assert_eq!(core::mem::size_of::<ThreadState>(), 56 + 8 * 64);
    }

    #[test]
    fn sled_kind_matches_llvm_values() {
        for v in 0..=5u8 {
            assert_eq!(SledKind::from_u8(v).map(|k| k as u8), Some(v));
        }
        assert_eq!(SledKind::from_u8(6), None);
    }
}
