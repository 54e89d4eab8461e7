//! The `cxx_suite` benchmark (issue 16): a real C++ library's own test suite traced whole,
//! with each way of observing exits.
//!
//! yaml-cpp 0.7.0 (Debian's source tarball, checked by its SHA-256; gtest and gmock from
//! Debian's `libgtest-dev` and `libgmock-dev`) and its tests are built with
//! `-fxray-instrument`, then a slice of its gtest suite that throws (malformed documents,
//! missing keys, bad conversions) runs untraced, under `--exits repair`, under the defaults
//! (`auto`, which repairs a launched command that can unwind; the table says what they chose)
//! and under `--exits sleds`. Every traced run must pass the same tests as the untraced one.
//! Target (issue 16): the defaults take at most 0.25x the time of `--exits sleds`.
use super::support::{self, median};
use crate::run;
use anyhow::{bail, Context as _, Result};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Instant;

const VERSION: &str = "0.7.0";
const SOURCE_URL: &str =
    "http://deb.debian.org/debian/pool/main/y/yaml-cpp/yaml-cpp_0.7.0+dfsg.orig.tar.xz";
const SOURCE_SHA256: &str = "dc63708605404e0b963e0ca3a9619d1c8270eda2839603e6fa0384e5e51e5312";
const CXXFLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fxray-instrument",
    "-fxray-instruction-threshold=1",
    "-std=c++17",
    "-w",
];
/// The slice of the suite that runs: node and parser tests, where yaml-cpp throws for bad
/// input and bad conversions (the whole suite takes minutes a run under exit sleds here).
pub(super) const FILTER: &str =
    "--gtest_filter=NodeTest.*:LoadNodeTest.*:ParserTest.*:NodeSpecTest.*";
/// Untraced runs (median taken).
const UNTRACED_RUNS: usize = 5;
/// A traced run's time limit, in seconds.
const LIMIT_SECS: u32 = 1800;

/// Runs the benchmark; returns its markdown section.
pub fn run() -> Result<String> {
    let daemon = support::daemon()?;
    let tests = build()?;
    let machine = support::machine_description();
    let work = support::scratch("cxx_suite")?;

    let mut untraced = Vec::new();
    let mut passed = String::new();
    for _ in 0..UNTRACED_RUNS {
        let (secs, line) = timed(Command::new(&tests).arg(FILTER))?;
        untraced.push(secs);
        passed = line;
    }
    let untraced = median(&untraced).unwrap_or(f64::NAN);
    eprintln!("xtask bench cxx_suite: untraced {untraced:.3} s ({passed})");
    let mut rows = Vec::new();
    for (name, exits) in [
        ("`--exits repair`", Some("repair")),
        ("defaults (`auto`)", None),
        ("`--exits sleds`", Some("sleds")),
    ] {
        let out = work.join(exits.unwrap_or("defaults"));
        let mut cmd = Command::new("timeout");
        cmd.args(["--kill-after=10", &LIMIT_SECS.to_string()])
            .arg(&daemon)
            .args(exits.map(|e| ["--exits", e]).into_iter().flatten())
            .args(["--no-report", "--out"])
            .arg(&out)
            .arg("--")
            .arg(&tests)
            .arg(FILTER);
        let (secs, line) = timed(&mut cmd)?;
        if line != passed {
            bail!("{name}: the suite said {line:?}, untraced {passed:?}");
        }
        let session: serde_json::Value = serde_json::from_slice(
            &std::fs::read(out.join("session.json")).context("reading session.json")?,
        )?;
        let lost = session["events_lost"].as_u64().unwrap_or(u64::MAX);
        let events = session["events"].as_u64().unwrap_or(0);
        let method = session["exits"].as_str().unwrap_or_default().to_owned();
        eprintln!("xtask bench cxx_suite: {name}: {secs:.1} s, {events} events, {lost} lost");
        rows.push((name, method, secs, events, lost));
        let _ = std::fs::remove_dir_all(&out);
    }

    let sleds = rows.last().map_or(f64::NAN, |r| r.2);
    let repair = rows[0].2 / sleds;
    let ratio = rows[1].2 / sleds;
    let mut s = String::new();
    let _ = writeln!(s, "## A real C++ test suite: yaml-cpp {VERSION}\n");
    let _ = writeln!(
        s,
        "yaml-cpp {VERSION} and its own gtest suite (Debian's source tarball; gtest and gmock \
         from Debian), built with `clang++-19 {}`, run with `{FILTER}` ({passed}): once per \
         configuration, {UNTRACED_RUNS} times untraced (median). Every traced run passes the \
         same tests.\n",
        CXXFLAGS.join(" ")
    );
    let _ = writeln!(s, "{machine}\n");
    let _ = writeln!(
        s,
        "| configuration | exits | wall time | / untraced | / `--exits sleds` | events | lost |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|");
    let _ = writeln!(s, "| untraced | | {untraced:.3} s | 1.0x | | | |");
    for (name, method, secs, events, lost) in &rows {
        let _ = writeln!(
            s,
            "| {name} | {method} | {secs:.1} s | {:.0}x | {:.2}x | {events} | {lost} |",
            secs / untraced,
            secs / sleds
        );
    }
    let _ = writeln!(
        s,
        "\nTarget (issue 16): the defaults at most 0.25x the time of `--exits sleds`: \
         {ratio:.2}x, {} (`--exits repair`: {repair:.2}x).",
        if ratio <= 0.25 { "met" } else { "not met" }
    );
    Ok(s)
}

