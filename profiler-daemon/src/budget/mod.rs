//! The overhead budget (`--max-overhead`, a service target's `max_overhead`): what the probes
//! may cost the traced program, and the functions that stop being traced while they would
//! cost more.
//!
//! - The kernel counts each budgeted function's calls (`kernel::bpf::CallCounts`); every
//!   second [`Controller::observe`] turns them, the measured cost of one call
//!   (`session::summary::ProbeCosts::per_call_ns`) and the CPU time the traced threads used
//!   ([`load`]) into the overhead the probes add, and decides which functions to drop or
//!   re-admit.
//! - [`probes`] places each function's probes as a set of its own, so that one can be
//!   removed (on a thread: the kernel takes tens of milliseconds per link) and placed again.
//!
//! The overhead is the probes' time over the time the program's threads had to run in:
//! over a period, with `n` threads that used the CPU, the probes take a share
//! `s = probe_time / (n * period)` of each; a thread busy all along then runs its own code
//! `1 / (1 - s)` times slower, and that slowdown less one, `s / (1 - s)`, is the overhead
//! compared with the limit. A CPU-bound program keeps at least `1 / (1 + limit)` of its
//! throughput (95% at 5%); an idle one pays little whatever it calls, and gets its functions
//! back when its load falls. Shares of the process's CPU time alone would not: they stay
//! the same whether the program is busy or quiet.
pub mod load;
pub mod probes;
pub mod watch;

use anyhow::{bail, Result};

/// After dropping, the overhead aimed at, as a share of the limit: the program runs faster
/// without the dropped probes and calls the others more often.
pub const DROP_TO: f64 = 0.7;
/// Functions come back only while the overhead with them would stay under this share of the
/// limit, and only after [`HOLD_NS`] without them: what keeps a function from flapping.
pub const READMIT_UNDER: f64 = 0.5;
pub const HOLD_NS: u64 = 10_000_000_000;

/// Parses a budget: `5%`, `5` (percent), `0.5%`; more than 0 and at most 10000%.
pub fn parse_percent(text: &str) -> Result<f64> {
    let number = text.trim().trim_end_matches('%').trim();
    let Ok(pct) = number.parse::<f64>() else {
        bail!("not a percentage: {text:?} (for example 5%)");
    };
    if !(pct > 0.0 && pct <= 10_000.0) {
        bail!("a budget must be more than 0% and at most 10000%: {text:?}");
    }
    Ok(pct / 100.0)
}

/// What one period measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// Monotonic time now, and the period's length.
    pub now_ns: u64,
    pub period_ns: u64,
    /// The traced program's threads that used the CPU in the period.
    pub threads: u32,
    /// The CPU time they used (their own code and the probes' traps).
    pub cpu_ns: u64,
    /// Time the threads spent stopped for the stack repair that no budgeted function is
    /// charged with (frames of functions outside the budget); the rest comes with each
    /// function's [`Counts`].
    pub stopped_ns: u64,
}

/// What the kernel and the repair keepers counted for one function so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Its calls (entries).
    pub calls: u64,
    /// Its share of the time threads spent stopped for the stack repair at throws through
    /// its hooked frames (`profiler_common::STOP_TIMES_MAP`).
    pub stopped_ns: u64,
}

/// A function dropped or re-admitted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Change {
    /// Its index (see [`Controller::add`]).
    pub function: usize,
    /// Dropped (else re-admitted).
    pub dropped: bool,
    /// Its calls a second: measured (dropped), or predicted from its calls per second of the
    /// threads' CPU time when it was dropped (re-admitted).
    pub calls_per_second: f64,
    /// The overhead its probes alone add (dropped) or would add (re-admitted), as a fraction.
    pub overhead: f64,
}

/// What the probes cost in the last period.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    /// The overhead of the functions traced, before this period's changes (fraction).
    pub overhead: f64,
    /// ... and after them, as estimated.
    pub overhead_after: f64,
    /// The probes' time in the period, as a share of one CPU.
    pub cpu_share: f64,
    /// Calls a second of the functions traced.
    pub calls_per_second: f64,
}

#[derive(Clone, Copy, Debug)]
enum State {
    Traced,
    /// Since `at_ns`; it made `calls_per_cpu_ns` calls, and cost `ns_per_cpu_ns` (its
    /// share of the repair's stops included), per nanosecond of the threads' CPU time then:
    /// what it would cost again.
    Dropped {
        at_ns: u64,
        calls_per_cpu_ns: f64,
        ns_per_cpu_ns: f64,
    },
}

#[derive(Clone, Copy, Debug)]
struct Function {
    cost_ns: f64,
    /// Its counts at the last look.
    seen: Counts,
    state: State,
}

/// The decisions of one budget.
#[derive(Debug)]
pub struct Controller {
    limit: f64,
    functions: Vec<Function>,
}

impl Controller {
    /// A budget of `limit` (a fraction: 0.05 for 5%).
    pub fn new(limit: f64) -> Controller {
        Controller {
            limit,
            functions: Vec::new(),
        }
    }

    /// The limit (a fraction).
    pub fn limit(&self) -> f64 {
        self.limit
    }

    /// Adds a traced function whose calls cost `cost_ns` each, counted `counts` so far;
    /// returns its index.
    pub fn add(&mut self, cost_ns: f64, counts: Counts) -> usize {
        self.functions.push(Function {
            cost_ns,
            seen: counts,
            state: State::Traced,
        });
        self.functions.len() - 1
    }

    /// Forgets the functions added after the first `n` (an attach undone).
    pub fn truncate(&mut self, n: usize) {
        self.functions.truncate(n);
    }

