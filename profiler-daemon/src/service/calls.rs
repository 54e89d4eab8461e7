//! What a binary's probes cost its processes now (issue 30: know the cost), for `status`:
//! each function's calls counted as the router hands its entries on (an array increment per
//! event: every event passes there anyway), turned at each status period into calls per
//! second, and, with what a probe hit was measured to cost at the service's start
//! ([`ProbeCosts`]), into an estimated share of a CPU. Calls whose events the kernel lost are
//! not counted (the status says how many events were lost).
use crate::kernel::bpf::{recording_program_ns, RunTimeStats, Tracer};
use crate::session::summary::ProbeCosts;
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// Highest function id (within its object) counted: XRay's are dense from 1, and a larger one
/// (never from our own probes) is left out rather than grow the table.
const MAX_FUNCTION_ID: u32 = 1 << 20;
/// Functions `status` names, the costliest first.
pub const COSTLIEST: usize = 5;

/// One function's calls over the last period.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FunctionRate {
    /// Packed function id (object id and XRay id).
    pub id: u32,
    pub calls_per_second: f64,
    /// Estimated share of a CPU its probes cost (1.0: one CPU).
    pub cpu_share: f64,
}

/// One binary's calls by function, and their rates over the last period.
#[derive(Debug, Default)]
pub struct FunctionCalls {
    /// Calls so far, by XRay object id then function id.
    counts: Vec<Vec<u64>>,
    /// `counts` at the end of the last period.
    before: Vec<Vec<u64>>,
    /// The last period's functions, costliest first.
    rates: Vec<FunctionRate>,
    /// Calls per second of all functions over the last period.
    pub calls_per_second: f64,
    /// Estimated share of a CPU (1.0: one CPU) the probes cost over the last period.
    pub cpu_share: f64,
}

impl FunctionCalls {
    /// One entry of function `function_id` of object `object_id`.
    #[inline]
    pub fn entered(&mut self, object_id: u32, function_id: u32) {
        if function_id >= MAX_FUNCTION_ID {
            return;
        }
        let (o, f) = (object_id as usize, function_id as usize);
        if o >= self.counts.len() {
            self.counts.resize_with(o + 1, Vec::new);
        }
        let calls = &mut self.counts[o];
        if f >= calls.len() {
            calls.resize(f + 1, 0);
        }
        calls[f] += 1;
    }

    /// Ends a period of `seconds`: the rates over it, estimated with `costs` and each
    /// function's exit method (`return_probed`: packed ids whose exits a return probe sees).
    pub fn tick(&mut self, seconds: f64, costs: &ProbeCosts, return_probed: &HashSet<u32>) {
        if seconds <= 0.0 {
            return;
        }
        let per_call = |id: u32| {
            costs.per_call_ns(if return_probed.contains(&id) {
                "return"
            } else {
                "sleds"
            })
        };
        let mut rates = Vec::new();
        for (o, calls) in self.counts.iter().enumerate() {
            let before = self.before.get(o).map_or(&[][..], Vec::as_slice);
            for (f, &n) in calls.iter().enumerate() {
                let new = n - before.get(f).copied().unwrap_or(0);
                if new > 0 {
                    let id = crate::plan::packed_id(o as u32, f as u32);
                    let calls_per_second = new as f64 / seconds;
                    rates.push(FunctionRate {
                        id,
                        calls_per_second,
                        cpu_share: calls_per_second * per_call(id) / 1e9,
                    });
                }
            }
        }
        self.calls_per_second = rates.iter().map(|r| r.calls_per_second).sum();
        self.cpu_share = rates.iter().map(|r| r.cpu_share).sum();
        rates.sort_by(|a, b| {
            b.cpu_share
                .total_cmp(&a.cpu_share)
                .then(b.calls_per_second.total_cmp(&a.calls_per_second))
                .then(a.id.cmp(&b.id))
        });
        self.rates = rates;
        self.before.clone_from(&self.counts);
    }

    /// The costliest functions of the last period.
    pub fn costliest(&self) -> &[FunctionRate] {
        &self.rates[..self.rates.len().min(COSTLIEST)]
    }
}

/// How long the recording programs' run time is sampled (this long, and until the program at
/// the sleds has run in it, [`PROGRAM_STATS_LONGEST`] at most), and how often.
const PROGRAM_STATS_FOR: Duration = Duration::from_secs(1);
const PROGRAM_STATS_LONGEST: Duration = Duration::from_secs(30);
const PROGRAM_STATS_EVERY: Duration = Duration::from_secs(600);

