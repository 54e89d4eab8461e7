//! The call benchmark's markdown section: the table of medians and ratios, the issue's target,
//! failed runs, and the commands of one round.
use super::{command, Measured, CONFIGS, FLAGS, FUNCTION, TARGET_RATIO};
use crate::bench::support::median;
use crate::run;
use std::fmt::Write as _;
use std::path::Path;

/// The markdown section: the table, the issue's target, how to reproduce.
pub fn render(
    rounds: usize,
    machine: &str,
    bin: &Path,
    results: &[Vec<Result<Measured, String>>],
) -> String {
    let index = |name: &str| CONFIGS.iter().position(|c| c.name == name);
    let ok = |i: usize| -> Vec<f64> {
        results[i]
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .map(|m| m.ns_per_call)
            .collect()
    };
    // Per-round ratios to the floor, for rounds where both ran.
    let ratios = |i: usize| -> Vec<f64> {
        let Some(f) = CONFIGS[i].floor.and_then(index) else {
            return Vec::new();
        };
        results[i]
            .iter()
            .zip(&results[f])
            .filter_map(|(a, b)| Some(a.as_ref().ok()?.ns_per_call / b.as_ref().ok()?.ns_per_call))
            .collect()
    };
    let mut s = String::new();
    let _ = writeln!(s, "## Call overhead\n");
    let _ = writeln!(
        s,
        "One thread calls `{FUNCTION}` (tests/fixtures/calls.c, `clang-19 {}`) in a tight loop and \
         times the loop itself. {rounds} rounds; in each round every configuration runs once and a \
         ratio is taken against that round's floor (empty BPF programs on exactly the same probes: \
         `fdr-profiled --floor`); the table shows medians over rounds. bpftrace and uftrace are \
         compared with the return-probe floor (bpftrace uses the same uprobe + uretprobe pair).\n",
        FLAGS.join(" ")
    );
    let _ = writeln!(s, "{machine}\n");
    let _ = writeln!(s, "| configuration | calls per run | ns/call, median | min - max | ratio to floor, median of per-round ratios | events lost | rounds ok |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    for (i, c) in CONFIGS.iter().enumerate() {
        let values = ok(i);
        let cell = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.1}"));
        let min = values.iter().copied().reduce(f64::min);
        let max = values.iter().copied().reduce(f64::max);
        let ratio = median(&ratios(i)).map_or("-".to_owned(), |r| format!("{r:.3}x"));
        let lost: Vec<String> = results[i]
            .iter()
            .filter_map(|r| r.as_ref().ok()?.lost)
            .map(|l| l.to_string())
            .collect();
        let lost = if lost.is_empty() {
            "-".to_owned()
        } else {
            lost.join(", ")
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} - {} | {ratio} | {lost} | {}/{rounds} |",
            c.name,
            c.calls,
            cell(median(&values)),
            cell(min),
            cell(max),
            values.len()
        );
    }
    let _ = writeln!(s, "\nTarget (issue 4): fdr-profiled at most {TARGET_RATIO:.2}x its floor in both exit modes.\n");
    for name in ["fdr-profiled --exits sleds", "fdr-profiled --exits return"] {
        if let Some(i) = index(name) {
            let verdict = match median(&ratios(i)) {
                Some(r) if r <= TARGET_RATIO => format!("{r:.3}x: met"),
                Some(r) => format!("{r:.3}x: NOT met"),
                None => "not measured".to_owned(),
            };
            let _ = writeln!(s, "- {name}: {verdict}");
        }
    }
    let failures: Vec<String> = CONFIGS
        .iter()
        .zip(results)
        .flat_map(|(c, rs)| {
            rs.iter()
                .filter_map(move |r| r.as_ref().err().map(|e| format!("- {}: {e}", c.name)))
        })
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(s, "\nFailed runs:\n{}", failures.join("\n"));
    }
    let _ = writeln!(
        s,
        "\nCommands of one round (`WORK` is a per-run scratch directory):\n\n```"
    );
    // Paths relative to the workspace root, where the commands are run from.
    let root = run::workspace_root();
    let shown = |p: &Path| p.strip_prefix(&root).unwrap_or(p).to_path_buf();
    let daemon = shown(
        &crate::bench::support::target_dir()
            .join("release")
            .join("fdr-profiled"),
    );
    for c in CONFIGS {
        let (program, args) = command(c, &shown(bin), &daemon, Path::new("WORK"));
        let quoted: Vec<String> = args
            .iter()
            .map(|a| {
                if a.contains(' ') {
                    format!("'{a}'")
                } else {
                    a.clone()
                }
            })
            .collect();
        let _ = writeln!(s, "{program} {}", quoted.join(" "));
    }
    let _ = writeln!(s, "```");
    s
}
