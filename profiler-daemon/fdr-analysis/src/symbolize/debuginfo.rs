//! Finding a binary's DWARF: in the file itself, under `<root>/.build-id/xx/yyyy.debug`, or
//! through `.gnu_debuglink` (next to the binary, in its `.debug/` directory, or under
//! `<root>/<binary's directory>/`), the places and order GDB uses.
//!
//! A separate debug file is only used when it provably belongs to the binary: equal build-ids
//! when both have one, else the CRC-32 the debug link names. A mismatching file is reported and
//! skipped, never used: it would name the wrong functions.
use object::{Object as _, ObjectSection as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use xray_object::elf::ElfImage;
use xray_object::symbols::SymbolTable;

/// The gimli reader over owned section data: the DWARF outlives the file image it came from.
pub type DwarfReader = gimli::EndianArcSlice<gimli::LittleEndian>;

/// Where distributions install separate debug files.
pub const SYSTEM_DEBUG_ROOT: &str = "/usr/lib/debug";

/// The DWARF found for a binary.
pub struct DebugInfo {
    /// The file it came from (the binary itself, or a separate debug file).
    pub path: PathBuf,
    /// The line and inlining tables, parsed lazily by addr2line.
    pub context: addr2line::Context<DwarfReader>,
    /// The debug file's own symbol table (a stripped binary keeps none), empty when the DWARF
    /// is the binary's own.
    pub symbols: SymbolTable,
}

/// What the search found, and why candidates were refused.
pub struct Found {
    /// The DWARF, if any acceptable file had some.
    pub debug: Option<DebugInfo>,
    /// One line per candidate file that exists but was refused.
    pub refused: Vec<String>,
}

/// Looks for the DWARF of `image`, whose GNU build-id is `build_id`, searching separate debug
/// files under `roots` (normally [`SYSTEM_DEBUG_ROOT`]).
pub fn find(image: &ElfImage, build_id: Option<&str>, roots: &[PathBuf]) -> Found {
    let mut found = Found {
        debug: None,
        refused: Vec::new(),
    };
    if let Some(context) = load_dwarf(image) {
        found.debug = Some(DebugInfo {
            path: image.path.clone(),
            context,
            symbols: SymbolTable::default(),
        });
        return found;
    }
    let mut candidates: Vec<(PathBuf, Option<u32>)> = Vec::new();
    if let Some(id) = build_id.filter(|id| id.len() > 2) {
        for root in roots {
            let file = format!("{}.debug", &id[2..]);
            candidates.push((root.join(".build-id").join(&id[..2]).join(file), None));
        }
    }
    if let Some((name, crc)) = debuglink(image) {
        let dir = image.path.parent().unwrap_or(Path::new("."));
        candidates.push((dir.join(&name), Some(crc)));
        candidates.push((dir.join(".debug").join(&name), Some(crc)));
        if let Ok(abs) = std::path::absolute(dir) {
            for root in roots {
                let rel = abs.strip_prefix("/").unwrap_or(&abs);
                candidates.push((root.join(rel).join(&name), Some(crc)));
            }
        }
    }
    for (path, crc) in candidates {
        // The binary itself can be its own debug link target: it has no DWARF, skip it.
        if !path.is_file() || same_file(&path, &image.path) {
            continue;
        }
        match accept(&path, build_id, crc) {
            Ok(debug) => {
                found.debug = Some(debug);
                return found;
            }
            Err(why) => found.refused.push(format!("{}: {why}", path.display())),
        }
    }
    found
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// Opens a candidate debug file and checks that it belongs to the binary.
fn accept(path: &Path, build_id: Option<&str>, crc: Option<u32>) -> Result<DebugInfo, String> {
    let image = ElfImage::open(path).map_err(|e| e.to_string())?;
    let theirs = image.build_id();
    match (build_id, theirs.as_deref(), crc) {
        (Some(ours), Some(theirs), _) if ours != theirs => {
            return Err(format!(
                "build-id {theirs} is not the binary's ({ours}): a debug file of another build"
            ))
        }
        (Some(_), Some(_), _) => {}
        (_, _, Some(crc)) => {
            let actual = crc32fast::hash(&image.data);
            if actual != crc {
                return Err(format!(
                    "CRC-32 {actual:#010x} is not the {crc:#010x} the debug link names"
                ));
            }
        }
        (_, _, None) => return Err("no build-id to check it against".into()),
    }
    let context = load_dwarf(&image).ok_or("no DWARF in it")?;
    Ok(DebugInfo {
        path: path.to_path_buf(),
        context,
        symbols: SymbolTable::from_elf(&image),
    })
}

/// The `.gnu_debuglink` section: the debug file's name and its CRC-32.
fn debuglink(image: &ElfImage) -> Option<(String, u32)> {
    let file = image.parse().ok()?;
    let data = file.section_by_name(".gnu_debuglink")?.data().ok()?;
    let end = data.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&data[..end]).ok()?;
    // The name must be a plain file name: a path would let a hostile binary point anywhere.
    if name.is_empty() || name.contains('/') || name == ".." {
        return None;
    }
    let crc_at = (end + 1).next_multiple_of(4);
    let crc = u32::from_le_bytes(data.get(crc_at..crc_at + 4)?.try_into().ok()?);
    Some((name.to_owned(), crc))
}

/// Most a compressed DWARF section may claim to grow by when decompressed. Real debug
/// information compresses 3 to 10 times; zlib can reach 1000 times, so without a bound a small
/// hostile file (a "zip bomb") would make the reader allocate gigabytes.
pub const MAX_COMPRESSION_RATIO: u64 = 64;

/// The section's contents, decompressed; `None` when they cannot be read or a compressed
/// section claims more than [`MAX_COMPRESSION_RATIO`] times its size (plus 1 MiB).
fn section_data<'a>(
    section: &impl object::ObjectSection<'a>,
) -> Option<std::borrow::Cow<'a, [u8]>> {
    let range = section.compressed_file_range().ok()?;
    if range.format != object::CompressionFormat::None {
        let limit = range
            .compressed_size
            .saturating_mul(MAX_COMPRESSION_RATIO)
            .saturating_add(1 << 20);
        if range.uncompressed_size > limit {
            return None;
        }
    }
    section.uncompressed_data().ok()
}

/// The DWARF sections of `image`, decompressed and copied out; `None` when it has no
/// `.debug_info` with contents (a stripped file, or `NOBITS` placeholders) or it does not parse.
fn load_dwarf(image: &ElfImage) -> Option<addr2line::Context<DwarfReader>> {
    let file = image.parse().ok()?;
    let info = file.section_by_name(".debug_info")?;
    if section_data(&info)?.is_empty() {
        return None;
    }
    let load = |id: gimli::SectionId| -> Result<DwarfReader, gimli::Error> {
        let data = file
            .section_by_name(id.name())
            .and_then(|s| section_data(&s))
            .unwrap_or_default();
        Ok(gimli::EndianArcSlice::new(
            Arc::from(&*data),
            gimli::LittleEndian,
        ))
    };
    let dwarf = gimli::Dwarf::load(load).ok()?;
    addr2line::Context::from_dwarf(dwarf).ok()
}
