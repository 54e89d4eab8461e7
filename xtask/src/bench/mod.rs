//! `cargo xtask bench [SECTION]`: benchmarks of fdr-profiled, each a module returning one
//! markdown section, gathered into `BENCHMARKS.md` at the repository root.
//!
//! Every section sits between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` markers, so that
//! running one section (`cargo xtask bench calls`) replaces only that section of an existing
//! file and keeps the others' last results.
//!
//! To add a benchmark: create `NAME.rs` here with `pub fn run() -> anyhow::Result<String>`
//! (returning its markdown section, starting with a `## ` heading), add `mod NAME;` below and
//! one line to [`SECTIONS`]. Nothing else needs to change.
mod aarch64;
mod attach;
mod budget;
mod calls;
mod cost;
mod cxx_pid;
mod cxx_suite;
mod daemon;
mod pipeline;
mod report;
mod service;
mod support;
mod unwinding;

use crate::{run, setup};
use anyhow::{bail, Context as _, Result};

/// One benchmark: its name on the command line and the function that runs it.
struct Section {
    /// The name given to `cargo xtask bench NAME` and used in the file's markers.
    name: &'static str,
    /// Runs the benchmark and returns its markdown section.
    run: fn() -> Result<String>,
}

/// Every benchmark, in the order they run and appear in `BENCHMARKS.md`.
const SECTIONS: &[Section] = &[
    Section {
        name: "calls",
        run: calls::run,
    },
    Section {
        name: "attach",
        run: attach::run,
    },
    Section {
        name: "report",
        run: report::run,
    },
    Section {
        name: "unwinding",
        run: unwinding::run,
    },
    Section {
        name: "service",
        run: service::run,
    },
    Section {
        name: "daemon",
        run: daemon::run,
    },
    Section {
        name: "pipeline",
        run: pipeline::run,
    },
    Section {
        name: "cxx_suite",
        run: cxx_suite::run,
    },
    Section {
        name: "cxx_pid",
        run: cxx_pid::run,
    },
    Section {
        name: "cxx_attach",
        run: cxx_pid::run_attach,
    },
    Section {
        name: "cost",
        run: cost::run,
    },
    Section {
        name: "budget",
        run: budget::run,
    },
    Section {
        name: "aarch64",
        run: aarch64::run,
    },
];

/// The names `cargo xtask bench` accepts: every section, and `all`.
pub fn names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = SECTIONS.iter().map(|s| s.name).collect();
    names.push("all");
    names
}

/// Sets up, builds the release daemon, runs the chosen sections (`all`: every one) and writes
/// their results into `BENCHMARKS.md`.
pub fn bench(which: &str) -> Result<()> {
    let chosen: Vec<&Section> = if which == "all" {
        SECTIONS.iter().collect()
    } else {
        SECTIONS.iter().filter(|s| s.name == which).collect()
    };
    if chosen.is_empty() {
        bail!(
            "no benchmark named {which:?} (choose one of: {})",
            names().join(", ")
        );
    }
    setup::setup()?;
    crate::build(true)?;
    let path = run::workspace_root().join("BENCHMARKS.md");
    let mut text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
    };
    for section in chosen {
        eprintln!("xtask bench: running {}", section.name);
        let body = (section.run)().with_context(|| format!("benchmark {}", section.name))?;
        let body = format!(
            "{}\n\nCommand: `cargo xtask bench {}` (this section), `cargo xtask bench` (all).\n",
            body.trim_end(),
            section.name
        );
        text = replace_section(&text, section.name, &body);
        // Written after every section, so a later failure keeps the results already measured.
        std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
        println!("{body}");
    }
    eprintln!("xtask bench: results written to {}", path.display());
    Ok(())
}

/// The file header written when `BENCHMARKS.md` does not exist yet.
const HEADER: &str = "# Benchmarks\n\nWritten by `cargo xtask bench` (all sections) or \
`cargo xtask bench NAME` (one section; the others keep their last results). Machine, kernel and \
date are recorded in each section.\n";

/// `text` with the section `name` replaced by `body` (appended if absent; the header added to an
/// empty file).
fn replace_section(text: &str, name: &str, body: &str) -> String {
    let open = format!("<!-- bench:{name} -->");
    let close = format!("<!-- /bench:{name} -->");
    let block = format!("{open}\n{}\n{close}", body.trim_end());
    let base = if text.trim().is_empty() {
        HEADER.to_owned()
    } else {
        text.to_owned()
    };
    match (base.find(&open), base.find(&close)) {
        (Some(start), Some(end)) if end > start => {
            format!("{}{block}{}", &base[..start], &base[end + close.len()..])
        }
        _ => format!("{}\n{block}\n", base.trim_end()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_only_the_named_section() {
        let first = replace_section("", "calls", "## Calls\nold");
        let both = replace_section(&first, "attach", "## Attach\nA");
        let updated = replace_section(&both, "calls", "## Calls\nnew");
        assert!(updated.starts_with("# Benchmarks"));
        assert!(updated.contains("## Calls\nnew"));
        assert!(!updated.contains("old"));
        assert!(updated.contains("## Attach\nA"));
        assert!(updated.find("## Calls").unwrap() < updated.find("## Attach").unwrap());
        assert_eq!(updated.matches("<!-- bench:calls -->").count(), 1);
    }
}