/// What a probe hit costs: the traps measured at the service's start, the recording programs'
/// own time from the kernel's BPF run-time statistics, turned on for [`PROGRAM_STATS_FOR`]
/// every [`PROGRAM_STATS_EVERY`] (while on, every BPF program of the host reads the clock
/// twice more per run; turning them on takes CAP_SYS_ADMIN: without it they stay unknown).
pub struct ServiceCosts {
    pub costs: ProbeCosts,
    /// The statistics, while on, since when, and the program at the sleds' runs then.
    sampling: Option<(RunTimeStats, Instant, u64)>,
    last_sample: Instant,
}

impl ServiceCosts {
    /// Measures the traps (see `Tracer::measure_trap_costs`) and starts sampling the
    /// programs; `None`, said, where the traps cannot be measured.
    pub fn measure(tracer: &mut Tracer) -> Option<ServiceCosts> {
        match tracer.measure_trap_costs() {
            Ok(traps) => Some(ServiceCosts {
                costs: ProbeCosts {
                    traps,
                    ..ProbeCosts::default()
                },
                sampling: RunTimeStats::enable()
                    .ok()
                    .map(|s| (s, Instant::now(), sled_runs(tracer))),
                last_sample: Instant::now(),
            }),
            Err(err) => {
                tracing::warn!(
                    "the probes' cost could not be measured ({err:#}): status has no estimate of it"
                );
                None
            }
        }
    }

    /// Ends a sample that is over (the programs' mean times taken from `tracer`), or starts
    /// the next one when it is due; call it now and then.
    pub fn tick(&mut self, tracer: &Tracer) {
        match &self.sampling {
            Some((_, since, runs))
                if since.elapsed() >= PROGRAM_STATS_FOR
                    && (sled_runs(tracer) > *runs || since.elapsed() >= PROGRAM_STATS_LONGEST) =>
            {
                let sampled = since.elapsed();
                self.sampling = None;
                let (sled, ret) = recording_program_ns(&tracer.program_costs());
                // The kernel's counts add up over every sample: the means are of all of them.
                if let Some(sled) = sled {
                    self.costs.sled_program_ns = sled;
                }
                if let Some(ret) = ret {
                    self.costs.return_program_ns = ret;
                }
                if sled.is_some() || ret.is_some() {
                    self.costs.program_stats_seconds += sampled.as_secs_f64();
                }
                self.last_sample = Instant::now();
            }
            None if self.last_sample.elapsed() >= PROGRAM_STATS_EVERY => {
                self.sampling = RunTimeStats::enable()
                    .ok()
                    .map(|s| (s, Instant::now(), sled_runs(tracer)));
                self.last_sample = Instant::now();
            }
            _ => {}
        }
    }
}

/// Runs of the program at the sleds the kernel's statistics have counted.
fn sled_runs(tracer: &Tracer) -> u64 {
    tracer
        .program_costs()
        .iter()
        .find(|p| p.program == profiler_common::SLED_PROGRAM)
        .map_or(0, |p| p.runs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::summary::TrapCosts;

    #[test]
    fn rates_are_the_period_s_calls_and_the_costliest_come_first() {
        let costs = ProbeCosts {
            traps: TrapCosts {
                entry_ns: 400.0,
                return_probe_ns: 200.0,
                exit_sled_ns: 10_000.0,
            },
            sled_program_ns: 100.0,
            return_program_ns: 100.0,
            ..ProbeCosts::default()
        };
        let mut calls = FunctionCalls::default();
        // Function 3 of the executable (return probe: 800 ns a call), 1,000 calls; function
        // 2 of object 1 (exit sleds: 10,600 ns a call), 100 calls.
        for _ in 0..1000 {
            calls.entered(0, 3);
        }
        for _ in 0..100 {
            calls.entered(1, 2);
        }
        let return_probed: HashSet<u32> = [3].into();
        calls.tick(2.0, &costs, &return_probed);
        let lib = crate::plan::packed_id(1, 2);
        let ids: Vec<(u32, f64)> = calls
            .costliest()
            .iter()
            .map(|r| (r.id, r.calls_per_second))
            .collect();
        assert_eq!(ids, [(lib, 50.0), (3, 500.0)]);
        assert!((calls.costliest()[1].cpu_share - 500.0 * 800.0 / 1e9).abs() < 1e-12);
        assert_eq!(calls.calls_per_second, 550.0);
        let want = (500.0 * 800.0 + 50.0 * 10_600.0) / 1e9;
        assert!(
            (calls.cpu_share - want).abs() < 1e-12,
            "{}",
            calls.cpu_share
        );
        // The next period counts only its own calls.
        calls.entered(0, 3);
        calls.tick(1.0, &costs, &return_probed);
        assert_eq!(
            calls.costliest().iter().map(|r| r.id).collect::<Vec<_>>(),
            [3]
        );
        assert_eq!(calls.calls_per_second, 1.0);
        // A function id past the table's bound is not counted.
        calls.entered(0, MAX_FUNCTION_ID);
        calls.tick(1.0, &costs, &return_probed);
        assert!(calls.costliest().is_empty());
    }
}
