//! `fdr-profiled bench-unwinding FILE...` (hidden; run by `cargo xtask bench unwinding`): how
//! much of each object's code the per-function exit analysis proves safe for a return probe,
//! by rule, over every function of the object (instrumented or not), and how long the analysis
//! takes. Prints one JSON object per file.
use anyhow::{Context as _, Result};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;
use xray_object::elf::ElfImage;
use xray_object::symbols::SymbolTable;
use xray_object::unwinding::{UnwindAnalysis, RULES};

/// Options of `bench-unwinding`.
#[derive(Debug, clap::Args)]
pub struct BenchUnwindingArgs {
    /// ELF files to analyse.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Analyses each file and prints its JSON line.
pub fn run(args: &BenchUnwindingArgs) -> Result<u8> {
    for path in &args.files {
        let start = Instant::now();
        let image = ElfImage::open(path)?;
        let symbols = SymbolTable::from_elf(&image);
        let analysis = UnwindAnalysis::of(&image, &symbols);
        let seconds = start.elapsed().as_secs_f64();
        let mut rules: BTreeMap<&str, usize> = RULES.iter().map(|r| (*r, 0)).collect();
        for (_, verdict) in analysis.verdicts() {
            *rules.entry(verdict.rule()).or_default() += 1;
        }
        let json = serde_json::json!({
            "file": path,
            "functions": analysis.len(),
            "contained": analysis.verdicts().filter(|(_, v)| v.is_contained()).count(),
            "rules": rules,
            "seconds": seconds,
            "bytes": image.data.len(),
        });
        outln!(
            "{}",
            serde_json::to_string(&json).context("encoding the result")?
        );
    }
    Ok(0)
}
