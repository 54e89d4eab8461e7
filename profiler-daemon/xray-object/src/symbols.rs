//! Function names for instrumented functions, from the ELF symbol tables.
//!
//! Names are demangled the way `llvm-xray extract --symbolize` shows them, so that summaries
//! and `llvm-xray account`/`graph` output of the same trace agree:
//!
//! * C++ (Itanium, `_Z`) through `cpp_demangle`: `fib(int)`, `ns::K::m(int) const`, with
//!   `>>` between closing template brackets as LLVM 17 and later print it (llvm-xray 14
//!   printed `> >`).
//!   Clang's `Tn` template-parameter declarations, which cpp_demangle cannot parse yet, are
//!   read by rewriting them (`param_decls`): `create<std::nullptr_t, 0>`, as LLVM prints it.
//! * Rust v0 (`_R`) through `rustc-demangle` without crate disambiguators, as LLVM's Rust
//!   demangler prints them: `<r::inner::W<u32>>::get`.
//! * Rust legacy (`_ZN...17h<hash>E`) through `rustc-demangle` *with* the hash. LLVM demangles
//!   these as Itanium names and keeps the hash too, but leaves the `$LT$`-style escapes in
//!   (`W$LT$T$GT$::get::h70e1...`) where we print `W<T>::get::h70e1...`. The hash is kept
//!   because legacy names carry no generic arguments: without it every instance of a generic
//!   function would have the same name.
//! * Anything else as it is.
//!
//! Symbol tables come from hostile files, so the table is built without reading any name:
//! the string tables are copied once, and a name is read (bounded), demangled (bounded) and
//! kept only when its address is first asked about. A file with millions of symbols sharing
//! one huge name costs a few bytes per symbol.

use std::fmt::Write as _;
use std::sync::OnceLock;

use object::elf;
use object::read::elf::{SectionHeader as _, Sym as _};
use object::LittleEndian;

use crate::elf::ElfImage;

/// Longest raw symbol name read from a string table; longer names are cut here. Real
/// mangled names stay well below this, and the cap bounds the work one lookup can cause.
pub const MAX_NAME_LEN: usize = 64 * 1024;

/// Function symbols of one file, sorted by address, one per address.
#[derive(Debug, Default)]
pub struct SymbolTable {
    /// Sorted by `address`; addresses are unique.
    entries: Vec<Entry>,
    /// Copies of the string tables the entries' names point into (`.strtab`, `.dynstr`).
    strtabs: Vec<Box<[u8]>>,
}

#[derive(Debug)]
struct Entry {
    address: u64,
    size: u64,
    /// Index into `SymbolTable::strtabs`.
    strtab: usize,
    /// Offset of the name in that string table.
    name_offset: u32,
    /// Demangled on first use.
    name: OnceLock<Box<str>>,
}

/// A function symbol as returned by [`SymbolTable::lookup`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Symbol<'a> {
    /// Start address (`st_value`).
    pub address: u64,
    /// Size in bytes (`st_size`); 0 when the symbol table does not say.
    pub size: u64,
    /// Demangled name.
    pub name: &'a str,
}

impl SymbolTable {
    /// Collects the function symbols (`STT_FUNC`, `STT_GNU_IFUNC`) defined in the file, from
    /// `.symtab` and then `.dynsym`. Never fails: a missing or broken table contributes
    /// nothing, so the result may be empty.
    ///
    /// `.dynsym` only names addresses `.symtab` leaves unnamed (it matters for stripped files).
    /// When several symbols of one table start at one address, the one kept is chosen as
    /// LLVM's symbolizer does: the largest size, then the last in table order.
    pub fn from_elf(image: &ElfImage) -> SymbolTable {
        let mut table = SymbolTable::default();
        let Ok(sections) = image.sections() else {
            return table;
        };
        let data = &image.data[..];
        let mut seen_addresses = std::collections::HashSet::new();
        for sh_type in [elf::SHT_SYMTAB, elf::SHT_DYNSYM] {
            let Ok(symbols) = sections.symbols(LittleEndian, data, sh_type) else {
                continue;
            };
            if symbols.is_empty() {
                continue;
            }
            // The names live in the linked string table; copy it (bounded by the file size,
            // once per table) so the table does not borrow the image.
            let strtab: Box<[u8]> = sections
                .section(symbols.string_section())
                .ok()
                .filter(|s| s.sh_type(LittleEndian) == elf::SHT_STRTAB)
                .and_then(|s| s.data(LittleEndian, data).ok())
                .unwrap_or_default()
                .into();
            let strtab_index = table.strtabs.len();
            table.strtabs.push(strtab);
            let mut found: Vec<Entry> = symbols
                .iter()
                .filter(|s| {
                    matches!(s.st_type(), elf::STT_FUNC | elf::STT_GNU_IFUNC)
                        && s.st_shndx(LittleEndian) != elf::SHN_UNDEF
                        && s.st_value(LittleEndian) != 0
                })
                .map(|s| Entry {
                    address: s.st_value(LittleEndian),
                    size: s.st_size(LittleEndian),
                    strtab: strtab_index,
                    name_offset: s.st_name(LittleEndian),
                    name: OnceLock::new(),
                })
                .collect();
            // Stable sort by (address, size): the last of each address run is the keeper.
            found.sort_by_key(|e| (e.address, e.size));
            let mut keep: Vec<Entry> = Vec::new();
            for e in found {
                match keep.last_mut() {
                    Some(last) if last.address == e.address => *last = e,
                    _ => keep.push(e),
                }
            }
            // `.dynsym` only fills addresses `.symtab` does not name.
            keep.retain(|e| !seen_addresses.contains(&e.address));
            seen_addresses.extend(keep.iter().map(|e| e.address));
            table.entries.extend(keep);
        }
        table.entries.sort_by_key(|e| e.address);
        table
    }

