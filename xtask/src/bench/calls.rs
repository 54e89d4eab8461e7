//! The call-overhead benchmark (issue 4): what one call of a tiny instrumented function costs
//! under each way of tracing it, and the ratio to the kernel floor of the same probes.
//!
//! The workload is `tests/fixtures/calls.c` (one thread calling `cx_tiny` in a tight loop); it
//! measures itself: `CLOCK_MONOTONIC` around the loop divided by the calls (`--bench`), so
//! start-up and attach times are not counted. Each round runs every configuration once; a ratio
//! is taken within a round (the floor and the measured run share that round's machine state),
//! and the table gives the median over rounds. Floor and traced runs swap order every round.
mod table;

use super::support::{self, last_lines, run_limited};
use crate::run;
use anyhow::{bail, Context as _, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Rounds, unless `FDR_BENCH_ROUNDS` says otherwise.
const DEFAULT_ROUNDS: usize = 5;
/// The function every tool probes.
const FUNCTION: &str = "cx_tiny";
/// Build flags of the workload: those of the tests' `calls_fixture`
/// (tests/src/fixtures/workloads.rs).
const FLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fxray-instrument",
    "-fxray-instruction-threshold=1",
    "-pthread",
    "-Wall",
    "-Wextra",
];
/// Seconds after which a single measured command is killed.
const LIMIT_SECS: u32 = 600;
/// The issue's target: traced cost per call at most this times the floor.
const TARGET_RATIO: f64 = 1.10;

/// How a configuration runs the workload.
#[derive(Clone, Copy)]
enum Tool {
    /// The workload alone.
    Bare,
    /// fdr-profiled with `--exits MODE`, recording (or `--floor`: empty programs, same probes;
    /// `ablate`: the hidden `--ablate` bits, skipping parts of the kernel-side work to show
    /// what each part costs).
    Daemon {
        exits: &'static str,
        floor: bool,
        ablate: u32,
    },
    /// bpftrace, uprobe + uretprobe on the function, counting in maps.
    BpftraceCount,
    /// bpftrace, uprobe + uretprobe, one printf per event into a file.
    BpftracePrintf,
    /// uftrace record, patching the XRay sleds of the function in process.
    Uftrace,
}

/// One row of the table.
struct Config {
    name: &'static str,
    tool: Tool,
    /// Calls of the function per run: enough for about a second, at most a few.
    calls: u64,
    /// The configuration whose cost is this one's floor.
    floor: Option<&'static str>,
}

const CONFIGS: &[Config] = &[
    Config {
        name: "no probes",
        tool: Tool::Bare,
        calls: 50_000_000,
        floor: None,
    },
    Config {
        name: "floor, exit sleds",
        tool: Tool::Daemon {
            exits: "sleds",
            floor: true,
            ablate: 0,
        },
        calls: 150_000,
        floor: None,
    },
    Config {
        name: "fdr-profiled --exits sleds",
        tool: Tool::Daemon {
            exits: "sleds",
            floor: false,
            ablate: 0,
        },
        calls: 150_000,
        floor: Some("floor, exit sleds"),
    },
    Config {
        name: "floor, return probes",
        tool: Tool::Daemon {
            exits: "return",
            floor: true,
            ablate: 0,
        },
        calls: 1_000_000,
        floor: None,
    },
    Config {
        name: "fdr-profiled --exits return",
        tool: Tool::Daemon {
            exits: "return",
            floor: false,
            ablate: 0,
        },
        calls: 1_000_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: "return, ablation: no ring-buffer write",
        tool: Tool::Daemon {
            exits: "return",
            floor: false,
            ablate: 1,
        },
        calls: 1_000_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: "return, ablation: no per-thread state",
        tool: Tool::Daemon {
            exits: "return",
            floor: false,
            ablate: 2,
        },
        calls: 1_000_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: "return, ablation: no clock read",
        tool: Tool::Daemon {
            exits: "return",
            floor: false,
            ablate: 4,
        },
        calls: 1_000_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: "return, ablation: none of the three",
        tool: Tool::Daemon {
            exits: "return",
            floor: false,
            ablate: 7,
        },
        calls: 1_000_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: "bpftrace, count()",
        tool: Tool::BpftraceCount,
        calls: 1_000_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: "bpftrace, printf per event",
        tool: Tool::BpftracePrintf,
        calls: 100_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: "uftrace record -P",
        tool: Tool::Uftrace,
        calls: 2_000_000,
        floor: Some("floor, return probes"),
    },
];

