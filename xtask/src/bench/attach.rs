//! The attach benchmark (issue 5): placing and removing the probes of a generated binary with
//! 100,000 instrumented functions, with one `uprobe_multi` link versus one perf event per probe
//! (the fallback for kernels before 6.6), measured by the hidden `fdr-profiled bench-attach`.
//!
//! Each method runs twice: with no process running the binary (the kernel only records the
//! probes) and with one process parked in it (the kernel also writes a breakpoint into that
//! process's copy of every probed page). The perf-event fallback is measured on a subset of the
//! probes: removing each perf-event uprobe waits for RCU grace periods under a kernel lock
//! (about 0.1 s each on the machine below; closing them from 64 threads was no faster), so all
//! 200,000 would take hours; its full-size numbers are that subset scaled linearly, and
//! labelled so.
use super::support::{self, median, run_limited};
use anyhow::{bail, Context as _, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Instrumented functions in the generated binary (plus `main`).
const FUNCTIONS: usize = 100_000;
/// Source files they are spread over (compiled in parallel).
const PARTS: usize = 10;
/// Compiler flags of every part and of `main.c`.
const FLAGS: &[&str] = &["-O1", "-fxray-instrument", "-fxray-instruction-threshold=1"];
/// Rounds of the `uprobe_multi` measurements (each takes about a second).
const MULTI_ROUNDS: usize = 3;
/// Probes in the perf-event subset, unless `FDR_BENCH_ATTACH_PERF_PROBES` says otherwise.
const DEFAULT_PERF_PROBES: usize = 500;
/// Seconds after which one measurement is killed.
const LIMIT_SECS: u32 = 1800;
/// The goal for uprobe_multi, in seconds, for each of attach and detach.
const GOAL_SECS: f64 = 1.0;

/// One `bench-attach` result.
struct Measured {
    probes: u64,
    plan_probes: u64,
    functions: u64,
    attach_s: f64,
    detach_s: f64,
    fds: u64,
}

/// Runs the benchmark and returns its markdown section.
pub fn run() -> Result<String> {
    let daemon = support::daemon()?;
    let binary = generated_binary()?;
    let perf_probes: usize = match std::env::var("FDR_BENCH_ATTACH_PERF_PROBES") {
        Ok(v) => v.parse().context("FDR_BENCH_ATTACH_PERF_PROBES")?,
        Err(_) => DEFAULT_PERF_PROBES,
    };
    let mut rows = Vec::new();
    let mut rescan = None;
    for running in [false, true] {
        let parked = if running {
            Some(Parked::start(&binary)?)
        } else {
            None
        };
        let mut multi = Vec::new();
        for _ in 0..MULTI_ROUNDS {
            multi.push(bench_attach(&daemon, &binary, &["--mode", "multi"])?);
        }
        let limit = perf_probes.to_string();
        let perf = bench_attach(&daemon, &binary, &["--mode", "perf", "--limit", &limit])?;
        if let Some(parked) = &parked {
            rescan = Some(bench_rescan(&daemon, parked.0.id())?);
        }
        drop(parked);
        rows.push((running, multi, perf));
    }

    let first = &rows[0].1[0];
    let mut out = String::new();
    writeln!(out, "## Attach and detach (issue 5)\n")?;
    writeln!(
        out,
        "A generated C program with {} instrumented functions ({} sleds: an entry and an exit \
         each), built with `clang-19 {}`; every sled gets a probe running the real `sled` program. \
         `uprobe_multi`: one `BPF_LINK_CREATE` link for all probes (median of {MULTI_ROUNDS} \
         runs). Perf events: one perf-event uprobe and descriptor per probe, placed and removed \
         one at a time as aya does, measured on the first {perf_probes} probes; the 200k rows \
         scale that linearly (*extrapolated*, not measured). Removing a perf-event uprobe waits \
         for RCU grace periods under a kernel lock, so closing them from many threads does not \
         help (64 threads measured no faster); a daemon on the fallback also takes that long to \
         exit. File descriptors: those the attached probes hold.\n",
        thousands(first.functions),
        thousands(first.plan_probes),
        FLAGS.join(" ")
    )?;
    writeln!(out, "{}\n", support::machine_description())?;
    writeln!(
        out,
        "| method | process running the binary | probes | attach | detach | descriptors held |"
    )?;
    writeln!(out, "|---|---|---:|---:|---:|---:|")?;
    let mut goal = Vec::new();
    for (running, multi, perf) in &rows {
        let who = if *running { "one (parked)" } else { "none" };
        let attach = median(&multi.iter().map(|m| m.attach_s).collect::<Vec<_>>()).unwrap_or(0.0);
        let detach = median(&multi.iter().map(|m| m.detach_s).collect::<Vec<_>>()).unwrap_or(0.0);
        let m = &multi[0];
        writeln!(
            out,
            "| uprobe_multi | {who} | {} | {} | {} | {} |",
            thousands(m.probes),
            seconds(attach),
            seconds(detach),
            m.fds
        )?;
        goal.push(attach < GOAL_SECS && detach < GOAL_SECS);
        writeln!(
            out,
            "| perf event per probe | {who} | {} | {} | {} | {} |",
            thousands(perf.probes),
            seconds(perf.attach_s),
            seconds(perf.detach_s),
            perf.fds
        )?;
        let scale = perf.plan_probes as f64 / perf.probes.max(1) as f64;
        writeln!(
            out,
            "| perf event per probe, *extrapolated* | {who} | {} | *{}* | *{}* | *{}* |",
            thousands(perf.plan_probes),
            seconds(perf.attach_s * scale),
            seconds(perf.detach_s * scale),
            thousands((perf.fds as f64 * scale).round() as u64)
        )?;
    }
    let met = if goal.iter().all(|g| *g) {
        "met"
    } else {
        "NOT met"
    };
    writeln!(
        out,
        "\nGoal (100k functions attached in under {GOAL_SECS} s and detached in under {GOAL_SECS} s \
         with uprobe_multi): **{met}**.\n\n{}",
        descriptor_limits()
    )?;
    if let Some(r) = rescan {
        writeln!(
            out,
            "\nFinding a running process's objects (`--pid`), measured on the parked process \
             ({} mapped files, {} instrumented, {} functions): the first scan, which screens \
             every file and plans the instrumented ones, took {}; each rescan for objects \
             loaded since (every 200 ms while recording; nothing new, so only \
             `/proc/PID/maps` is read) {:.0} µs, i.e. {:.3}% of one CPU.",
            r.files,
            r.instrumented,
            thousands(r.functions),
            seconds(r.first_scan_s),
            r.rescan_us,
            r.rescan_us / 200_000.0 * 100.0
        )?;
    }
    Ok(out)
}

/// How many perf-event probes this machine lets the daemon hold: one descriptor each, up to the
/// hard `RLIMIT_NOFILE`, or up to `fs.nr_open` with CAP_SYS_RESOURCE (containers often lack it).
fn descriptor_limits() -> String {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointer to an rlimit to fill.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let nr_open: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let cap_sys_resource = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let caps = s
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))?
                .to_owned();
            u64::from_str_radix(caps.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << 24) != 0);
    let ceiling = if cap_sys_resource {
        nr_open
    } else {
        lim.rlim_max
    };
    format!(
        "Descriptors: without `uprobe_multi` every probe holds one, so the daemon raises \
         `RLIMIT_NOFILE` as far as it may and stops with an error when that is not enough. Here \
         the hard limit is {}, `fs.nr_open` is {} and CAP_SYS_RESOURCE is {}: the fallback \
         could hold at most about {} probes.",
        thousands(lim.rlim_max),
        thousands(nr_open),
        if cap_sys_resource {
            "present"
        } else {
            "absent"
        },
        thousands(ceiling.saturating_sub(1024)),
    )
}

