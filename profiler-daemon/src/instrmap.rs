//! The XRay instrumentation map (`xray_instr_map`) of a linked executable or shared object.
//!
//! Every sled the compiler emitted has one 32-byte entry: where the sled is, which function it
//! belongs to, what kind it is. The tracer puts a uprobe on every sled, so this module turns the
//! raw entries into absolute link-time addresses, file offsets (uprobes are attached by file
//! offset) and XRay function ids. The ids must be exactly the ones the XRay runtime and
//! `llvm-xray` compute, because trace files carry only ids and `llvm-xray` maps them back to
//! functions with its own numbering.
//!
//! Entry layout (little-endian, possibly unaligned):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | sled address |
//! | 8 | 8 | function address |
//! | 16 | 1 | kind |
//! | 17 | 1 | always-instrument |
//! | 18 | 1 | version |
//! | 19 | 13 | padding |
//!
//! Versions 0 and 1 hold absolute addresses; version 2 holds PC-relative ones (relative to the
//! field itself). What is done here mirrors LLVM's `InstrumentationMap.cpp` (`loadObj`), with
//! stricter validation because the input is untrusted.

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;

use object::elf;
use object::read::elf::{Rela as _, SectionHeader as _, Sym as _};
use object::{LittleEndian, SectionIndex, SymbolIndex};
use profiler_common::SledKind;

use crate::elf::{ElfError, ElfImage, LoadSegment, Machine, Sections};

/// Name of the section holding the instrumentation map.
pub const SECTION_NAME: &str = "xray_instr_map";

/// Size of one map entry on 64-bit targets.
pub const ENTRY_SIZE: usize = 32;

/// Most entries accepted. A map this large (512 MiB) is far beyond any real program; the limit
/// bounds what a hostile file can make the daemon allocate.
pub const MAX_ENTRIES: usize = 1 << 24;

/// Largest function id accepted. Ids of shared objects are packed as
/// `(object_id << 24) | function_id`, so a function id must fit in 24 bits.
pub const MAX_FUNCTION_ID: u32 = (1 << 24) - 1;

/// One sled: a patchable instruction sequence the compiler left in a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sled {
    /// Link-time virtual address of the sled's first byte.
    pub address: u64,
    /// Link-time virtual address of the start of the function the sled belongs to.
    pub function_address: u64,
    /// What the sled marks (entry, exit, tail call, event call site...).
    pub kind: SledKind,
    /// Whether the function was marked `xray_always_instrument`.
    pub always_instrument: bool,
    /// Version byte of the map entry (0, 1 or 2).
    pub version: u8,
    /// XRay function id (1-based; see [`InstrMap`] for the numbering rule).
    pub function_id: u32,
    /// File offset of the sled's first byte, where the uprobe goes.
    pub file_offset: u64,
}

/// One instrumented function: a run of consecutive map entries with the same function address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstrFunction {
    /// XRay function id.
    pub id: u32,
    /// Link-time virtual address of the function's start.
    pub address: u64,
    /// The function's sleds, as indices into [`InstrMap::sleds`].
    pub sleds: Range<usize>,
}

/// All entries of a file's `xray_instr_map`, in map order, with XRay function ids.
///
/// Ids follow the rule of the XRay runtime (`controlPatching` in compiler-rt) and llvm-xray:
/// start at 1, walk the entries in order, and take the next id whenever an entry's function
/// address differs from the previous entry's. `functions[i]` therefore has id `i + 1`. Should a
/// function's entries not be contiguous (never seen from a real linker), each run gets its own
/// id, as in the runtime; llvm-xray would instead label both runs with the last id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstrMap {
    /// Every entry of the map, in map order.
    pub sleds: Vec<Sled>,
    /// Every function, in id order (`functions[i].id == i + 1`).
    pub functions: Vec<InstrFunction>,
}

/// Which address field of a map entry an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// Bytes 0..8, the sled address.
    Sled,
    /// Bytes 8..16, the function address.
    Function,
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Field::Sled => "sled",
            Field::Function => "function",
        })
    }
}