    /// Number of function symbols.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the file had no usable function symbols.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The function symbol that starts at or contains `addr`.
    ///
    /// A symbol contains the addresses `[address, address + size)`; a symbol of size 0 is
    /// taken to extend to the next symbol, as LLVM's symbolizer does.
    pub fn lookup(&self, addr: u64) -> Option<Symbol<'_>> {
        let after = self.entries.partition_point(|e| e.address <= addr);
        let entry = self.entries.get(after.checked_sub(1)?)?;
        if entry.size != 0 && addr - entry.address >= entry.size {
            return None;
        }
        Some(Symbol {
            address: entry.address,
            size: entry.size,
            name: self.name_of(entry),
        })
    }

    /// Demangled name of the function symbol that starts at (or contains) `addr`: Rust legacy
    /// and v0 via rustc-demangle, C++ Itanium via cpp_demangle, plain names as they are. A
    /// symbol whose name is empty (a broken or hostile string table) names nothing.
    pub fn name_at(&self, addr: u64) -> Option<&str> {
        self.lookup(addr).map(|s| s.name).filter(|n| !n.is_empty())
    }

    fn name_of<'a>(&'a self, entry: &'a Entry) -> &'a str {
        entry.name.get_or_init(|| {
            let raw = self
                .strtabs
                .get(entry.strtab)
                .and_then(|t| t.get(usize::try_from(entry.name_offset).ok()?..))
                .unwrap_or_default();
            let raw = &raw[..raw.len().min(MAX_NAME_LEN)];
            let raw = raw.split(|&b| b == 0).next().unwrap_or_default();
            demangle(&String::from_utf8_lossy(raw)).into_boxed_str()
        })
    }
}

/// Demangles one symbol name the way [`SymbolTable`] does (see the module documentation);
/// returns the name unchanged when it is not mangled or does not demangle.
pub fn demangle(raw: &str) -> String {
    // Demanglers are complex parsers fed hostile input; should one panic anyway, the raw
    // name is still a correct answer.
    std::panic::catch_unwind(|| try_demangle(raw))
        .ok()
        .flatten()
        .unwrap_or_else(|| raw.to_owned())
}

fn try_demangle(raw: &str) -> Option<String> {
    let mut out = Limited::default();
    let v0 = raw.starts_with("_R");
    if v0 || raw.starts_with("_ZN") {
        if let Ok(d) = rustc_demangle::try_demangle(raw) {
            // `{:#}` drops v0 crate disambiguators (LLVM prints none) and would drop legacy
            // hashes (which we keep, see the module documentation).
            let r = if v0 {
                write!(out, "{d:#}")
            } else {
                write!(out, "{d}")
            };
            return r.ok().map(|()| out.text);
        }
    }
    if raw.starts_with("_Z") {
        let parsed = cpp_demangle::Symbol::new(raw.as_bytes())
            .ok()
            .and_then(|symbol| {
                symbol
                    .structured_demangle(&mut out, &cpp_demangle::DemangleOptions::default())
                    .ok()
            });
        let text = match parsed {
            Some(()) => out.text,
            None => param_decls::demangle(raw)?,
        };
        return Some(close_angle_brackets(&text));
    }
    None
}

/// Drops the space cpp_demangle puts between consecutive closing template brackets
/// (`vector<basic_string<char> >`), as LLVM's demangler stopped doing in LLVM 17: llvm-xray 19
/// prints `vector<basic_string<char>>` (llvm-xray 14 still printed `> >`).
fn close_angle_brackets(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    for (i, c) in text.char_indices() {
        let between_closers =
            c == ' ' && i > 0 && bytes[i - 1] == b'>' && bytes.get(i + 1) == Some(&b'>');
        if !between_closers {
            out.push(c);
        }
    }
    out
}

mod limited;
mod param_decls;
use limited::Limited;
pub use limited::MAX_DEMANGLED_LEN;

#[cfg(test)]
mod tests;
