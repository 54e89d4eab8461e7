//! What the daemon knows of the CPU architecture, in one place (issue 33): a ptrace-stopped
//! thread's registers by what they are for (program counter, stack pointer, a system call's
//! number, arguments and result), and the cycle counter. The eBPF programs' side is
//! `profiler-ebpf/src/regs.rs`; the XRay sleds' shapes are `xray-object`'s.
//!
//! x86-64 is the architecture everything is built and tested on. On AArch64 the daemon builds,
//! and what needs x86-64's own code (the inline engine's handler and sled bytes, the stack
//! repair's passes through the uretprobe trampoline, a system call) is refused in one line
//! ([`unsupported`]; the repair by [`repair_applies`], as arm64 does not need it).
use anyhow::{bail, Result};

/// The architecture's name, as `uname -m` says it.
pub const NAME: &str = std::env::consts::ARCH;

/// Debian's multiarch name of the architecture (`/usr/lib/<MULTIARCH>`, where the dynamic
/// loader looks for libraries).
pub const MULTIARCH: &str = if cfg!(target_arch = "aarch64") {
    "aarch64-linux-gnu"
} else {
    "x86_64-linux-gnu"
};

/// Whether a probe on an exit sled costs what a return probe does. On x86-64 the kernel
/// single-steps the sled's `ret` out of line (10 to 30 times a return probe: platform.md), so
/// `--exits auto` prefers return probes and repairs the stack for them. On AArch64 it simulates
/// the sled's first instruction, a `b`, instead of stepping it, and measured in the emulated
/// machine an exit sled costs 0.9x a return probe (BENCHMARKS.md, "aarch64"): exit sleds are
/// then both the cheapest way and safe under unwinding, and `auto` chooses them.
pub const EXIT_SLEDS_CHEAP: bool = cfg!(target_arch = "aarch64");

/// Fails with one line where the stack repair is not for this architecture: where exit sleds
/// are cheap ([`EXIT_SLEDS_CHEAP`]) they record exceptions and `longjmp` exactly at the cost
/// of return probes, and the repair has nothing to win; elsewhere it is x86-64 code
/// ([`unsupported`]). The one gate of every way to the repair.
pub fn repair_applies(what: &str) -> Result<()> {
    if EXIT_SLEDS_CHEAP {
        bail!(
            "{what}: not on {NAME}, where an exit sled costs what a return probe does: exit sleds \
             (what `auto` chooses here) record exceptions and longjmp exactly"
        );
    }
    unsupported(what)
}

/// Fails with one line saying `what` does not work on this architecture yet.
pub fn unsupported(what: &str) -> Result<()> {
    if cfg!(target_arch = "x86_64") {
        return Ok(());
    }
    bail!("{what} works on x86-64 only for now; this is {NAME}")
}

/// A stopped thread's general registers (`PTRACE_GETREGS`'s, or `NT_PRSTATUS` where that
/// request does not exist).
#[derive(Clone, Copy)]
pub struct Registers(libc::user_regs_struct);

impl Registers {
    /// The registers of `tid`, which this process traces and which is stopped.
    pub fn of(tid: u32) -> Option<Registers> {
        imp::get(tid).map(Registers)
    }

    /// Sets `tid`'s registers to these; whether it could.
    pub fn set(&self, tid: u32) -> bool {
        imp::set(tid, &self.0)
    }

    pub fn pc(&self) -> u64 {
        imp::pc(&self.0)
    }

    pub fn set_pc(&mut self, pc: u64) {
        imp::set_pc(&mut self.0, pc)
    }

    pub fn sp(&self) -> u64 {
        imp::sp(&self.0)
    }

    pub fn set_sp(&mut self, sp: u64) {
        imp::set_sp(&mut self.0, sp)
    }

    /// At a system-call stop: the number of the call being made.
    pub fn syscall(&self) -> u64 {
        imp::syscall(&self.0)
    }

    /// At a system-call stop, or before resuming: no system call is made (or restarted).
    pub fn cancel_syscall(&mut self) {
        imp::cancel_syscall(&mut self.0)
    }

    /// The registers that make system call `nr` with `args` when the thread executes the
    /// architecture's system-call instruction.
    pub fn prepare_syscall(&mut self, nr: u64, args: [u64; 6]) {
        imp::prepare_syscall(&mut self.0, nr, args)
    }

    /// After a system call: its result (a negative errno on failure).
    pub fn syscall_result(&self) -> i64 {
        imp::syscall_result(&self.0)
    }
}

