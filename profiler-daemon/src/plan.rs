//! The attach plan: from one instrumented ELF file to the list of probes to place, each with the
//! cookie the eBPF program will see, plus the names the summary needs.
use crate::elf::ElfImage;
use crate::instrmap::InstrMap;
use crate::process::TracedProcess;
use crate::symbols::SymbolTable;
use anyhow::{Context as _, Result};
use profiler_common::{Cookie, SledKind};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One uprobe to place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Offset of the sled in the file (uprobes are placed by file offset).
    pub file_offset: u64,
    /// What the eBPF program learns when this probe fires.
    pub cookie: Cookie,
}

/// Everything needed to trace one binary.
#[derive(Debug)]
pub struct AttachPlan {
    /// The binary, as an absolute path (uprobes attach to its inode). For a process given by
    /// pid this is `/proc/PID/exe`.
    pub binary: PathBuf,
    /// The binary's path as users know it, for messages and the session manifest.
    pub display_path: String,
    /// The traced file was deleted or replaced on disk: `display_path` no longer names it.
    pub deleted: bool,
    /// File name of the binary, used to name per-process output directories.
    pub exe_name: String,
    /// Probes on every sled: entry, log-args entry, exit, tail, custom and typed event sleds
    /// (which of them are placed depends on the exit mode, see `bpf::Tracer::attach`).
    pub probes: Vec<Probe>,
    /// Event sleds whose argument registers could not be decoded (not probed).
    pub undecodable_event_sleds: usize,
    /// Number of instrumented functions in the map.
    pub functions: usize,
    /// Function names by XRay function id.
    pub names: FunctionNames,
}

/// The probe for a sled: function and tail sleds need only the kind; event sleds also the
/// registers their arguments are in, decoded from the sled's bytes (`None` if undecodable).
fn probe_for(sled: &crate::instrmap::Sled, data: &[u8]) -> Option<Probe> {
    let mut cookie = Cookie::new(sled.function_id, sled.kind);
    if matches!(sled.kind, SledKind::CustomEvent | SledKind::TypedEvent) {
        let at = usize::try_from(sled.file_offset).ok()?;
        let bytes = data.get(at..at.saturating_add(32).min(data.len()))?;
        cookie.regs = crate::eventsled::decode(bytes, sled.kind == SledKind::TypedEvent)?;
    }
    Some(Probe {
        file_offset: sled.file_offset,
        cookie,
    })
}

impl AttachPlan {
    /// Reads `binary`'s instrumentation map and symbols and plans a probe per probed sled.
    pub fn for_binary(binary: &Path) -> Result<AttachPlan> {
        let image = ElfImage::open(binary)?;
        let map = InstrMap::from_elf(&image)?;
        let symbols = SymbolTable::from_elf(&image);
        let probes: Vec<Probe> = map
            .sleds
            .iter()
            .filter_map(|sled| probe_for(sled, &image.data))
            .collect();
        let undecodable_event_sleds = map.sleds.len() - probes.len();
        // Probes are placed one at a time, and a process keeps running meanwhile. With every
        // exit probe placed before any entry probe, a call whose entry is recorded always has
        // its exit recorded too; the window can only produce exits without entries, which the
        // writer drops and counts. The other order leaves entries without exits.
        let mut probes: Vec<Probe> = probes;
        probes.sort_by_key(|p| SledKind::from_u8(p.cookie.kind).is_some_and(SledKind::is_entry));
        let names = FunctionNames(
            map.functions
                .iter()
                .filter_map(|f| Some((f.id, symbols.name_at(f.address)?.to_owned())))
                .collect(),
        );
        // Absolute, so that the uprobe and the messages name the same file whatever the cwd.
        let binary = std::path::absolute(binary).unwrap_or_else(|_| binary.to_path_buf());
        let exe_name = binary
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "process".to_owned());
        Ok(AttachPlan {
            display_path: binary.display().to_string(),
            deleted: false,
            binary,
            exe_name,
            probes,
            undecodable_event_sleds,
            functions: map.functions.len(),
            names,
        })
    }
}

impl AttachPlan {
    /// The plan for the executable of a running process, read through `/proc/PID/exe` so that
    /// it is the file the process runs even if the path now names another file or none.
    pub fn for_process(process: &TracedProcess) -> Result<AttachPlan> {
        let mut plan = AttachPlan::for_binary(&process.exe_link)
            .with_context(|| format!("pid {} ({})", process.pid, process.exe_path))?;
        plan.exe_name = process.exe_name();
        plan.display_path = process.exe_path_on_disk().to_owned();
        plan.deleted = process.exe_deleted();
        Ok(plan)
    }
}

/// Function names by XRay function id.
#[derive(Debug, Default)]
pub struct FunctionNames(HashMap<u32, String>);

impl FunctionNames {
    /// The function's symbol name, or `#id` when the binary has no symbol for it.
    pub fn name(&self, id: u32) -> String {
        self.0.get(&id).cloned().unwrap_or_else(|| format!("#{id}"))
    }
}
