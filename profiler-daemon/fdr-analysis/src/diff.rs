//! Two sessions side by side (`fdr-profiled diff A B`): per function its calls, total, self
//! and p99 time in each and the change, the largest change in self time first.
//!
//! Functions are matched by name (a shared object's with its file name, as `report` shows
//! them), not by XRay id: ids are positions in a build's instrumentation map and change when
//! a function is added or removed, so two builds of one program agree on names only. Where
//! several functions of one session share a name (static functions of different files), they
//! are added up, and the p99 is the largest of theirs.
use crate::report::{FunctionRow, Report};
use fdr_session::units::human_ns;
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One function in one session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Side {
    /// Calls that returned.
    pub calls: u64,
    /// Their inclusive time, ns.
    pub total: u64,
    /// Their exclusive time, ns.
    pub self_time: u64,
    /// The 99th percentile of a call's inclusive time, ns.
    pub p99: u64,
}

/// One function in either session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiffRow {
    /// As `report` names it.
    pub function: String,
    /// In the first session (the baseline), if it ran there.
    pub a: Option<Side>,
    /// In the second, if it ran there.
    pub b: Option<Side>,
}

impl DiffRow {
    fn side(side: Option<Side>) -> Side {
        side.unwrap_or_default()
    }

    /// The change in self time, ns (B − A).
    pub fn self_change(&self) -> i128 {
        i128::from(Self::side(self.b).self_time) - i128::from(Self::side(self.a).self_time)
    }

    /// The change in total time, ns (B − A).
    pub fn total_change(&self) -> i128 {
        i128::from(Self::side(self.b).total) - i128::from(Self::side(self.a).total)
    }

    /// The change in calls (B − A).
    pub fn calls_change(&self) -> i128 {
        i128::from(Self::side(self.b).calls) - i128::from(Self::side(self.a).calls)
    }
}

/// A session as the comparison names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compared {
    /// What was given on the command line.
    pub name: String,
    /// Calls that returned, over every function.
    pub calls: u64,
    /// Self time over every function, ns.
    pub self_time: u64,
}

/// The comparison.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diff {
    pub a: Compared,
    pub b: Compared,
    /// Largest change in self time first (then by name).
    pub rows: Vec<DiffRow>,
    /// The reports' warnings, each prefixed with its session's letter.
    pub warnings: Vec<String>,
}

/// The name a row is matched by.
fn key(row: &FunctionRow) -> String {
    match &row.shared_object {
        Some(object) => format!("{} [{object}]", row.info.name),
        None => row.info.name.clone(),
    }
}

/// Each function of `report`, by name (see the module's note on shared names).
fn by_name(report: &Report) -> BTreeMap<String, Side> {
    let mut sides: BTreeMap<String, Side> = BTreeMap::new();
    for row in &report.functions {
        let side = sides.entry(key(row)).or_default();
        side.calls += row.calls;
        side.total += row.total;
        side.self_time += row.self_time;
        side.p99 = side.p99.max(row.percentiles.p99);
    }
    sides
}

/// The order of the rows: the largest change in self time first, either way; then by name.
fn by_self_change(x: &DiffRow, y: &DiffRow) -> std::cmp::Ordering {
    y.self_change()
        .abs()
        .cmp(&x.self_change().abs())
        .then_with(|| x.function.cmp(&y.function))
}

/// Compares `b` with `a` (the baseline), named `a_name` and `b_name`; `top` keeps the first
/// rows only (0: all).
pub fn diff(a: &Report, a_name: &str, b: &Report, b_name: &str, top: usize) -> Diff {
    let (mut a_sides, mut b_sides) = (by_name(a), by_name(b));
    let names: Vec<String> = a_sides.keys().chain(b_sides.keys()).cloned().collect();
    let mut rows: Vec<DiffRow> = Vec::new();
    for function in names {
        let (side_a, side_b) = (a_sides.remove(&function), b_sides.remove(&function));
        if side_a.is_none() && side_b.is_none() {
            continue;
        }
        rows.push(DiffRow {
            function,
            a: side_a,
            b: side_b,
        });
    }
    rows.sort_by(by_self_change);
    if top > 0 {
        rows.truncate(top);
    }
    let compared = |report: &Report, name: &str| Compared {
        name: name.to_owned(),
        calls: report.functions.iter().map(|r| r.calls).sum(),
        self_time: report.functions.iter().map(|r| r.self_time).sum(),
    };
    let warnings = a
        .warnings
        .iter()
        .map(|w| format!("A: {w}"))
        .chain(b.warnings.iter().map(|w| format!("B: {w}")))
        .collect();
    Diff {
        a: compared(a, a_name),
        b: compared(b, b_name),
        rows,
        warnings,
    }
}