/// The CPU's cycle counter (x86-64's TSC; AArch64's virtual counter, CNTVCT_EL0).
pub fn cycles() -> u64 {
    imp::cycles()
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use libc::user_regs_struct as Regs;

    fn ptrace(request: libc::c_uint, tid: u32, data: *mut libc::c_void) -> bool {
        // SAFETY: plain system call; `data` points at a `user_regs_struct` of the caller's.
        unsafe {
            libc::ptrace(
                request,
                tid as libc::pid_t,
                std::ptr::null_mut::<libc::c_void>(),
                data,
            ) == 0
        }
    }

    pub fn get(tid: u32) -> Option<Regs> {
        let mut out = std::mem::MaybeUninit::<Regs>::zeroed();
        // SAFETY: zeroed plain data; the kernel fills it on success.
        ptrace(libc::PTRACE_GETREGS, tid, out.as_mut_ptr().cast())
            .then(|| unsafe { out.assume_init() })
    }

    pub fn set(tid: u32, regs: &Regs) -> bool {
        ptrace(
            libc::PTRACE_SETREGS,
            tid,
            (regs as *const Regs).cast_mut().cast(),
        )
    }

    pub fn pc(r: &Regs) -> u64 {
        r.rip
    }

    pub fn set_pc(r: &mut Regs, pc: u64) {
        r.rip = pc;
    }

    pub fn sp(r: &Regs) -> u64 {
        r.rsp
    }

    pub fn set_sp(r: &mut Regs, sp: u64) {
        r.rsp = sp;
    }

    pub fn syscall(r: &Regs) -> u64 {
        r.orig_rax
    }

    pub fn cancel_syscall(r: &mut Regs) {
        r.orig_rax = u64::MAX;
    }

    pub fn prepare_syscall(r: &mut Regs, nr: u64, args: [u64; 6]) {
        r.rax = nr;
        r.orig_rax = u64::MAX;
        r.rdi = args[0];
        r.rsi = args[1];
        r.rdx = args[2];
        r.r10 = args[3];
        r.r8 = args[4];
        r.r9 = args[5];
    }

    pub fn syscall_result(r: &Regs) -> i64 {
        r.rax as i64
    }

    pub fn cycles() -> u64 {
        // SAFETY: rdtsc has no preconditions on x86-64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
}

#[cfg(target_arch = "aarch64")]
mod imp {
    use libc::user_regs_struct as Regs;

    /// `PTRACE_GETREGSET`/`SETREGSET` of `NT_PRSTATUS`: arm64 has no `PTRACE_GETREGS`.
    fn regset(request: libc::c_uint, tid: u32, regs: *mut Regs) -> bool {
        let mut iov = libc::iovec {
            iov_base: regs.cast(),
            iov_len: std::mem::size_of::<Regs>(),
        };
        // SAFETY: plain system call on a buffer of ours of the size the iovec says.
        unsafe {
            libc::ptrace(
                request,
                tid as libc::pid_t,
                libc::NT_PRSTATUS as usize as *mut libc::c_void,
                (&mut iov as *mut libc::iovec).cast::<libc::c_void>(),
            ) == 0
        }
    }

    pub fn get(tid: u32) -> Option<Regs> {
        let mut out = std::mem::MaybeUninit::<Regs>::zeroed();
        // SAFETY: zeroed plain data; the kernel fills it on success.
        regset(libc::PTRACE_GETREGSET, tid, out.as_mut_ptr()).then(|| unsafe { out.assume_init() })
    }

    pub fn set(tid: u32, regs: &Regs) -> bool {
        let mut copy = *regs;
        regset(libc::PTRACE_SETREGSET, tid, &mut copy)
    }

    pub fn pc(r: &Regs) -> u64 {
        r.pc
    }

    pub fn set_pc(r: &mut Regs, pc: u64) {
        r.pc = pc;
    }

    pub fn sp(r: &Regs) -> u64 {
        r.sp
    }

    pub fn set_sp(r: &mut Regs, sp: u64) {
        r.sp = sp;
    }

    /// x8 holds the number at the system-call stop.
    pub fn syscall(r: &Regs) -> u64 {
        r.regs[8]
    }

    /// Cancelling a system call on arm64 takes the `NT_ARM_SYSTEM_CALL` regset; nothing here
    /// uses it yet (the callers are refused on arm64, see `unsupported`).
    pub fn cancel_syscall(_: &mut Regs) {}

    pub fn prepare_syscall(r: &mut Regs, nr: u64, args: [u64; 6]) {
        r.regs[8] = nr;
        r.regs[..6].copy_from_slice(&args);
    }

    pub fn syscall_result(r: &Regs) -> i64 {
        r.regs[0] as i64
    }

    pub fn cycles() -> u64 {
        let count: u64;
        // SAFETY: reading the virtual counter is allowed at EL0 on Linux.
        unsafe { core::arch::asm!("mrs {}, cntvct_el0", out(reg) count) };
        count
    }
}
