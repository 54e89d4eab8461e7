//! The call-overhead benchmark (issues 4 and 14): what one call of a tiny instrumented function
//! costs under each way of tracing it, and the ratio to the kernel floor of the same probes.
//!
//! Two workloads, each one thread calling a leaf in a tight loop: `tests/fixtures/calls.c`
//! (`cx_tiny`, plain C) and `tests/fixtures/hot_leaf.cpp` (`hl_tiny`, in a C++ program that
//! first throws and catches exceptions through other instrumented functions: the default
//! `--exits auto` repairs its stack at each throw, `--exits per-function` decides per function). Each measures itself: `CLOCK_MONOTONIC` around the loop
//! divided by the calls (`--bench`), so start-up, attach times and the throws are not counted.
//! Each round runs every configuration once; a ratio is taken within a round (the floor and the
//! measured run share that round's machine state), and the table gives the median over rounds.
//! Floor and traced runs swap order every round.
mod inline;
mod table;

use super::support::{self, last_lines, run_limited};
use crate::run;
use anyhow::{bail, Context as _, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Rounds, unless `FDR_BENCH_ROUNDS` says otherwise.
const DEFAULT_ROUNDS: usize = 5;
/// Build flags of both workloads: those of the tests' `calls_fixture`
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
/// Issue 4's target: traced cost per call at most this times the floor.
const TARGET_RATIO: f64 = 1.10;
/// Issue 14's target: the C++ hot leaf under fdr-profiled's defaults at most this times
/// bpftrace's uprobe + uretprobe `count()` on it.
const TARGET_CPP_VS_BPFTRACE: f64 = 1.30;
/// Exceptions the C++ workload throws and catches before its timed loop (`--throws`).
const CPP_THROWS: u64 = 1000;
/// The C++ rows that issue 14's target compares: fdr-profiled's defaults and bpftrace.
const CPP_DEFAULTS: &str = "C++: fdr-profiled, defaults";
const CPP_BPFTRACE: &str = "C++: bpftrace, count()";
const CPP_FLOOR: &str = "C++: floor, return probe on hl_tiny";

/// Floor and traced configurations (by name) whose order swaps on odd rounds.
const SWAPPED: &[(&str, &str)] = &[
    ("floor, exit sleds", "fdr-profiled --exits sleds"),
    ("floor, return probes", "fdr-profiled --exits return"),
    (CPP_FLOOR, CPP_DEFAULTS),
];

/// The program a configuration runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    /// `tests/fixtures/calls.c`: `cx_tiny` in a loop, plain C.
    C,
    /// `tests/fixtures/hot_leaf.cpp`: `hl_tiny` in a loop, in a C++ program that throws.
    Cpp,
}

impl Workload {
    /// The hot leaf: the function bpftrace and uftrace probe, and whose calls are timed.
    fn function(self) -> &'static str {
        match self {
            Workload::C => "cx_tiny",
            Workload::Cpp => "hl_tiny",
        }
    }

    /// The source file under `tests/fixtures`.
    fn source(self) -> &'static str {
        match self {
            Workload::C => "calls.c",
            Workload::Cpp => "hot_leaf.cpp",
        }
    }

    /// The compiler that builds it.
    fn compiler(self) -> &'static str {
        match self {
            Workload::C => "clang-19",
            Workload::Cpp => "clang++-19",
        }
    }
}

/// The built workloads.
struct Binaries {
    /// The C workload.
    c: PathBuf,
    /// The C++ workload.
    cpp: PathBuf,
}

impl Binaries {
    /// The binary of `workload`.
    fn get(&self, workload: Workload) -> &Path {
        match workload {
            Workload::C => &self.c,
            Workload::Cpp => &self.cpp,
        }
    }
}

/// How a configuration runs the workload.
#[derive(Clone, Copy)]
enum Tool {
    /// The workload alone.
    Bare,
    /// fdr-profiled with `--exits MODE` (`None`: no `--exits`, the default `auto`), recording
    /// (or `--floor`: empty programs, same probes; `ablate`: the hidden `--ablate` bits, skipping
    /// parts of the kernel-side work to show what each part costs; `functions`: `--functions
    /// PATTERN`, probing only those).
    Daemon {
        exits: Option<&'static str>,
        floor: bool,
        ablate: u32,
        functions: Option<&'static str>,
    },
    /// bpftrace, uprobe + uretprobe on the function, counting in maps.
    BpftraceCount,
    /// bpftrace, uprobe + uretprobe, one printf per event into a file.
    BpftracePrintf,
    /// uftrace record, patching the XRay sleds of the function in process.
    Uftrace,
    /// XRay's own FDR runtime, linked into the workload, turned on by it before its loop
    /// (`--xray-fdr`: every call recorded, no duration threshold), its log written after.
    XrayFdr,
    /// fdr-profiled `--pid --engine inline`, attached to the workload waiting before its loop.
    InlinePid,
}

