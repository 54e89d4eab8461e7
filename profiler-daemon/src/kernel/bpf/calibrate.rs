//! What a probe hit costs a traced thread on this host (issue 30: know the cost): measured
//! once, at the start of a session, on a function of the daemon's own shaped like an XRay
//! function (an entry sled `jmp +9` and nine bytes of padding, then an exit sled `ret`), with
//! the empty programs (`floor`) on the probes the session would place: its entry alone, its
//! entry and a return probe, its entry and its exit sled. The kernel takes the same trap, and
//! emulates or single-steps the same instructions, as it does in the traced program; what the
//! recording programs add on top is the kernel's BPF run-time statistics' business
//! (`RunTimeStats`, sampled by the session).
//!
//! The function is x86-64 or AArch64 code (on AArch64: the entry sled `b #32` over seven NOPs,
//! the exit sled the same before the `ret`, as clang emits them there); on another
//! architecture nothing is measured, and what only the measurement uses is unused there.
#![cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(unused_imports, dead_code)
)]
use super::{Scope, Tracer};
use crate::plan::Probe;
use anyhow::{anyhow, Context as _, Result};
use aya::programs::uprobe::UProbeScope;
use profiler_common::{Cookie, SledKind, FLOOR_PROGRAM, FLOOR_RETURN_PROGRAM};
use std::num::NonZeroU32;
use std::path::PathBuf;

use fdr_session::schema::TrapCosts;

// The function the probes are measured on: an XRay x86-64 function with nothing in it. Its
// entry sled is `jmp +9` over a 9-byte NOP (the kernel emulates the jump), its exit sled a
// `ret` followed by a 10-byte NOP (the kernel single-steps the `ret`), byte for byte as clang
// emits them.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .text.fdr_calibration_leaf,\"ax\",@progbits",
    ".globl fdr_calibration_leaf",
    ".type fdr_calibration_leaf,@function",
    ".p2align 4",
    "fdr_calibration_leaf:",
    ".byte 0xeb, 0x09",
    ".byte 0x66, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x02, 0x00, 0x00",
    "fdr_calibration_leaf_exit:",
    "ret",
    ".byte 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x02, 0x00, 0x00",
    ".size fdr_calibration_leaf, . - fdr_calibration_leaf",
    ".popsection",
);

// The same on AArch64: entry sled, exit sled, `ret` (the kernel simulates both sleds' `b`).
#[cfg(target_arch = "aarch64")]
std::arch::global_asm!(
    ".pushsection .text.fdr_calibration_leaf,\"ax\",%progbits",
    ".globl fdr_calibration_leaf",
    ".type fdr_calibration_leaf,%function",
    ".p2align 2",
    "fdr_calibration_leaf:",
    ".inst 0x14000008",
    ".inst 0xd503201f, 0xd503201f, 0xd503201f, 0xd503201f, 0xd503201f, 0xd503201f, 0xd503201f",
    ".inst 0x14000008",
    ".inst 0xd503201f, 0xd503201f, 0xd503201f, 0xd503201f, 0xd503201f, 0xd503201f, 0xd503201f",
    "ret",
    ".size fdr_calibration_leaf, . - fdr_calibration_leaf",
    ".popsection",
);

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
unsafe extern "C" {
    fn fdr_calibration_leaf();
}

/// Bytes from the leaf's entry to its exit sled (x86-64: the `ret`; AArch64: the sled's `b`).
const EXIT_AT: u64 = if cfg!(target_arch = "aarch64") {
    32
} else {
    11
};

/// Calls of the leaf in one timed round, by what is probed (the exit sled's single step
/// costs about 15 times an entry's): each round takes a few milliseconds.
const CALLS_ENTRY: u32 = 4_000;
const CALLS_SLED: u32 = 500;
/// Rounds of each measurement; the median is kept.
const ROUNDS: usize = 7;

