//! The daemon's source tree keeps the shape of its pipeline: every import between two of its
//! files runs down the stages (console → traced → plan → kernel → session → repair, budget, inline → commands → cli), no files
//! import each other in a cycle, and `cli` is used by `main` alone.
//!
//! Imports are read from the sources, not from the compiler: `crate::a::b` and `super::b`
//! paths (including `use` groups like `crate::{a::b, c}`) and paths through a module's own
//! children (`child::Item`), outside comments. A path names the deepest module file it reaches.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The stages, lowest first. A file may use files of its own stage or of a lower one.
const STAGES: &[(&str, u32)] = &[
    // Writing to the terminal (its macros are used by every stage).
    ("console", 0),
    // What differs between architectures: registers, the cycle counter.
    ("arch", 0),
    ("traced", 1),
    ("plan", 2),
    ("kernel", 3),
    ("session", 4),
    ("repair", 5),
    ("budget", 5),
    ("inline", 5),
    ("record", 6),
    ("tools", 6),
    ("service", 6),
    ("cli", 7),
];

/// `lib.rs` and `main.rs` sit above everything.
const ROOT_RANK: u32 = 8;

type Module = Vec<String>;

struct SourceFile {
    path: PathBuf,
    module: Module,
    /// Child modules it declares (`mod x;`, `pub mod x;`, inline `mod x {`).
    children: BTreeSet<String>,
    /// The text with comments removed.
    code: String,
}

fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.strip_suffix(".rs").unwrap().to_owned();
    if !(stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"))) {
        parts.push(stem);
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Drops comments (`//`, `/* */`) and the contents of string literals, where a path is text.
fn strip_comments(text: &str) -> String {
    // Bytes: whole UTF-8 sequences are copied or skipped, since every delimiter is ASCII.
    let mut out = Vec::with_capacity(text.len());
    let b = text.as_bytes();
    let (mut i, mut in_str) = (0, false);
    while i < b.len() {
        let c = b[i];
        if in_str {
            if c == b'\\' {
                i += 2;
                continue;
            }
            if c == b'"' {
                in_str = false;
                out.push(b'"');
            }
            i += 1;
            continue;
        } else if c == b'"' && !(i > 0 && b[i - 1] == b'\'' && b.get(i + 1) == Some(&b'\'')) {
            in_str = true;
        } else if text[i..].starts_with("//") {
            i = text[i..].find('\n').map_or(b.len(), |n| i + n);
            continue;
        } else if text[i..].starts_with("/*") {
            i = text[i..].find("*/").map_or(b.len(), |n| i + n + 2);
            continue;
        }
        out.push(c);
        i += 1;
    }
    String::from_utf8(out).expect("comments and strings end at ASCII delimiters")
}

/// Drops inline test modules (`#[cfg(test)] mod tests { ... }`): their `super::` is the file's
/// own module, and what tests import is no part of the pipeline.
fn strip_inline_tests(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        let after = &rest[at + "#[cfg(test)]".len()..];
        let body = after.trim_start();
        let is_inline_mod = body.starts_with("mod ")
            && body
                .find(['{', ';'])
                .is_some_and(|n| body.as_bytes()[n] == b'{');
        if !is_inline_mod {
            out.push_str(&rest[..at + "#[cfg(test)]".len()]);
            rest = after;
            continue;
        }
        out.push_str(&rest[..at]);
        let open = body.find('{').unwrap();
        let mut depth = 0usize;
        let mut end = body.len();
        for (i, c) in body[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &body[end..];
    }
    out.push_str(rest);
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Expands the path tree that starts at `text` (just after `prefix::`): `a::b::C`,
/// `{a::b, c::{d, e}}`, `*`. Appends each full path (as segments) to `out`.
fn expand(text: &str, prefix: &[String], out: &mut Vec<Module>) -> usize {
    let t = text.trim_start();
    let skipped = text.len() - t.len();
    if let Some(rest) = t.strip_prefix('{') {
        let mut used = 1;
        let mut rest = rest;
        loop {
            let r = rest.trim_start();
            used += rest.len() - r.len();
            if let Some(r2) = r.strip_prefix('}') {
                let _ = r2;
                return skipped + used + 1;
            }
            if r.is_empty() {
                return skipped + used;
            }
            let n = expand(r, prefix, out);
            used += n;
            rest = &r[n..];
            let r = rest.trim_start();
            used += rest.len() - r.len();
            rest = r;
            if let Some(r2) = rest.strip_prefix(',') {
                used += 1;
                rest = r2;
            }
            if n == 0 && !rest.starts_with('}') {
                return skipped + used;
            }
        }
    }
    let len = t.find(|c: char| !is_ident(c)).unwrap_or(t.len());
    if len == 0 {
        out.push(prefix.to_vec());
        return skipped + t.len().min(1);
    }
    let mut path = prefix.to_vec();
    path.push(t[..len].to_owned());
    let rest = &t[len..];
    if let Some(after) = rest.strip_prefix("::") {
        skipped + len + 2 + expand(after, &path, out)
    } else {
        out.push(path);
        skipped + len
    }
}

/// Every module path `file` names: through `crate::`, `super::`, and its own children.
fn references(file: &SourceFile) -> Vec<Module> {
    let mut out = Vec::new();
    let code = &file.code;
    let mut starts: Vec<(usize, Module)> = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        starts.push((at + "crate::".len(), Vec::new()));
    }
    for (at, _) in code.match_indices("super::") {
        if at >= 2 && &code[at - 2..at] == "::" {
            continue; // super::super::x: counted from the first super
        }
        let mut base = file.module.clone();
        let mut i = at;
        while code[i..].starts_with("super::") {
            base.pop();
            i += "super::".len();
        }
        starts.push((i, base));
    }
    for child in &file.children {
        let needle = format!("{child}::");
        for (at, _) in code.match_indices(&needle) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| is_ident(c) || c == ':') {
                continue;
            }
            let mut base = file.module.clone();
            base.push(child.clone());
            starts.push((at + needle.len(), base));
        }
    }
    for (at, base) in starts {
        if at >= 2
            && (code[..at].ends_with("crate::")
                && code[..at - 7].ends_with(|c: char| is_ident(c) || c == ':'))
        {
            continue; // `$crate::` or `foo_crate::`
        }
        expand(&code[at..], &base, &mut out);
    }
    out
}

