//! The `unwinding` benchmark (issue 14): how much real C++ code the per-function exit analysis
//! proves safe for a return probe, rule by rule, and how long it takes.
//!
//! `--exits auto` gives a function a return probe only where its machine code proves that no
//! exception can leave it (`xray_object::unwinding`). Which share of functions that is decides
//! what C++ tracing costs. The hidden `fdr-profiled bench-unwinding` runs the analysis over
//! every function of each file (instrumented or not): the project's two C++ fixtures, and real
//! C++ that every machine with the prerequisites has: GCC's `libstdc++` (built with exceptions)
//! and clang's `libclang-cpp` (LLVM code, built without exceptions, but calling `operator new`,
//! which can throw).
use super::support;
use crate::run;
use anyhow::{bail, Context as _, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Build flags of the fixtures (those of the tests' C++ fixtures).
const FLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fxray-instrument",
    "-fxray-instruction-threshold=1",
    "-pthread",
];

/// Real C++ objects to analyse, as globs: the first match of each that exists.
const SYSTEM_OBJECTS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
    "/usr/lib/llvm-19/lib/libclang-cpp.so.19*",
];

/// Columns of the table: (rule key, heading).
const COLUMNS: &[(&str, &str)] = &[
    ("leaf", "leaf"),
    ("calls_only_contained", "calls only safe"),
    ("exception_table", "exception table"),
    ("throws", "throws"),
    ("calls_may_unwind", "calls a may-unwind"),
    ("indirect_call", "indirect call"),
    ("indirect_jump", "indirect jump"),
    ("import", "unknown import"),
    ("unknown_target", "unknown target"),
];

/// Runs the benchmark; returns its markdown section.
pub fn run() -> Result<String> {
    let daemon = support::daemon()?;
    let work = support::scratch("unwinding")?;
    let mut files = Vec::new();
    for fixture in ["unwind_cases.cpp", "exceptions.cpp"] {
        files.push(build_fixture(&work, fixture)?);
    }
    for pattern in SYSTEM_OBJECTS {
        match first_match(pattern) {
            Some(path) => files.push(path),
            None => eprintln!("xtask bench unwinding: {pattern}: not found, skipped"),
        }
    }
    let out = Command::new(&daemon)
        .arg("bench-unwinding")
        .args(&files)
        .output()
        .context("running fdr-profiled bench-unwinding")?;
    if !out.status.success() {
        bail!(
            "fdr-profiled bench-unwinding failed: {}",
            support::last_lines(&String::from_utf8_lossy(&out.stderr), 3)
        );
    }
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("reading bench-unwinding's output")?;

    let mut s = String::new();
    let _ = writeln!(
        s,
        "## Exits chosen per function: what the analysis proves\n"
    );
    let _ = writeln!(
        s,
        "`--exits auto` gives a function a return probe (about 1 µs a call) only where its machine \
         code proves that no exception can leave it, and exit sleds (a single-stepped `ret`, 10 \
         to 30 µs) elsewhere. Share of all functions of each file (instrumented or not) by the \
         rule that decided; the first three columns get a return probe. Fixtures built with \
         `clang++-19 {}` (most of their functions are compiler-rt's XRay runtime, linked \
         statically); `libstdc++` is GCC's C++ runtime (built with exceptions), \
         `libclang-cpp` is LLVM code (built without exceptions, but `operator new` can throw).\n",
        FLAGS.join(" ")
    );
    let _ = writeln!(s, "{}\n", support::machine_description());
    let mut header = "| file | functions | return probe |".to_owned();
    let mut rule = "|---|---:|---:|".to_owned();
    for (_, title) in COLUMNS {
        let _ = write!(header, " {title} |");
        rule.push_str("---:|");
    }
    header.push_str(" analysis time |");
    rule.push_str("---:|");
    let _ = writeln!(s, "{header}\n{rule}");
    let root = run::workspace_root();
    for row in &rows {
        let functions = row["functions"].as_u64().unwrap_or(0).max(1) as f64;
        let pct = |n: u64| format!("{:.1}%", 100.0 * n as f64 / functions);
        let file = row["file"].as_str().unwrap_or("?");
        let file = Path::new(file)
            .strip_prefix(&root)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| file.to_owned());
        let _ = write!(
            s,
            "| `{file}` | {} | {} |",
            row["functions"],
            pct(row["contained"].as_u64().unwrap_or(0))
        );
        for (key, _) in COLUMNS {
            let _ = write!(s, " {} |", pct(row["rules"][key].as_u64().unwrap_or(0)));
        }
        let _ = writeln!(
            s,
            " {:.0} ms for {:.1} MiB |",
            row["seconds"].as_f64().unwrap_or(0.0) * 1e3,
            row["bytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64
        );
    }
    let _ = writeln!(
        s,
        "\nRules (README, \"Exits chosen per function\"): *leaf* calls nothing; *calls only safe* \
         calls only functions proven safe and harmless imports; *exception table*: its LSDA keeps \
         every exception in (`noexcept`, `catch (...)`). The others may unwind: *throws* calls a \
         thrower; *calls a may-unwind* calls (or tail-jumps to) a function that may; *indirect* \
         calls and jumps go through pointers (virtual calls, function pointers, switch tables); \
         *unknown import* is an imported function not on the list of harmless ones (`operator \
         new` among them); *unknown target* an address that starts no known function.\n"
    );
    let _ = writeln!(
        s,
        "Measured with `target/release/fdr-profiled bench-unwinding FILE...`."
    );
    Ok(s)
}

/// Compiles `tests/fixtures/NAME` into `dir`.
fn build_fixture(dir: &Path, name: &str) -> Result<PathBuf> {
    let source = run::workspace_root()
        .join("tests")
        .join("fixtures")
        .join(name);
    let bin = dir.join(name.trim_end_matches(".cpp"));
    run::status(
        Command::new("clang++-19")
            .args(FLAGS)
            .arg(&source)
            .arg("-o")
            .arg(&bin),
    )?;
    Ok(bin)
}

/// The first existing path matching `pattern` (a `*` only in the last component).
fn first_match(pattern: &str) -> Option<PathBuf> {
    let path = Path::new(pattern);
    let name = path.file_name()?.to_str()?;
    let Some(prefix) = name.strip_suffix('*') else {
        return path.exists().then(|| path.to_path_buf());
    };
    let mut found: Vec<PathBuf> = std::fs::read_dir(path.parent()?)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect();
    found.sort();
    found.into_iter().next()
}
