//! What the benchmarks share: where the build puts things, the `calls.c` workload, a
//! description of the machine for the report, running a measured command, and medians.
use crate::run;
use anyhow::{bail, Context as _, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// The cargo target directory (see [`run::target_dir`]).
pub fn target_dir() -> PathBuf {
    run::target_dir()
}

/// The release daemon that `cargo xtask bench` built before running any section.
pub fn daemon() -> Result<PathBuf> {
    let path = target_dir().join("release").join("fdr-profiled");
    if !path.is_file() {
        bail!("{} is missing (the release build failed?)", path.display());
    }
    Ok(path)
}

/// A fresh, empty scratch directory `<target>/bench/<name>`.
pub fn scratch(name: &str) -> Result<PathBuf> {
    let dir = target_dir().join("bench").join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Compiles `tests/fixtures/calls.c` into `dir/calls` with the tests' flags.
pub fn build_calls(dir: &Path) -> Result<PathBuf> {
    let bin = dir.join("calls");
    let source = run::workspace_root().join("tests/fixtures/calls.c");
    run::xray_build("clang-19", &source, &bin, &["-pthread"])?;
    Ok(bin)
}

/// Compiles `tests/fixtures/deep_server.cpp` (the C++ server of the `cxx_pid` and `budget`
/// benchmarks) into `dir/deep_server`.
pub fn build_deep_server(dir: &Path) -> Result<PathBuf> {
    let bin = dir.join("deep_server");
    let source = run::workspace_root().join("tests/fixtures/deep_server.cpp");
    run::xray_build("clang++-19", &source, &bin, &[])?;
    Ok(bin)
}

/// A background process, stopped (SIGINT) and reaped when dropped.
pub struct Background(pub Child);

impl Drop for Background {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGINT) };
        let _ = self.0.wait();
    }
}

/// One line per fact about where the numbers were taken: kernel, CPUs, load, tool versions.
/// Noise from other work on the machine shows in the load average.
pub fn machine_description() -> String {
    let first_line = |cmd: &mut Command| {
        run::output(cmd)
            .and_then(|s| s.lines().next().map(str::to_owned))
            .unwrap_or_else(|| "unavailable".to_owned())
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!(
        "- date: {}\n- kernel: {}\n- CPU: {cpu}, {cpus} CPUs available\n- load average when the section started: {}\n- clang: {}",
        first_line(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"])),
        first_line(Command::new("uname").args(["-r"])),
        load.join(" "),
        first_line(Command::new("clang-19").arg("--version")),
    )
}

/// What a measured command printed.
pub struct Output {
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

/// Runs `program args`, killed after `limit_secs` (coreutils `timeout`: SIGTERM, then SIGKILL 10 s
/// later), and fails unless it exits 0.
pub fn run_limited(limit_secs: u32, program: &str, args: &[String]) -> Result<Output> {
    let out = Command::new("timeout")
        .args(["--kill-after=10", &limit_secs.to_string(), program])
        .args(args)
        .output()
        .with_context(|| format!("could not start {program}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            last_lines(&stderr, 3)
        );
    }
    Ok(Output { stdout, stderr })
}

/// The last `n` non-empty lines of `text`, joined with ` / ` (for one-line errors).
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" / ")
}

/// The median of `values` (the mean of the middle two for an even count); `None` if empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 2.0]), Some(2.0));
    }

    #[test]
    fn last_lines_of_text() {
        assert_eq!(last_lines("a\n\nb\nc\n", 2), "b / c");
        assert_eq!(last_lines("", 2), "");
    }
}
