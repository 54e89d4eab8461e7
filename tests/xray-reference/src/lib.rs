//! The reference reader of the tests: `llvm-xray` of LLVM 14 and 19 (the Debian packages `llvm`
//! and `llvm-19`) run on trace files and binaries, and its YAML output parsed ([`yaml`]).
//!
//! One copy for the workspace: the unit tests of `xray-fdr` (a dev-dependency) and the
//! end-to-end tests (the `tests` crate, which re-exports it) check files with it. It uses no
//! workspace crate, so it stays independent of the code under test and no dependency cycle
//! arises.
//!
//! - [`llvm_xray`], [`LLVM_XRAY_VERSIONS`]: where the tools are. A missing one panics saying
//!   what to install: the tests never skip.
//! - [`run`], [`run_output`], [`output_text`], [`tail_lines`]: running them.
//! - One version: [`convert`] ([`try_convert_text`] for callers that parse the text
//!   themselves), [`account`], [`fdr_dump`], [`extract_sleds`] ([`try_extract_sleds`]).
//! - [`both`]: both versions at once, asserting that each accepts the file and that they agree.
//!
//! A rejected trace file panics (or, from the `try_` functions, errs) naming the version, the
//! command and the file, with the end of the tool's stderr and of `llvm-xray fdr-dump` of the
//! file, which shows the parse error that `convert` and `account` hide behind a YAML message.

pub mod yaml;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub use yaml::{
    parse_convert_yaml, parse_extract_yaml, Converted, Header, Record, RecordKind, Sled, SledKind,
};

/// The llvm-xray versions every trace is checked with.
pub const LLVM_XRAY_VERSIONS: [u32; 2] = [14, 19];

/// llvm-xray of LLVM `major` (14 or 19) from the Debian packages. Panics if it is not
/// installed: the tests never skip for a missing tool.
pub fn llvm_xray(major: u32) -> PathBuf {
    let path = PathBuf::from(format!("/usr/lib/llvm-{major}/bin/llvm-xray"));
    if !path.is_file() {
        panic!(
            "{} missing: install Debian packages llvm and llvm-19 (cargo xtask setup does)",
            path.display()
        );
    }
    path
}

/// Runs a command to completion, capturing stdout and stderr. Panics if it cannot be started.
pub fn run_output(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// `llvm-xray ARGS` of LLVM `major`, run to completion.
pub fn run<I, S>(major: u32, args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_output(Command::new(llvm_xray(major)).args(args))
}

/// Stdout followed by stderr, as text.
pub fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Keeps the last `n` lines of `text` (for panic messages).
pub fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let skip = lines.len().saturating_sub(n);
    let mut out = String::new();
    if skip > 0 {
        out.push_str(&format!("[... {skip} lines cut ...]\n"));
    }
    for l in &lines[skip..] {
        out.push_str(l);
        out.push('\n');
    }
    out
}

/// `llvm-xray fdr-dump FILE` (stdout and stderr): shows the real parse error that
/// `convert`/`account` hide behind a YAML message.
pub fn fdr_dump(major: u32, file: &Path) -> String {
    output_text(&run(major, [OsStr::new("fdr-dump"), file.as_os_str()]))
}

/// `llvm-xray MAJOR WHAT ARGS FILE` with ARGS between the subcommand and the file.
fn run_on_file(major: u32, what: &[&str], args: &[&str], file: &Path) -> Output {
    let mut all: Vec<&OsStr> = what.iter().chain(args).map(OsStr::new).collect();
    all.push(file.as_os_str());
    run(major, all)
}

/// Why llvm-xray `major` rejected `file`: the command, its status, the end of its stderr and
/// the end of `fdr-dump` of the file (where the real error is).
fn rejected(major: u32, what: &str, args: &[&str], file: &Path, out: &Output) -> String {
    let args = if args.is_empty() {
        String::new()
    } else {
        format!("arguments {args:?}, ")
    };
    format!(
        "llvm-xray {major} {what} rejected {} ({args}{}):\n--- stderr:\n{}\n--- llvm-xray {major} fdr-dump (the real error is at the end):\n{}",
        file.display(),
        out.status,
        tail_lines(&String::from_utf8_lossy(&out.stderr), 40),
        tail_lines(&fdr_dump(major, file), 60)
    )
}