/// Why the instrumentation map of a file could not be read. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum InstrMapError {
    /// The file itself was refused.
    #[error(transparent)]
    Elf(#[from] ElfError),
    /// The file is a relocatable object: sled addresses are not known until it is linked.
    #[error("{}: is a relocatable object file; trace the linked executable or shared object", path.display())]
    Relocatable {
        /// The file.
        path: PathBuf,
    },
    /// There is no `xray_instr_map` section.
    #[error("{}: no xray_instr_map section (was it built with -fxray-instrument?)", path.display())]
    NoSection {
        /// The file.
        path: PathBuf,
    },
    /// The section occupies no file space (`SHT_NOBITS`).
    #[error("{}: xray_instr_map section has no contents in the file (SHT_NOBITS)", path.display())]
    NoBits {
        /// The file.
        path: PathBuf,
    },
    /// The section's file range runs past the end of the file.
    #[error("{}: xray_instr_map section (offset {offset:#x}, size {size:#x}) extends past the end of the file", path.display())]
    OutOfBounds {
        /// The file.
        path: PathBuf,
        /// `sh_offset`.
        offset: u64,
        /// `sh_size`.
        size: u64,
    },
    /// The section size is not a whole number of entries.
    #[error("{}: xray_instr_map size {size} is not a multiple of {ENTRY_SIZE}", path.display())]
    BadSize {
        /// The file.
        path: PathBuf,
        /// `sh_size`.
        size: u64,
    },
    /// The section has no entries.
    #[error("{}: xray_instr_map is empty", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The section has more than [`MAX_ENTRIES`] entries.
    #[error("{}: xray_instr_map has {count} entries, more than the limit of {MAX_ENTRIES}", path.display())]
    TooManyEntries {
        /// The file.
        path: PathBuf,
        /// Number of entries.
        count: u64,
    },
    /// More than [`MAX_FUNCTION_ID`] functions.
    #[error("{}: xray_instr_map has more than {MAX_FUNCTION_ID} functions", path.display())]
    TooManyFunctions {
        /// The file.
        path: PathBuf,
    },
    /// An entry's kind byte is not one LLVM defines.
    #[error("{}: xray_instr_map entry {index} has unknown kind {kind}", path.display())]
    UnknownKind {
        /// The file.
        path: PathBuf,
        /// Entry index (0-based).
        index: usize,
        /// The kind byte.
        kind: u8,
    },
    /// An entry's version byte is not 0, 1 or 2.
    #[error("{}: xray_instr_map entry {index} has unsupported version {version}", path.display())]
    UnknownVersion {
        /// The file.
        path: PathBuf,
        /// Entry index (0-based).
        index: usize,
        /// The version byte.
        version: u8,
    },
    /// Computing an address overflowed 64 bits.
    #[error("{}: xray_instr_map entry {index}: {field} address overflows", path.display())]
    Overflow {
        /// The file.
        path: PathBuf,
        /// Entry index (0-based).
        index: usize,
        /// Which field.
        field: Field,
    },
    /// An absolute (version 0/1) field is 0 and no dynamic relocation supplies its value.
    #[error("{}: xray_instr_map entry {index}: {field} address is 0 and no relocation fills it", path.display())]
    Unrelocated {
        /// The file.
        path: PathBuf,
        /// Entry index (0-based).
        index: usize,
        /// Which field.
        field: Field,
    },
    /// An address does not lie in the file-backed part of an executable `PT_LOAD` segment.
    #[error("{}: xray_instr_map entry {index}: {field} address {address:#x} is not in an executable PT_LOAD segment", path.display())]
    NotInText {
        /// The file.
        path: PathBuf,
        /// Entry index (0-based).
        index: usize,
        /// Which field.
        field: Field,
        /// The computed address.
        address: u64,
    },
}

