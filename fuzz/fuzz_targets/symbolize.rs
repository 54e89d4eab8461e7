//! Any bytes as an instrumented object: reading its symbols (instrumentation map, ELF symbol
//! tables, DWARF through addr2line) and naming its functions, their source lines, inlining
//! chains and event sites never panics, whatever the tables say.
#![no_main]

use std::path::PathBuf;

use fdr_analysis::symbolize::ObjectSymbols;
use libfuzzer_sys::fuzz_target;
use profiler_common::SledKind;
use xray_object::elf::ElfImage;
use xray_object::symbols::SymbolTable;

fuzz_target!(|data: &[u8]| {
    // A path in a directory that does not exist: no separate debug file is ever found.
    let path = PathBuf::from("/nonexistent-fuzz-dir/object");
    let Ok(image) = ElfImage::from_bytes(path, data.to_vec()) else {
        return;
    };
    let table = SymbolTable::from_elf(&image);
    let Ok(object) = ObjectSymbols::from_image(image, &[]) else {
        return;
    };
    let n = object.function_count() as u32;
    // The first functions, the last, and ids outside the map.
    for id in (0..n.min(32) + 2).chain(n.saturating_sub(4)..n.saturating_add(2)) {
        let info = object.function(id);
        assert_eq!(info.id, id);
        assert!(!info.name.is_empty());
        let _ = table.name_at(info.address);
        let _ = object.frames(info.address);
        let _ = object.event_sites(id, SledKind::CustomEvent);
        let _ = object.event_sites(id, SledKind::TypedEvent);
    }
});