    /// Whether function `index` is dropped now.
    pub fn is_dropped(&self, index: usize) -> bool {
        matches!(
            self.functions.get(index).map(|f| f.state),
            Some(State::Dropped { .. })
        )
    }

    /// How many functions are dropped now.
    pub fn dropped(&self) -> usize {
        (0..self.functions.len())
            .filter(|&i| self.is_dropped(i))
            .count()
    }

    /// The overhead of `probe_ns` of probes in `sample` (a fraction; infinite where the
    /// probes would take the threads' whole time).
    fn overhead(sample: &Sample, probe_ns: f64) -> f64 {
        let capacity = f64::from(sample.threads.max(1)) * sample.period_ns.max(1) as f64;
        let share = probe_ns / capacity;
        if share >= 1.0 {
            f64::INFINITY
        } else {
            share / (1.0 - share)
        }
    }

    /// Takes one period's measurements (`count(i)`: function `i`'s counts now) and, with
    /// `decide`, decides: the hottest functions dropped while the overhead exceeds the limit,
    /// down to [`DROP_TO`] of it; else dropped ones re-admitted, cheapest first, while it
    /// would stay under [`READMIT_UNDER`] of it. The caller carries the changes out. Without
    /// `decide` (a period that the last changes were still taking effect in: its costs are
    /// not those of what is traced now), only the estimate.
    pub fn observe(
        &mut self,
        sample: &Sample,
        count: impl Fn(usize) -> Counts,
        decide: bool,
    ) -> (Estimate, Vec<Change>) {
        let seconds = sample.period_ns.max(1) as f64 / 1e9;
        let mut costs = Vec::new();
        let mut calls = 0u64;
        // Costs no drop can remove: stops charged to no budgeted function, and those of
        // dropped functions' frames still hooked (a removed return probe leaves the frames it
        // hooked hooked until they return).
        let mut fixed_ns = sample.stopped_ns as f64;
        for (i, f) in self.functions.iter_mut().enumerate() {
            let now = count(i);
            let delta = now.calls.saturating_sub(f.seen.calls);
            let stopped = now.stopped_ns.saturating_sub(f.seen.stopped_ns);
            f.seen = now;
            if !matches!(f.state, State::Traced) {
                fixed_ns += stopped as f64;
            } else if delta > 0 || stopped > 0 {
                calls += delta;
                costs.push((i, delta, delta as f64 * f.cost_ns + stopped as f64));
            }
        }
        let probe_ns: f64 = costs.iter().map(|c| c.2).sum::<f64>() + fixed_ns;
        let overhead = Self::overhead(sample, probe_ns);
        let mut estimate = Estimate {
            overhead,
            overhead_after: overhead,
            cpu_share: probe_ns / sample.period_ns.max(1) as f64,
            calls_per_second: calls as f64 / seconds,
        };
        // Calls are predicted per nanosecond of the threads' CPU time, probes included: the
        // probes' estimate may exceed the time measured (clock ticks are coarse), and a busy
        // program uses the same CPU with or without the dropped probes.
        let cpu_ns = (sample.cpu_ns as f64).max(1e6);
        let mut changes = Vec::new();
        if !decide {
            return (estimate, changes);
        }
        // No thread ran: nothing paid, nothing to drop; functions may come back (at no cost
        // now, predicted from no CPU time).
        // Costs no drop removes do not make other functions go: they are those of frames
        // hooked before a drop (gone once they return, or are left unhooked at a catch).
        if Self::overhead(sample, probe_ns - fixed_ns) > self.limit && sample.threads > 0 {
            costs.sort_by(|a, b| b.2.total_cmp(&a.2));
            let mut left = probe_ns;
            for (i, delta, ns) in costs {
                if Self::overhead(sample, left - fixed_ns) <= self.limit * DROP_TO {
                    break;
                }
                left -= ns;
                self.functions[i].state = State::Dropped {
                    at_ns: sample.now_ns,
                    calls_per_cpu_ns: delta as f64 / cpu_ns,
                    ns_per_cpu_ns: ns / cpu_ns,
                };
                changes.push(Change {
                    function: i,
                    dropped: true,
                    calls_per_second: delta as f64 / seconds,
                    overhead: Self::overhead(sample, ns),
                });
            }
            estimate.overhead_after = Self::overhead(sample, left.max(0.0));
            return (estimate, changes);
        }
        // Re-admission: each dropped function's calls, predicted from the program's own CPU
        // time now at the rate it had when dropped.
        let mut candidates: Vec<(usize, f64, f64)> = self
            .functions
            .iter()
            .enumerate()
            .filter_map(|(i, f)| match f.state {
                State::Dropped {
                    at_ns,
                    calls_per_cpu_ns,
                    ns_per_cpu_ns,
                } if sample.now_ns.saturating_sub(at_ns) >= HOLD_NS => {
                    Some((i, calls_per_cpu_ns * cpu_ns, ns_per_cpu_ns * cpu_ns))
                }
                _ => None,
            })
            .collect();
        candidates.sort_by(|a, b| a.2.total_cmp(&b.2));
        let mut with = probe_ns;
        for (i, predicted_calls, ns) in candidates {
            if Self::overhead(sample, with + ns) > self.limit * READMIT_UNDER {
                break;
            }
            with += ns;
            let f = &mut self.functions[i];
            f.state = State::Traced;
            f.seen = count(i);
            changes.push(Change {
                function: i,
                dropped: false,
                calls_per_second: predicted_calls / seconds,
                overhead: Self::overhead(sample, ns),
            });
        }
        estimate.overhead_after = Self::overhead(sample, with);
        (estimate, changes)
    }
}

#[cfg(test)]
mod tests;