/// Nanoseconds per call of the leaf, the median of [`ROUNDS`] rounds of `calls` calls, in the
/// calling thread's CPU time (its own code and the kernel's traps, both charged to it): on a
/// loaded host, wall time would count the time other tasks ran while the thread waited for
/// a CPU, the median of rounds preempted as often as not, and every cost derived from the
/// measurement (the summary's, the overhead budget's) would be inflated by the load of the
/// moment (a CI host's measured five times the return probe's cost so, and a budget dropped
/// a function that cost it a third of what it estimated).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn time_calls(calls: u32) -> f64 {
    use rustix::time::{clock_gettime, ClockId};
    let cpu_ns = || {
        let t = clock_gettime(ClockId::ThreadCPUTime);
        t.tv_sec as f64 * 1e9 + t.tv_nsec as f64
    };
    let leaf: unsafe extern "C" fn() = std::hint::black_box(fdr_calibration_leaf);
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = cpu_ns();
            for _ in 0..calls {
                // SAFETY: the leaf only returns.
                unsafe { leaf() };
            }
            (cpu_ns() - start) / f64::from(calls)
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}

/// Where the leaf is: the daemon's own executable, and the leaf's offset in it.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn leaf_location() -> Result<(PathBuf, u64)> {
    let address = fdr_calibration_leaf as *const () as usize as u64;
    let maps = std::fs::read_to_string("/proc/self/maps").context("reading /proc/self/maps")?;
    for line in maps.lines() {
        // start-end perms offset dev inode path
        let mut fields = line.split_whitespace();
        let (Some(range), Some(_perms), Some(offset), Some(_dev), Some(_inode), Some(path)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(offset)) = (
            u64::from_str_radix(start, 16),
            u64::from_str_radix(end, 16),
            u64::from_str_radix(offset, 16),
        ) else {
            continue;
        };
        if (start..end).contains(&address) {
            return Ok((PathBuf::from(path), address - start + offset));
        }
    }
    Err(anyhow!(
        "the calibration function is in no mapping of a file"
    ))
}

impl Tracer {
    /// Measures what a probe hit costs on this host (see the module above). Takes about a
    /// tenth of a second; the probes it placed are removed on a thread of their own.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    pub fn measure_trap_costs(&mut self) -> Result<TrapCosts> {
        let (binary, at) = leaf_location()?;
        let me = NonZeroU32::new(std::process::id()).context("process id 0")?;
        let scope = UProbeScope::from(Scope::Process(me));
        let probe = |at: u64, kind: SledKind| Probe {
            file_offset: at,
            cookie: Cookie::new(0, kind),
        };
        let before = self.take_attachment();
        let mut measure = |placed: &[(&'static str, u64, SledKind)], calls: u32| -> Result<f64> {
            for &(program, at, kind) in placed {
                self.place(program, &[probe(at, kind)], &binary, scope)?;
            }
            let ns = time_calls(calls);
            let placed = self.take_attachment();
            let links = self.detach_later(placed);
            std::thread::Builder::new()
                .name("fdr-calibrated".into())
                .spawn(move || drop(links))
                .context("starting a thread to remove the calibration probes")?;
            Ok(ns)
        };
        let measured = (|| -> Result<TrapCosts> {
            let untraced = time_calls(CALLS_ENTRY);
            let entry = measure(&[(FLOOR_PROGRAM, at, SledKind::Entry)], CALLS_ENTRY)?;
            let with_return = measure(
                &[
                    (FLOOR_RETURN_PROGRAM, at, SledKind::Exit),
                    (FLOOR_PROGRAM, at, SledKind::Entry),
                ],
                CALLS_ENTRY,
            )?;
            let with_sled = measure(
                &[
                    (FLOOR_PROGRAM, at + EXIT_AT, SledKind::Exit),
                    (FLOOR_PROGRAM, at, SledKind::Entry),
                ],
                CALLS_SLED,
            )?;
            Ok(TrapCosts {
                entry_ns: (entry - untraced).max(0.0),
                return_probe_ns: (with_return - entry).max(0.0),
                exit_sled_ns: (with_sled - entry).max(0.0),
            })
        })();
        // What the caller had placed and not taken yet stays its own.
        let mine = std::mem::replace(&mut self.attachment, before);
        drop(self.detach_later(mine));
        if let Ok(traps) = &measured {
            self.trap_costs = Some(*traps);
        }
        measured
    }

    /// Not measured on this architecture yet.
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub fn measure_trap_costs(&mut self) -> Result<TrapCosts> {
        anyhow::bail!("probe costs are measured on x86-64 and AArch64 only")
    }
}