fn rank(module: &Module) -> u32 {
    match module.first() {
        None => ROOT_RANK,
        Some(top) => STAGES
            .iter()
            .find(|(name, _)| name == top)
            .map(|(_, r)| *r)
            .unwrap_or_else(|| panic!("module `{top}` is in no stage: add it to STAGES")),
    }
}

fn load(src: &Path) -> Vec<SourceFile> {
    let mut paths = Vec::new();
    rust_files(src, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let code = strip_inline_tests(&strip_comments(&text));
            let mut children = BTreeSet::new();
            for line in code.lines() {
                let l = line.trim_start();
                let l = l.strip_prefix("pub ").unwrap_or(l);
                let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
                if let Some(rest) = l.strip_prefix("mod ") {
                    let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
                    children.insert(name);
                }
            }
            SourceFile {
                module: module_of(src, &path),
                path,
                children,
                code,
            }
        })
        .collect()
}

/// File-to-file imports: `from` uses something of `to`.
fn edges(files: &[SourceFile]) -> BTreeMap<usize, BTreeSet<usize>> {
    let by_module: BTreeMap<&Module, usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (&f.module, i))
        .collect();
    let mut graph: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for (i, f) in files.iter().enumerate() {
        for path in references(f) {
            let target = (0..=path.len())
                .rev()
                .find_map(|n| by_module.get(&path[..n].to_vec()).copied());
            if let Some(t) = target {
                if t != i && !files[t].module.is_empty() {
                    graph.entry(i).or_default().insert(t);
                }
            }
        }
    }
    graph
}

fn name(f: &SourceFile) -> String {
    f.path
        .strip_prefix(concat!(env!("CARGO_MANIFEST_DIR"), "/"))
        .unwrap_or(&f.path)
        .display()
        .to_string()
}

/// The crates whose files must not import each other in a cycle: the daemon and the four
/// nested under it.
const CRATES: &[&str] = &[
    "src",
    "xray-object/src",
    "xray-fdr/src",
    "fdr-session/src",
    "fdr-analysis/src",
];

fn source_tree_of(src: &str) -> (Vec<SourceFile>, BTreeMap<usize, BTreeSet<usize>>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(src);
    let files = load(&src);
    let graph = edges(&files);
    (files, graph)
}

fn source_tree() -> (Vec<SourceFile>, BTreeMap<usize, BTreeSet<usize>>) {
    source_tree_of("src")
}

