//! Numbers as people read them.

/// A duration in nanoseconds with a unit that keeps it short: `999 ns`, `1.500 us`, `2.000 s`.
pub fn human_ns(ns: u64) -> String {
    let ns = ns as f64;
    if ns >= 1e9 {
        format!("{:.3} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.3} us", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// A rate or count with a unit prefix that keeps it short: `950`, `1.2k`, `2.1M`, `3.0G`.
pub fn human_count(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human_ns(999), "999 ns");
        assert_eq!(human_ns(1_500), "1.500 us");
        assert_eq!(human_ns(2_000_000_000), "2.000 s");
        assert_eq!(human_count(950.0), "950");
        assert_eq!(human_count(319_800.0), "319.8k");
        assert_eq!(human_count(2_100_000.0), "2.1M");
    }
}
