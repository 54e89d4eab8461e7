//! The symbolizer against independent references: for every function id of the C++ and Rust
//! fixtures, the name `llvm-xray extract --symbolize` (LLVM 19) gives and the declaration
//! file:line `llvm-symbolizer --verbose` gives ("Function start line"); the same answers when
//! the DWARF has moved to a separate file (debug link, `.build-id/` tree); symbol-table names,
//! then `object+0xaddress`, without DWARF; separate debug files of another build refused; and
//! the inlining chain at custom-event sleds inlined into instrumented functions.
use fdr_analysis::symbolize::{NameSource, ObjectSymbols, Symbolizer};
use profiler_common::SledKind;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tests::fixtures::symbolize::{
    fixture_line, inlined_events_fixture, llvm_symbolize, split_debug, unescape_rust_legacy,
};
use tests::{cpp_fixture, extract_sleds, rust_fixture, scratch_dir};
use xray_object::elf::ElfImage;

/// Function id → (address, name) as llvm-xray 19 extracts them.
fn reference_names(bin: &Path) -> BTreeMap<u32, (u64, String)> {
    extract_sleds(19, bin)
        .into_iter()
        .map(|s| (s.id, (s.function, unescape_rust_legacy(&s.function_name))))
        .collect()
}

fn load(bin: &Path, roots: &[PathBuf]) -> ObjectSymbols {
    ObjectSymbols::load(bin, roots).unwrap_or_else(|e| panic!("{}: {e:#}", bin.display()))
}

/// Names of every id equal llvm-xray's; declarations equal llvm-symbolizer's.
fn check_against_llvm(bin: &Path, reference_bin: &Path, object: &ObjectSymbols) {
    let want = reference_names(reference_bin);
    assert!(
        want.len() >= 10,
        "{}: {} functions",
        bin.display(),
        want.len()
    );
    assert_eq!(object.function_count(), want.len());
    for (&id, (address, name)) in &want {
        let got = object.function(id);
        assert_eq!(
            got.address,
            *address,
            "address of {id} in {}",
            bin.display()
        );
        assert_eq!(&got.name, name, "name of {id} in {}", bin.display());
        let frames = llvm_symbolize(reference_bin, *address);
        let outer = frames.last().expect("llvm-symbolizer frame");
        if outer.start_line == 0 {
            // No DWARF describes it (compiler-made shims such as `__rust_alloc`): the name
            // comes from the symbol table, and there is no location.
            assert_eq!(got.source, NameSource::SymbolTable, "{name}");
            assert_eq!(got.location, None, "{name}");
            continue;
        }
        assert_eq!(got.source, NameSource::Dwarf, "{name}");
        let loc = got
            .location
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: no location"));
        assert_eq!(
            (loc.file.as_str(), loc.line),
            (outer.start_file.as_str(), outer.start_line),
            "declaration of {name} in {}",
            bin.display()
        );
        assert!(loc.line > 0, "{name}: line 0");
    }
}

fn build_id(bin: &Path) -> String {
    ElfImage::open(bin)
        .unwrap()
        .build_id()
        .expect("fixture has a build-id")
}

#[test]
fn cpp_names_and_locations_match_llvm() {
    let bin = cpp_fixture();
    check_against_llvm(&bin, &bin, &load(&bin, &[]));
}

#[test]
fn rust_names_and_locations_match_llvm() {
    let bin = rust_fixture();
    check_against_llvm(&bin, &bin, &load(&bin, &[]));
}

#[test]
fn debug_link_and_build_id_directory_give_the_same_answers() {
    for bin in [cpp_fixture(), rust_fixture()] {
        let dir = scratch_dir("split-debug");
        let split = split_debug(&bin, dir.path(), &build_id(&bin));
        let linked = load(&split.linked, &[]);
        assert_eq!(
            linked.debug_file.as_deref(),
            Some(split.debug_file.as_path())
        );
        check_against_llvm(&split.linked, &bin, &linked);
        let by_id = load(&split.unlinked, std::slice::from_ref(&split.root));
        assert!(by_id
            .debug_file
            .as_ref()
            .is_some_and(|p| p.starts_with(&split.root)));
        check_against_llvm(&split.unlinked, &bin, &by_id);
    }
}

#[test]
fn without_dwarf_names_come_from_symbol_tables_then_addresses() {
    let bin = cpp_fixture();
    let dir = scratch_dir("no-dwarf");
    let split = split_debug(&bin, dir.path(), &build_id(&bin));
    let want = reference_names(&bin);
    // DWARF gone, .symtab kept: the same names, from the symbol table, no location.
    let unlinked = load(&split.unlinked, &[]);
    assert!(unlinked.debug_file.is_none());
    for (&id, (_, name)) in &want {
        let f = unlinked.function(id);
        assert_eq!((&f.name, f.source), (name, NameSource::SymbolTable));
        assert!(f.location.is_none());
    }
    // .symtab gone too: `object+0xaddress` for what .dynsym does not name.
    let bare = load(&split.bare, &[]);
    let name = split
        .bare
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    for (&id, (address, _)) in &want {
        let f = bare.function(id);
        if f.source == NameSource::Address {
            assert_eq!(f.name, format!("{name}+{address:#x}"));
        }
    }
    assert!(
        want.keys()
            .any(|&id| bare.function(id).source == NameSource::Address),
        "a stripped binary leaves some function unnamed"
    );
    // An id outside the map.
    assert_eq!(bare.function(999_999).name, "#999999");
}

