//! Choosing how function exits are observed (`--exits`), for each function.
//!
//! A return probe replaces the return address on the stack. An exception or panic unwinding
//! through such a frame finds the kernel's trampoline instead of a call site, has no unwind
//! information for it, and terminates the program (platform.md: reproduced with C++). An exit
//! sled is always safe, but the kernel single-steps its `ret`: 10 to 30 times the cost of a
//! return probe. So `auto` decides per function:
//! - nothing in the process image has an unwinding personality routine (the executable, the
//!   libraries it needs, and for a running process everything it has mapped): nothing can
//!   unwind, return probes everywhere;
//! - otherwise each function gets a return probe when its machine code proves that no
//!   exception can leave its frame (`xray_object::unwinding`), exit sleds elsewhere.
//!
//! Where an exit sled costs no more than a return probe (AArch64: `arch::EXIT_SLEDS_CHEAP`),
//! `auto` is exit sleds everywhere.
use object::{Object as _, ObjectSymbol as _};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use xray_object::elf::ElfImage;
use xray_object::instrmap::InstrMap;
use xray_object::symbols::SymbolTable;
use xray_object::unwinding::{UnwindAnalysis, Verdict};

use crate::plan::{packed_id, AttachPlan};
use profiler_common::cookie_flags;

/// How function exits are to be observed, as asked for (`--exits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExitMode {
    /// Exit and tail sleds.
    Sleds,
    /// Return probes at function entry.
    Return,
    /// The best safe method: for a launched command that can unwind, `repair`; otherwise
    /// `per-function`.
    Auto,
    /// Return probes where no unwinding can pass through a frame, exit sleds otherwise:
    /// decided for each function from its machine code.
    PerFunction,
    /// Return probes everywhere, the stack repaired at each throw (a launched command or a
    /// running process: fdr-profiled becomes its ptrace tracer; see `repair::keeper`).
    Repair,
}

/// How one function's exits are observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exits {
    /// Probes on its EXIT and TAIL sleds.
    Sleds,
    /// A return probe at its entry, plus its TAIL sleds.
    Return,
}

impl Exits {
    /// How the summary and `list` name it.
    pub fn label(self) -> &'static str {
        match self {
            Exits::Sleds => "exit sleds",
            Exits::Return => "return probe",
        }
    }
}

/// How exits are decided for the session's objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitPolicy {
    /// One method for every function.
    All(Exits),
    /// Each function from its code: a return probe where no exception can leave it.
    PerFunction,
}

/// How exits were decided, for the manifest.
#[derive(Clone, Debug)]
pub struct ExitsChoice {
    /// `sleds`, `return` or `per-function`.
    pub mode: &'static str,
    /// Why (`--exits` given, or what `auto` found).
    pub reason: String,
}

/// The routines that drive unwinding through frames: C++ (`__gxx_personality_v0`), C compiled
/// with `-fexceptions` (`__gcc_personality_v0`), Rust panics (`rust_eh_personality`).
pub const PERSONALITY_ROUTINES: &[&str] = &[
    "__gxx_personality_v0",
    "__gcc_personality_v0",
    "rust_eh_personality",
    "__gxx_personality_seh0",
    "__gcc_personality_sj0",
];

/// Resolves `--exits` for the objects that make up the traced image.
pub fn choose(mode: ExitMode, image: &[PathBuf]) -> (ExitPolicy, ExitsChoice) {
    match mode {
        ExitMode::Sleds => (
            ExitPolicy::All(Exits::Sleds),
            ExitsChoice {
                mode: "sleds",
                reason: "--exits sleds".into(),
            },
        ),
        ExitMode::Return => (
            ExitPolicy::All(Exits::Return),
            ExitsChoice {
                mode: "return",
                reason: "--exits return: an exception or panic unwinding through a probed frame \
                         would kill the program"
                    .into(),
            },
        ),
        ExitMode::Repair => (
            ExitPolicy::All(Exits::Return),
            ExitsChoice {
                mode: "repair",
                reason: "--exits repair: return probes everywhere; at each throw the original \
                         return addresses are put back, at the catch the live frames are hooked \
                         again"
                    .into(),
            },
        ),
        ExitMode::Auto if crate::arch::EXIT_SLEDS_CHEAP => (
            ExitPolicy::All(Exits::Sleds),
            ExitsChoice {
                mode: "sleds",
                reason: format!(
                    "auto: on {} a probe on an exit sled costs what a return probe does and is \
                     safe under unwinding",
                    crate::arch::NAME
                ),
            },
        ),
        ExitMode::Auto | ExitMode::PerFunction => match unwinder(image) {
            Some((path, symbol)) => (
                ExitPolicy::PerFunction,
                ExitsChoice {
                    mode: "per-function",
                    reason: format!(
                        "auto: {} has {symbol}, so exceptions or panics may unwind: a return \
                         probe where the code proves none can leave the function, exit sleds \
                         elsewhere (`fdr-profiled list` says which and why)",
                        path.display()
                    ),
                },
            ),
            None => (
                ExitPolicy::All(Exits::Return),
                ExitsChoice {
                    mode: "return",
                    reason: format!(
                        "auto: no unwinding personality routine in {} object{}",
                        image.len(),
                        if image.len() == 1 { "" } else { "s" }
                    ),
                },
            ),
        },
    }
}

