//! `fdr-profiled list TARGET`: the instrumented functions of a binary, or of every instrumented
//! object a running process maps, with their ids, sled kinds and counts — what a trace's ids
//! will mean (a shared object's ids are packed as `(object_id << 24) | id`, as `--pid` traces
//! them; object ids are given in the order the objects are found, so a process that loads more
//! objects later can number them differently from this listing).
use crate::traced::process::TracedProcess;
use anyhow::{Context as _, Result};
use profiler_common::SledKind;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use xray_object::elf::ElfImage;
use xray_object::instrmap::InstrMap;
use xray_object::symbols::SymbolTable;

/// One object to list: the file to read, how to name it, its object id.
struct Listed {
    path: PathBuf,
    shown: String,
    object_id: u32,
}

/// Where the functions come from: a pid (all digits; every instrumented object it maps) or a
/// path.
fn resolve(target: &str) -> Result<Vec<Listed>> {
    if !target.is_empty()
        && target.bytes().all(|b| b.is_ascii_digit())
        && !Path::new(target).exists()
    {
        let pid: u32 = target
            .parse()
            .with_context(|| format!("{target}: not a pid"))?;
        let process = TracedProcess::find(pid)?;
        let planned = crate::record::objects::for_process(&process)?;
        return Ok(planned
            .plans
            .into_iter()
            .map(|plan| Listed {
                shown: match plan.object_id {
                    0 => format!("pid {pid} ({})", plan.display_path),
                    id => format!("pid {pid} {} (object {id})", plan.display_path),
                },
                path: plan.binary,
                object_id: plan.object_id,
            })
            .collect());
    }
    Ok(vec![Listed {
        path: PathBuf::from(target),
        shown: target.to_owned(),
        object_id: 0,
    }])
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

/// Renders the table for `target`: one per object.
pub fn render(target: &str) -> Result<String> {
    let mut out = String::new();
    for (i, listed) in resolve(target)?.into_iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        render_object(&listed, target, &mut out)?;
    }
    Ok(out)
}

fn render_object(listed: &Listed, target: &str, out: &mut String) -> Result<()> {
    let Listed {
        path,
        shown,
        object_id,
    } = listed;
    // ELF errors already name the path; a pid's /proc path needs the pid and real path added.
    let read = || -> Result<(ElfImage, InstrMap)> {
        let image = ElfImage::open(path)?;
        let map = InstrMap::from_elf(&image)?;
        Ok((image, map))
    };
    let (image, map) = if shown == target {
        read()?
    } else {
        read().with_context(|| shown.clone())?
    };
    let symbols = SymbolTable::from_elf(&image);
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
        let name = symbols
            .name_at(function.address)
            .map_or_else(|| format!("{shown}+{:#x}", function.address), str::to_owned);
        let _ = writeln!(
            out,
            "{:>8}  {:>#18x}  {:>5}  {:<40}  {}",
            crate::plan::packed_id(*object_id, function.id),
            function.address,
            sleds.len(),
            kinds.join(","),
            name
        );
    }
    Ok(())
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
