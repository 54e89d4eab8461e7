//! The handler the inline engine puts into a traced process: three trampolines that a patched
//! sled calls (an entry or tail sled: `mov r10d, id; call entry`) or jumps to (an exit sled:
//! `mov r10d, id; jmp exit`, in place of its `ret`), and that write one 32-byte record of the
//! hit into the calling thread's slot of memory shared with fdr-profiled ([`super::buffers`]).
//!
//! It is assembled here, with the daemon, and copied byte for byte into a page of the traced
//! process near the object whose sleds call it (a `call rel32` reaches ±2 GiB). It refers to
//! nothing outside itself: its parameters (where the shared memory is mapped in the process,
//! its sizes, where glibc keeps a thread's id) are words of its own data block, at the end of
//! the copy, read `rip`-relative, which fdr-profiled writes into the copy before any sled
//! calls it.
//!
//! What it must and must not do, in the traced program's threads:
//! - No system call, no lock, no memory of its own: a thread's slot is found from its id
//!   (read from its thread control block, `%fs:0`, at glibc's `_thread_db_pthread_tid`
//!   offset) through a table indexed by thread id; a thread's first hit claims a free slot
//!   (`lock cmpxchg`) and notes its process (`getpid`, the one system call, once a thread).
//! - Every register the function may still need is kept: the argument registers at an entry,
//!   the return registers at an exit (`rax`, `rdx`; vector registers are not touched). `r10`
//!   and `r11` are free at both (XRay's own trampolines clobber `r10` the same way).
//! - A signal handler that runs traced code may interrupt it anywhere: the slot's counters are
//!   moved by single instructions (`xadd`, `inc`, `sub`: atomic for the thread they belong to,
//!   which alone writes them), and a record is published by its commit word, written last.
//!   So nested hits get numbers and places of their own; only the thread's order of numbers
//!   and places may differ, and the reader orders by number.
//! - A full slot loses the hit, counted: the sequence number is still consumed and the lost
//!   count kept in the slot is carried by the thread's next record (its `gap`), as the kernel
//!   side does.
//!
//! Record (32 bytes): commit (`seq + 1`, 0 until written), TSC, then a word of the stack
//! slot (bits 0-47: for an entry or tail, the frame's return-address slot; for an exit, `rsp`
//! at its `ret`, the same slot; user addresses have 47 bits), the kind (bits 48-55) and the
//! CPU (bits 56-63: the low byte of the CPU's number, read with `lsl` as the vDSO's `getcpu`
//! does, at every 64th hit of the thread: on a VM it costs as much as the rest of the hit; a
//! migration shows up to 63 hits late), then the function id (u32) and the events lost right
//! before it (u32). The time is the TSC (`rdtsc`; `rdtscp`, which would give the CPU too,
//! costs twice as much on a VM).

/// Offsets of the handler's data block (u64 words), written by fdr-profiled into the copy.
pub mod data {
    /// Address of the table of slots by thread id (u32 each: slot number + 1, 0 if none).
    pub const TABLE: usize = 0;
    /// Entries in the table (thread ids at or above it get no slot).
    pub const TABLE_LEN: usize = 8;
    /// Address of slot 0.
    pub const SLOTS: usize = 16;
    /// Bytes per slot (header and ring).
    pub const SLOT_BYTES: usize = 24;
    /// Slots.
    pub const SLOT_COUNT: usize = 32;
    /// Records per ring, minus one (a power of two).
    pub const RING_MASK: usize = 40;
    /// A ring holding this many unread records is full (a margin below its size, for hits
    /// nested in the handler between the check and the reservation).
    pub const RING_LIMIT: usize = 48;
    /// Where glibc keeps a thread's id in its thread control block.
    pub const TID_OFFSET: usize = 56;
    /// Address of the shared memory's header.
    pub const HEADER: usize = 64;
    /// Size of the block.
    pub const SIZE: usize = 72;
}

/// Offsets in a slot's header (the ring follows at [`slot::RING`]).
pub mod slot {
    /// u32: the thread that owns the slot, 0 if free.
    pub const OWNER: usize = 0;
    /// u32: its process (`getpid`, made once, when the thread claims the slot), 0 until known.
    pub const PID: usize = 4;
    /// u64: the next sequence number (events written or lost).
    pub const SEQ: usize = 8;
    /// u64: records reserved (the next place in the ring).
    pub const HEAD: usize = 16;
    /// u64: records read by fdr-profiled (written by it alone).
    pub const TAIL: usize = 24;
    /// u64: events lost since the last record (carried by the next one).
    pub const PENDING: usize = 32;
    /// u32: the CPU the thread was on at its last hit numbered a multiple of 64.
    pub const CPU: usize = 40;
    /// The ring of records.
    pub const RING: usize = 64;
}

/// Offsets in the shared memory's header.
pub mod header {
    /// u64: hits of threads that found no slot (every slot taken, or a thread id beyond the
    /// table), counted with `lock inc`.
    pub const NO_SLOT: usize = 8;
}

