//! `fdr-profiled diff A B` on two recordings of one program whose workload was changed on
//! purpose (one function's loop made 100 times longer), the second from a build with a
//! function more (every XRay id shifted): the changed function ranks first, matched by name,
//! with the calls each session made; the added function is new in B. And the flame-graph way
//! the README documents: `convert --format pprof` both, `go tool pprof -diff_base`, which
//! puts the same function first.
//!
//! Needs root, BPF, clang-19, go (golang-go) and a built daemon.

use std::path::Path;
use std::time::Duration;

use tests::fixtures::workloads::{diffme_extra_fixture, diffme_fixture};
use tests::launched::{launch, Launched};
use tests::pprof::go_pprof;
use tests::tools::{fdr_profiled, run_output};

const TIMEOUT: Duration = Duration::from_secs(120);

fn record(label: &str, bin: &Path, work: &str) -> Launched {
    let run = launch(label, bin, &["--no-report"], &[work], TIMEOUT);
    assert!(
        run.done.stdout.starts_with("diffme: sum="),
        "{}",
        run.done.stdout
    );
    run
}

fn diff(a: &Path, b: &Path, format: &str) -> String {
    let out = run_output(
        std::process::Command::new(fdr_profiled())
            .arg("diff")
            .arg(a)
            .arg(b)
            .args(["--format", format]),
    );
    assert!(
        out.status.success(),
        "diff: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn diff_ranks_the_function_whose_work_changed_first() {
    let a = record("diff-a", &diffme_fixture(), "2000");
    let b = record("diff-b", &diffme_extra_fixture(), "200000");

    let json: serde_json::Value = serde_json::from_str(&diff(&a.out, &b.out, "json")).unwrap();
    let functions = json["functions"].as_array().unwrap();
    let names: Vec<&str> = functions
        .iter()
        .map(|f| f["function"].as_str().unwrap())
        .collect();
    assert_eq!(names[0], "df_changed", "{json:#}");
    let row = |name: &str| functions.iter().find(|f| f["function"] == name).unwrap();
    for name in ["df_changed", "df_steady"] {
        assert_eq!(row(name)["a"]["calls"], 2000, "{name}");
        assert_eq!(row(name)["b"]["calls"], 2000, "{name}");
        assert_eq!(row(name)["calls_change"], 0, "{name}");
    }
    let changed = row("df_changed");
    let (self_a, self_b) = (
        changed["a"]["self_ns"].as_i64().unwrap(),
        changed["b"]["self_ns"].as_i64().unwrap(),
    );
    assert_eq!(changed["self_change_ns"].as_i64().unwrap(), self_b - self_a);
    assert!(self_b > 10 * self_a, "{changed}");
    assert!(row("df_extra")["a"].is_null(), "{json:#}");
    assert_eq!(row("df_extra")["b"]["calls"], 1);
    assert_eq!(row("main")["a"]["calls"], 1);

    // In text, the first row after the heading and the column names.
    let text = diff(&a.out, &b.out, "text");
    let first = text.lines().nth(2).unwrap_or_default();
    assert!(first.ends_with(" df_changed"), "{text}");
    assert!(first.contains("2000"), "{text}");

    // The flame-graph way: pprof's own diff ranks it first too.
    let pprof = |run: &Launched| {
        let file = run.scratch.path().join("profile.pb.gz");
        let out = run_output(
            std::process::Command::new(fdr_profiled())
                .arg("convert")
                .arg(&run.out)
                .args(["--format", "pprof", "-o"])
                .arg(&file),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        file
    };
    let (profile_a, profile_b) = (pprof(&a), pprof(&b));
    let top = go_pprof(
        &[
            "-top",
            "-sample_index=self",
            "-diff_base",
            profile_a.to_str().unwrap(),
        ],
        &profile_b,
    );
    let first_row = top
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .nth(1)
        .unwrap_or_default();
    assert!(first_row.ends_with(" df_changed"), "{top}");
}
