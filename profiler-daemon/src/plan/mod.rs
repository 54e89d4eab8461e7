//! The attach plan: from one instrumented ELF object (an executable or a shared object) to the
//! list of probes to place, each with the cookie the eBPF program will see, plus the names and
//! identity the summary and the session manifest need.
//!
//! Function ids are the trace's: the executable (XRay object 0) keeps its map's ids, a shared
//! object's are packed as XRay's runtime packs them, `(object_id << 24) | function_id`.
//!
//! Stage 2 of the pipeline: besides the plan itself, which objects of a process get one
//! ([`discovery`]), which functions ([`select`]), how exits are observed ([`exits`]), where
//! event sleds keep their arguments ([`eventsled`]) and where exceptions are caught
//! ([`catches`]).
pub mod catches;
pub mod discovery;
pub mod eventsled;
pub mod exits;
pub mod object_ids;
pub mod objects;
pub mod select;

use anyhow::Result;
use profiler_common::{Cookie, SledKind};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use xray_object::elf::{ElfImage, Machine};
use xray_object::instrmap::InstrMap;
use xray_object::symbols::SymbolTable;

/// One uprobe to place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Offset of the sled in the file (uprobes are placed by file offset).
    pub file_offset: u64,
    /// What the eBPF program learns when this probe fires.
    pub cookie: Cookie,
}

impl Probe {
    /// Whether its function's return probe goes here: the entry of a function whose exits a
    /// return probe observes (`plan::exits`), where `Tracer::attach` places it.
    pub fn carries_return_probe(&self) -> bool {
        self.cookie.return_probed()
            && profiler_common::SledKind::from_u8(self.cookie.kind)
                .is_some_and(profiler_common::SledKind::is_entry)
    }
}

/// Bits of a trace function id that hold the function's id within its object.
pub const OBJECT_ID_SHIFT: u32 = 24;
/// Largest object id a trace can hold: FDR function records carry 28 bits of id.
pub const MAX_OBJECT_ID: u32 = 15;

/// The id a trace uses for function `function_id` of object `object_id`.
pub fn packed_id(object_id: u32, function_id: u32) -> u32 {
    (object_id << OBJECT_ID_SHIFT) | function_id
}

/// Everything needed to trace one object.
#[derive(Clone, Debug)]
pub struct AttachPlan {
    /// The file, as an absolute path (uprobes attach to its inode). For a process given by
    /// pid this is `/proc/PID/exe` or a `/proc/PID/map_files` link.
    pub binary: PathBuf,
    /// XRay object id: 0 for the executable, 1..=[`MAX_OBJECT_ID`] for shared objects.
    pub object_id: u32,
    /// GNU build-id of the file (lowercase hex), read with the map: lets readers of the
    /// session check they symbolize with the same file.
    pub build_id: Option<String>,
    /// Where the process maps the object's file offset 0; 0 when unknown (not yet mapped,
    /// or several processes).
    pub load_address: u64,
    /// The binary's path as users know it, for messages and the session manifest.
    pub display_path: String,
    /// The traced file was deleted or replaced on disk: `display_path` no longer names it.
    pub deleted: bool,
    /// File name of the binary, used to name per-process output directories.
    pub exe_name: String,
    /// Probes on every sled: entry, log-args entry, exit, tail, custom and typed event sleds
    /// (the exit sleds of return-probed functions are not placed, see `bpf::Tracer::attach`).
    pub probes: Vec<Probe>,
    /// Event sleds whose argument registers could not be decoded (not probed).
    pub undecodable_event_sleds: usize,
    /// Number of instrumented functions in the map.
    pub functions: usize,
    /// Function names by trace function id.
    pub names: FunctionNames,
    /// The functions (trace ids) whose exits a return probe observes; their probes carry
    /// `cookie_flags::RETURN_PROBED`. Set by [`exits::decide`]; empty until then (exit sleds).
    pub return_probed: BTreeSet<u32>,
}

/// The probe for a sled: function and tail sleds need only the kind; event sleds also the
/// registers their arguments are in, decoded from the sled's bytes (those of `machine`'s
/// code, in the object's `data`; `None` if undecodable).
fn probe_for(
    sled: &xray_object::instrmap::Sled,
    data: &[u8],
    machine: Machine,
    object_id: u32,
) -> Option<Probe> {
    let mut cookie = Cookie::new(packed_id(object_id, sled.function_id), sled.kind);
    if matches!(sled.kind, SledKind::CustomEvent | SledKind::TypedEvent) {
        let at = usize::try_from(sled.file_offset).ok()?;
        let bytes = data.get(at..at.saturating_add(48).min(data.len()))?;
        let typed = sled.kind == SledKind::TypedEvent;
        cookie.regs = crate::plan::eventsled::decode(machine, bytes, typed)?;
    }
    Some(Probe {
        file_offset: sled.file_offset,
        cookie,
    })
}

impl AttachPlan {
    /// Reads `binary`'s instrumentation map and symbols and plans a probe per probed sled,
    /// as the executable (object 0).
    pub fn for_binary(binary: &Path) -> Result<AttachPlan> {
        AttachPlan::for_object(binary, 0)
    }

    /// [`AttachPlan::for_binary`] for object `object_id` (at most [`MAX_OBJECT_ID`]).
    pub fn for_object(binary: &Path, object_id: u32) -> Result<AttachPlan> {
        anyhow::ensure!(
            object_id <= MAX_OBJECT_ID,
            "object id {object_id} does not fit in a trace"
        );
        let image = ElfImage::open(binary)?;
        let map = InstrMap::from_elf(&image)?;
        // A probe must land on a sled, never inside an instruction the map misplaced.
        map.check_sleds(&image)?;
        let symbols = SymbolTable::from_elf(&image);
        let machine = image.machine()?;
        let probes: Vec<Probe> = map
            .sleds
            .iter()
            .filter_map(|sled| probe_for(sled, &image.data, machine, object_id))
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
                .filter_map(|f| {
                    let name = symbols.name_at(f.address)?.to_owned();
                    Some((packed_id(object_id, f.id), name))
                })
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
            object_id,
            build_id: image.build_id(),
            load_address: 0,
            exe_name,
            probes,
            undecodable_event_sleds,
            functions: map.functions.len(),
            names,
            return_probed: BTreeSet::new(),
        })
    }
}

/// Function names by XRay function id.
#[derive(Clone, Debug, Default)]
pub struct FunctionNames(HashMap<u32, String>);

impl FunctionNames {
    /// The same names followed by ` [tag]`: functions of shared objects in the summary, as
    /// reports show them (`name [libfoo.so]`), so that same-named functions of different
    /// objects can be told apart.
    pub fn tagged(self, tag: &str) -> FunctionNames {
        FunctionNames(
            self.0
                .into_iter()
                .map(|(id, name)| (id, format!("{name} [{tag}]")))
                .collect(),
        )
    }

    /// Adds the names of another object's functions (their ids are packed, so none collide).
    pub fn extend(&mut self, other: FunctionNames) {
        self.0.extend(other.0);
    }

    /// The function's symbol name, or `#id` when the binary has no symbol for it.
    pub fn name(&self, id: u32) -> String {
        self.0.get(&id).cloned().unwrap_or_else(|| format!("#{id}"))
    }
}
