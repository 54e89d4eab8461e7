//! Unit tests of `instrmap`: hostile inputs must give errors, never panics.
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
        if let Ok(image) = ElfImage::from_bytes(PathBuf::from("./x"), base.data[..len].to_vec()) {
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

/// Unpatched x86-64 sleds as clang emits them.
const ENTRY_SLED: [u8; 11] = [0xeb, 0x09, 0x66, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0];
const EXIT_SLED: [u8; 11] = [0xc3, 0x2e, 0x66, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0];
/// `jmp +15` and what the runtime's call sequence would be (not checked here).
const CUSTOM_SLED: [u8; 17] = [
    0xeb, 0x0f, 0x57, 0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

/// A file whose text holds `code` pieces at their addresses (int3 elsewhere) and whose map
/// holds `entries`; `machine` is the ELF machine.
fn with_code(machine: u16, code: &[(u64, &[u8])], entries: &[[u8; 32]]) -> ElfImage {
    let mut text = text_section();
    for (address, bytes) in code {
        let at = (address - TEXT) as usize;
        text.data[at..at + bytes.len()].copy_from_slice(bytes);
    }
    let data = build(
        elf::ET_EXEC,
        machine,
        &segments(),
        &[text, map_section(entries)],
    );
    ElfImage::from_bytes(PathBuf::from("./x"), data).unwrap()
}

fn check(image: &ElfImage) -> Result<(), String> {
    let map = InstrMap::from_elf(image).map_err(|e| e.to_string())?;
    map.check_sleds(image).map_err(|e| e.to_string())
}

#[test]
fn sleds_at_their_bytes_pass_the_check() {
    let image = with_code(
        elf::EM_X86_64,
        &[
            (TEXT, &ENTRY_SLED),
            (TEXT + 0x20, &EXIT_SLED),
            (TEXT + 0x40, &CUSTOM_SLED),
            // Exit sleds keep the function's own return, here `ret 8`, and any split of NOPs.
            (
                TEXT + 0x60,
                &[
                    0xc2, 0x08, 0x00, 0x90, 0x66, 0x90, 0x0f, 0x1f, 0x40, 0x00, 0x90, 0x90, 0x90,
                ],
            ),
        ],
        &[
            rel_entry(0, TEXT, TEXT, 0),
            rel_entry(1, TEXT + 0x20, TEXT, 1),
            rel_entry(2, TEXT + 0x40, TEXT, 4),
            rel_entry(3, TEXT + 0x60, TEXT, 1),
        ],
    );
    assert_eq!(check(&image), Ok(()));
}

#[test]
fn sleds_the_code_does_not_have_are_refused() {
    let code: &[(u64, &[u8])] = &[(TEXT, &ENTRY_SLED), (TEXT + 0x20, &EXIT_SLED)];
    let refused = |entries: &[[u8; 32]]| check(&with_code(elf::EM_X86_64, code, entries));
    // In the middle of the entry sled's NOP: a probe there would split an instruction.
    assert_eq!(
        refused(&[rel_entry(0, TEXT + 3, TEXT, 0)]),
        Err("./x: xray_instr_map entry 0: no Entry sled at 0x1003: the bytes there are not the sled's `jmp +9`".into())
    );
    // Code that is no sled at all (int3 here).
    assert_eq!(
        refused(&[rel_entry(0, TEXT + 0x80, TEXT, 1)]),
        Err("./x: xray_instr_map entry 0: no Exit sled at 0x1080: the bytes there are not the sled's `ret`".into())
    );
    // The right first instruction with the wrong kind.
    assert!(refused(&[rel_entry(0, TEXT + 0x20, TEXT, 0)])
        .unwrap_err()
        .contains("not the sled's `jmp +9`"));
    assert!(refused(&[rel_entry(0, TEXT, TEXT, 5)])
        .unwrap_err()
        .contains("not the event sled's short jump"));
    // `jmp +9` over something other than NOPs.
    let bad_nops = check(&with_code(
        elf::EM_X86_64,
        &[(TEXT, &[0xeb, 0x09, 0x90, 0xc3])],
        &[rel_entry(0, TEXT, TEXT, 0)],
    ));
    assert!(bad_nops.unwrap_err().contains("are not the sled's NOPs"));
    // A sled cut by the end of the segment.
    let cut = check(&with_code(
        elf::EM_X86_64,
        &[(TEXT + 0xf8, &ENTRY_SLED[..8])],
        &[rel_entry(0, TEXT + 0xf8, TEXT, 0)],
    ));
    assert_eq!(
        cut,
        Err("./x: xray_instr_map entry 0: no Entry sled at 0x10f8: the sled runs past the end of its segment".into())
    );
}

#[test]
fn overlapping_sleds_are_refused() {
    let code: &[(u64, &[u8])] = &[(TEXT, &ENTRY_SLED), (TEXT + 0x20, &EXIT_SLED)];
    // The same sled listed twice.
    let twice = check(&with_code(
        elf::EM_X86_64,
        code,
        &[
            rel_entry(0, TEXT, TEXT, 0),
            rel_entry(1, TEXT + 0x20, TEXT, 1),
            rel_entry(2, TEXT, TEXT, 0),
        ],
    ));
    assert_eq!(
        twice,
        Err("./x: xray_instr_map entries 0 and 2 overlap (sleds at 0x1000 and 0x1000)".into())
    );
    // A sled whose bytes start inside another's: an exit sled's `ret` hidden in an entry sled's
    // NOP would also decode, so the overlap itself is what refuses it.
    let mut inner = ENTRY_SLED;
    inner[2..].copy_from_slice(&[0xc3, 0x2e, 0x66, 0x0f, 0x1f, 0x84, 0, 0, 0]);
    let nested = check(&with_code(
        elf::EM_X86_64,
        &[(TEXT, &inner), (TEXT + 11, &[0, 0])],
        &[rel_entry(0, TEXT, TEXT, 1), rel_entry(1, TEXT + 2, TEXT, 1)],
    ));
    assert!(nested.is_err(), "{nested:?}");
}

#[test]
fn aarch64_sleds() {
    let mut sled = vec![0x08, 0x00, 0x00, 0x14];
    for _ in 0..7 {
        sled.extend_from_slice(&0xd503_201fu32.to_le_bytes());
    }
    let ok = with_code(
        elf::EM_AARCH64,
        &[(TEXT, &sled), (TEXT + 0x20, &sled)],
        &[
            rel_entry(0, TEXT, TEXT, 0),
            rel_entry(1, TEXT + 0x20, TEXT, 1),
        ],
    );
    assert_eq!(check(&ok), Ok(()));
    let inside = with_code(
        elf::EM_AARCH64,
        &[(TEXT, &sled)],
        &[rel_entry(0, TEXT + 4, TEXT, 0)],
    );
    assert!(check(&inside)
        .unwrap_err()
        .contains("not the sled's `b #32`"));
}
