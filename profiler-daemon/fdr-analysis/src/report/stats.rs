//! Per-function call statistics with the percentiles `llvm-xray account` computes, in bounded
//! memory.
//!
//! Exact percentiles need every duration. Durations are kept exactly (8 bytes per call) up to
//! a budget shared by all functions; past it, the functions with the most kept durations move
//! to a histogram with 3 significant digits (HdrHistogram), so memory stays bounded whatever
//! the number of calls. Counts, totals, minimum and maximum stay exact; a function whose
//! percentiles come from a histogram is marked approximate.
use hdrhistogram::Histogram;

/// Durations kept exactly across all functions before histograms take over (64 MiB).
pub const DEFAULT_EXACT_BUDGET: usize = 8 << 20;

/// The durations of one function's calls.
#[derive(Debug, Default)]
pub struct Durations {
    exact: Vec<u64>,
    histogram: Option<Histogram<u64>>,
}

/// The percentiles of a set of durations, as `llvm-xray account` defines them: after sorting,
/// the element at index `n / 2`, `floor(n * 0.9)` and `floor(n * 0.99)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Percentiles {
    /// Median.
    pub median: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// False when they come from a histogram (3 significant digits).
    pub exact: bool,
}

impl Durations {
    /// Adds one duration; returns how many durations are now kept exactly in addition (0 or 1).
    pub fn push(&mut self, d: u64) -> usize {
        match &mut self.histogram {
            Some(h) => {
                record(h, d);
                0
            }
            None => {
                self.exact.push(d);
                1
            }
        }
    }

    /// Durations kept exactly.
    pub fn exact_len(&self) -> usize {
        self.exact.len()
    }

    /// Moves every duration into a histogram; returns how many exact ones were freed.
    pub fn spill(&mut self) -> usize {
        let h = self.histogram.get_or_insert_with(|| {
            Histogram::new(3).expect("3 significant digits is a valid histogram precision")
        });
        for &d in &self.exact {
            record(h, d);
        }
        let freed = self.exact.len();
        self.exact = Vec::new();
        freed
    }

    /// Merges `other` in; returns the change in exact durations kept.
    pub fn merge(&mut self, mut other: Durations) -> isize {
        match (&mut self.histogram, other.histogram.take()) {
            (None, None) => {
                let n = other.exact.len();
                self.exact.append(&mut other.exact);
                n as isize
            }
            (_, theirs) => {
                let freed = self.spill() as isize;
                let h = self.histogram.as_mut().expect("spill made one");
                if let Some(theirs) = theirs {
                    // Same precision, auto-resizing: adding cannot fail.
                    let _ = h.add(theirs);
                }
                for d in other.exact {
                    record(h, d);
                }
                -freed
            }
        }
    }

    /// The percentiles (reorders the exact durations).
    pub fn percentiles(&mut self) -> Percentiles {
        if let Some(h) = &self.histogram {
            return Percentiles {
                median: h.value_at_quantile(0.5),
                p90: h.value_at_quantile(0.9),
                p99: h.value_at_quantile(0.99),
                exact: false,
            };
        }
        let n = self.exact.len();
        if n == 0 {
            return Percentiles {
                exact: true,
                ..Percentiles::default()
            };
        }
        let mut at = |i: usize| *self.exact.select_nth_unstable(i.min(n - 1)).1;
        Percentiles {
            median: at(n / 2),
            p90: at((n as f64 * 0.9).floor() as usize),
            p99: at((n as f64 * 0.99).floor() as usize),
            exact: true,
        }
    }
}

/// Records `d`, growing the histogram as needed (`saturating_record` would not grow it; it
/// clamps to the current highest value). Values beyond what any histogram holds are clamped.
fn record(h: &mut Histogram<u64>, d: u64) {
    if h.record(d).is_err() {
        h.saturating_record(d);
    }
}

/// Everything known about one function (on one thread, or overall).
#[derive(Debug, Default)]
pub struct FunctionStats {
    /// Calls that returned.
    pub calls: u64,
    /// Sum of their inclusive durations (a recursive call counts at every level, as
    /// `llvm-xray account` counts it), ns.
    pub total: u64,
    /// Sum of their exclusive durations, ns.
    pub self_time: u64,
    /// Shortest call, ns.
    pub min: u64,
    /// Longest call, ns.
    pub max: u64,
    /// Every duration (or a histogram of them).
    pub durations: Durations,
    /// Calls ended by a caller's exit (no timing kept).
    pub unwound: u64,
    /// Calls still open at the end of the trace (no timing kept).
    pub unfinished: u64,
}

impl FunctionStats {
    /// Adds a returned call; returns how many durations are now kept exactly in addition.
    pub fn add(&mut self, duration: u64, self_time: u64) -> usize {
        if self.calls == 0 {
            self.min = duration;
            self.max = duration;
        } else {
            self.min = self.min.min(duration);
            self.max = self.max.max(duration);
        }
        self.calls += 1;
        self.total = self.total.saturating_add(duration);
        self.self_time = self.self_time.saturating_add(self_time);
        self.durations.push(duration)
    }

    /// Merges `other` in; returns the change in exact durations kept.
    pub fn merge(&mut self, other: FunctionStats) -> isize {
        if other.calls > 0 {
            if self.calls == 0 {
                self.min = other.min;
                self.max = other.max;
            } else {
                self.min = self.min.min(other.min);
                self.max = self.max.max(other.max);
            }
        }
        self.calls += other.calls;
        self.total = self.total.saturating_add(other.total);
        self.self_time = self.self_time.saturating_add(other.self_time);
        self.unwound += other.unwound;
        self.unfinished += other.unfinished;
        self.durations.merge(other.durations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_elements_llvm_xray_account_picks() {
        let mut d = Durations::default();
        // 1..=10 shuffled: median index 5 → 6, p90 index 9 → 10, p99 index 9 → 10.
        for v in [7, 3, 10, 1, 9, 2, 8, 4, 6, 5] {
            d.push(v);
        }
        let p = d.percentiles();
        assert_eq!((p.median, p.p90, p.p99, p.exact), (6, 10, 10, true));
        let mut one = Durations::default();
        one.push(42);
        assert_eq!(one.percentiles().median, 42);
    }

    #[test]
    fn spilled_durations_give_close_percentiles() {
        let mut d = Durations::default();
        for v in 1..=100_000u64 {
            d.push(v);
        }
        assert_eq!(d.spill(), 100_000);
        assert_eq!(d.exact_len(), 0);
        let p = d.percentiles();
        assert!(!p.exact);
        for (got, want) in [(p.median, 50_000f64), (p.p90, 90_000.0), (p.p99, 99_000.0)] {
            assert!((got as f64 - want).abs() / want < 0.002, "{got} vs {want}");
        }
    }

    #[test]
    fn merging_keeps_min_max_and_counts() {
        let mut a = FunctionStats::default();
        a.add(10, 5);
        let mut b = FunctionStats::default();
        b.add(3, 3);
        b.add(30, 1);
        assert_eq!(a.merge(b), 2);
        assert_eq!(
            (a.calls, a.min, a.max, a.total, a.self_time),
            (3, 3, 30, 43, 9)
        );
        assert_eq!(a.durations.percentiles().median, 10);
    }
}
