//! `fdr-profiled list TARGET`: the instrumented functions of a binary, or of every instrumented
//! object a running process maps, with their ids, sled kinds and counts — what a trace's ids
//! will mean, and how `--exits auto` would observe each function's exits and why (a shared
//! object's ids are packed as `(object_id << 24) | id`, as `--pid` traces
//! them; object ids are given in the order the objects are found, so a process that loads more
//! objects later can number them differently from this listing).
use crate::plan::exits::{self, ExitMode, ExitPolicy, Exits};
use crate::traced::process::TracedProcess;
use anyhow::{Context as _, Result};
use profiler_common::SledKind;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use xray_object::elf::ElfImage;
use xray_object::instrmap::InstrMap;
use xray_object::symbols::SymbolTable;

/// One object to list: the file to read, how to name it, its object id, and how `--exits
/// auto` decides its exits.
struct Listed {
    path: PathBuf,
    shown: String,
    object_id: u32,
    policy: ExitPolicy,
}

/// Separates a function's name from why its exits are observed the way they are.
pub const WHY_SEPARATOR: &str = "  | ";

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
        let planned = crate::plan::objects::for_process(&process)?;
        let (policy, _) = exits::choose(ExitMode::PerFunction, &planned.image);
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
                policy,
            })
            .collect());
    }
    let path = PathBuf::from(target);
    let (policy, _) = exits::choose(ExitMode::PerFunction, &exits::static_image(&path));
    Ok(vec![Listed {
        path,
        shown: target.to_owned(),
        object_id: 0,
        policy,
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
        policy,
    } = listed;
    // ELF errors already name the path; a pid's /proc path needs the pid and real path added.
    let read = || -> Result<(ElfImage, InstrMap)> {
        let image = ElfImage::open(path)?;
        let map = InstrMap::from_elf(&image)?;
        // What is listed is where probes would go: refused as tracing would refuse it.
        map.check_sleds(&image)?;
        Ok((image, map))
    };
    let (image, map) = if shown == target {
        read()?
    } else {
        read().with_context(|| shown.clone())?
    };
    let symbols = SymbolTable::from_elf(&image);
    let decisions = exits::decisions(path, *policy);
    let returns = decisions
        .values()
        .filter(|(e, _)| *e == Exits::Return)
        .count();
    let _ = writeln!(
        out,
        "{shown}: {} instrumented functions, {} sleds; --exits per-function: {} by return probe, {} by exit sleds",
        map.functions.len(),
        map.sleds.len(),
        returns,
        map.functions.len() - returns,
    );
    let _ = writeln!(
        out,
        "{:>8}  {:>18}  {:>5}  {:<40}  {:<6}  function{WHY_SEPARATOR}why",
        "id", "address", "sleds", "kinds", "exit"
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
        let (exit, why) = match decisions.get(&function.id) {
            Some((Exits::Return, why)) => ("return", why.as_str()),
            Some((Exits::Sleds, why)) => ("sleds", why.as_str()),
            None => ("sleds", "not analysed"),
        };
        let _ = writeln!(
            out,
            "{:>8}  {:>#18x}  {:>5}  {:<40}  {:<6}  {}{WHY_SEPARATOR}{}",
            crate::plan::packed_id(*object_id, function.id),
            function.address,
            sleds.len(),
            kinds.join(","),
            exit,
            name,
            why
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
