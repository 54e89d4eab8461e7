//! `cargo xtask demo`: the README's first command. From a fresh machine: set up, build, compile
//! the demo XRay program, trace it with `fdr-profiled -- ./demo`, and print the report; then
//! let the reference reader (`llvm-xray account`) read one of the files, as proof they are real.
use crate::{run, setup};
use anyhow::{Context as _, Result};
use std::process::Command;

pub fn demo() -> Result<()> {
    setup::setup()?;
    crate::build(true)?;
    let root = run::workspace_root();
    let dir = root.join("target").join("demo");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let bin = dir.join("demo");
    let source = root.join("xtask").join("demo").join("demo.cpp");
    run::xray_build("clang++-19", &source, &bin, &["-pthread"])?;
    let trace = dir.join("trace");
    if trace.exists() {
        std::fs::remove_dir_all(&trace)
            .with_context(|| format!("removing old {}", trace.display()))?;
    }
    let daemon = root.join("target").join("release").join("fdr-profiled");
    run::status(
        Command::new(&daemon)
            .arg("--out")
            .arg(&trace)
            .arg("--")
            .arg(&bin),
    )?;

    // The largest per-thread file is the most interesting one to hand to llvm-xray.
    let largest = largest_file(&trace)?;
    if let Some(file) = largest {
        eprintln!(
            "\nxtask demo: llvm-xray 19 reads {} (per-function accounting):",
            file.display()
        );
        run::status(
            Command::new("/usr/lib/llvm-19/bin/llvm-xray")
                .args([
                    "account",
                    "-sort=sum",
                    "-sortorder=dsc",
                    "-top=8",
                    "-instr_map",
                ])
                .arg(&bin)
                .arg(&file),
        )?;
    }
    eprintln!("\nxtask demo: trace files are in {}", trace.display());
    Ok(())
}

fn largest_file(dir: &std::path::Path) -> Result<Option<std::path::PathBuf>> {
    let mut best: Option<(u64, std::path::PathBuf)> = None;
    for proc_dir in std::fs::read_dir(dir)? {
        let proc_dir = proc_dir?.path();
        if !proc_dir.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&proc_dir)? {
            let path = file?.path();
            let len = path.metadata()?.len();
            if best.as_ref().is_none_or(|(l, _)| len > *l) {
                best = Some((len, path));
            }
        }
    }
    Ok(best.map(|(_, p)| p))
}