/// Runs the suite as `cmd` says; returns its wall time and gtest's closing `[  PASSED  ]`
/// line. Fails unless it exits 0.
fn timed(cmd: &mut Command) -> Result<(f64, String)> {
    let started = Instant::now();
    let out = cmd.output().context("running the yaml-cpp tests")?;
    let secs = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "the yaml-cpp tests failed ({}): {}",
            out.status,
            support::last_lines(
                &format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr)),
                3
            )
        );
    }
    let passed = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("[  PASSED  ]"))
        .context("gtest printed no [  PASSED  ] line")?
        .to_owned();
    Ok((secs, passed))
}

/// The instrumented test binary, built once into the cache.
pub(super) fn build() -> Result<PathBuf> {
    let dir = crate::setup::cache_dir().join(format!("yaml-cpp-{VERSION}"));
    let binary = dir.join("yaml-cpp-tests");
    if binary.is_file() {
        return Ok(binary);
    }
    std::fs::create_dir_all(&dir)?;
    let tarball = dir.join("source.tar.xz");
    run::fetch_source(SOURCE_URL, SOURCE_SHA256, &tarball, &dir).context("yaml-cpp's source")?;
    let mut sources = Vec::new();
    for sub in [
        "src",
        "src/contrib",
        "test",
        "test/integration",
        "test/node",
    ] {
        for entry in std::fs::read_dir(dir.join(sub))?.flatten() {
            if entry.path().extension().is_some_and(|e| e == "cpp") {
                sources.push(entry.path());
            }
        }
    }
    sources.sort();
    let objects = dir.join("obj");
    std::fs::create_dir_all(&objects)?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    eprintln!(
        "xtask bench cxx_suite: compiling {} files of yaml-cpp {VERSION} and its tests ({jobs} at a time)",
        sources.len()
    );
    let mut running: Vec<(PathBuf, Child)> = Vec::new();
    let mut outputs = Vec::new();
    for (i, source) in sources.iter().enumerate() {
        if running.len() >= jobs {
            wait_one(&mut running)?;
        }
        let object = objects.join(format!("{i}.o"));
        let child = Command::new("clang++-19")
            .args(CXXFLAGS)
            .arg(format!("-I{}", dir.join("include").display()))
            .arg(format!("-I{}", dir.join("src").display()))
            .arg(format!("-I{}", dir.join("test").display()))
            .arg(format!("-I{}", dir.join("test/integration").display()))
            .arg("-c")
            .arg(source)
            .arg("-o")
            .arg(&object)
            .spawn()
            .context("starting clang++-19")?;
        running.push((source.clone(), child));
        outputs.push(object);
    }
    while !running.is_empty() {
        wait_one(&mut running)?;
    }
    let partial = dir.join("yaml-cpp-tests.partial");
    run::status(
        Command::new("clang++-19")
            .arg("-fxray-instrument")
            .args(&outputs)
            .args(["-lgmock", "-lgtest", "-pthread", "-o"])
            .arg(&partial),
    )
    .context("linking the yaml-cpp tests")?;
    std::fs::rename(&partial, &binary)?;
    Ok(binary)
}

/// Waits for the oldest compiler still running; fails if it failed.
fn wait_one(running: &mut Vec<(PathBuf, Child)>) -> Result<()> {
    let (source, mut child) = running.remove(0);
    let status = child.wait()?;
    if !status.success() {
        bail!("clang++-19 failed on {} ({status})", source.display());
    }
    Ok(())
}