/// The first object of `image` with an unwinding personality routine, and the routine.
pub fn unwinder(image: &[PathBuf]) -> Option<(&PathBuf, &'static str)> {
    image.iter().find_map(|p| personality_in(p).map(|s| (p, s)))
}

/// Each instrumented function of the object at `path` with the method `policy` gives it and
/// why, by function id (within the object, unpacked).
pub fn decisions(path: &Path, policy: ExitPolicy) -> HashMap<u32, (Exits, String)> {
    let read = || -> Option<(ElfImage, InstrMap)> {
        let image = ElfImage::open(path).ok()?;
        let map = InstrMap::from_elf(&image).ok()?;
        Some((image, map))
    };
    let Some((image, map)) = read() else {
        return HashMap::new();
    };
    match policy {
        ExitPolicy::All(exits) => map
            .functions
            .iter()
            .map(|f| {
                let why = match exits {
                    Exits::Return => "return probes everywhere",
                    Exits::Sleds => "exit sleds everywhere",
                };
                (f.id, (exits, why.to_owned()))
            })
            .collect(),
        ExitPolicy::PerFunction => {
            let symbols = SymbolTable::from_elf(&image);
            let analysis = UnwindAnalysis::of(&image, &symbols);
            map.functions
                .iter()
                .map(|f| {
                    let verdict = analysis.verdict(f.address);
                    let exits = match verdict {
                        Verdict::Contained(_) => Exits::Return,
                        Verdict::MayUnwind(_) => Exits::Sleds,
                    };
                    (f.id, (exits, verdict.to_string()))
                })
                .collect()
        }
    }
}

/// Marks the probes of the functions that get a return probe under `policy`
/// ([`cookie_flags::RETURN_PROBED`]) and records them in `plan.return_probed`.
pub fn decide(plan: &mut AttachPlan, policy: ExitPolicy) {
    let returns: BTreeSet<u32> = match policy {
        ExitPolicy::All(Exits::Sleds) => BTreeSet::new(),
        ExitPolicy::All(Exits::Return) => {
            plan.probes.iter().map(|p| p.cookie.function_id).collect()
        }
        ExitPolicy::PerFunction => decisions(&plan.binary, policy)
            .into_iter()
            .filter(|(_, (exits, _))| *exits == Exits::Return)
            .map(|(id, _)| packed_id(plan.object_id, id))
            .collect(),
    };
    for probe in &mut plan.probes {
        if returns.contains(&probe.cookie.function_id) {
            probe.cookie = probe.cookie.with_flags(cookie_flags::RETURN_PROBED);
        }
    }
    plan.return_probed = plan
        .probes
        .iter()
        .filter(|p| p.cookie.return_probed())
        .map(|p| p.cookie.function_id)
        .collect();
}

/// The first personality routine `path` defines or imports; `None` if none (or unreadable:
/// an object we cannot read is reported as having one, the safe answer).
pub fn personality_in(path: &Path) -> Option<&'static str> {
    let Ok(image) = ElfImage::open(path) else {
        return Some("no readable symbol table");
    };
    let Ok(file) = image.parse() else {
        return Some("no readable symbol table");
    };
    file.symbols()
        .chain(file.dynamic_symbols())
        .filter_map(|s| s.name().ok())
        .find_map(|name| PERSONALITY_ROUTINES.iter().find(|&&p| p == name).copied())
}

/// The executable and the shared libraries it names (DT_NEEDED, transitively), found where the
/// dynamic loader would look: DT_RPATH (when there is no DT_RUNPATH), `LD_LIBRARY_PATH` (ours,
/// which a command we launch inherits), DT_RUNPATH, then the system directories.
pub fn static_image(executable: &Path) -> Vec<PathBuf> {
    let ld_library_path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    image_with(executable, &ld_library_path, &[])
}