/// A signed duration for people: `+1.20 ms`, `-350 ns`, `0`.
fn signed_ns(ns: i128) -> String {
    let magnitude = u64::try_from(ns.unsigned_abs()).unwrap_or(u64::MAX);
    match ns {
        0 => "0".to_owned(),
        n if n > 0 => format!("+{}", human_ns(magnitude)),
        _ => format!("-{}", human_ns(magnitude)),
    }
}

/// The change of `from` to `to` in per cent, or what happened instead.
fn percent(from: Option<u64>, to: Option<u64>) -> String {
    match (from, to) {
        (None, Some(_)) => "new".to_owned(),
        (Some(_), None) => "gone".to_owned(),
        (Some(0), Some(0)) | (None, None) => String::new(),
        (Some(0), Some(_)) => "+inf%".to_owned(),
        (Some(f), Some(t)) => format!("{:+.1}%", (t as f64 - f as f64) * 100.0 / f as f64),
    }
}

/// Aligned columns for people.
pub fn text(diff: &Diff) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "fdr-profiled diff: A = {} ({} calls, {} self), B = {} ({} calls, {} self)",
        diff.a.name,
        diff.a.calls,
        human_ns(diff.a.self_time),
        diff.b.name,
        diff.b.calls,
        human_ns(diff.b.self_time)
    );
    for w in &diff.warnings {
        let _ = writeln!(s, "warning: {w}");
    }
    let _ = writeln!(
        s,
        "{:>12} {:>12} {:>12} {:>8}  {:>10} {:>10}  {:>12} {:>12}  {:>10} {:>10}  function",
        "self A",
        "self B",
        "self change",
        "",
        "calls A",
        "calls B",
        "total A",
        "total B",
        "p99 A",
        "p99 B"
    );
    let dash = |v: Option<u64>, f: &dyn Fn(u64) -> String| v.map_or("-".to_owned(), f);
    for row in &diff.rows {
        let ns = |v: u64| human_ns(v);
        let count = |v: u64| v.to_string();
        let _ = writeln!(
            s,
            "{:>12} {:>12} {:>12} {:>8}  {:>10} {:>10}  {:>12} {:>12}  {:>10} {:>10}  {}",
            dash(row.a.map(|x| x.self_time), &ns),
            dash(row.b.map(|x| x.self_time), &ns),
            signed_ns(row.self_change()),
            percent(row.a.map(|x| x.self_time), row.b.map(|x| x.self_time)),
            dash(row.a.map(|x| x.calls), &count),
            dash(row.b.map(|x| x.calls), &count),
            dash(row.a.map(|x| x.total), &ns),
            dash(row.b.map(|x| x.total), &ns),
            dash(row.a.map(|x| x.p99), &ns),
            dash(row.b.map(|x| x.p99), &ns),
            row.function
        );
    }
    s
}

/// One JSON document; times in ns, a function absent from a session `null` there.
pub fn to_json(diff: &Diff) -> serde_json::Value {
    let side = |s: Option<Side>| {
        s.map_or(serde_json::Value::Null, |s| {
            json!({
                "calls": s.calls,
                "total_ns": s.total,
                "self_ns": s.self_time,
                "p99_ns": s.p99,
            })
        })
    };
    let compared = |c: &Compared| json!({"name": c.name, "calls": c.calls, "self_ns": c.self_time});
    json!({
        "a": compared(&diff.a),
        "b": compared(&diff.b),
        "warnings": diff.warnings,
        "functions": diff.rows.iter().map(|r| json!({
            "function": r.function,
            "a": side(r.a),
            "b": side(r.b),
            "self_change_ns": i64::try_from(r.self_change()).unwrap_or(i64::MAX),
            "total_change_ns": i64::try_from(r.total_change()).unwrap_or(i64::MAX),
            "calls_change": i64::try_from(r.calls_change()).unwrap_or(i64::MAX),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_ordered_by_the_largest_change_in_self_time_either_way() {
        let row = |function: &str, a: Option<u64>, b: Option<u64>| DiffRow {
            function: function.to_owned(),
            a: a.map(|t| Side {
                calls: 1,
                total: t,
                self_time: t,
                p99: t,
            }),
            b: b.map(|t| Side {
                calls: 1,
                total: t,
                self_time: t,
                p99: t,
            }),
        };
        let mut rows = [
            row("steady", Some(100), Some(110)),
            row("faster", Some(5_000), Some(1_000)),
            row("slower", Some(1_000), Some(3_000)),
            row("new", None, Some(50)),
            row("gone", Some(3_500), None),
        ];
        rows.sort_by(by_self_change);
        let names: Vec<&str> = rows.iter().map(|r| r.function.as_str()).collect();
        assert_eq!(names, ["faster", "gone", "slower", "new", "steady"]);
        assert_eq!(rows[0].self_change(), -4_000);
        assert_eq!(percent(Some(1_000), Some(3_000)), "+200.0%");
        assert_eq!(percent(None, Some(3)), "new");
        assert_eq!(signed_ns(-4_000), format!("-{}", human_ns(4_000)));
    }
}