/// One run's result.
#[derive(Clone)]
struct Measured {
    ns_per_call: f64,
    /// Events the daemon reported lost (fdr-profiled runs only).
    lost: Option<u64>,
}

/// Runs the benchmark and returns its markdown section.
pub fn run() -> Result<String> {
    let rounds = std::env::var("FDR_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(DEFAULT_ROUNDS);
    let machine = support::machine_description();
    let dir = support::scratch("calls")?;
    let bin = build_workload(&dir)?;
    let daemon = support::daemon()?;
    let mut results: Vec<Vec<Result<Measured, String>>> = vec![Vec::new(); CONFIGS.len()];
    for round in 0..rounds {
        for i in round_order(round) {
            let config = &CONFIGS[i];
            let work = dir.join(format!("run-{round}-{i}"));
            std::fs::create_dir_all(&work)?;
            let result = measure(config, &bin, &daemon, &work).map_err(|e| format!("{e:#}"));
            match &result {
                Ok(m) => eprintln!(
                    "xtask bench calls: round {round}: {}: {:.1} ns/call",
                    config.name, m.ns_per_call
                ),
                Err(e) => eprintln!(
                    "xtask bench calls: round {round}: {}: failed: {e}",
                    config.name
                ),
            }
            results[i].push(result);
            // Traces can be large; only the numbers are kept.
            let _ = std::fs::remove_dir_all(&work);
        }
    }
    let section = table::render(rounds, &machine, &bin, &results);
    let failed: Vec<&str> = CONFIGS
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.iter().any(Result::is_err))
        .map(|(c, _)| c.name)
        .collect();
    if !failed.is_empty() {
        // Keep what was measured: the caller writes the section before reporting the failure.
        eprintln!(
            "xtask bench calls: failed configurations: {}",
            failed.join(", ")
        );
    }
    Ok(section)
}

/// Configuration indices in the order of `round`: even rounds run each floor before its traced
/// configuration, odd rounds after, so a drift in machine load does not favour either side.
fn round_order(round: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..CONFIGS.len()).collect();
    if round % 2 == 1 {
        order.swap(1, 2);
        order.swap(3, 4);
    }
    order
}

/// Compiles the workload into `dir`.
fn build_workload(dir: &Path) -> Result<PathBuf> {
    let source = run::workspace_root()
        .join("tests")
        .join("fixtures")
        .join("calls.c");
    let bin = dir.join("calls");
    run::status(
        Command::new("clang-19")
            .args(FLAGS)
            .arg(&source)
            .arg("-o")
            .arg(&bin),
    )?;
    Ok(bin)
}