/// [`static_image`] as the dynamic loader of a process whose environment has
/// `ld_library_path` and preloads `preload` (`LD_PRELOAD`'s paths, mapped first, with what
/// they need).
pub fn image_with(executable: &Path, ld_library_path: &str, preload: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = vec![executable.to_path_buf()];
    out.extend(preload.iter().filter(|p| p.is_file()).cloned());
    let mut seen = BTreeSet::new();
    let ld_library_path: Vec<String> = ld_library_path
        .split([':', ';'])
        .filter(|d| !d.is_empty())
        .map(str::to_owned)
        .collect();
    let mut i = 0;
    let system_dirs: Vec<PathBuf> = system_library_dirs().collect();
    while i < out.len() && out.len() < 256 {
        let (needed, search) = dynamic_deps(&out[i]);
        for lib in needed {
            if !seen.insert(lib.clone()) {
                continue;
            }
            let found = search
                .rpath
                .iter()
                .chain(&ld_library_path)
                .chain(&search.runpath)
                .map(PathBuf::from)
                .chain(system_dirs.iter().cloned())
                .map(|d| d.join(&lib))
                .find(|p| p.is_file());
            if let Some(path) = found {
                out.push(path);
            }
        }
        i += 1;
    }
    out
}

/// Every file a running process maps: through its root directory, which names it as the
/// process sees it (containers included), or through `/proc/PID/map_files` for files deleted
/// since they were mapped (see [`crate::traced::mappings`]).
pub fn mapped_image(pid: u32) -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from(format!("/proc/{pid}/exe"))];
    out.extend(
        crate::traced::mappings::mapped_objects(pid)
            .unwrap_or_default()
            .into_iter()
            .map(|m| match m.deleted {
                true => m.open_path,
                false => PathBuf::from(format!("/proc/{pid}/root{}", m.path)),
            }),
    );
    out
}

/// The dynamic loader's default directories: Debian's multiarch ones for this architecture
/// first, then the traditional ones.
fn system_library_dirs() -> impl Iterator<Item = PathBuf> {
    let multiarch = crate::arch::MULTIARCH;
    [format!("/lib/{multiarch}"), format!("/usr/lib/{multiarch}")]
        .into_iter()
        .map(PathBuf::from)
        .chain(
            ["/lib64", "/usr/lib64", "/lib", "/usr/lib", "/usr/local/lib"]
                .into_iter()
                .map(PathBuf::from),
        )
}

/// Library search directories an object names, `$ORIGIN` expanded.
#[derive(Default)]
struct SearchPath {
    /// DT_RPATH, searched first, and only when the object has no DT_RUNPATH.
    rpath: Vec<String>,
    /// DT_RUNPATH, searched after `LD_LIBRARY_PATH`.
    runpath: Vec<String>,
}

/// DT_NEEDED names and library search directories of an object.
fn dynamic_deps(path: &Path) -> (Vec<String>, SearchPath) {
    use object::elf;
    use object::read::elf::Dyn as _;
    let mut needed = Vec::new();
    let mut search = SearchPath::default();
    let Ok(image) = ElfImage::open(path) else {
        return (needed, search);
    };
    let Ok(file) = image.parse() else {
        return (needed, search);
    };
    let endian = file.endian();
    let table = file.elf_section_table();
    let Ok(Some((entries, strings_at))) = table.dynamic(endian, file.data()) else {
        return (needed, search);
    };
    let Ok(strings) = table.strings(endian, file.data(), strings_at) else {
        return (needed, search);
    };
    let origin = path
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    for entry in entries {
        let tag = entry.d_tag(endian) as u32;
        let Ok(value) = entry.string(endian, strings) else {
            continue;
        };
        let value = String::from_utf8_lossy(value).into_owned();
        match tag {
            elf::DT_NEEDED if !needed.contains(&value) => needed.push(value),
            elf::DT_RUNPATH => search
                .runpath
                .extend(value.split(':').map(|d| d.replace("$ORIGIN", &origin))),
            elf::DT_RPATH => search
                .rpath
                .extend(value.split(':').map(|d| d.replace("$ORIGIN", &origin))),
            _ => {}
        }
    }
    if !search.runpath.is_empty() {
        search.rpath.clear();
    }
    (needed, search)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_modes_are_taken_as_given() {
        assert_eq!(
            choose(ExitMode::Sleds, &[]).0,
            ExitPolicy::All(Exits::Sleds)
        );
        assert_eq!(
            choose(ExitMode::Return, &[]).0,
            ExitPolicy::All(Exits::Return)
        );
    }

    #[test]
    fn an_unreadable_object_counts_as_unwinding() {
        let (exits, why) = choose(ExitMode::Auto, &[PathBuf::from("/nonexistent/lib.so")]);
        assert_eq!(exits, ExitPolicy::PerFunction);
        assert!(
            why.reason.contains("no readable symbol table"),
            "{}",
            why.reason
        );
    }
}
