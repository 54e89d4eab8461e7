//! Loading the eBPF object and placing the uprobes of an [`AttachPlan`].
use crate::plan::AttachPlan;
use anyhow::{anyhow, bail, Context as _, Result};
use aya::maps::{MapData, PerCpuArray, RingBuf};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use aya::programs::UProbe;
use aya::{Ebpf, EbpfLoader};
use profiler_common::{EVENTS_MAP, LOST_MAP, SLED_PROGRAM};
use std::num::NonZeroU32;

/// The eBPF object built by `build.rs` from the `profiler-ebpf` crate.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));

/// The loaded programs and maps. Dropping it detaches every probe.
pub struct Tracer {
    ebpf: Ebpf,
}

/// Which processes the probes fire for.
#[derive(Clone, Copy, Debug)]
pub enum Scope {
    /// Every process that runs the binary, now or later.
    AllProcesses,
    /// Only this process (all of its threads).
    Process(NonZeroU32),
}

impl Tracer {
    /// Loads the programs with an events ring buffer of `ring_bytes` bytes (a power of two and a
    /// multiple of the page size, as the kernel requires).
    pub fn load(ring_bytes: u32) -> Result<Tracer> {
        let page = page_size();
        if !ring_bytes.is_power_of_two() || ring_bytes < page {
            bail!(
                "--buffer-size must be a power of two of at least {page} bytes, not {ring_bytes}"
            );
        }
        raise_memlock_limit();
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(EVENTS_MAP, ring_bytes)
            .load(EBPF_OBJECT)
            .map_err(|e| anyhow!("loading the eBPF programs failed: {}", one_line(&e)))?;
        let program: &mut UProbe = ebpf
            .program_mut(SLED_PROGRAM)
            .context("the eBPF object has no sled program")?
            .try_into()?;
        program
            .load()
            .map_err(|e| anyhow!("the kernel refused the sled program: {}", one_line(&e)))?;
        Ok(Tracer { ebpf })
    }

    /// Places one uprobe per planned probe. Returns how many were placed.
    pub fn attach(&mut self, plan: &AttachPlan, scope: Scope) -> Result<usize> {
        raise_fd_limit(plan.probes.len());
        let program: &mut UProbe = self
            .ebpf
            .program_mut(SLED_PROGRAM)
            .context("the eBPF object has no sled program")?
            .try_into()?;
        let scope = match scope {
            Scope::AllProcesses => UProbeScope::AllProcesses,
            Scope::Process(pid) => UProbeScope::OneProcess(pid),
        };
        for probe in &plan.probes {
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(probe.file_offset),
                cookie: Some(probe.cookie.encode()),
            };
            program.attach(point, &plan.binary, scope).map_err(|e| {
                anyhow!(
                    "cannot place a uprobe at offset {:#x} of {}: {}",
                    probe.file_offset,
                    plan.binary.display(),
                    one_line(&e)
                )
            })?;
        }
        Ok(plan.probes.len())
    }

    /// Takes the events ring buffer out (the reader owns it from then on).
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>> {
        let map = self
            .ebpf
            .take_map(EVENTS_MAP)
            .context("the eBPF object has no events map")?;
        Ok(RingBuf::try_from(map)?)
    }

    /// Takes the lost-events counter out.
    pub fn take_lost_counter(&mut self) -> Result<LostCounter> {
        let map = self
            .ebpf
            .take_map(LOST_MAP)
            .context("the eBPF object has no lost-events map")?;
        Ok(LostCounter(PerCpuArray::try_from(map)?))
    }
}

/// Count of events the kernel side could not write because the ring buffer was full.
pub struct LostCounter(PerCpuArray<MapData, u64>);

impl LostCounter {
    /// Total over all CPUs.
    pub fn total(&self) -> Result<u64> {
        let values = self.0.get(&0, 0)?;
        Ok(values.iter().sum())
    }
}

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

/// Each uprobe is one perf-event file descriptor: make room for `probes` of them.
fn raise_fd_limit(probes: usize) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointer to an rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return;
    }
    let wanted = (probes as u64).saturating_add(1024).max(lim.rlim_cur);
    if wanted > lim.rlim_cur {
        let new = libc::rlimit {
            rlim_cur: wanted.max(lim.rlim_max),
            rlim_max: wanted.max(lim.rlim_max),
        };
        // SAFETY: valid pointer; failure leaves the old limit, and attach reports EMFILE.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) };
    }
}
