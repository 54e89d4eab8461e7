//! The kernel half of fdr-profiled: one uprobe program, attached to every XRay sled.
//!
//! Each hit writes one [`SledEvent`] into a BPF ring buffer. The cookie set at attach time says
//! which function and which kind of sled fired, so the program does no lookups at all. Writes use
//! `BPF_RB_NO_WAKEUP`: waking the reader per event costs several times the probe itself
//! (platform.md), so the daemon drains on a timer instead.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
    },
    macros::{map, uprobe},
    maps::{PerCpuArray, RingBuf},
    programs::ProbeContext,
    EbpfContext,
};
use profiler_common::{Cookie, SledEvent, SledKind, DEFAULT_RING_BYTES};

/// Events for the daemon. Its size is set by the daemon at load time (`--buffer-size`).
#[map(name = "EVENTS")]
static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

/// Per-CPU count of events that found the ring buffer full.
#[map(name = "LOST")]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[uprobe]
pub fn sled(ctx: ProbeContext) -> u32 {
    // SAFETY: plain BPF helper calls; the context pointer comes from the kernel.
    let (cookie, ts_ns, cpu) = unsafe {
        (
            bpf_get_attach_cookie(ctx.as_ptr()),
            bpf_ktime_get_ns(),
            bpf_get_smp_processor_id(),
        )
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    // At a LOG_ARGS_ENTRY sled (the function's first instruction) rdi still holds the first
    // argument; XRay's own runtime logs exactly that one.
    let arg = if Cookie::decode(cookie).kind == SledKind::LogArgsEntry as u8 {
        ctx.arg::<u64>(0).unwrap_or(0)
    } else {
        0
    };
    match EVENTS.reserve::<SledEvent>(0) {
        Some(mut entry) => {
            entry.write(SledEvent {
                ts_ns,
                pid: (pid_tgid >> 32) as u32,
                tid: pid_tgid as u32,
                cookie,
                cpu,
                reserved: 0,
                arg,
            });
            entry.submit(BPF_RB_NO_WAKEUP as u64);
        }
        None => {
            if let Some(lost) = LOST.get_ptr_mut(0) {
                // SAFETY: per-CPU slot, so no other writer can race with this increment.
                unsafe { *lost += 1 };
            }
        }
    }
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