/// One row of the table.
struct Config {
    name: &'static str,
    /// The program it runs.
    workload: Workload,
    tool: Tool,
    /// Calls of the function per run: enough for about a second, at most a few.
    calls: u64,
    /// The configuration whose cost is this one's floor.
    floor: Option<&'static str>,
}

const CONFIGS: &[Config] = &[
    Config {
        name: "no probes",
        workload: Workload::C,
        tool: Tool::Bare,
        calls: 50_000_000,
        floor: None,
    },
    Config {
        name: "floor, exit sleds",
        workload: Workload::C,
        tool: Tool::Daemon {
            exits: Some("sleds"),
            floor: true,
            ablate: 0,
            functions: None,
        },
        calls: 150_000,
        floor: None,
    },
    Config {
        name: "fdr-profiled --exits sleds",
        workload: Workload::C,
        tool: Tool::Daemon {
            exits: Some("sleds"),
            floor: false,
            ablate: 0,
            functions: None,
        },
        calls: 150_000,
        floor: Some("floor, exit sleds"),
    },
    Config {
        name: "floor, return probes",
        workload: Workload::C,
        tool: Tool::Daemon {
            exits: Some("return"),
            floor: true,
            ablate: 0,
            functions: None,
        },
        calls: 1_000_000,
        floor: None,
    },
    Config {
        name: "fdr-profiled --exits return",
        workload: Workload::C,
        tool: Tool::Daemon {
            exits: Some("return"),
            floor: false,
            ablate: 0,
            functions: None,
        },
        calls: 1_000_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: "return, ablation: no ring-buffer write",
        workload: Workload::C,
        tool: Tool::Daemon {
            exits: Some("return"),
            floor: false,
            ablate: 1,
            functions: None,
        },
        calls: 1_000_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: "return, ablation: no per-thread state",
        workload: Workload::C,
        tool: Tool::Daemon {
            exits: Some("return"),
            floor: false,
            ablate: 2,
            functions: None,
        },
        calls: 1_000_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: "return, ablation: no clock read",
        workload: Workload::C,
        tool: Tool::Daemon {
            exits: Some("return"),
            floor: false,
            ablate: 4,
            functions: None,
        },
        calls: 1_000_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: "return, write by one copy (bpf_ringbuf_output)",
        workload: Workload::C,
        tool: Tool::Daemon {
            exits: Some("return"),
            floor: false,
            ablate: 8,
            functions: None,
        },
        calls: 1_000_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: "return, ablation: write to per-CPU memory, not the ring",
        workload: Workload::C,
        tool: Tool::Daemon {
            exits: Some("return"),
            floor: false,
            ablate: 16,
            functions: None,
        },
        calls: 1_000_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: "return, ablation: none of the three",
        workload: Workload::C,
        tool: Tool::Daemon {
            exits: Some("return"),
            floor: false,
            ablate: 7,
            functions: None,
        },
        calls: 1_000_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: "bpftrace, count()",
        workload: Workload::C,
        tool: Tool::BpftraceCount,
        calls: 1_000_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: "bpftrace, printf per event",
        workload: Workload::C,
        tool: Tool::BpftracePrintf,
        calls: 100_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: "uftrace record -P",
        workload: Workload::C,
        tool: Tool::Uftrace,
        calls: 2_000_000,
        floor: Some("floor, return probes"),
    },
    Config {
        name: inline::XRAY_FDR,
        workload: Workload::C,
        tool: Tool::XrayFdr,
        calls: 5_000_000,
        floor: None,
    },
    Config {
        name: inline::INLINE,
        workload: Workload::C,
        tool: Tool::InlinePid,
        calls: 5_000_000,
        floor: None,
    },
    Config {
        name: CPP_FLOOR,
        workload: Workload::Cpp,
        // Only the leaf: the exceptions must not cross a return probe.
        tool: Tool::Daemon {
            exits: Some("return"),
            floor: true,
            ablate: 0,
            functions: Some("hl_tiny"),
        },
        calls: 1_000_000,
        floor: None,
    },
    Config {
        name: CPP_DEFAULTS,
        workload: Workload::Cpp,
        tool: Tool::Daemon {
            exits: None,
            floor: false,
            ablate: 0,
            functions: None,
        },
        calls: 1_000_000,
        floor: Some(CPP_FLOOR),
    },
    Config {
        name: CPP_BPFTRACE,
        workload: Workload::Cpp,
        tool: Tool::BpftraceCount,
        calls: 1_000_000,
        floor: Some(CPP_FLOOR),
    },
    Config {
        name: "C++: fdr-profiled --exits per-function",
        workload: Workload::Cpp,
        tool: Tool::Daemon {
            exits: Some("per-function"),
            floor: false,
            ablate: 0,
            functions: None,
        },
        calls: 1_000_000,
        floor: Some(CPP_FLOOR),
    },
    Config {
        name: "C++: fdr-profiled --exits sleds",
        workload: Workload::Cpp,
        tool: Tool::Daemon {
            exits: Some("sleds"),
            floor: false,
            ablate: 0,
            functions: None,
        },
        calls: 150_000,
        floor: None,
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
    let bins = Binaries {
        c: build_workload(&dir, Workload::C)?,
        cpp: build_workload(&dir, Workload::Cpp)?,
    };
    let daemon = support::daemon()?;
    let mut results: Vec<Vec<Result<Measured, String>>> = vec![Vec::new(); CONFIGS.len()];
    for round in 0..rounds {
        for i in round_order(round) {
            let config = &CONFIGS[i];
            let work = dir.join(format!("run-{round}-{i}"));
            std::fs::create_dir_all(&work)?;
            let result = measure(config, &bins, &daemon, &work).map_err(|e| format!("{e:#}"));
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
    let kernel = kernel_times(&bins, &daemon, &dir);
    let section = table::render(rounds, &machine, &bins, &results, &kernel);
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

/// The time the kernel spent per run of the recording programs, per configuration of the C
/// workload in return-probe mode (floor and ablations included): one more run of each with
/// `--kernel-stats` (BPF run-time statistics on, which the timed rounds leave off: they add
/// two clock reads to every run). By configuration index: (entry program, return program)
/// nanoseconds per run, or why not measured.
pub type KernelTimes = Vec<(usize, Result<(f64, f64), String>)>;

fn kernel_times(bins: &Binaries, daemon: &Path, dir: &Path) -> KernelTimes {
    CONFIGS
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            c.workload == Workload::C
                && matches!(
                    c.tool,
                    Tool::Daemon {
                        exits: Some("return"),
                        functions: None,
                        ..
                    }
                )
        })
        .map(|(i, config)| {
            let work = dir.join(format!("kernel-{i}"));
            let result = kernel_time(config, bins, daemon, &work).map_err(|e| format!("{e:#}"));
            let _ = std::fs::remove_dir_all(&work);
            match &result {
                Ok((entry, ret)) => eprintln!(
                    "xtask bench calls: kernel statistics: {}: {entry:.1} / {ret:.1} ns per run",
                    config.name
                ),
                Err(e) => eprintln!(
                    "xtask bench calls: kernel statistics: {}: failed: {e}",
                    config.name
                ),
            }
            (i, result)
        })
        .collect()
}

fn kernel_time(config: &Config, bins: &Binaries, daemon: &Path, work: &Path) -> Result<(f64, f64)> {
    std::fs::create_dir_all(work)?;
    let (program, mut args) = command(config, bins, daemon, work);
    args.insert(0, "--kernel-stats".to_owned());
    let out = run_limited(LIMIT_SECS, &program, &args)?;
    let line = out
        .stderr
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("kernel programs (BPF run-time statistics): ")
        })
        .with_context(|| {
            format!(
                "fdr-profiled reported no kernel program times: {}",
                last_lines(&out.stderr, 3)
            )
        })?;
    // `NAME RUNS runs, NS ns/run; ...`
    let per_run = |name: &str| -> Option<f64> {
        line.split("; ").find_map(|part| {
            let rest = part.strip_prefix(name)?.strip_prefix(' ')?;
            rest.split(", ")
                .nth(1)?
                .strip_suffix(" ns/run")?
                .parse()
                .ok()
        })
    };
    let (entry, ret) = if matches!(config.tool, Tool::Daemon { floor: true, .. }) {
        ("floor", "floor_return")
    } else {
        ("sled", "sled_return")
    };
    match (per_run(entry), per_run(ret)) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => bail!("no {entry} and {ret} times in {line:?}"),
    }
}

