//! Reading the traced thread's registers at a sled.
use aya_ebpf::{programs::ProbeContext, EbpfContext};

/// The System V integer argument registers rdi, rsi, rdx, rcx, r8, r9. At an entry sled (the
/// function's first instruction) they still hold the arguments.
pub fn args(ctx: &ProbeContext) -> [u64; 6] {
    let r = ctx.as_ptr() as *const aya_ebpf::bindings::pt_regs;
    // SAFETY: the context of a uprobe program is the traced thread's pt_regs; reading its
    // fields is what the verifier allows.
    unsafe { [(*r).rdi, (*r).rsi, (*r).rdx, (*r).rcx, (*r).r8, (*r).r9] }
}

/// The register with x86-64 number `n` (0 rax, 1 rcx, 2 rdx, 3 rbx, 4 rsp, 5 rbp, 6 rsi,
/// 7 rdi, 8..15 r8..r15), as the daemon decoded it from the sled's instructions.
///
/// The verifier only accepts context loads at constant offsets, so every register is loaded
/// (volatile: the compiler must not turn the loads into one load at a computed offset) and the
/// wanted one is picked from the copy.
pub fn read(ctx: &ProbeContext, n: u8) -> u64 {
    let r = ctx.as_ptr() as *const aya_ebpf::bindings::pt_regs;
    // SAFETY: as above.
    let all: [u64; 16] = unsafe {
        use core::ptr::{addr_of, read_volatile as v};
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
    };
    all[(n & 15) as usize]
}
