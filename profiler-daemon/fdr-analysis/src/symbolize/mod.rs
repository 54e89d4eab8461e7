//! From XRay function ids to what people read: function id → object → address → demangled
//! name, source file and line, and the chain of inlined frames at an address.
//!
//! Names come, in this order, from the DWARF (the binary's own, or a separate debug file found
//! by [`debuginfo`]), the ELF symbol tables, and last `object+0xaddress`. They are demangled as
//! [`xray_object::symbols::demangle`] does, which is how `llvm-xray extract --symbolize` shows them.
//!
//! Each object is read once per [`Symbolizer`] and shared ([`Arc`]); lookups are cached per
//! function, and every type here is `Send + Sync`, so threads can share one symbolizer.
pub mod debuginfo;
mod decl;
mod location;

use anyhow::{Context as _, Result};
use debuginfo::DwarfReader;
pub use location::SourceLocation;
use profiler_common::SledKind;
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use xray_object::elf::ElfImage;
use xray_object::instrmap::InstrMap;
use xray_object::symbols::{self, SymbolTable};

/// Where a function's name came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NameSource {
    /// DWARF debug information.
    Dwarf,
    /// The ELF symbol tables.
    SymbolTable,
    /// Nothing names it: `object+0xaddress`.
    Address,
    /// The id is not in the object's instrumentation map, or the object could not be used: `#id`.
    Unknown,
}

/// One instrumented function, symbolized.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FunctionInfo {
    /// XRay function id.
    pub id: u32,
    /// Link-time address of the function (0 when unknown).
    pub address: u64,
    /// Demangled name.
    pub name: String,
    /// Where the function starts in the source, when the DWARF says.
    pub location: Option<SourceLocation>,
    /// Where `name` came from.
    pub source: NameSource,
}

impl FunctionInfo {
    /// A function nothing is known about: named `#id`.
    pub fn unknown(id: u32) -> FunctionInfo {
        FunctionInfo {
            id,
            address: 0,
            name: format!("#{id}"),
            location: None,
            source: NameSource::Unknown,
        }
    }
}

/// One frame of the inlining chain at an address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Frame {
    /// The function this frame is in (demangled).
    pub function: String,
    /// The position in that function: for the innermost frame the address's own line, for the
    /// others the call site of the frame inside them.
    pub location: Option<SourceLocation>,
}

/// An event sled (custom or typed) of a function, with the inlining chain at its address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventSite {
    /// The sled's address.
    pub address: u64,
    /// Innermost first: `frames[0]` is where the event is emitted, the last frame the
    /// instrumented function everything was inlined into. Empty without DWARF.
    pub frames: Vec<Frame>,
}

/// One object's symbol data: instrumentation map, symbol tables, DWARF.
pub struct ObjectSymbols {
    /// The file read.
    pub path: PathBuf,
    /// File name, for `object+0xaddress` names.
    pub name: String,
    /// GNU build-id (lowercase hex), if the file has one.
    pub build_id: Option<String>,
    /// The file the DWARF came from, if any was found.
    pub debug_file: Option<PathBuf>,
    /// Separate debug files found but refused (wrong build-id or CRC), one line each.
    pub refused_debug_files: Vec<String>,
    /// Function addresses by id - 1.
    functions: Vec<u64>,
    /// Custom and typed event sleds by function id.
    event_sleds: HashMap<u32, Vec<(SledKind, u64)>>,
    symbols: SymbolTable,
    debug_symbols: SymbolTable,
    /// addr2line parses lazily through interior mutability (not `Sync`), hence the lock.
    dwarf: Option<Mutex<addr2line::Context<DwarfReader>>>,
    cache: Mutex<HashMap<u32, Arc<FunctionInfo>>>,
}

impl ObjectSymbols {
    /// Reads `path`'s instrumentation map, symbol tables and DWARF (searching separate debug
    /// files under `debug_roots`).
    pub fn load(path: &Path, debug_roots: &[PathBuf]) -> Result<ObjectSymbols> {
        ObjectSymbols::from_image(ElfImage::open(path)?, debug_roots)
    }