/// Configuration indices in the order of `round`: even rounds run each floor before its traced
/// configuration ([`SWAPPED`]), odd rounds after, so a drift in machine load does not favour
/// either side.
fn round_order(round: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..CONFIGS.len()).collect();
    if round % 2 == 1 {
        let index = |name: &str| CONFIGS.iter().position(|c| c.name == name);
        for &(a, b) in SWAPPED {
            if let (Some(a), Some(b)) = (index(a), index(b)) {
                order.swap(a, b);
            }
        }
    }
    order
}

/// Compiles `workload` into `dir`.
fn build_workload(dir: &Path, workload: Workload) -> Result<PathBuf> {
    let source = run::workspace_root()
        .join("tests")
        .join("fixtures")
        .join(workload.source());
    let bin = dir.join(match workload {
        Workload::C => "calls",
        Workload::Cpp => "hot_leaf",
    });
    run::status(
        Command::new(workload.compiler())
            .args(FLAGS)
            .arg(&source)
            .arg("-o")
            .arg(&bin),
    )?;
    Ok(bin)
}

/// The workload's own arguments for `calls` calls.
fn workload_args(workload: Workload, calls: u64) -> Vec<String> {
    let mut args: Vec<String> = ["--iterations", &calls.to_string()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if workload == Workload::Cpp {
        args.extend(["--throws".to_owned(), CPP_THROWS.to_string()]);
    }
    args.extend(["--bench".to_owned(), "--quiet".to_owned()]);
    args
}

/// The command line of `config` (program, arguments), writing anything it records into `work`.
fn command(config: &Config, bins: &Binaries, daemon: &Path, work: &Path) -> (String, Vec<String>) {
    let bin_s = bins.get(config.workload).display().to_string();
    let function = config.workload.function();
    let args = workload_args(config.workload, config.calls);
    let workload = format!("{bin_s} {}", args.join(" "));
    let probe = |body_entry: &str, body_exit: &str| {
        format!("uprobe:{bin_s}:{function} {{ {body_entry} }} uretprobe:{bin_s}:{function} {{ {body_exit} }}")
    };
    match config.tool {
        Tool::Bare => (bin_s, args),
        Tool::Daemon {
            exits,
            floor,
            ablate,
            functions,
        } => {
            let mut a = vec!["--no-report".to_owned()];
            if floor {
                a.push("--floor".to_owned());
            }
            if ablate != 0 {
                a.extend(["--ablate".to_owned(), ablate.to_string()]);
            }
            if let Some(exits) = exits {
                a.extend(["--exits".to_owned(), exits.to_owned()]);
            }
            if let Some(functions) = functions {
                a.extend(["--functions".to_owned(), functions.to_owned()]);
            }
            a.push("--out".to_owned());
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
            let mut a: Vec<String> = ["record", "--no-libcall", "-P", function, "-d"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            a.push(work.join("uftrace.data").display().to_string());
            a.push(bin_s);
            a.extend(args);
            ("uftrace".to_owned(), a)
        }
        Tool::XrayFdr => inline::xray_fdr_command(&bin_s, &args, work),
        Tool::InlinePid => inline::inline_command(&bin_s, &args, daemon, work),
    }
}

/// Runs `config` once and checks that the tool really saw the calls (and, for the C++ workload,
/// that the program still caught its exceptions).
fn measure(config: &Config, bins: &Binaries, daemon: &Path, work: &Path) -> Result<Measured> {
    let (program, args) = command(config, bins, daemon, work);
    let out = match config.tool {
        Tool::InlinePid => inline::run_inline(
            bins.get(config.workload),
            &workload_args(config.workload, config.calls),
            daemon,
            work,
        )?,
        _ => run_limited(LIMIT_SECS, &program, &args)?,
    };
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
    if config.workload == Workload::Cpp {
        check_caught(&out.stdout)?;
    }
    let mut lost = None;
    match config.tool {
        Tool::Daemon { exits, floor, .. } => {
            let want = match exits {
                Some("sleds") => "exit sleds (",
                Some("per-function") => "per function:",
                Some(_) => "return probes (",
                // A launched C++ program: repaired (return probes everywhere).
                None => "return probes (auto: ",
            };
            let line = out
                .stderr
                .lines()
                .find_map(|l| l.strip_prefix("fdr-profiled: exits: "))
                .with_context(|| {
                    format!(
                        "fdr-profiled did not say which exits it used: {}",
                        last_lines(&out.stderr, 3)
                    )
                })?;
            if !line.starts_with(want) {
                bail!(
                    "asked for --exits {}, fdr-profiled says {line:?}",
                    exits.unwrap_or("(default)")
                );
            }
            if !floor {
                let session = session_json(&work.join("trace"))?;
                lost = Some(
                    session
                        .get("events_lost")
                        .and_then(serde_json::Value::as_u64)
                        .context("no events_lost number in session.json")?,
                );
                if exits.is_none() {
                    check_return_probed(&session, config.workload.function())?;
                }
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
        Tool::XrayFdr => inline::check_xray_fdr(work)?,
        Tool::InlinePid => {
            let session = session_json(&work.join("trace"))?;
            lost = session
                .get("events_lost")
                .and_then(serde_json::Value::as_u64);
            inline::check_inline(&session, config.workload.function(), config.calls)?;
        }
        Tool::Bare => {}
    }
    Ok(Measured { ns_per_call, lost })
}

/// A session's `session.json`, parsed.
fn session_json(dir: &Path) -> Result<serde_json::Value> {
    let path = dir.join("session.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// Fails unless `session.json`'s `functions` show `function` with `"exit": "return"`: the
/// default `--exits auto` gave the hot leaf a return probe (repairing the stack of the launched
/// program, or deciding per function).
fn check_return_probed(session: &serde_json::Value, function: &str) -> Result<()> {
    let entry = session
        .get("functions")
        .and_then(serde_json::Value::as_array)
        .context("no functions array in session.json")?
        .iter()
        .find(|f| f.get("name").and_then(serde_json::Value::as_str) == Some(function))
        .with_context(|| format!("{function} is not among session.json's functions"))?;
    let exit = entry.get("exit").and_then(serde_json::Value::as_str);
    if exit != Some("return") {
        bail!("--exits auto observed {function}'s exits by {exit:?}, not by a return probe");
    }
    Ok(())
}

/// Fails unless the C++ workload's last line (`hot_leaf: done caught=K calls=N`) says it caught
/// all its [`CPP_THROWS`] exceptions: it ran normally under the tool. bpftrace prints its maps
/// after the program's output, so the line is looked for, not taken as stdout's last.
fn check_caught(stdout: &str) -> Result<()> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("hot_leaf: done "))
        .with_context(|| {
            format!(
                "the C++ workload did not finish normally: {}",
                last_lines(stdout, 3)
            )
        })?;
    let want = format!("caught={CPP_THROWS}");
    if !line.split_whitespace().any(|w| w == want) {
        bail!("the C++ workload did not catch its {CPP_THROWS} exceptions: {line:?}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_unique_and_floors_and_swaps_resolve() {
        let index = |name: &str| CONFIGS.iter().position(|c| c.name == name);
        for (i, c) in CONFIGS.iter().enumerate() {
            assert_eq!(index(c.name), Some(i), "{} twice", c.name);
            if let Some(floor) = c.floor {
                assert!(index(floor).is_some(), "{}: no floor {floor}", c.name);
            }
        }
        for &(a, b) in SWAPPED {
            assert!(index(a).is_some() && index(b).is_some(), "{a} / {b}");
        }
        for name in [CPP_DEFAULTS, CPP_BPFTRACE, CPP_FLOOR] {
            assert!(index(name).is_some(), "{name}");
        }
    }

    #[test]
    fn odd_rounds_swap_floor_and_traced() {
        let index = |name: &str| CONFIGS.iter().position(|c| c.name == name).unwrap();
        let even = round_order(0);
        let odd = round_order(1);
        assert_eq!(even, (0..CONFIGS.len()).collect::<Vec<_>>());
        let at = |order: &[usize], name: &str| order.iter().position(|&i| i == index(name));
        for &(floor, traced) in SWAPPED {
            assert!(at(&even, floor) < at(&even, traced));
            assert!(at(&odd, floor) > at(&odd, traced));
        }
        let mut sorted = odd.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, even);
    }

    #[test]
    fn caught_line() {
        let ok = format!("ns_per_call=1.0 thread=0 calls=5\nhot_leaf: done caught={CPP_THROWS} calls=5\n@entries: 5\n");
        assert!(check_caught(&ok).is_ok());
        assert!(check_caught("hot_leaf: done caught=3 calls=5\n").is_err());
        assert!(check_caught("ns_per_call=1.0\n").is_err());
    }
}
