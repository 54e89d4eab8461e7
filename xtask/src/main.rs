//! `cargo xtask`: everything around the Rust build — installing prerequisites, building the eBPF
//! programs and the daemon, the demo, the whole test suite, and benchmarks.
//!
//! The two commands the README promises are `cargo xtask demo` and `cargo xtask test`; both run
//! `setup` first so that a fresh machine needs nothing else.
mod bench;
mod cross;
mod demo;
mod install;
mod run;
mod setup;
mod viewers;
mod vm;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "xtask",
    about = "Set-up, build, demo and tests of fdr-profiled"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install every prerequisite (idempotent): nightly rust-src, bpf-linker, clang/llvm packages.
    Setup,
    /// Set up, then build everything (eBPF programs and the daemon, release profile).
    Build,
    /// Set up, build, build a demo XRay program, trace it and print the symbolized report.
    Demo,
    /// Set up, then run every test: unit tests and end-to-end tests that load real BPF, the
    /// arm64 ones in an emulated arm64 machine among them.
    Test {
        /// Only the tests of this architecture's machine (`aarch64`: `tests/tests/aarch64`).
        #[arg(long, value_parser = ["aarch64"])]
        arch: Option<String>,
        /// Extra arguments passed to `cargo test` (e.g. a test name filter after `--`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, build (release) and install the binary, the systemd unit and the example
    /// configuration (kept if one exists); starts nothing.
    Install {
        /// Where the binary goes: PREFIX/bin/fdr-profiled.
        #[arg(long, default_value = "/usr/local")]
        prefix: std::path::PathBuf,
        /// Install under this directory instead of / (to stage or inspect).
        #[arg(long, default_value = "/")]
        root: std::path::PathBuf,
    },
    /// Set up, build (release) and make the Debian package (cargo-deb) in target/debian/.
    Package,
    /// Run COMMAND (`sh -c`) in an emulated machine of ARCH (aarch64), the workspace shared at
    /// the path it has here; its kernel and initramfs are made once under target/vm/. Exits with COMMAND's
    /// status.
    Vm {
        /// The machine's architecture.
        #[arg(value_parser = ["aarch64"])]
        arch: String,
        /// Seconds before the machine is stopped.
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
        /// The command, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Set up, build (release), run benchmarks and write BENCHMARKS.md at the repository root.
    Bench {
        /// Which benchmark: a section name (calls, ...) or `all`.
        #[arg(default_value = "all", value_parser = clap::builder::PossibleValuesParser::new(bench::names()))]
        which: String,
    },
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Setup => setup::setup(),
        Command::Build => setup::setup().and_then(|()| build(true)),
        Command::Demo => demo::demo(),
        Command::Test { arch, args } => test(arch.as_deref(), &args),
        Command::Bench { which } => bench::bench(&which),
        Command::Install { prefix, root } => install::install(&prefix, &root),
        Command::Package => install::package(),
        Command::Vm {
            arch,
            timeout,
            command,
        } => vm::vm(&arch, &command, std::time::Duration::from_secs(timeout)),
    };
    if let Err(err) = result {
        eprintln!("xtask: error: {err:#}");
        std::process::exit(1);
    }
}

/// Builds the daemon (and with it the eBPF object, through its build script).
fn build(release: bool) -> Result<()> {
    let mut args = vec!["build", "--package", "profiler-daemon"];
    if release {
        args.push("--release");
    }
    run::cargo(&args)
}

/// Runs the whole suite. The end-to-end tests call the `fdr-profiled` binary, so it is built
/// first; `cargo test` alone only builds the daemon's library. The arm64 tests need their
/// machine, the arm64 daemon and runtime (`cross::prepare`). Ends with one line totalling every
/// test binary's results, so the log's last word is the whole suite's, not the last doc-test's.
/// With `arch`, only that architecture's tests run.
fn test(arch: Option<&str>, extra: &[String]) -> Result<()> {
    setup::setup()?;
    cross::prepare()?;
    if arch.is_some() {
        // The host's daemon reads the arm64 sessions back (`report`, `dump`).
        build(false)?;
        let mut args = vec!["test", "--package", "tests", "--test", "aarch64"];
        args.extend(extra.iter().map(String::as_str));
        return totals(run::cargo_test(&args)?);
    }
    build(false)?;
    // The full-speed loss tests (tests/tests/loss.rs) run the release daemon: throughput is a
    // property of the optimised build.
    build(true)?;
    // Every test binary runs even after one fails, so a run reports every failure at once.
    let mut args = vec![
        "test",
        "--workspace",
        "--exclude",
        "profiler-ebpf",
        "--no-fail-fast",
    ];
    args.extend(extra.iter().map(String::as_str));
    totals(run::cargo_test(&args)?)
}

/// Prints the one line of totals; fails if a test failed or the run failed otherwise.
fn totals(totals: run::TestTotals) -> Result<()> {
    println!("{} passed, {} failed", totals.passed, totals.failed);
    if totals.failed > 0 {
        anyhow::bail!("{} tests failed", totals.failed);
    }
    if !totals.success {
        anyhow::bail!("cargo test failed without a failing test (a build error? see above)");
    }
    Ok(())
}