impl InstrMap {
    /// Reads every entry of the file's `xray_instr_map`.
    ///
    /// Fails (never panics) on a missing, truncated or oddly sized section, unknown kinds or
    /// versions, and sled or function addresses outside the executable `PT_LOAD` segments.
    pub fn from_elf(image: &ElfImage) -> Result<InstrMap, InstrMapError> {
        let path = || image.path.clone();
        let data = &image.data[..];
        if image.file_type()? == elf::ET_REL {
            // In a .o every function has its own map section and all addresses are
            // relocations against section symbols: nothing here would be meaningful.
            return Err(InstrMapError::Relocatable { path: path() });
        }
        let machine = image.machine()?;
        let sections = image.sections()?;
        // The first section with that name, as llvm-xray does; names that cannot be read are
        // skipped rather than fatal, also as llvm-xray does.
        let Some(section) = sections
            .iter()
            .find(|s| sections.section_name(LittleEndian, s) == Ok(SECTION_NAME.as_bytes()))
        else {
            return Err(InstrMapError::NoSection { path: path() });
        };
        if section.sh_type(LittleEndian) == elf::SHT_NOBITS {
            return Err(InstrMapError::NoBits { path: path() });
        }
        let offset = section.sh_offset(LittleEndian);
        let size = section.sh_size(LittleEndian);
        let bytes = offset
            .checked_add(size)
            .filter(|&end| end <= data.len() as u64)
            .and_then(|end| data.get(usize::try_from(offset).ok()?..usize::try_from(end).ok()?))
            .ok_or_else(|| InstrMapError::OutOfBounds {
                path: path(),
                offset,
                size,
            })?;
        if size % ENTRY_SIZE as u64 != 0 {
            return Err(InstrMapError::BadSize { path: path(), size });
        }
        let count = size / ENTRY_SIZE as u64;
        if count == 0 {
            return Err(InstrMapError::Empty { path: path() });
        }
        if count > MAX_ENTRIES as u64 {
            return Err(InstrMapError::TooManyEntries {
                path: path(),
                count,
            });
        }
        let section_addr = section.sh_addr(LittleEndian);
        let section_end =
            section_addr
                .checked_add(size)
                .ok_or_else(|| InstrMapError::Overflow {
                    path: path(),
                    index: 0,
                    field: Field::Sled,
                })?;
        let segments = image.load_segments()?;
        // Built on first need: only absolute entries whose field is 0 look relocations up.
        let mut relocs: Option<HashMap<u64, u64>> = None;

        let mut map = InstrMap {
            sleds: Vec::with_capacity(count as usize),
            functions: Vec::new(),
        };
        for (index, entry) in bytes.chunks_exact(ENTRY_SIZE).enumerate() {
            let word = |at: usize| {
                let mut w = [0u8; 8];
                w.copy_from_slice(&entry[at..at + 8]);
                u64::from_le_bytes(w)
            };
            let (raw_sled, raw_function) = (word(0), word(8));
            let (kind_byte, always, version) = (entry[16], entry[17], entry[18]);
            let kind = SledKind::from_u8(kind_byte).ok_or_else(|| InstrMapError::UnknownKind {
                path: path(),
                index,
                kind: kind_byte,
            })?;
            let overflow = |field| InstrMapError::Overflow {
                path: path(),
                index,
                field,
            };
            // index < MAX_ENTRIES, so the multiplication cannot overflow; the addition can.
            let entry_va = section_addr
                .checked_add((index * ENTRY_SIZE) as u64)
                .ok_or_else(|| overflow(Field::Sled))?;
            let function_field_va = entry_va
                .checked_add(8)
                .ok_or_else(|| overflow(Field::Function))?;
            let (address, function_address) = match version {
                0 | 1 => {
                    let mut absolute = |raw: u64, field: Field, field_va: u64| {
                        // llvm-xray consults relocations only when the field is 0: in a PIE,
                        // lld leaves RELATIVE targets 0 while GNU ld also stores the value.
                        if raw != 0 {
                            return Ok(raw);
                        }
                        let relocs = relocs.get_or_insert_with(|| {
                            collect_relocations(
                                image,
                                &sections,
                                machine,
                                section_addr..section_end,
                            )
                        });
                        relocs
                            .get(&field_va)
                            .copied()
                            .ok_or_else(|| InstrMapError::Unrelocated {
                                path: path(),
                                index,
                                field,
                            })
                    };
                    (
                        absolute(raw_sled, Field::Sled, entry_va)?,
                        absolute(raw_function, Field::Function, function_field_va)?,
                    )
                }
                2 => (
                    // PC-relative: relative to the field's own address, as the runtime's
                    // `XRaySledEntry::address()`/`function()` compute it.
                    entry_va
                        .checked_add_signed(raw_sled as i64)
                        .ok_or_else(|| overflow(Field::Sled))?,
                    function_field_va
                        .checked_add_signed(raw_function as i64)
                        .ok_or_else(|| overflow(Field::Function))?,
                ),
                _ => {
                    return Err(InstrMapError::UnknownVersion {
                        path: path(),
                        index,
                        version,
                    })
                }
            };
            let in_text = |address: u64, field: Field| {
                exec_file_offset(&segments, address).ok_or_else(|| InstrMapError::NotInText {
                    path: path(),
                    index,
                    field,
                    address,
                })
            };
            let file_offset = in_text(address, Field::Sled)?;
            in_text(function_address, Field::Function)?;
            // The runtime treats function address 0 as "no function yet" when numbering;
            // refusing it keeps our ids and the runtime's from ever diverging.
            if function_address == 0 {
                return Err(InstrMapError::NotInText {
                    path: path(),
                    index,
                    field: Field::Function,
                    address: 0,
                });
            }
            let new_function = map
                .functions
                .last()
                .is_none_or(|f| f.address != function_address);
            if new_function {
                let id = u32::try_from(map.functions.len() + 1)
                    .ok()
                    .filter(|&id| id <= MAX_FUNCTION_ID)
                    .ok_or_else(|| InstrMapError::TooManyFunctions { path: path() })?;
                map.functions.push(InstrFunction {
                    id,
                    address: function_address,
                    sleds: index..index,
                });
            }
            // Never fails (a function was pushed above at the latest); no unwrap on hostile paths.
            let function = map
                .functions
                .last_mut()
                .ok_or_else(|| InstrMapError::TooManyFunctions { path: path() })?;
            function.sleds.end = index + 1;
            map.sleds.push(Sled {
                address,
                function_address,
                kind,
                always_instrument: always != 0,
                version,
                function_id: function.id,
                file_offset,
            });
        }
        Ok(map)
    }

