//! Where a function is declared in the source: `DW_AT_decl_file` and `DW_AT_decl_line` of its
//! DWARF entry (following `DW_AT_specification` and `DW_AT_abstract_origin` to the declaration
//! that has them), which is what `llvm-symbolizer --verbose` calls the function's start line.
//!
//! The line table is no help here: at an XRay entry sled, the first instruction of a function,
//! compilers put line 0 (code before the prologue belongs to no statement).
use super::debuginfo::DwarfReader;
use super::location::SourceLocation;
use gimli::{AttributeValue, Reader as _, UnitOffset};

/// Specification and abstract-origin links followed at most (a hostile file could loop them).
const MAX_LINKS: usize = 8;

/// The declaration of the function whose entry (`die`, from addr2line's frame) covers `address`.
pub fn decl_location(
    ctx: &addr2line::Context<DwarfReader>,
    address: u64,
    die: UnitOffset<usize>,
) -> Option<SourceLocation> {
    let unit = ctx.find_dwarf_and_unit(address).skip_all_loads()?;
    let mut offset = die;
    for _ in 0..MAX_LINKS {
        let entry = unit.entry(offset).ok()?;
        let line = entry
            .attr_value(gimli::DW_AT_decl_line)
            .and_then(|v| v.udata_value());
        let file = match entry.attr_value(gimli::DW_AT_decl_file) {
            Some(AttributeValue::FileIndex(index)) => Some(index),
            Some(v) => v.udata_value(),
            None => None,
        };
        if let (Some(line), Some(file)) = (line, file) {
            return Some(SourceLocation {
                file: file_name(unit, file)?,
                line: u32::try_from(line).ok()?,
                column: entry
                    .attr_value(gimli::DW_AT_decl_column)
                    .and_then(|v| v.udata_value())
                    .and_then(|c| u32::try_from(c).ok())
                    .unwrap_or(0),
            });
        }
        // Only links within the unit are followed; others are rare (LTO) and left unnamed.
        offset = [gimli::DW_AT_specification, gimli::DW_AT_abstract_origin]
            .into_iter()
            .find_map(|at| match entry.attr_value(at) {
                Some(AttributeValue::UnitRef(o)) => Some(o),
                _ => None,
            })?;
    }
    None
}

/// The path of file `index` of the unit's line program, made absolute with the unit's
/// compilation directory as addr2line does for line locations.
fn file_name(unit: gimli::UnitRef<'_, DwarfReader>, index: u64) -> Option<String> {
    let header = unit.line_program.as_ref()?.header();
    let file = header.file(index)?;
    let text = |v: AttributeValue<DwarfReader>| -> Option<String> {
        Some(
            unit.attr_string(v)
                .ok()?
                .to_string_lossy()
                .ok()?
                .into_owned(),
        )
    };
    let mut path = match &unit.comp_dir {
        Some(dir) => dir.to_string_lossy().ok()?.into_owned(),
        None => String::new(),
    };
    // Directory 0 is the compilation directory itself.
    if file.directory_index() != 0 {
        if let Some(dir) = file.directory(header).and_then(text) {
            push(&mut path, &dir);
        }
    }
    push(&mut path, &text(file.path_name())?);
    Some(path)
}

fn push(path: &mut String, part: &str) {
    if part.starts_with('/') {
        *path = part.to_owned();
    } else {
        if !path.is_empty() && !path.ends_with('/') {
            path.push('/');
        }
        path.push_str(part);
    }
}