#[test]
fn debug_files_of_another_build_are_refused() {
    let cpp = cpp_fixture();
    let dir = scratch_dir("wrong-debug");
    let split = split_debug(&cpp, dir.path(), &build_id(&cpp));
    // Put the Rust fixture's debug file where the C++ binary's debug link points.
    let rust = rust_fixture();
    let other = scratch_dir("wrong-debug-rs");
    let rust_split = split_debug(&rust, other.path(), &build_id(&rust));
    std::fs::copy(&rust_split.debug_file, &split.debug_file).unwrap();
    let object = load(&split.linked, &[]);
    assert!(object.debug_file.is_none(), "a foreign debug file was used");
    assert_eq!(
        object.refused_debug_files.len(),
        1,
        "{:?}",
        object.refused_debug_files
    );
    assert!(object.refused_debug_files[0].contains("build-id"));
    // And the build-id recorded by a session is checked against the binary.
    let symbolizer = Symbolizer::new(vec![]);
    let err = symbolizer
        .object(&cpp, Some(&build_id(&rust)))
        .err()
        .expect("a binary with another build-id is refused");
    assert!(
        err.to_string().contains("has changed since the recording"),
        "{err}"
    );
    assert!(symbolizer.object(&cpp, Some(&build_id(&cpp))).is_ok());
}

#[test]
fn inlined_custom_event_sites_name_the_inlined_function_and_its_caller() {
    let bin = inlined_events_fixture();
    let object = load(&bin, &[]);
    let want = reference_names(&bin);
    let id_of = |name: &str| {
        *want
            .iter()
            .find(|(_, (_, n))| n == name)
            .unwrap_or_else(|| panic!("{name} not in the map"))
            .0
    };
    let (source, event_line) = fixture_line("inlined_events.cpp", "// EVENT-NOTE");
    let source = source.display().to_string();
    for (function, markers) in [
        ("ie_note", &["// CALL-NOTE"][..]),
        ("ie_twice", &["// CALL-TWICE-A", "// CALL-TWICE-B"][..]),
    ] {
        let sites = object.event_sites(id_of(function), SledKind::CustomEvent);
        assert_eq!(sites.len(), markers.len(), "{function}: {sites:?}");
        for (site, marker) in sites.iter().zip(markers) {
            let names: Vec<&str> = site.frames.iter().map(|f| f.function.as_str()).collect();
            assert_eq!(names, ["note(char const*, long)", function], "{site:?}");
            let inner = site.frames[0].location.as_ref().unwrap();
            assert_eq!(
                (inner.file.as_str(), inner.line),
                (source.as_str(), event_line)
            );
            let call = site.frames[1].location.as_ref().unwrap();
            assert_eq!(call.line, fixture_line("inlined_events.cpp", marker).1);
            // The reference: llvm-symbolizer's inline chain at the sled.
            let reference = llvm_symbolize(&bin, site.address);
            let theirs: Vec<(&str, u32)> = reference
                .iter()
                .map(|f| (f.function.as_str(), f.line))
                .collect();
            let ours: Vec<(&str, u32)> = site
                .frames
                .iter()
                .map(|f| (f.function.as_str(), f.location.as_ref().unwrap().line))
                .collect();
            assert_eq!(ours, theirs);
        }
    }
}

#[test]
fn rust_legacy_escapes_are_undone_like_rustc_demangle() {
    assert_eq!(
        unescape_rust_legacy("core::ptr::drop_in_place$LT$std..rt..lang_start$LT$$LP$$RP$$GT$..$u7b$$u7b$closure$u7d$$u7d$$GT$::h1234"),
        "core::ptr::drop_in_place<std::rt::lang_start<()>::{{closure}}>::h1234"
    );
    assert_eq!(
        xray_object::symbols::demangle(
            "_ZN4core3ptr85drop_in_place$LT$std..rt..lang_start$LT$$LP$$RP$$GT$..$u7b$$u7b$closure$u7d$$u7d$$GT$17h0123456789abcdefE"
        ),
        unescape_rust_legacy(
            "core::ptr::drop_in_place$LT$std..rt..lang_start$LT$$LP$$RP$$GT$..$u7b$$u7b$closure$u7d$$u7d$$GT$::h0123456789abcdef"
        )
    );
}