/// The workload's own arguments for `calls` calls.
fn workload_args(calls: u64) -> Vec<String> {
    ["--iterations", &calls.to_string(), "--bench", "--quiet"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// The command line of `config` (program, arguments), writing anything it records into `work`.
fn command(config: &Config, bin: &Path, daemon: &Path, work: &Path) -> (String, Vec<String>) {
    let bin_s = bin.display().to_string();
    let args = workload_args(config.calls);
    let workload = format!("{bin_s} {}", args.join(" "));
    let probe = |body_entry: &str, body_exit: &str| {
        format!("uprobe:{bin_s}:{FUNCTION} {{ {body_entry} }} uretprobe:{bin_s}:{FUNCTION} {{ {body_exit} }}")
    };
    match config.tool {
        Tool::Bare => (bin_s, args),
        Tool::Daemon {
            exits,
            floor,
            ablate,
        } => {
            let mut a = vec!["--no-report".to_owned()];
            if floor {
                a.push("--floor".to_owned());
            }
            if ablate != 0 {
                a.extend(["--ablate".to_owned(), ablate.to_string()]);
            }
            a.extend(["--exits".to_owned(), exits.to_owned(), "--out".to_owned()]);
            a.push(work.join("trace").display().to_string());
            a.push("--".to_owned());
            a.push(bin_s);
            a.extend(args);
            (daemon.display().to_string(), a)
        }
        Tool::BpftraceCount => (
            "bpftrace".to_owned(),
            vec![
                "-e".to_owned(),
                probe("@entries = count();", "@exits = count();"),
                "-c".to_owned(),
                workload,
            ],
        ),
        Tool::BpftracePrintf => (
            "bpftrace".to_owned(),
            vec![
                "-o".to_owned(),
                work.join("bpftrace.txt").display().to_string(),
                "-e".to_owned(),
                probe(
                    r#"printf("enter %d %llu\n", tid, nsecs);"#,
                    r#"printf("exit %d %llu\n", tid, nsecs);"#,
                ),
                "-c".to_owned(),
                workload,
            ],
        ),
        Tool::Uftrace => {
            let mut a: Vec<String> = ["record", "--no-libcall", "-P", FUNCTION, "-d"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            a.push(work.join("uftrace.data").display().to_string());
            a.push(bin_s);
            a.extend(args);
            ("uftrace".to_owned(), a)
        }
    }
}

/// Runs `config` once and checks that the tool really saw the calls.
fn measure(config: &Config, bin: &Path, daemon: &Path, work: &Path) -> Result<Measured> {
    let (program, args) = command(config, bin, daemon, work);
    let out = run_limited(LIMIT_SECS, &program, &args)?;
    let ns_per_call = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("ns_per_call="))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
        .with_context(|| {
            format!(
                "no ns_per_call line in the output of {program}: {}",
                last_lines(&out.stdout, 3)
            )
        })?;
    let mut lost = None;
    match config.tool {
        Tool::Daemon { exits, floor, .. } => {
            let want = if exits == "sleds" {
                "exit sleds"
            } else {
                "return probes"
            };
            let line = out
                .stderr
                .lines()
                .find(|l| l.starts_with("fdr-profiled: exits: "))
                .with_context(|| {
                    format!(
                        "fdr-profiled did not say which exits it used: {}",
                        last_lines(&out.stderr, 3)
                    )
                })?;
            if !line.contains(want) {
                bail!("asked for --exits {exits}, fdr-profiled says {line:?}");
            }
            if !floor {
                lost = Some(events_lost(&work.join("trace"))?);
            }
        }
        Tool::BpftracePrintf => {
            let text =
                std::fs::read(work.join("bpftrace.txt")).context("reading bpftrace's output")?;
            let lines = text.iter().filter(|&&b| b == b'\n').count() as u64;
            if lines < 2 * config.calls {
                bail!("bpftrace printed {lines} lines for {} calls", config.calls);
            }
        }
        Tool::Uftrace => {
            // uftrace writes 16 bytes per entry and per exit into `<tid>.dat`.
            let mut bytes = 0;
            for entry in std::fs::read_dir(work.join("uftrace.data"))? {
                let entry = entry?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name
                    .strip_suffix(".dat")
                    .is_some_and(|t| t.bytes().all(|b| b.is_ascii_digit()))
                {
                    bytes += entry.metadata()?.len();
                }
            }
            if bytes < 32 * config.calls {
                bail!("uftrace recorded {bytes} bytes for {} calls", config.calls);
            }
        }
        Tool::BpftraceCount => {
            let want = format!("@entries: {}", config.calls);
            if !out.stdout.lines().any(|l| l.trim() == want) {
                bail!(
                    "bpftrace did not count {} entries: {}",
                    config.calls,
                    last_lines(&out.stdout, 4)
                );
            }
        }
        Tool::Bare => {}
    }
    Ok(Measured { ns_per_call, lost })
}

/// `events_lost` of a session's `session.json`.
fn events_lost(dir: &Path) -> Result<u64> {
    let path = dir.join("session.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    json.get("events_lost")
        .and_then(serde_json::Value::as_u64)
        .with_context(|| format!("no events_lost number in {}", path.display()))
}