/// `llvm-xray MAJOR convert --output-format=yaml ARGS FILE` (ARGS e.g. `-symbolize
/// -instr_map=BIN`): its stdout, or why the tool rejected the file.
pub fn try_convert_text(major: u32, file: &Path, args: &[&str]) -> Result<String, String> {
    let out = run_on_file(major, &["convert", "--output-format=yaml"], args, file);
    if !out.status.success() {
        return Err(rejected(major, "convert", args, file, &out));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`try_convert_text`], parsed. Panics (with the tool's stderr and `fdr-dump`'s view of the
/// file) if the tool rejects the file, or if its output does not parse.
pub fn convert(major: u32, file: &Path, args: &[&str]) -> Converted {
    let text = try_convert_text(major, file, args).unwrap_or_else(|e| panic!("{e}"));
    parse_convert_yaml(&text).unwrap_or_else(|e| {
        panic!(
            "cannot parse llvm-xray {major} convert output for {}: {e}",
            file.display()
        )
    })
}

/// `llvm-xray MAJOR account ARGS FILE` (ARGS e.g. `-instr_map=BIN`, without `-keep-going`
/// unless given); returns its stdout. Panics (with stderr and `fdr-dump` output) if the tool
/// rejects the file.
pub fn account(major: u32, file: &Path, args: &[&str]) -> String {
    let out = run_on_file(major, &["account"], args, file);
    if !out.status.success() {
        panic!("{}", rejected(major, "account", args, file, &out));
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `llvm-xray MAJOR extract --symbolize BIN`, parsed; `Err` with the tool's stderr if it
/// cannot read the binary's map. Panics if its output does not parse.
pub fn try_extract_sleds(major: u32, bin: &Path) -> Result<Vec<Sled>, String> {
    let out = run_on_file(major, &["extract", "--symbolize"], &[], bin);
    if !out.status.success() {
        return Err(format!(
            "llvm-xray {major} extract {} failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(parse_extract_yaml(&String::from_utf8_lossy(&out.stdout))
        .unwrap_or_else(|e| panic!("llvm-xray {major} extract output: {e}")))
}

/// [`try_extract_sleds`]; panics if llvm-xray cannot read the map.
pub fn extract_sleds(major: u32, bin: &Path) -> Vec<Sled> {
    try_extract_sleds(major, bin).unwrap_or_else(|e| panic!("{e}"))
}

/// Both versions of [`LLVM_XRAY_VERSIONS`] at once: each must accept the file, and they must
/// agree. What is returned is LLVM 19's view.
pub mod both {
    use super::*;

    /// The part of a record both versions must agree on (function names may be printed
    /// differently by different llvm-xray versions).
    fn record_key(r: &Record) -> (i64, &RecordKind, u64, u32, u16, &[u64]) {
        (r.func_id, &r.kind, r.tsc, r.thread, r.cpu, &r.args)
    }

    /// [`super::convert`] (with `args`) in both versions: both must accept `file` and agree
    /// on the header and on every record's function id, kind, tsc, thread, cpu and arguments.
    pub fn convert(file: &Path, args: &[&str]) -> Converted {
        let [a, b] = LLVM_XRAY_VERSIONS.map(|major| super::convert(major, file, args));
        assert_eq!(
            a.header,
            b.header,
            "llvm-xray 14 and 19 disagree on the header of {}",
            file.display()
        );
        let (ka, kb): (Vec<_>, Vec<_>) = (
            a.records.iter().map(record_key).collect(),
            b.records.iter().map(record_key).collect(),
        );
        if ka != kb {
            let i = ka.iter().zip(&kb).take_while(|(x, y)| x == y).count();
            panic!(
                "llvm-xray 14 and 19 disagree on {}: record {i}: {:?} vs {:?} ({} vs {} records)",
                file.display(),
                a.records.get(i),
                b.records.get(i),
                ka.len(),
                kb.len()
            );
        }
        b
    }

    /// The records of `file` (`convert --output-format=yaml`, no instrumentation map needed
    /// when not symbolizing) as both versions read them, asserted to agree.
    pub fn load_records(file: &Path) -> Vec<Record> {
        convert(file, &[]).records
    }

    /// `fdr-dump` output lines (raw records with deltas) of both versions, asserted equal.
    pub fn dump(file: &Path) -> Vec<String> {
        let [a, b] = LLVM_XRAY_VERSIONS.map(|major| {
            let out = run(major, [OsStr::new("fdr-dump"), file.as_os_str()]);
            assert!(
                out.status.success(),
                "llvm-xray {major} fdr-dump failed on {}:\n{}",
                file.display(),
                output_text(&out)
            );
            output_text(&out)
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        });
        assert_eq!(
            a,
            b,
            "llvm-xray 14 and 19 dump {} differently",
            file.display()
        );
        b
    }

    /// Asserts that `llvm-xray account` (both versions, no `-keep-going`) accepts the file,
    /// symbolizing with `instr_map` if given; returns the LLVM 19 report.
    pub fn account(file: &Path, instr_map: Option<&Path>) -> String {
        let map_arg = instr_map.map(|m| format!("-instr_map={}", m.display()));
        let args: Vec<&str> = map_arg.as_deref().into_iter().collect();
        let [_, report] = LLVM_XRAY_VERSIONS.map(|major| super::account(major, file, &args));
        report
    }
}
