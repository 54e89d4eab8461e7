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
    /// The bytes at an entry's sled address are not an unpatched XRay sled of its kind: the
    /// map does not describe the code (a corrupted or hostile file). A probe placed there could
    /// land in the middle of an instruction and change what the program does.
    #[error("{}: xray_instr_map entry {index}: no {kind:?} sled at {address:#x}: {reason}", path.display())]
    NotASled {
        /// The file.
        path: PathBuf,
        /// Entry index (0-based).
        index: usize,
        /// The entry's kind.
        kind: SledKind,
        /// The sled address.
        address: u64,
        /// What the bytes there are instead.
        reason: &'static str,
    },
    /// Two entries' sleds share bytes (the same sled listed twice, or one inside another).
    #[error("{}: xray_instr_map entries {first} and {second} overlap (sleds at {first_address:#x} and {second_address:#x})", path.display())]
    Overlap {
        /// The file.
        path: PathBuf,
        /// Index of the entry with the lower address (0-based).
        first: usize,
        /// Index of the other entry.
        second: usize,
        /// Sled address of `first`.
        first_address: u64,
        /// Sled address of `second`.
        second_address: u64,
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

    /// Checks that every sled is where the map says: at each entry's address the file holds an
    /// unpatched XRay sled of the entry's kind, wholly inside the file-backed part of one
    /// executable segment, and no two sleds share a byte.
    ///
    /// [`InstrMap::from_elf`] only reads the map (as llvm-xray does); this check is for those
    /// that place probes on the sleds or show them as probe sites. A map that does not match
    /// the code (corrupted, or hostile) could otherwise put a breakpoint in the middle of an
    /// instruction, changing what the traced program does, or two probes on one address.
    ///
    /// x86-64: entry, log-args entry and tail sleds are `jmp +9` over 9 bytes of NOPs, exit
    /// sleds the function's `ret` followed by 10 bytes of NOPs, custom and typed event sleds
    /// start with `jmp +15` and `jmp +20`. AArch64: function sleds are `b #32` over 7 NOPs,
    /// event sleds start with a short forward `b`. These are what LLVM emits
    /// (`X86AsmPrinter::LowerPATCHABLE_*`, `AArch64AsmPrinter::emitSled`).
    pub fn check_sleds(&self, image: &ElfImage) -> Result<(), InstrMapError> {
        let machine = image.machine()?;
        let segments = image.load_segments()?;
        let mut extents: Vec<(u64, u64, usize)> = Vec::with_capacity(self.sleds.len());
        for (index, sled) in self.sleds.iter().enumerate() {
            let not_a_sled = |reason| InstrMapError::NotASled {
                path: image.path.clone(),
                index,
                kind: sled.kind,
                address: sled.address,
                reason,
            };
            // The bytes from the sled to the end of its segment's file-backed part, at most
            // what the longest sled needs.
            let code = segments
                .iter()
                .filter(|s| s.is_executable())
                .find_map(|s| {
                    let start = s.file_offset(sled.address)?;
                    let end = s
                        .offset
                        .checked_add(s.filesz)?
                        .min(start.saturating_add(32));
                    image
                        .data
                        .get(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
                })
                .ok_or_else(|| not_a_sled("not in an executable segment"))?;
            let len = match machine {
                Machine::X86_64 => x86_64_sled_len(sled.kind, code, sled.address),
                Machine::Aarch64 => aarch64_sled_len(sled.kind, code),
            }
            .map_err(not_a_sled)?;
            extents.push((sled.address, len, index));
        }
        extents.sort_unstable();
        for pair in extents.windows(2) {
            let [(a, a_len, first), (b, _, second)] = [pair[0], pair[1]];
            // a + a_len cannot overflow: the sled's bytes were found in the file.
            if b < a.saturating_add(a_len) {
                return Err(InstrMapError::Overlap {
                    path: image.path.clone(),
                    first,
                    second,
                    first_address: a,
                    second_address: b,
                });
            }
        }
        Ok(())
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

/// Length of the x86-64 sled of `kind` at the start of `code` (at link-time `address`), or why
/// the bytes are not one.
fn x86_64_sled_len(kind: SledKind, code: &[u8], address: u64) -> Result<u64, &'static str> {
    use iced_x86::{Code, Decoder, DecoderOptions, Mnemonic};
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let first = decoder.decode();
    if first.is_invalid() {
        return Err("the bytes there do not decode as an instruction");
    }
    // How many bytes of NOPs must follow the first instruction, and the sled's length.
    let nops = match kind {
        SledKind::Entry | SledKind::LogArgsEntry | SledKind::Tail => {
            if first.code() != Code::Jmp_rel8_64
                || first.near_branch_target() != address.wrapping_add(11)
            {
                return Err("the bytes there are not the sled's `jmp +9`");
            }
            9
        }
        SledKind::Exit => {
            if first.mnemonic() != Mnemonic::Ret {
                return Err("the bytes there are not the sled's `ret`");
            }
            10
        }
        SledKind::CustomEvent | SledKind::TypedEvent => {
            let over = if kind == SledKind::CustomEvent {
                15
            } else {
                20
            };
            let target = address.wrapping_add(2 + over);
            if first.code() != Code::Jmp_rel8_64 || first.near_branch_target() != target {
                return Err("the bytes there are not the event sled's short jump");
            }
            if code.len() < 2 + over as usize {
                return Err("the sled runs past the end of its segment");
            }
            // What the jump skips is the runtime's call sequence, read by the planner.
            return Ok(2 + over);
        }
    };
    let mut covered = 0u64;
    while covered < nops {
        let nop = decoder.decode();
        if nop.is_invalid() && decoder.last_error() == iced_x86::DecoderError::NoMoreBytes {
            return Err("the sled runs past the end of its segment");
        }
        if nop.mnemonic() != Mnemonic::Nop {
            return Err("the bytes after its first instruction are not the sled's NOPs");
        }
        covered += nop.len() as u64;
    }
    if covered != nops {
        return Err("the sled's NOPs do not end where the sled does");
    }
    Ok(first.len() as u64 + nops)
}

/// Length of the AArch64 sled of `kind` at the start of `code`, or why the bytes are not one.
fn aarch64_sled_len(kind: SledKind, code: &[u8]) -> Result<u64, &'static str> {
    const B_32: u32 = 0x1400_0008;
    const NOP: u32 = 0xd503_201f;
    let word = |i: usize| {
        code.get(4 * i..4 * i + 4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
    };
    let first = word(0).ok_or("the sled runs past the end of its segment")?;
    match kind {
        SledKind::CustomEvent | SledKind::TypedEvent => {
            // `b` with a small forward offset (in words) over the runtime's call sequence.
            let words = first ^ 0x1400_0000;
            if words >> 26 != 0 || !(2..=8).contains(&words) {
                return Err("the bytes there are not the event sled's short branch");
            }
            if code.len() < 4 * words as usize {
                return Err("the sled runs past the end of its segment");
            }
            Ok(4 * u64::from(words))
        }
        _ => {
            if first != B_32 {
                return Err("the bytes there are not the sled's `b #32`");
            }
            for i in 1..8 {
                match word(i) {
                    None => return Err("the sled runs past the end of its segment"),
                    Some(NOP) => {}
                    Some(_) => return Err("the bytes after its branch are not the sled's NOPs"),
                }
            }
            Ok(32)
        }
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
mod tests;