    /// [`ObjectSymbols::load`] of a file already read (`image.path` is where separate debug
    /// files are looked for, next to it, and the name used in messages).
    pub fn from_image(image: ElfImage, debug_roots: &[PathBuf]) -> Result<ObjectSymbols> {
        let path = image.path.clone();
        let path = path.as_path();
        let map = InstrMap::from_elf(&image)
            .with_context(|| format!("{}: reading the instrumentation map", path.display()))?;
        // A map that does not match the code is a corrupted or hostile file: refused as the
        // recorder refuses it, rather than trusted to name functions.
        // (Its errors name the file.)
        map.check_sleds(&image)?;
        let build_id = image.build_id();
        let found = debuginfo::find(&image, build_id.as_deref(), debug_roots);
        let mut event_sleds: HashMap<u32, Vec<(SledKind, u64)>> = HashMap::new();
        for sled in &map.sleds {
            if matches!(sled.kind, SledKind::CustomEvent | SledKind::TypedEvent) {
                event_sleds
                    .entry(sled.function_id)
                    .or_default()
                    .push((sled.kind, sled.address));
            }
        }
        let (debug_file, dwarf, debug_symbols) = match found.debug {
            Some(d) => (Some(d.path), Some(Mutex::new(d.context)), d.symbols),
            None => (None, None, SymbolTable::default()),
        };
        Ok(ObjectSymbols {
            name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.display().to_string()),
            path: path.to_path_buf(),
            build_id,
            debug_file,
            refused_debug_files: found.refused,
            functions: map.functions.iter().map(|f| f.address).collect(),
            event_sleds,
            symbols: SymbolTable::from_elf(&image),
            debug_symbols,
            dwarf,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Number of functions in the instrumentation map (ids are 1 to this).
    pub fn function_count(&self) -> usize {
        self.functions.len()
    }

    /// The function with XRay id `id`: name, address, source location. Ids outside the map
    /// give [`FunctionInfo::unknown`].
    pub fn function(&self, id: u32) -> Arc<FunctionInfo> {
        if let Some(info) = lock(&self.cache).get(&id) {
            return info.clone();
        }
        let info = Arc::new(self.resolve(id));
        lock(&self.cache).insert(id, info.clone());
        info
    }

    fn resolve(&self, id: u32) -> FunctionInfo {
        let Some(&address) = (id as usize)
            .checked_sub(1)
            .and_then(|i| self.functions.get(i))
        else {
            return FunctionInfo::unknown(id);
        };
        // The outermost frame is the function itself (an entry sled is never inside inlined
        // code). Its location is its declaration: the line table says line 0 at an entry sled.
        let mut location = None;
        if let Some(dwarf) = &self.dwarf {
            let ctx = lock(dwarf);
            if let Some((outer, die)) = frames_at(&ctx, address).pop() {
                return FunctionInfo {
                    id,
                    address,
                    name: outer.function,
                    location: die.and_then(|die| decl::decl_location(&ctx, address, die)),
                    source: NameSource::Dwarf,
                };
            }
            // No function entry covers it, but the line table may.
            location = ctx.find_location(address).ok().flatten().and_then(|l| {
                Some(SourceLocation {
                    file: l.file?.to_owned(),
                    line: l.line.unwrap_or(0),
                    column: l.column.unwrap_or(0),
                })
            });
        }
        if let Some(name) = self
            .symbols
            .name_at(address)
            .or_else(|| self.debug_symbols.name_at(address))
        {
            return FunctionInfo {
                id,
                address,
                name: name.to_owned(),
                location,
                source: NameSource::SymbolTable,
            };
        }
        FunctionInfo {
            id,
            address,
            name: format!("{}+{address:#x}", self.name),
            location,
            source: NameSource::Address,
        }
    }

    /// The inlining chain at `address`, innermost first; empty without DWARF for it. Frames
    /// the DWARF does not name are left out.
    pub fn frames(&self, address: u64) -> Vec<Frame> {
        let Some(dwarf) = &self.dwarf else {
            return Vec::new();
        };
        let ctx = lock(dwarf);
        frames_at(&ctx, address)
            .into_iter()
            .map(|(f, _)| f)
            .collect()
    }

    /// The custom-event sleds (`kind` [`SledKind::CustomEvent`]) or typed-event sleds of
    /// function `id`, each with its inlining chain. An FDR event record does not say which
    /// sled fired: a function with several sleds of the kind has several candidates.
    pub fn event_sites(&self, id: u32, kind: SledKind) -> Vec<EventSite> {
        self.event_sleds
            .get(&id)
            .into_iter()
            .flatten()
            .filter(|(k, _)| *k == kind)
            .map(|&(_, address)| EventSite {
                address,
                frames: self.frames(address),
            })
            .collect()
    }
}

/// The inlining chain at `address`, innermost first, each frame with its DWARF entry.
fn frames_at(
    ctx: &addr2line::Context<DwarfReader>,
    address: u64,
) -> Vec<(Frame, Option<gimli::UnitOffset<usize>>)> {
    let mut out = Vec::new();
    let Ok(mut iter) = ctx.find_frames(address).skip_all_loads() else {
        return out;
    };
    // Bounded: a hostile DWARF could describe a very deep (or looping) inline chain.
    while let Ok(Some(frame)) = iter.next() {
        if out.len() >= 256 {
            break;
        }
        let Some(name) = frame
            .function
            .as_ref()
            .and_then(|f| f.raw_name().ok().map(|n| n.into_owned()))
            // An empty name (a hostile or broken DWARF) names nothing: the next source does.
            .filter(|n| !n.is_empty())
        else {
            continue;
        };
        let location = frame.location.as_ref().and_then(|l| {
            Some(SourceLocation {
                file: l.file?.to_owned(),
                line: l.line.unwrap_or(0),
                column: l.column.unwrap_or(0),
            })
        });
        out.push((
            Frame {
                function: symbols::demangle(&name),
                location,
            },
            frame.dw_die_offset,
        ));
    }
    out
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves only caches behind: still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Loads objects on first use and shares them.
pub struct Symbolizer {
    debug_roots: Vec<PathBuf>,
    /// Files to read instead of the recorded path, by build-id (see [`Symbolizer::with_file`]).
    by_build_id: HashMap<String, PathBuf>,
    objects: Mutex<HashMap<PathBuf, Arc<ObjectSymbols>>>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Symbolizer::new(vec![PathBuf::from(debuginfo::SYSTEM_DEBUG_ROOT)])
    }
}

impl Symbolizer {
    /// A symbolizer looking for separate debug files under `debug_roots`.
    pub fn new(debug_roots: Vec<PathBuf>) -> Symbolizer {
        Symbolizer {
            debug_roots,
            by_build_id: HashMap::new(),
            objects: Mutex::new(HashMap::new()),
        }
    }

    /// Reads `path` for an object recorded with `build_id` when the recorded path does not
    /// have it (any more): the recording daemon holds each object it probed open and passes
    /// `/proc/self/fd/N`, so objects deleted or replaced on disk since, or only reachable in
    /// the traced process's mount namespace, are still named in its report.
    pub fn with_file(mut self, build_id: String, path: PathBuf) -> Symbolizer {
        self.by_build_id.insert(build_id, path);
        self
    }

    /// The object at `path`, loaded once. When `recorded_build_id` is given (what the session
    /// recorded), the file must have that build-id: a binary rebuilt or replaced since the
    /// recording is refused rather than used to name the wrong functions.
    pub fn object(
        &self,
        path: &Path,
        recorded_build_id: Option<&str>,
    ) -> Result<Arc<ObjectSymbols>> {
        // The recorded path first: separate debug files are found next to it.
        let at_path = self.object_at(path, recorded_build_id);
        match recorded_build_id.and_then(|id| self.by_build_id.get(id)) {
            Some(held) if at_path.is_err() => self.object_at(held, recorded_build_id),
            _ => at_path,
        }
    }

    fn object_at(
        &self,
        path: &Path,
        recorded_build_id: Option<&str>,
    ) -> Result<Arc<ObjectSymbols>> {
        let cached = lock(&self.objects).get(path).cloned();
        let object = match cached {
            Some(o) => o,
            None => {
                let o = Arc::new(ObjectSymbols::load(path, &self.debug_roots)?);
                lock(&self.objects).insert(path.to_path_buf(), o.clone());
                o
            }
        };
        if let Some(recorded) = recorded_build_id {
            match object.build_id.as_deref() {
                Some(now) if now == recorded => {}
                now => anyhow::bail!(
                    "{} has changed since the recording: its build-id is {}, the session recorded {recorded}",
                    path.display(),
                    now.unwrap_or("absent")
                ),
            }
        }
        Ok(object)
    }
}