/// The segment selector whose limit Linux sets to the CPU's number (and node, above bit 12)
/// on x86-64 (`__CPUNODE_SEG`, what `getcpu` in the vDSO reads with `lsl`).
#[cfg(target_arch = "x86_64")]
const CPU_SEGMENT: u32 = 15 * 8 + 3;

/// Bytes per record.
pub const RECORD_BYTES: usize = 32;

/// Record kinds (as `profiler_common::SledKind`).
pub const KIND_ENTRY: u32 = 0;
/// An exit sled.
pub const KIND_EXIT: u32 = 1;
/// A tail-call sled.
pub const KIND_TAIL: u32 = 2;

// Registers: r10d the function id (from the sled), r11 the kind (<< 48), rsi the frame's
// slot; rax, rcx, rdx, rdi and
// r8 are saved by each trampoline and put back before its `ret` (which, at an exit, is the
// function's own return). x86-64 code: on another architecture there is no handler, and the
// engine is refused before one is asked for (`crate::arch::unsupported`).
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .text.fdr_inline_handler,\"ax\",@progbits",
    ".balign 64",
    ".globl fdr_inline_begin",
    ".hidden fdr_inline_begin",
    "fdr_inline_begin:",
    // Called from an entry sled: the frame's slot is above our return address.
    ".globl fdr_inline_entry",
    ".hidden fdr_inline_entry",
    "fdr_inline_entry:",
    "push rax", "push rcx", "push rdx", "push rsi", "push rdi", "push r8",
    "lea rsi, [rsp + 56]",
    "mov r11d, {entry}",
    "shl r11, 48",
    "jmp 2f",
    // Called from a tail-call sled.
    ".globl fdr_inline_tail",
    ".hidden fdr_inline_tail",
    "fdr_inline_tail:",
    "push rax", "push rcx", "push rdx", "push rsi", "push rdi", "push r8",
    "lea rsi, [rsp + 56]",
    "mov r11d, {tail}",
    "shl r11, 48",
    "jmp 2f",
    // Jumped to from an exit sled, in place of its `ret`: the slot is where rsp was.
    ".globl fdr_inline_exit",
    ".hidden fdr_inline_exit",
    "fdr_inline_exit:",
    "push rax", "push rcx", "push rdx", "push rsi", "push rdi", "push r8",
    "lea rsi, [rsp + 48]",
    "mov r11d, {exit}",
    "shl r11, 48",
    "2:",
    // The thread's id, from its control block.
    "mov rax, qword ptr fs:[0]",
    "add rax, qword ptr [rip + .Lfdr_data + {tid_offset}]",
    "mov eax, dword ptr [rax]",
    "cmp rax, qword ptr [rip + .Lfdr_data + {table_len}]",
    "jae 9f",
    "mov rcx, qword ptr [rip + .Lfdr_data + {table}]",
    "mov ecx, dword ptr [rcx + rax*4]",
    "test ecx, ecx",
    "jz 8f",
    "3:",
    // ecx: the slot's number + 1 (0xffffffff: none was free at the thread's first hit).
    "cmp ecx, -1",
    "je 9f",
    "dec ecx",
    "imul rcx, qword ptr [rip + .Lfdr_data + {slot_bytes}]",
    "add rcx, qword ptr [rip + .Lfdr_data + {slots}]",
    "mov r8d, 1",
    "xadd qword ptr [rcx + {seq}], r8",
    "mov rax, qword ptr [rcx + {head}]",
    "sub rax, qword ptr [rcx + {tail_pos}]",
    "cmp rax, qword ptr [rip + .Lfdr_data + {ring_limit}]",
    "jae 7f",
    "mov eax, 1",
    "xadd qword ptr [rcx + {head}], rax",
    "and rax, qword ptr [rip + .Lfdr_data + {ring_mask}]",
    "shl rax, 5",
    "lea rdi, [rcx + rax + {ring}]",
    "mov dword ptr [rdi + 24], r10d",
    "mov rax, qword ptr [rcx + {pending}]",
    "test rax, rax",
    "jnz 6f",
    "4:",
    "mov dword ptr [rdi + 28], eax",
    // The CPU, read every 64th hit of the thread (23 ns on a VM: as much as the rest).
    "test r8d, 63",
    "jnz 41f",
    "mov eax, {cpu_segment}",
    "lsl eax, ax",
    "and eax, 0xfff",
    "mov dword ptr [rcx + {cpu}], eax",
    "41:",
    "mov eax, dword ptr [rcx + {cpu}]",
    "shl rax, 56",
    "or rsi, rax",
    "or rsi, r11",
    "mov qword ptr [rdi + 16], rsi",
    "rdtsc",
    "shl rdx, 32",
    "or rax, rdx",
    "mov qword ptr [rdi + 8], rax",
    // Published: the commit word last (x86 keeps stores in order for other CPUs).
    "inc r8",
    "mov qword ptr [rdi], r8",
    "5:",
    "pop r8", "pop rdi", "pop rsi", "pop rdx", "pop rcx", "pop rax",
    "ret",
    // Events lost before this one (rax, not 0): at most 2^32 - 1 carried by this record.
    "6:",
    "mov edx, 0xffffffff",
    "cmp rax, rdx",
    "cmova rax, rdx",
    "sub qword ptr [rcx + {pending}], rax",
    "jmp 4b",
    // The ring is full: the event is lost, its number consumed.
    "7:",
    "inc qword ptr [rcx + {pending}]",
    "jmp 5b",
    // The thread's first hit: claim a free slot (rax: the thread's id).
    "8:",
    "mov r8, qword ptr [rip + .Lfdr_data + {slots}]",
    "xor edx, edx",
    "81:",
    "cmp rdx, qword ptr [rip + .Lfdr_data + {slot_count}]",
    "jae 83f",
    "mov edi, eax",
    "xor eax, eax",
    "lock cmpxchg dword ptr [r8 + {owner}], edi",
    "mov eax, edi",
    "je 82f",
    "inc rdx",
    "add r8, qword ptr [rip + .Lfdr_data + {slot_bytes}]",
    "jmp 81b",
    // Its process, once (a process forked while traced runs this code too): the only
    // system call the handler makes.
    "82:",
    "push r11",
    "push rax",
    "mov eax, {getpid}",
    "syscall",
    "mov dword ptr [r8 + {owner_pid}], eax",
    "pop rax",
    "pop r11",
    "lea ecx, [rdx + 1]",
    "mov rdi, qword ptr [rip + .Lfdr_data + {table}]",
    "mov dword ptr [rdi + rax*4], ecx",
    "jmp 3b",
    // None free: the thread goes without, counted, and is not looked for again.
    "83:",
    "mov rdi, qword ptr [rip + .Lfdr_data + {table}]",
    "mov dword ptr [rdi + rax*4], -1",
    // No slot: counted for all threads together.
    "9:",
    "mov rax, qword ptr [rip + .Lfdr_data + {header_at}]",
    "lock inc qword ptr [rax + {no_slot}]",
    "jmp 5b",
    ".balign 8",
    ".globl fdr_inline_data",
    ".hidden fdr_inline_data",
    "fdr_inline_data:",
    ".Lfdr_data:",
    ".zero {data_size}",
    ".globl fdr_inline_end",
    ".hidden fdr_inline_end",
    "fdr_inline_end:",
    ".popsection",
    entry = const KIND_ENTRY,
    tail = const KIND_TAIL,
    exit = const KIND_EXIT,
    tid_offset = const data::TID_OFFSET,
    table_len = const data::TABLE_LEN,
    table = const data::TABLE,
    slot_bytes = const data::SLOT_BYTES,
    slots = const data::SLOTS,
    slot_count = const data::SLOT_COUNT,
    ring_limit = const data::RING_LIMIT,
    ring_mask = const data::RING_MASK,
    header_at = const data::HEADER,
    data_size = const data::SIZE,
    seq = const slot::SEQ,
    head = const slot::HEAD,
    tail_pos = const slot::TAIL,
    pending = const slot::PENDING,
    ring = const slot::RING,
    owner = const slot::OWNER,
    no_slot = const header::NO_SLOT,
    cpu = const slot::CPU,
    owner_pid = const slot::PID,
    getpid = const libc::SYS_getpid,
    cpu_segment = const CPU_SEGMENT,
);

