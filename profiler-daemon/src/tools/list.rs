//! `fdr-profiled list TARGET`: the instrumented functions of a binary or of a running process's
//! executable, with their XRay ids, sled kinds and counts — what a trace's ids will mean.
use crate::elf::ElfImage;
use crate::instrmap::InstrMap;
use crate::process::TracedProcess;
use crate::symbols::SymbolTable;
use anyhow::{Context as _, Result};
use profiler_common::SledKind;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Where the functions come from: a pid (all digits) or a path.
fn resolve(target: &str) -> Result<(PathBuf, String)> {
    if !target.is_empty()
        && target.bytes().all(|b| b.is_ascii_digit())
        && !Path::new(target).exists()
    {
        let pid: u32 = target
            .parse()
            .with_context(|| format!("{target}: not a pid"))?;
        let process = TracedProcess::find(pid)?;
        let shown = format!("pid {pid} ({})", process.exe_path);
        return Ok((process.exe_link, shown));
    }
    Ok((PathBuf::from(target), target.to_owned()))
}

/// Short names of the sled kinds, as `llvm-xray extract` spells them.
fn kind_name(kind: SledKind) -> &'static str {
    match kind {
        SledKind::Entry => "function-enter",
        SledKind::Exit => "function-exit",
        SledKind::Tail => "tail-exit",
        SledKind::LogArgsEntry => "log-args-enter",
        SledKind::CustomEvent => "custom-event",
        SledKind::TypedEvent => "typed-event",
    }
}

/// Renders the table for `target`.
pub fn render(target: &str) -> Result<String> {
    let (path, shown) = resolve(target)?;
    // ELF errors already name the path; a pid's /proc path needs the pid and real path added.
    let read = || -> Result<(ElfImage, InstrMap)> {
        let image = ElfImage::open(&path)?;
        let map = InstrMap::from_elf(&image)?;
        Ok((image, map))
    };
    let (image, map) = if shown == target {
        read()?
    } else {
        read().with_context(|| shown.clone())?
    };
    let symbols = SymbolTable::from_elf(&image);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{shown}: {} instrumented functions, {} sleds",
        map.functions.len(),
        map.sleds.len()
    );
    let _ = writeln!(
        out,
        "{:>8}  {:>18}  {:>5}  {:<40}  function",
        "id", "address", "sleds", "kinds"
    );
    for function in &map.functions {
        let sleds = map.sleds_of(function.id);
        let mut kinds: Vec<SledKind> = sleds.iter().map(|s| s.kind).collect();
        kinds.sort();
        kinds.dedup();
        let kinds: Vec<&str> = kinds.into_iter().map(kind_name).collect();
        let name = symbols.name_at(function.address).map_or_else(
            || format!("{}+{:#x}", image.path.display(), function.address),
            str::to_owned,
        );
        let _ = writeln!(
            out,
            "{:>8}  {:>#18x}  {:>5}  {:<40}  {}",
            function.id,
            function.address,
            sleds.len(),
            kinds.join(","),
            name
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_is_not_an_instrumented_binary() {
        assert!(render("/nonexistent/binary").is_err());
        let err = format!("{:#}", render("/proc/self/exe").map(|_| ()).unwrap_err());
        assert!(
            err.contains("xray_instr_map") || err.contains("not"),
            "{err}"
        );
        // Digits that name no file are a pid: this one cannot exist (pid_max <= 2^22).
        let err = format!("{:#}", render("8388608").unwrap_err());
        assert!(err.contains("no process"), "{err}");
    }
}
