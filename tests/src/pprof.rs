//! Reading pprof profiles with the reference consumer, `go tool pprof` (Debian's golang-go):
//! its `-top` table per sample type and its `-raw` dump.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use crate::tools::go;

/// Per function: (flat, cum) of one sample type, from `go tool pprof -top`.
pub type Top = BTreeMap<String, (u64, u64)>;

/// `go tool pprof -symbolize=none ARGS PROFILE`'s standard output; panics if it fails.
pub fn go_pprof(args: &[&str], profile: &Path) -> String {
    let out = Command::new(go())
        .args(["tool", "pprof", "-symbolize=none"])
        .args(args)
        .arg(profile)
        .output()
        .expect("running go tool pprof");
    assert!(
        out.status.success(),
        "go tool pprof {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `go tool pprof -top` of one sample type, every node kept, numbers unscaled.
pub fn top(profile: &Path, sample: &str) -> Top {
    let unit = if sample == "calls" { "count" } else { "ns" };
    let text = go_pprof(
        &[
            "-top",
            &format!("-sample_index={sample}"),
            "-nodefraction=0",
            "-nodecount=1000000",
            &format!("-unit={unit}"),
        ],
        profile,
    );
    let mut rows = Top::new();
    let mut header_seen = false;
    for line in text.lines() {
        if line.trim_start().starts_with("flat") {
            header_seen = true;
            continue;
        }
        if !header_seen {
            continue;
        }
        // flat flat% sum% cum cum% name (the name may hold spaces)
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert!(fields.len() >= 6, "a -top row: {line:?}");
        let number = |f: &str| -> u64 {
            f.trim_end_matches(|c: char| c.is_ascii_alphabetic())
                .parse()
                .unwrap_or_else(|e| panic!("{f:?} in {line:?}: {e}"))
        };
        let (flat, cum) = (number(fields[0]), number(fields[3]));
        let name = fields[5..].join(" ");
        assert!(
            rows.insert(name.clone(), (flat, cum)).is_none(),
            "{name} twice"
        );
    }
    assert!(header_seen, "no table in go tool pprof -top:\n{text}");
    rows
}

/// Functions that appear more than once in some sample's stack (`go tool pprof -raw`).
pub fn recursive_functions(raw: &str) -> BTreeSet<String> {
    let mut names: BTreeMap<u64, String> = BTreeMap::new();
    let mut samples: Vec<Vec<u64>> = Vec::new();
    let mut section = "";
    for line in raw.lines() {
        match line.trim_end() {
            "Samples:" | "Locations" | "Mappings" => {
                section = line.trim_end();
                continue;
            }
            _ => {}
        }
        match section {
            "Samples:" => {
                if let Some((_, stack)) = line.split_once(':') {
                    samples.push(
                        stack
                            .split_whitespace()
                            .map(|id| id.parse().unwrap())
                            .collect(),
                    );
                }
            }
            "Locations" => {
                // `     1: 0x23b60 M=1 name file:line s=N`
                let (id, rest) = line.split_once(':').unwrap();
                let name = rest.split_whitespace().nth(2).unwrap_or_default();
                names.insert(id.trim().parse().unwrap(), name.to_owned());
            }
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    for s in samples {
        let mut seen = BTreeSet::new();
        for id in s {
            if !seen.insert(id) {
                out.insert(names[&id].clone());
            }
        }
    }
    out
}

/// The `Time:` line of `go tool pprof -raw`, in ns since the epoch (to the second).
pub fn raw_time_ns(raw: &str) -> u64 {
    // `Time: 2026-11-25 15:47:10.380707 +0000 UTC`: checked against the clock below, to the
    // second.
    let line = raw
        .lines()
        .find(|l| l.starts_with("Time: "))
        .expect("a Time line");
    let stamp = line.trim_start_matches("Time: ");
    let out = Command::new("date")
        .args(["-u", "-d", stamp.trim_end_matches(" UTC").trim(), "+%s"])
        .output()
        .unwrap();
    let secs: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{stamp}: {e}"));
    secs * 1_000_000_000
}
