//! A histogram of call durations for the live view: log-linear buckets, counts only, so that
//! the sums at two moments subtract into the calls between them (see [`super::live`]).
use serde::{Deserialize, Serialize};

/// Buckets per power of two: a duration is known to within 1/8 of itself (p99 within ~6%).
const SUB_BUCKETS: u64 = 8;
/// Durations below 8 ns have a bucket each; above, 8 per power of two up to 2^64.
const BUCKETS: usize = (64 - 1) * SUB_BUCKETS as usize;

/// A histogram of call durations (ns), log-linear: counts only, so two can be subtracted.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(into = "Sparse", from = "Sparse")]
pub struct Latencies {
    /// Calls by bucket; empty until the first call.
    counts: Vec<u64>,
}

/// [`Latencies`] on the wire: `[bucket, calls]` of the buckets that have calls.
#[derive(Serialize, Deserialize)]
struct Sparse(Vec<(u16, u64)>);

impl From<Latencies> for Sparse {
    fn from(l: Latencies) -> Sparse {
        Sparse(
            (l.counts.iter().enumerate())
                .filter(|&(_, &n)| n > 0)
                .map(|(i, &n)| (i as u16, n))
                .collect(),
        )
    }
}

impl From<Sparse> for Latencies {
    fn from(s: Sparse) -> Latencies {
        let mut l = Latencies::default();
        for (bucket, calls) in s.0 {
            if usize::from(bucket) < BUCKETS {
                l.counts.resize(BUCKETS, 0);
                l.counts[usize::from(bucket)] += calls;
            }
        }
        l
    }
}

fn bucket(ns: u64) -> usize {
    if ns < SUB_BUCKETS {
        return ns as usize;
    }
    let power = 63 - u64::from(ns.leading_zeros()); // 3 and up
    let sub = (ns >> (power - 3)) & (SUB_BUCKETS - 1);
    ((power - 2) * SUB_BUCKETS + sub) as usize
}

/// The middle of the durations bucket `i` holds.
fn middle(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB_BUCKETS {
        return i;
    }
    let (power, sub) = (i / SUB_BUCKETS + 2, i % SUB_BUCKETS);
    let low = (SUB_BUCKETS + sub) << (power - 3);
    low + (1u64 << (power - 3)) / 2
}

impl Latencies {
    /// One call of `ns`.
    #[inline]
    pub fn add(&mut self, ns: u64) {
        if self.counts.is_empty() {
            self.counts.resize(BUCKETS, 0);
        }
        self.counts[bucket(ns)] += 1;
    }

    /// Adds another's calls.
    pub fn merge(&mut self, other: &Latencies) {
        if other.counts.is_empty() {
            return;
        }
        self.counts.resize(BUCKETS, 0);
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
    }

    /// These calls less `before`'s (the same sums, earlier).
    pub fn since(&self, before: &Latencies) -> Latencies {
        let mut counts = self.counts.clone();
        for (now, then) in counts.iter_mut().zip(&before.counts) {
            *now = now.saturating_sub(*then);
        }
        Latencies { counts }
    }

    /// The duration that `q` (0 to 1) of the calls take at most; `None` without calls.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let total: u64 = self.counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(middle(i));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_knows_a_duration_to_within_an_eighth() {
        for ns in [
            0,
            1,
            7,
            8,
            9,
            15,
            16,
            100,
            1_000,
            123_456,
            10_000_000_000,
            u64::MAX / 3,
        ] {
            let mut l = Latencies::default();
            l.add(ns);
            let got = l.quantile(0.5).unwrap();
            assert!(got.abs_diff(ns) <= ns / 8, "{ns} read back as {got}");
        }
        assert!(bucket(u64::MAX) < BUCKETS);
    }
}
