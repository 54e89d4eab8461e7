//! The attach plan: from one instrumented ELF file to the list of probes to place, each with the
//! cookie the eBPF program will see, plus the names the summary needs.
use crate::elf::ElfImage;
use crate::instrmap::InstrMap;
use crate::symbols::SymbolTable;
use anyhow::Result;
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
    /// The binary, as an absolute path (uprobes attach to its inode).
    pub binary: PathBuf,
    /// File name of the binary, used to name per-process output directories.
    pub exe_name: String,
    /// Probes on entry, log-args entry, exit and tail sleds.
    pub probes: Vec<Probe>,
    /// Number of instrumented functions in the map.
    pub functions: usize,
    /// Function names by XRay function id.
    pub names: FunctionNames,
}

/// The sled kinds this version probes. Custom and typed event sleds need their payload
/// registers decoded first and are not probed yet.
fn probed(kind: SledKind) -> bool {
    matches!(
        kind,
        SledKind::Entry | SledKind::LogArgsEntry | SledKind::Exit | SledKind::Tail
    )
}

impl AttachPlan {
    /// Reads `binary`'s instrumentation map and symbols and plans a probe per probed sled.
    pub fn for_binary(binary: &Path) -> Result<AttachPlan> {
        let image = ElfImage::open(binary)?;
        let map = InstrMap::from_elf(&image)?;
        let symbols = SymbolTable::from_elf(&image);
        let probes = map
            .sleds
            .iter()
            .filter(|sled| probed(sled.kind))
            .map(|sled| Probe {
                file_offset: sled.file_offset,
                cookie: Cookie {
                    function_id: sled.function_id,
                    kind: sled.kind as u8,
                },
            })
            .collect();
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
            binary,
            exe_name,
            probes,
            functions: map.functions.len(),
            names,
        })
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