    /// The function with XRay id `id`, if there is one.
    pub fn function(&self, id: u32) -> Option<&InstrFunction> {
        let index = usize::try_from(id.checked_sub(1)?).ok()?;
        self.functions.get(index)
    }

    /// The sleds of the function with XRay id `id` (empty when there is no such function).
    pub fn sleds_of(&self, id: u32) -> &[Sled] {
        self.function(id)
            .and_then(|f| self.sleds.get(f.sleds.clone()))
            .unwrap_or(&[])
    }
}

/// File offset of `address` if it lies in the file-backed part of an executable segment.
fn exec_file_offset(segments: &[LoadSegment], address: u64) -> Option<u64> {
    segments
        .iter()
        .filter(|s| s.is_executable())
        .find_map(|s| s.file_offset(address))
}

/// The values dynamic relocations store into `[range)`, keyed by the address they patch.
///
/// Mirrors llvm-xray: every `SHT_RELA` section counts; `*_RELATIVE` yields its addend and the
/// 64-bit absolute type yields symbol value + addend; the first relocation of an address wins.
/// Relocation sections that cannot be parsed are skipped: the entries that needed them then
/// fail with [`InstrMapError::Unrelocated`].
fn collect_relocations(
    image: &ElfImage,
    sections: &Sections<'_>,
    machine: Machine,
    range: Range<u64>,
) -> HashMap<u64, u64> {
    let data = &image.data[..];
    let (relative, absolute) = match machine {
        Machine::X86_64 => (elf::R_X86_64_RELATIVE, elf::R_X86_64_64),
        Machine::Aarch64 => (elf::R_AARCH64_RELATIVE, elf::R_AARCH64_ABS64),
    };
    let mut out = HashMap::new();
    for section in sections.iter() {
        let Ok(Some((relas, link))) = section.rela(LittleEndian, data) else {
            continue;
        };
        let symbols = if link == SectionIndex(0) {
            None
        } else {
            sections
                .symbol_table_by_index(LittleEndian, data, link)
                .ok()
        };
        for rela in relas {
            let r_offset = rela.r_offset(LittleEndian);
            if !range.contains(&r_offset) {
                continue;
            }
            let r_type = rela.r_type(LittleEndian, false);
            let addend = rela.r_addend(LittleEndian);
            let value = if r_type == relative {
                Some(addend as u64)
            } else if r_type == absolute {
                let sym_index = rela.r_sym(LittleEndian, false);
                let sym_value = if sym_index == 0 {
                    Some(0)
                } else {
                    symbols
                        .as_ref()
                        .and_then(|t| t.symbol(SymbolIndex(sym_index as usize)).ok())
                        // An undefined symbol's value is only known at run time.
                        .filter(|s| s.st_shndx(LittleEndian) != elf::SHN_UNDEF)
                        .map(|s| s.st_value(LittleEndian))
                };
                sym_value.and_then(|v| v.checked_add_signed(addend))
            } else {
                None
            };
            if let Some(value) = value {
                out.entry(r_offset).or_insert(value);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::testelf::{build, Section, Segment};

    const TEXT: u64 = 0x1000;
    const MAP: u64 = 0x2000;

    fn entry(sled: u64, function: u64, kind: u8, always: u8, version: u8) -> [u8; 32] {
        let mut e = [0u8; 32];
        e[0..8].copy_from_slice(&sled.to_le_bytes());
        e[8..16].copy_from_slice(&function.to_le_bytes());
        e[16] = kind;
        e[17] = always;
        e[18] = version;
        e
    }

    /// A version-2 entry at index `i` of a map at `MAP` for absolute `sled` and `function`.
    fn rel_entry(i: usize, sled: u64, function: u64, kind: u8) -> [u8; 32] {
        let va = MAP + 32 * i as u64;
        entry(
            sled.wrapping_sub(va),
            function.wrapping_sub(va + 8),
            kind,
            0,
            2,
        )
    }

    fn map_section(entries: &[[u8; 32]]) -> Section {
        Section {
            name: SECTION_NAME,
            sh_type: elf::SHT_PROGBITS,
            flags: u64::from(elf::SHF_ALLOC),
            addr: MAP,
            data: entries.concat(),
            link: 0,
            entsize: 0,
        }
    }

    fn text_section() -> Section {
        Section {
            name: ".text",
            sh_type: elf::SHT_PROGBITS,
            flags: u64::from(elf::SHF_ALLOC | elf::SHF_EXECINSTR),
            addr: TEXT,
            data: vec![0xcc; 0x100],
            link: 0,
            entsize: 0,
        }
    }

    fn segments() -> Vec<Segment> {
        vec![
            Segment {
                vaddr: TEXT,
                offset: TEXT,
                size: 0x100,
                flags: elf::PF_R | elf::PF_X,
            },
            Segment {
                vaddr: MAP,
                offset: MAP,
                size: 0x100,
                flags: elf::PF_R,
            },
        ]
    }

    fn file(e_type: u16, sections: Vec<Section>) -> ElfImage {
        let data = build(e_type, elf::EM_X86_64, &segments(), &sections);
        ElfImage::from_bytes(PathBuf::from("./x"), data).unwrap()
    }

    fn with_map(entries: &[[u8; 32]]) -> ElfImage {
        file(elf::ET_EXEC, vec![text_section(), map_section(entries)])
    }

    fn err(image: &ElfImage) -> String {
        InstrMap::from_elf(image).unwrap_err().to_string()
    }

    #[test]
    fn reads_version_2_entries_and_numbers_functions() {
        let image = with_map(&[
            rel_entry(0, TEXT, TEXT, 0),
            rel_entry(1, TEXT + 0x20, TEXT, 1),
            rel_entry(2, TEXT + 0x40, TEXT + 0x40, 3),
            rel_entry(3, TEXT + 0x50, TEXT + 0x40, 4),
            rel_entry(4, TEXT + 0x60, TEXT + 0x40, 5),
            rel_entry(5, TEXT + 0x70, TEXT + 0x40, 2),
            rel_entry(6, TEXT + 0x80, TEXT, 1),
        ]);
        let map = InstrMap::from_elf(&image).unwrap();
        assert_eq!(map.sleds.len(), 7);
        let ids: Vec<u32> = map.sleds.iter().map(|s| s.function_id).collect();
        // Function TEXT comes back after TEXT+0x40: a new id, as the runtime does.
        assert_eq!(ids, [1, 1, 2, 2, 2, 2, 3]);
        let kinds: Vec<SledKind> = map.sleds.iter().map(|s| s.kind).collect();
        assert_eq!(
            kinds,
            [
                SledKind::Entry,
                SledKind::Exit,
                SledKind::LogArgsEntry,
                SledKind::CustomEvent,
                SledKind::TypedEvent,
                SledKind::Tail,
                SledKind::Exit
            ]
        );
        assert_eq!(map.sleds[1].address, TEXT + 0x20);
        assert_eq!(map.sleds[1].function_address, TEXT);
        assert_eq!(map.sleds[1].file_offset, TEXT + 0x20);
        assert_eq!(map.functions.len(), 3);
        assert_eq!(map.function(2).unwrap().sleds, 2..6);
        assert_eq!(map.function(3).unwrap().address, TEXT);
        assert_eq!(map.sleds_of(1).len(), 2);
        assert!(map.function(0).is_none());
        assert!(map.function(4).is_none());
        assert!(map.sleds_of(u32::MAX).is_empty());
    }

    #[test]
    fn reads_absolute_entries() {
        let image = with_map(&[
            entry(TEXT + 4, TEXT, 0, 1, 1),
            entry(TEXT + 8, TEXT, 1, 1, 0),
        ]);
        let map = InstrMap::from_elf(&image).unwrap();
        assert_eq!(map.sleds[0].address, TEXT + 4);
        assert_eq!(map.sleds[1].version, 0);
        assert!(map.sleds[0].always_instrument);
        assert_eq!(map.functions.len(), 1);
    }

    fn rela_section(relocs: &[(u64, u32, i64)]) -> Section {
        let mut data = Vec::new();
        for &(offset, r_type, addend) in relocs {
            data.extend_from_slice(&offset.to_le_bytes());
            data.extend_from_slice(&u64::from(r_type).to_le_bytes());
            data.extend_from_slice(&addend.to_le_bytes());
        }
        Section {
            name: ".rela.dyn",
            sh_type: elf::SHT_RELA,
            flags: u64::from(elf::SHF_ALLOC),
            addr: 0,
            data,
            link: 0,
            entsize: 24,
        }
    }

    #[test]
    fn applies_relative_relocations_to_zero_fields_only() {
        let map = map_section(&[entry(0, 0, 0, 0, 1), entry(TEXT + 0x10, 0, 1, 0, 1)]);
        let rela = rela_section(&[
            (MAP, elf::R_X86_64_RELATIVE, TEXT as i64),
            (MAP + 8, elf::R_X86_64_RELATIVE, TEXT as i64),
            // Ignored: the field is not 0.
            (MAP + 32, elf::R_X86_64_RELATIVE, 0x7777),
            (MAP + 40, elf::R_X86_64_RELATIVE, TEXT as i64),
            // Ignored: a later relocation of an address already seen.
            (MAP, elf::R_X86_64_RELATIVE, 0x7777),
        ]);
        let image = file(elf::ET_DYN, vec![text_section(), map, rela]);
        let map = InstrMap::from_elf(&image).unwrap();
        assert_eq!(map.sleds[0].address, TEXT);
        assert_eq!(map.sleds[0].function_address, TEXT);
        assert_eq!(map.sleds[1].address, TEXT + 0x10);
        assert_eq!(map.sleds[1].function_id, 1);
    }

    #[test]
    fn zero_field_without_relocation_is_an_error() {
        let map = map_section(&[entry(TEXT, 0, 0, 0, 1)]);
        let image = file(elf::ET_DYN, vec![text_section(), map]);
        assert_eq!(
            err(&image),
            "./x: xray_instr_map entry 0: function address is 0 and no relocation fills it"
        );
    }

    #[test]
    fn missing_section() {
        let image = file(elf::ET_EXEC, vec![text_section()]);
        assert_eq!(
            err(&image),
            "./x: no xray_instr_map section (was it built with -fxray-instrument?)"
        );
    }

    #[test]
    fn relocatable_objects_are_refused() {
        let image = file(
            elf::ET_REL,
            vec![text_section(), map_section(&[entry(0, 0, 0, 0, 2)])],
        );
        assert!(matches!(
            InstrMap::from_elf(&image),
            Err(InstrMapError::Relocatable { .. })
        ));
    }

    #[test]
    fn bad_sizes() {
        let mut section = map_section(&[rel_entry(0, TEXT, TEXT, 0)]);
        section.data.pop();
        let image = file(elf::ET_EXEC, vec![text_section(), section]);
        assert_eq!(
            err(&image),
            "./x: xray_instr_map size 31 is not a multiple of 32"
        );
        let image = with_map(&[]);
        assert_eq!(err(&image), "./x: xray_instr_map is empty");
    }

    /// File offset of the section header of section `index` (1-based: after the null header).
    fn shdr(image: &ElfImage, index: usize) -> usize {
        let shoff = u64::from_le_bytes(image.data[0x28..0x30].try_into().unwrap()) as usize;
        shoff + 64 * index
    }

    #[test]
    fn section_outside_the_file() {
        for (offset, size) in [(1u64 << 40, 32u64), (u64::MAX - 8, 32), (0x2000, 1 << 40)] {
            let mut image = with_map(&[rel_entry(0, TEXT, TEXT, 0)]);
            let h = shdr(&image, 2);
            image.data[h + 24..h + 32].copy_from_slice(&offset.to_le_bytes());
            image.data[h + 32..h + 40].copy_from_slice(&size.to_le_bytes());
            let e = err(&image);
            assert!(e.contains("extends past the end of the file"), "{e}");
        }
        let mut image = with_map(&[rel_entry(0, TEXT, TEXT, 0)]);
        let h = shdr(&image, 2);
        image.data[h + 4..h + 8].copy_from_slice(&elf::SHT_NOBITS.to_le_bytes());
        assert!(matches!(
            InstrMap::from_elf(&image),
            Err(InstrMapError::NoBits { .. })
        ));
    }

    #[test]
    fn unknown_kind_and_version() {
        let mut e = rel_entry(1, TEXT, TEXT, 0);
        e[16] = 9;
        let image = with_map(&[rel_entry(0, TEXT, TEXT, 0), e]);
        assert_eq!(
            err(&image),
            "./x: xray_instr_map entry 1 has unknown kind 9"
        );
        let mut e = rel_entry(0, TEXT, TEXT, 0);
        e[18] = 3;
        let image = with_map(&[e]);
        assert_eq!(
            err(&image),
            "./x: xray_instr_map entry 0 has unsupported version 3"
        );
    }

    #[test]
    fn addresses_outside_executable_segments() {
        // In the map's own (non-executable) segment.
        let image = with_map(&[rel_entry(0, MAP, TEXT, 0)]);
        assert_eq!(
            err(&image),
            "./x: xray_instr_map entry 0: sled address 0x2000 is not in an executable PT_LOAD segment"
        );
        // Just past the end of the text segment.
        let image = with_map(&[rel_entry(0, TEXT + 0x100, TEXT, 0)]);
        assert!(err(&image).contains("sled address 0x1100"));
        // Function outside.
        let image = with_map(&[rel_entry(0, TEXT, 0x9000, 0)]);
        assert!(err(&image).contains("function address 0x9000"));
        // Absolute zero / huge values.
        let image = with_map(&[entry(u64::MAX, TEXT, 0, 0, 1)]);
        assert!(err(&image).contains("is not in an executable PT_LOAD segment"));
        // PC-relative offsets that leave the address space.
        let image = with_map(&[entry(0u64.wrapping_sub(MAP + 1), 0, 0, 0, 2)]);
        assert_eq!(
            err(&image),
            "./x: xray_instr_map entry 0: sled address overflows"
        );
        let image = with_map(&[
            rel_entry(0, TEXT, TEXT, 0),
            entry(0, 0u64.wrapping_sub(MAP + 41), 0, 0, 2),
        ]);
        assert_eq!(
            err(&image),
            "./x: xray_instr_map entry 1: function address overflows"
        );
    }

    #[test]
    fn corrupted_files_never_panic() {
        let base = with_map(&[
            rel_entry(0, TEXT, TEXT, 0),
            rel_entry(1, TEXT + 0x20, TEXT, 1),
            rel_entry(2, TEXT + 0x40, TEXT + 0x40, 2),
        ]);
        // Every prefix.
        for len in 0..base.data.len() {
            if let Ok(image) = ElfImage::from_bytes(PathBuf::from("./x"), base.data[..len].to_vec())
            {
                let _ = InstrMap::from_elf(&image);
            }
        }
        // Every byte of the headers set to a few interesting values.
        let shoff = u64::from_le_bytes(base.data[0x28..0x30].try_into().unwrap()) as usize;
        let interesting = (0..0x100)
            .chain(MAP as usize..MAP as usize + 96)
            .chain(shoff..base.data.len());
        for at in interesting {
            for v in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                let mut image = base.clone();
                image.data[at] = v;
                let _ = InstrMap::from_elf(&image);
            }
        }
    }
}
