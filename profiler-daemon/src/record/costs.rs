//! What the session's probes cost the traced program (issue 30: know the cost): the traps
//! measured before any probe of the session is placed (`Tracer::measure_trap_costs`), the
//! recording programs' own time from the kernel's BPF run-time statistics, turned on for the
//! first [`PROGRAM_STATS_FOR`] of the recording only (while on, every BPF program of the
//! system reads the clock twice more per run), and the recording's length. The session
//! estimates each function's cost from them (`SessionReport::probe_costs`).
use crate::kernel::bpf::{ProgramCost, RunTimeStats, Tracer};
use crate::session::summary::{ProbeCosts, TrapCosts};
use std::time::{Duration, Instant};

/// How long the recording programs' run time is sampled at the start of a recording: this
/// long, and until the program at the sleds has run (a program that starts calling late),
/// for [`PROGRAM_STATS_LONGEST`] at most.
pub const PROGRAM_STATS_FOR: Duration = Duration::from_secs(1);
pub const PROGRAM_STATS_LONGEST: Duration = Duration::from_secs(30);

/// Measures the traps (a warning, and no estimate, where that fails).
pub fn measure_traps(tracer: &mut Tracer) -> Option<TrapCosts> {
    match tracer.measure_trap_costs() {
        Ok(traps) => Some(traps),
        Err(err) => {
            errln!("fdr-profiled: warning: the probes' cost could not be measured ({err:#}): the summary has no estimate of it");
            None
        }
    }
}

/// The recording's side of the estimate: its length, and the programs' time sampled at its
/// start.
pub struct CostSampling {
    traps: TrapCosts,
    started: Instant,
    /// On while sampling; `None` once [`PROGRAM_STATS_FOR`] is over (or when it could not be
    /// turned on).
    stats: Option<RunTimeStats>,
    /// How long the statistics were on.
    sampled: Duration,
    /// The statistics are on for the whole session anyway (`--kernel-stats`).
    whole_session: bool,
}

impl CostSampling {
    /// Starts sampling now, as the recording starts.
    pub fn start(traps: TrapCosts, whole_session: bool) -> CostSampling {
        // Turning them on takes CAP_SYS_ADMIN, which a recording does not need otherwise:
        // without it the summary says the programs' own time is not known.
        let stats = if whole_session {
            None
        } else {
            RunTimeStats::enable().ok()
        };
        CostSampling {
            traps,
            started: Instant::now(),
            sampled: Duration::ZERO,
            whole_session,
            stats,
        }
    }

    /// Turns the statistics off once the sample is over (see [`PROGRAM_STATS_FOR`]); call it
    /// now and then.
    pub fn tick(&mut self, tracer: &Tracer) {
        let elapsed = self.started.elapsed();
        if self.stats.is_none() || elapsed < PROGRAM_STATS_FOR {
            return;
        }
        let ran = crate::kernel::bpf::recording_program_ns(&tracer.program_costs())
            .0
            .is_some();
        if ran || elapsed >= PROGRAM_STATS_LONGEST {
            self.stats = None;
            self.sampled = elapsed;
        }
    }

    /// The costs, as the recording ends; `programs` is what the kernel's statistics say of
    /// each program now.
    pub fn finish(mut self, programs: &[ProgramCost]) -> ProbeCosts {
        let recorded = self.started.elapsed();
        if self.stats.take().is_some() || self.whole_session {
            self.sampled = recorded;
        }
        let (sled, ret) = crate::kernel::bpf::recording_program_ns(programs);
        ProbeCosts {
            traps: self.traps,
            sled_program_ns: sled.unwrap_or(0.0),
            return_program_ns: ret.unwrap_or(0.0),
            program_stats_seconds: if sled.is_some() || ret.is_some() {
                self.sampled.as_secs_f64()
            } else {
                0.0
            },
            recorded_ns: u64::try_from(recorded.as_nanos()).unwrap_or(u64::MAX),
        }
    }
}
