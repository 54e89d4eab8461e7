//! Runs the reference reader (`llvm-xray` of LLVM 14 and 19) on trace files, for the unit tests
//! of this module tree.
use std::path::{Path, PathBuf};
use std::process::Command;

/// The two reference readers the files must satisfy.
pub(crate) const VERSIONS: [&str; 2] = [
    "/usr/lib/llvm-14/bin/llvm-xray",
    "/usr/lib/llvm-19/bin/llvm-xray",
];

/// One expanded record as `llvm-xray convert --output-format=yaml` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct XrayRecord {
    pub func_id: u32,
    /// `function-enter`, `function-exit`, `function-tail-exit`, `function-enter-arg`.
    pub kind: String,
    pub tsc: u64,
    pub cpu: u16,
    pub thread: u32,
}

fn tool(path: &str) -> PathBuf {
    let p = PathBuf::from(path);
    assert!(
        p.exists(),
        "{path} is missing: install the Debian packages `llvm` (LLVM 14) and `llvm-19`"
    );
    p
}

pub(crate) fn run(tool_path: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(tool(tool_path))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {tool_path}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let at = line
        .find(key)
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        + key.len();
    let rest = &line[at..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim()
}

fn parse_yaml(yaml: &str) -> Vec<XrayRecord> {
    yaml.lines()
        .filter(|l| l.trim_start().starts_with("- {"))
        .map(|l| XrayRecord {
            func_id: field(l, " func-id: ").parse().unwrap(),
            kind: field(l, " kind: ").to_string(),
            tsc: field(l, " tsc: ").parse().unwrap(),
            cpu: field(l, " cpu: ").parse().unwrap(),
            thread: field(l, " thread: ").parse().unwrap(),
        })
        .collect()
}

/// Loads `path` with `convert --output-format=yaml` in both versions (no instrumentation map
/// needed when not symbolizing), asserts both succeed and agree, and returns the records.
pub(crate) fn load_records(path: &Path) -> Vec<XrayRecord> {
    let p = path.to_str().unwrap();
    let mut results = Vec::new();
    for v in VERSIONS {
        let (ok, text) = run(v, &["convert", "--output-format=yaml", p]);
        let (_, dump) = run(v, &["fdr-dump", "-verify", p]);
        assert!(
            ok,
            "{v} convert failed on {p}:\n{text}\nfdr-dump -verify says:\n{dump}"
        );
        results.push(parse_yaml(&text));
    }
    assert_eq!(
        results[0], results[1],
        "llvm-xray 14 and 19 disagree on {p}"
    );
    results.pop().unwrap()
}

/// `fdr-dump` output lines (raw records with deltas) of both versions, asserted equal.
pub(crate) fn dump(path: &Path) -> Vec<String> {
    let p = path.to_str().unwrap();
    let mut results = Vec::new();
    for v in VERSIONS {
        let (ok, text) = run(v, &["fdr-dump", p]);
        assert!(ok, "{v} fdr-dump failed on {p}:\n{text}");
        results.push(text.lines().map(str::to_string).collect::<Vec<_>>());
    }
    assert_eq!(
        results[0], results[1],
        "llvm-xray 14 and 19 dump {p} differently"
    );
    results.pop().unwrap()
}

/// Asserts `llvm-xray account` (both versions, no -keep-going) accepts the file; returns the
/// LLVM 19 report.
pub(crate) fn account(path: &Path, instr_map: Option<&Path>) -> String {
    let p = path.to_str().unwrap();
    let map_arg = instr_map.map(|m| format!("-instr_map={}", m.display()));
    let mut args = vec!["account", p];
    if let Some(m) = &map_arg {
        args.push(m);
    }
    let mut last = String::new();
    for v in VERSIONS {
        let (ok, text) = run(v, &args);
        assert!(ok, "{v} account rejected {p}:\n{text}");
        last = text;
    }
    last
}