#[test]
fn imports_run_down_the_pipeline() {
    let (files, graph) = source_tree();
    let mut wrong = Vec::new();
    for (&from, tos) in &graph {
        for &to in tos {
            let (a, b) = (rank(&files[from].module), rank(&files[to].module));
            if b > a {
                wrong.push(format!(
                    "{} (stage {a}) uses {} (stage {b})",
                    name(&files[from]),
                    name(&files[to])
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the pipeline:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_import_cycle_between_files() {
    let cycles: Vec<String> = CRATES.iter().flat_map(|src| cycles_in(src)).collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

/// Each cycle of imports between the files of one crate, as `a → b → a`.
fn cycles_in(src: &str) -> Vec<String> {
    let (files, graph) = source_tree_of(src);
    // Depth-first search, colouring files: a grey file met again closes a cycle.
    #[derive(Clone, Copy, PartialEq)]
    enum Colour {
        White,
        Grey,
        Black,
    }
    fn visit(
        at: usize,
        graph: &BTreeMap<usize, BTreeSet<usize>>,
        colour: &mut [Colour],
        stack: &mut Vec<usize>,
        cycles: &mut Vec<Vec<usize>>,
    ) {
        colour[at] = Colour::Grey;
        stack.push(at);
        for &next in graph.get(&at).into_iter().flatten() {
            match colour[next] {
                Colour::White => visit(next, graph, colour, stack, cycles),
                Colour::Grey => {
                    let from = stack.iter().position(|&s| s == next).unwrap();
                    cycles.push(stack[from..].to_vec());
                }
                Colour::Black => {}
            }
        }
        stack.pop();
        colour[at] = Colour::Black;
    }
    let mut colour = vec![Colour::White; files.len()];
    let mut cycles = Vec::new();
    for i in 0..files.len() {
        if colour[i] == Colour::White {
            visit(i, &graph, &mut colour, &mut Vec::new(), &mut cycles);
        }
    }
    cycles
        .iter()
        .map(|c| {
            let mut names: Vec<String> = c.iter().map(|&i| name(&files[i])).collect();
            names.push(names[0].clone());
            names.join(" → ")
        })
        .collect()
}

#[test]
fn only_main_uses_the_command_line() {
    let (files, graph) = source_tree();
    let users: Vec<String> = graph
        .iter()
        .filter(|(_, tos)| tos.iter().any(|&t| files[t].module == ["cli"]))
        .map(|(&from, _)| name(&files[from]))
        .collect();
    assert!(
        users.is_empty(),
        "files below the commands use cli: {users:?}"
    );
    let main =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/main.rs")).unwrap();
    assert!(
        main.contains("cli::"),
        "main.rs no longer parses the command line through cli"
    );
}

/// The recorder writes sessions with the schema the readers read them with (`fdr-session`),
/// and takes nothing else from the readers' crate: a field cannot drift between a writer and
/// a reader that declare it once.
#[test]
fn the_session_is_written_with_the_shared_schema_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src/session"), &mut files);
    assert!(!files.is_empty());
    let readers: Vec<String> = files
        .iter()
        .filter(|f| strip_comments(&std::fs::read_to_string(f).unwrap()).contains("fdr_analysis"))
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        readers.is_empty(),
        "session/ takes from fdr-analysis (use fdr_session): {readers:?}"
    );
    // The schema is declared in fdr-session alone, which depends on neither side.
    let manifest = std::fs::read_to_string(root.join("fdr-session/Cargo.toml")).unwrap();
    for side in ["fdr-analysis", "profiler-daemon"] {
        assert!(
            !manifest.contains(&format!("{side} =")),
            "fdr-session depends on {side}"
        );
    }
    for src in ["src", "fdr-analysis/src"] {
        let mut files = Vec::new();
        rust_files(&root.join(src), &mut files);
        for f in files {
            let code = strip_comments(&std::fs::read_to_string(&f).unwrap());
            for declared in [
                "struct SessionReport",
                "struct ThreadReport",
                "struct Manifest",
            ] {
                assert!(
                    !code.contains(declared),
                    "{}: declares {declared} again (it is fdr_session::schema's)",
                    f.display()
                );
            }
        }
    }
}

#[test]
fn the_reader_sees_imports() {
    // The checks above are only as good as this reader: it must find each form of path.
    let file = SourceFile {
        path: PathBuf::from("x.rs"),
        module: vec!["session".into(), "thread".into()],
        children: ["inner".to_owned()].into(),
        code: strip_comments(
            "use crate::{plan::exits::{ExitMode, Exits}, kernel::intake};\n\
             // use crate::cli::Nothing;\n\
             use super::order::Gap; let s = \"crate::tools\"; inner::f(); outer::inner::g();\n\
             fn f() -> crate::traced::process::TracedProcess { todo!() } /* crate::record */",
        ),
    };
    let mut got: Vec<String> = references(&file).iter().map(|p| p.join("::")).collect();
    got.sort();
    assert_eq!(
        got,
        [
            "kernel::intake",
            "plan::exits::ExitMode",
            "plan::exits::Exits",
            "session::order::Gap",
            "session::thread::inner::f",
            "traced::process::TracedProcess",
        ]
    );
}

/// Most lines a file of the daemon may have: past it, a file holds more than one job (the
/// service's event loop once had 1,719 lines and six), and is split by job.
const MAX_LINES: usize = 900;

#[test]
fn no_file_holds_more_than_one_jobs_worth_of_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(f).ok()?.lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", f.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "over {MAX_LINES} lines: split by job: {long:?}"
    );
}

/// The end-to-end tests stay grouped by what they prove: a new test is a module of a group
/// (`tests/tests/<group>/`), not a binary of its own (each costs a link and hides where it
/// belongs). The binaries alone are those that must not share the CPUs with other tests
/// (the two kill tests spread their kills over a time measured first).
#[test]
fn end_to_end_tests_live_in_their_groups() {
    const ALONE: &[&str] = &["load.rs", "loss.rs", "repair_kill.rs", "inline_kill.rs"];
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tests");
    let mut stray = Vec::new();
    let mut groups = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().unwrap().is_dir() {
            assert!(
                entry.path().join("main.rs").is_file(),
                "tests/tests/{name}/ has no main.rs"
            );
            groups += 1;
        } else if name.ends_with(".rs") && !ALONE.contains(&name.as_str()) {
            stray.push(name);
        }
    }
    assert!(groups >= 6, "{groups} groups in {}", dir.display());
    assert!(
        stray.is_empty(),
        "test binaries outside the groups (make each a module of a group in tests/tests/<group>/): {stray:?}"
    );
}
