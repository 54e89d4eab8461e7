//! Unit tests of `symbols`: hostile inputs must give errors, never panics.
use super::*;
use crate::elf::testelf::{build, Section, Segment};
use std::path::PathBuf;

#[test]
fn demangles_like_llvm_xray() {
    assert_eq!(demangle("_Z3fibi"), "fib(int)");
    assert_eq!(demangle("_ZNK2ns1K1mEi"), "ns::K::m(int) const");
    assert_eq!(demangle("main"), "main");
    assert_eq!(
        demangle("_Z5totalRKSt6vectorIS_IiSaIiEESaIS1_EE"),
        "total(std::vector<std::vector<int, std::allocator<int>>, \
         std::allocator<std::vector<int, std::allocator<int>>>> const&)"
    );
    assert_eq!(
        demangle("_ZN1r3fib17hf87c77873f524c04E"),
        "r::fib::hf87c77873f524c04"
    );
    assert_eq!(
        demangle("_ZN1r5inner10W$LT$T$GT$3get17h70e1d8cdf02118a5E"),
        "r::inner::W<T>::get::h70e1d8cdf02118a5"
    );
    assert_eq!(demangle("_RNvCs1234_1r3fib"), "r::fib");
    // Not demanglable: returned as is.
    assert_eq!(demangle("_Z"), "_Z");
    assert_eq!(demangle("_ZZZZ"), "_ZZZZ");
    assert_eq!(demangle("_R"), "_R");
}

#[test]
fn hostile_names_are_bounded() {
    // Deep nesting: the demanglers' recursion limits refuse it; we return it raw.
    let deep = format!("_Z1f{}", "P".repeat(100_000)) + "i";
    assert_eq!(demangle(&deep), deep);
    // A name whose demangling would be huge falls back to the raw name.
    let long = format!("_ZN{}E", "9abcdefghi".repeat(4000));
    assert_eq!(demangle(&long), long);
}

fn symtab(symbols: &[(u64, u64, u8, &str)]) -> (Section, Section) {
    let mut strtab = vec![0u8];
    let mut data = vec![0u8; 24]; // null symbol
    for &(value, size, st_type, name) in symbols {
        let off = strtab.len() as u32;
        strtab.extend_from_slice(name.as_bytes());
        strtab.push(0);
        data.extend_from_slice(&off.to_le_bytes());
        data.push((elf::STB_GLOBAL << 4) | st_type);
        data.push(0);
        data.extend_from_slice(&1u16.to_le_bytes()); // section 1 (.strtab), any non-zero
        data.extend_from_slice(&value.to_le_bytes());
        data.extend_from_slice(&size.to_le_bytes());
    }
    (
        Section {
            name: ".strtab",
            sh_type: elf::SHT_STRTAB,
            flags: 0,
            addr: 0,
            data: strtab,
            link: 0,
            entsize: 0,
        },
        Section {
            name: ".symtab",
            sh_type: elf::SHT_SYMTAB,
            flags: 0,
            addr: 0,
            data,
            link: 1,
            entsize: 24,
        },
    )
}

fn image(sections: Vec<Section>) -> ElfImage {
    let seg = Segment {
        vaddr: 0x1000,
        offset: 0,
        size: 0x40,
        flags: elf::PF_R | elf::PF_X,
    };
    let data = build(elf::ET_EXEC, elf::EM_X86_64, &[seg], &sections);
    ElfImage::from_bytes(PathBuf::from("./x"), data).unwrap()
}

#[test]
fn looks_up_function_symbols() {
    let (strtab, symtab) = symtab(&[
        (0x1000, 0x10, elf::STT_FUNC, "_Z3fibi"),
        (0x1010, 0x10, elf::STT_OBJECT, "data"),
        (0x1020, 0, elf::STT_FUNC, "sizeless"),
        (0x1040, 0x10, elf::STT_FUNC, "small"),
        (0x1040, 0x20, elf::STT_FUNC, "big"),
        (0x1040, 0x20, elf::STT_FUNC, "big_last"),
    ]);
    let table = SymbolTable::from_elf(&image(vec![strtab, symtab]));
    assert_eq!(table.len(), 3);
    assert_eq!(table.name_at(0x1000), Some("fib(int)"));
    assert_eq!(table.name_at(0x100f), Some("fib(int)"));
    assert_eq!(table.name_at(0x1010), None);
    assert_eq!(table.name_at(0x0fff), None);
    assert_eq!(table.name_at(0x103f), Some("sizeless"));
    assert_eq!(table.name_at(0x1040), Some("big_last"));
    assert_eq!(table.name_at(0x1060), None);
    assert_eq!(table.name_at(u64::MAX), None);
    assert_eq!(
        table.lookup(0x1044),
        Some(Symbol {
            address: 0x1040,
            size: 0x20,
            name: "big_last"
        })
    );
}

#[test]
fn broken_tables_give_an_empty_table() {
    let (strtab, mut bad) = symtab(&[(0x1000, 0x10, elf::STT_FUNC, "f")]);
    bad.data.truncate(30); // not a whole number of symbols
    bad.link = 7; // and a dangling string table link
    let table = SymbolTable::from_elf(&image(vec![strtab, bad]));
    assert!(table.name_at(0x1000).is_none_or(|n| n == "f"));
    // Name offsets outside the string table give empty names, not panics; and an empty name
    // is no name (readers then fall back to `object+0xaddress`, not to "").
    let (mut strtab, symtab) = symtab(&[(0x1000, 0x10, elf::STT_FUNC, "f")]);
    strtab.data.truncate(1);
    let table = SymbolTable::from_elf(&image(vec![strtab, symtab]));
    assert_eq!(table.len(), 1);
    assert_eq!(table.name_at(0x1000), None);
    let garbage = ElfImage {
        path: PathBuf::from("./x"),
        data: vec![1, 2, 3],
    };
    assert!(SymbolTable::from_elf(&garbage).is_empty());
}
