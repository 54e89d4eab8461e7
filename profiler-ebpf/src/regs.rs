//! Reading the traced thread's registers at a probe: the one place the programs know the
//! architecture (`bpf_target_arch`, set by aya-build from the daemon's target).
//!
//! The frame's identity the programs and the daemon use is where the stack pointer was at
//! the function's entry sled ([`sp`]): on x86-64 the address of its return-address slot (the
//! `call` pushed it); on AArch64 the caller's stack pointer (`bl` leaves the return address in
//! x30, and a function restores `sp` before its `ret`). A return probe fires once the function
//! has returned: [`return_slot`] gives the same identity from there.
use aya_ebpf::{programs::ProbeContext, EbpfContext};
use core::ffi::c_void;

#[cfg(bpf_target_arch = "x86_64")]
mod arch {
    use core::ptr::{addr_of, read_volatile as v};

    pub type Regs = aya_ebpf::bindings::pt_regs;

    /// The System V integer argument registers rdi, rsi, rdx, rcx, r8, r9. At an entry sled
    /// (the function's first instruction) they still hold the arguments.
    pub unsafe fn args(r: *const Regs) -> [u64; 6] {
        [(*r).rdi, (*r).rsi, (*r).rdx, (*r).rcx, (*r).r8, (*r).r9]
    }

    /// How many registers [`all`] reads.
    pub const COUNT: usize = 16;

    /// Every general register, by x86-64 number (0 rax, 1 rcx, 2 rdx, 3 rbx, 4 rsp, 5 rbp,
    /// 6 rsi, 7 rdi, 8..15 r8..r15).
    pub unsafe fn all(r: *const Regs) -> [u64; COUNT] {
        [
            v(addr_of!((*r).rax)),
            v(addr_of!((*r).rcx)),
            v(addr_of!((*r).rdx)),
            v(addr_of!((*r).rbx)),
            v(addr_of!((*r).rsp)),
            v(addr_of!((*r).rbp)),
            v(addr_of!((*r).rsi)),
            v(addr_of!((*r).rdi)),
            v(addr_of!((*r).r8)),
            v(addr_of!((*r).r9)),
            v(addr_of!((*r).r10)),
            v(addr_of!((*r).r11)),
            v(addr_of!((*r).r12)),
            v(addr_of!((*r).r13)),
            v(addr_of!((*r).r14)),
            v(addr_of!((*r).r15)),
        ]
    }

    pub unsafe fn sp(r: *const Regs) -> u64 {
        (*r).rsp
    }

    /// `ret` popped the return-address slot: it was just below.
    pub const RETURN_SLOT_BELOW: u64 = 8;
}

#[cfg(bpf_target_arch = "aarch64")]
mod arch {
    use core::ptr::{addr_of, read_volatile as v};

    /// A uprobe's context on arm64 begins with the user registers.
    pub type Regs = aya_ebpf::bindings::user_pt_regs;

    /// AAPCS64's first argument registers x0 to x5 (XRay logs at most six).
    pub unsafe fn args(r: *const Regs) -> [u64; 6] {
        let x = &(*r).regs;
        [x[0], x[1], x[2], x[3], x[4], x[5]]
    }

    /// How many registers [`all`] reads: x0 to x30 (an event sled may take its arguments from
    /// a callee-saved register, x19 to x28), and an unused slot.
    pub const COUNT: usize = 32;

    /// x0 to x30, by number.
    pub unsafe fn all(r: *const Regs) -> [u64; COUNT] {
        let x = addr_of!((*r).regs) as *const u64;
        let mut all = [0u64; COUNT];
        let mut i = 0;
        while i < 31 {
            all[i] = v(x.add(i));
            i += 1;
        }
        all
    }

    pub unsafe fn sp(r: *const Regs) -> u64 {
        (*r).sp
    }

    /// `ret` moves no stack: the caller's stack pointer is the one the entry saw.
    pub const RETURN_SLOT_BELOW: u64 = 0;
}

fn regs(ctx: *mut c_void) -> *const arch::Regs {
    ctx as *const arch::Regs
}

/// The argument registers at an entry sled.
pub fn args(ctx: &ProbeContext) -> [u64; 6] {
    // SAFETY: the context of a uprobe program is the traced thread's registers; reading its
    // fields is what the verifier allows.
    unsafe { arch::args(regs(ctx.as_ptr())) }
}

/// The register numbered `n` (x86-64's numbering, or x`n` on arm64), as the daemon decoded it
/// from the sled's instructions.
///
/// The verifier only accepts context loads at constant offsets, so every register is loaded
/// (volatile: the compiler must not turn the loads into one load at a computed offset) and the
/// wanted one is picked from the copy.
pub fn read(ctx: &ProbeContext, n: u8) -> u64 {
    // SAFETY: as above.
    let all = unsafe { arch::all(regs(ctx.as_ptr())) };
    // COUNT is a power of two: the mask keeps the index in bounds for the verifier.
    all[n as usize & (arch::COUNT - 1)]
}

/// The stack pointer at the probe.
pub fn sp(ctx: *mut c_void) -> u64 {
    // SAFETY: as above.
    unsafe { arch::sp(regs(ctx)) }
}

/// A returned function's frame identity (its entry's [`sp`]), from a return probe.
pub fn return_slot(ctx: *mut c_void) -> u64 {
    sp(ctx).wrapping_sub(arch::RETURN_SLOT_BELOW)
}
