//! `fdr-profiled bench-attach` (hidden; run by `cargo xtask bench attach`): times placing and
//! removing every probe of a binary's attach plan, either with `uprobe_multi` links or with one
//! perf event per probe (the fallback for kernels without them), and counts the file
//! descriptors the probes hold. Prints one JSON object.
use crate::kernel::bpf::EBPF_OBJECT;
use crate::kernel::rlimit;
use crate::kernel::uprobe_multi::{self, MultiProgram};
use crate::plan::AttachPlan;
use anyhow::{anyhow, Context as _, Result};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use aya::programs::UProbe;
use profiler_common::SLED_PROGRAM;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Options of `bench-attach`.
#[derive(Debug, clap::Args)]
pub struct BenchAttachArgs {
    /// How probes are placed.
    #[arg(long, value_enum)]
    pub mode: AttachMode,
    /// Place only the first N probes of the plan.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// The instrumented binary (probes fire in every process running it).
    pub binary: PathBuf,
}

/// How `bench-attach` places probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    /// One `uprobe_multi` link for all probes.
    Multi,
    /// One perf event (and descriptor) per probe, through aya.
    Perf,
}

/// Runs the measurement and prints its JSON result.
pub fn run(args: &BenchAttachArgs) -> Result<u8> {
    let plan = AttachPlan::for_binary(&args.binary)?;
    let count = args.limit.unwrap_or(usize::MAX).min(plan.probes.len());
    let probes = &plan.probes[..count];
    let mut ebpf = crate::kernel::bpf::object_loader()
        .load(EBPF_OBJECT)
        .map_err(|e| anyhow!("loading the eBPF object: {e}"))?;
    let (attach, fds, detach) = match args.mode {
        AttachMode::Multi => {
            let program = MultiProgram::load(&ebpf, EBPF_OBJECT, SLED_PROGRAM)?;
            let offsets: Vec<u64> = probes.iter().map(|p| p.file_offset).collect();
            let cookies: Vec<u64> = probes.iter().map(|p| p.cookie.encode()).collect();
            let before = rlimit::open_files();
            let start = Instant::now();
            let link =
                uprobe_multi::attach(program.fd(), &plan.binary, &offsets, &cookies, None, false)
                    .context("uprobe_multi attach")?;
            let attach = start.elapsed();
            let fds = rlimit::open_files() - before;
            let start = Instant::now();
            drop(link);
            (attach, fds, start.elapsed())
        }
        AttachMode::Perf => {
            let program: &mut UProbe = ebpf
                .program_mut(SLED_PROGRAM)
                .context("the eBPF object has no sled program")?
                .try_into()?;
            program.load()?;
            rlimit::reserve_open_files(probes.len())?;
            let before = rlimit::open_files();
            let start = Instant::now();
            let mut links = Vec::with_capacity(probes.len());
            for probe in probes {
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(probe.file_offset),
                    cookie: Some(probe.cookie.encode()),
                };
                let link = program
                    .attach(point, &plan.binary, UProbeScope::AllProcesses)
                    .with_context(|| format!("perf-event uprobe #{}", links.len()))?;
                links.push(link);
            }
            let attach = start.elapsed();
            let fds = rlimit::open_files() - before;
            // One at a time, as dropping aya's links does. Each removal waits for RCU grace
            // periods under a lock, so closing from several threads is no faster (measured).
            let start = Instant::now();
            for link in links {
                program.detach(link)?;
            }
            (attach, fds, start.elapsed())
        }
    };
    outln!(
        "{}",
        serde_json::json!({
            "mode": format!("{:?}", args.mode).to_lowercase(),
            "functions": plan.functions,
            "plan_probes": plan.probes.len(),
            "probes": count,
            "attach_s": secs(attach),
            "detach_s": secs(detach),
            "fds": fds,
        })
    );
    Ok(0)
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
