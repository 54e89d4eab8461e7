//! The fixtures' own account of what they ran: `count` lines and `gap_ns`.
//!
//! Each fixture thread prints, at its end, one line per function it called:
//! `count tid=<gettid()> function=<llvm-xray name> calls=<n>`. Function names
//! may contain blanks (`fx::work(int, int)`), so a line is split at
//! ` function=` and the last ` calls=`.

use std::collections::BTreeMap;

/// One `count` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountLine {
    pub tid: u32,
    pub function: String,
    pub calls: u64,
}

/// Parses one `count ...` line; `None` for any other line.
pub fn parse_count_line(line: &str) -> Option<Result<CountLine, String>> {
    let rest = line.trim_end().strip_prefix("count ")?;
    Some((|| {
        let rest = rest
            .strip_prefix("tid=")
            .ok_or_else(|| format!("no tid= in {line:?}"))?;
        let (tid, rest) = rest
            .split_once(" function=")
            .ok_or_else(|| format!("no function= in {line:?}"))?;
        let (function, calls) = rest
            .rsplit_once(" calls=")
            .ok_or_else(|| format!("no calls= in {line:?}"))?;
        Ok(CountLine {
            tid: tid.parse().map_err(|e| format!("tid in {line:?}: {e}"))?,
            function: function.to_string(),
            calls: calls
                .parse()
                .map_err(|e| format!("calls in {line:?}: {e}"))?,
        })
    })())
}

/// All `count` lines of a fixture's stdout (other lines are ignored). Panics
/// on a malformed `count` line.
pub fn parse_count_lines(stdout: &str) -> Vec<CountLine> {
    stdout
        .lines()
        .filter_map(parse_count_line)
        .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
        .collect()
}

/// Per thread, per function: the calls the fixture reported.
pub type ExpectedCalls = BTreeMap<u32, BTreeMap<String, u64>>;

/// Groups `count` lines by thread. Panics if a (thread, function) pair is
/// reported twice.
pub fn expected_calls(lines: &[CountLine]) -> ExpectedCalls {
    let mut m = ExpectedCalls::new();
    for l in lines {
        let prev = m
            .entry(l.tid)
            .or_default()
            .insert(l.function.clone(), l.calls);
        assert!(prev.is_none(), "duplicate count line for {l:?}");
    }
    m
}

/// The `gap_ns=<n>` line the C++ fixture prints with `--gap-ms`.
pub fn parse_gap_ns(stdout: &str) -> Option<u64> {
    stdout.lines().find_map(|l| {
        l.trim()
            .strip_prefix("gap_ns=")
            .map(|v| v.parse().unwrap_or_else(|e| panic!("bad {l:?}: {e}")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_lines() {
        let out = "hello\ncount tid=12 function=fx::work(int, int) calls=3\ncount tid=13 function=rx_leaf calls=40\ngap_ns=4500123\n";
        let lines = parse_count_lines(out);
        assert_eq!(
            lines,
            vec![
                CountLine {
                    tid: 12,
                    function: "fx::work(int, int)".into(),
                    calls: 3
                },
                CountLine {
                    tid: 13,
                    function: "rx_leaf".into(),
                    calls: 40
                }
            ]
        );
        assert_eq!(expected_calls(&lines)[&13]["rx_leaf"], 40);
        assert_eq!(parse_gap_ns(out), Some(4500123));
        assert_eq!(parse_gap_ns("x"), None);
        assert!(parse_count_line("count tid=x function=f calls=1")
            .unwrap()
            .is_err());
    }
}