/// `1234567` as `1,234,567`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One `bench-rescan` result.
struct Rescan {
    files: u64,
    instrumented: u64,
    functions: u64,
    first_scan_s: f64,
    rescan_us: f64,
}

/// The JSON line a hidden `fdr-profiled bench-*` tool prints, with typed field access.
struct ToolJson {
    line: String,
    json: serde_json::Value,
}

impl ToolJson {
    /// Runs `fdr-profiled ARGS` (under the time limit) and parses its last stdout line.
    fn run(daemon: &Path, args: &[String]) -> Result<ToolJson> {
        let out = run_limited(LIMIT_SECS, &daemon.display().to_string(), args)?;
        let line = out
            .stdout
            .lines()
            .last()
            .with_context(|| format!("{} printed nothing", args[0]))?
            .to_owned();
        let json =
            serde_json::from_str(&line).with_context(|| format!("{} printed {line:?}", args[0]))?;
        Ok(ToolJson { line, json })
    }

    fn uint(&self, key: &str) -> Result<u64> {
        self.json[key]
            .as_u64()
            .with_context(|| format!("{key} in {}", self.line))
    }

    fn float(&self, key: &str) -> Result<f64> {
        self.json[key]
            .as_f64()
            .with_context(|| format!("{key} in {}", self.line))
    }
}