#[cfg(target_arch = "x86_64")]
extern "C" {
    static fdr_inline_begin: u8;
    static fdr_inline_entry: u8;
    static fdr_inline_tail: u8;
    static fdr_inline_exit: u8;
    static fdr_inline_data: u8;
    static fdr_inline_end: u8;
}

/// The handler's bytes, to copy into a process, and where its parts are in them.
pub struct Handler {
    /// The code and its (zeroed) data block.
    pub bytes: &'static [u8],
    /// Offset of the trampoline entry sleds call.
    pub entry: usize,
    /// Offset of the trampoline tail-call sleds call.
    pub tail: usize,
    /// Offset of the trampoline exit sleds jump to.
    pub exit: usize,
    /// Offset of the data block ([`data`]).
    pub data: usize,
}

/// No handler on this architecture (see above): nothing to copy.
#[cfg(not(target_arch = "x86_64"))]
pub fn handler() -> Handler {
    Handler {
        bytes: &[],
        entry: 0,
        tail: 0,
        exit: 0,
        data: 0,
    }
}

/// The handler as assembled into fdr-profiled.
#[cfg(target_arch = "x86_64")]
pub fn handler() -> Handler {
    // SAFETY: the symbols are labels of the block above, in this order, in one section; only
    // their addresses are taken, and the bytes between them are the block's.
    unsafe {
        let begin = std::ptr::addr_of!(fdr_inline_begin);
        let at = |p: *const u8| p as usize - begin as usize;
        let len = at(std::ptr::addr_of!(fdr_inline_end));
        Handler {
            bytes: std::slice::from_raw_parts(begin, len),
            entry: at(std::ptr::addr_of!(fdr_inline_entry)),
            tail: at(std::ptr::addr_of!(fdr_inline_tail)),
            exit: at(std::ptr::addr_of!(fdr_inline_exit)),
            data: at(std::ptr::addr_of!(fdr_inline_data)),
        }
    }
}