/// Runs `fdr-profiled bench-rescan PID` and parses its JSON line.
fn bench_rescan(daemon: &Path, pid: u32) -> Result<Rescan> {
    let j = ToolJson::run(daemon, &["bench-rescan".to_string(), pid.to_string()])?;
    Ok(Rescan {
        files: j.uint("files")?,
        instrumented: j.uint("instrumented")?,
        functions: j.uint("functions")?,
        first_scan_s: j.float("first_scan_s")?,
        rescan_us: j.float("rescan_us")?,
    })
}

/// Runs `fdr-profiled bench-attach ARGS BINARY` and parses its JSON line.
fn bench_attach(daemon: &Path, binary: &Path, args: &[&str]) -> Result<Measured> {
    let mut all: Vec<String> = vec!["bench-attach".into()];
    all.extend(args.iter().map(|a| a.to_string()));
    all.push(binary.display().to_string());
    let j = ToolJson::run(daemon, &all)?;
    Ok(Measured {
        probes: j.uint("probes")?,
        plan_probes: j.uint("plan_probes")?,
        functions: j.uint("functions")?,
        attach_s: j.float("attach_s")?,
        detach_s: j.float("detach_s")?,
        fds: j.uint("fds")?,
    })
}

fn seconds(s: f64) -> String {
    if s >= 7200.0 {
        format!("{:.1} h", s / 3600.0)
    } else if s >= 120.0 {
        format!("{:.0} min", s / 60.0)
    } else if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.0} ms", s * 1000.0)
    }
}

/// A process parked in the generated binary (`--park`: `pause()`), killed when dropped.
struct Parked(Child);

impl Parked {
    fn start(binary: &Path) -> Result<Parked> {
        let child = Command::new(binary)
            .arg("--park")
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        // Its pages are mapped once it runs main; a short wait is plenty.
        std::thread::sleep(std::time::Duration::from_millis(300));
        Ok(Parked(child))
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The generated binary, built once and kept in `<target>/bench-attach/` (rebuilt when the
/// recipe recorded next to it changes).
fn generated_binary() -> Result<PathBuf> {
    let dir = support::target_dir().join("bench-attach");
    let binary = dir.join("attach100k");
    let recipe = format!(
        "v1 {FUNCTIONS} functions in {PARTS} parts, {}",
        FLAGS.join(" ")
    );
    let stamp = dir.join("attach100k.recipe");
    if binary.is_file() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&recipe) {
        return Ok(binary);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    eprintln!("xtask bench attach: generating and compiling {FUNCTIONS} functions");
    let per_part = FUNCTIONS.div_ceil(PARTS);
    let mut objects = Vec::new();
    let mut sources = Vec::new();
    for part in 0..PARTS {
        let mut c = String::new();
        for i in part * per_part..((part + 1) * per_part).min(FUNCTIONS) {
            // Distinct constants keep bodies distinct (no merging); noinline keeps each function.
            writeln!(
                c,
                "__attribute__((noinline)) int bf_{i}(int x) {{ return x * {} + {i}; }}",
                i % 9973 + 3
            )?;
        }
        let source = dir.join(format!("part{part}.c"));
        std::fs::write(&source, c).with_context(|| format!("writing {}", source.display()))?;
        objects.push(dir.join(format!("part{part}.o")));
        sources.push(source);
    }
    let main = dir.join("main.c");
    std::fs::write(
        &main,
        "#include <string.h>\n#include <unistd.h>\nint bf_0(int);\n\
         int main(int argc, char **argv) {\n\
           if (argc > 1 && !strcmp(argv[1], \"--park\")) pause();\n\
           return bf_0(argc) == 0;\n}\n",
    )?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    for batch in sources
        .iter()
        .zip(&objects)
        .collect::<Vec<_>>()
        .chunks(jobs)
    {
        let mut children = Vec::new();
        for (source, object) in batch {
            let child = Command::new("clang-19")
                .args(FLAGS)
                .arg("-c")
                .arg(source)
                .arg("-o")
                .arg(object)
                .spawn()
                .context("starting clang-19")?;
            children.push((source, child));
        }
        for (source, mut child) in children {
            if !child.wait()?.success() {
                bail!("clang-19 failed on {}", source.display());
            }
        }
    }
    let status = Command::new("clang-19")
        .args(FLAGS)
        .arg(&main)
        .args(&objects)
        .arg("-o")
        .arg(&binary)
        .status()
        .context("starting clang-19")?;
    if !status.success() {
        bail!("linking {} failed", binary.display());
    }
    std::fs::write(&stamp, recipe)?;
    Ok(binary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_for_the_table() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(200_002), "200,002");
        assert_eq!(thousands(1_048_576), "1,048,576");
        assert_eq!(seconds(0.1474), "147 ms");
        assert_eq!(seconds(1.5), "1.50 s");
        assert_eq!(seconds(600.0), "10 min");
        assert_eq!(seconds(54_248.0), "15.1 h");
    }
}
