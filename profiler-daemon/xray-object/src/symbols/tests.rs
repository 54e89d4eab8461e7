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

/// Clang's `Tn` template-parameter declarations (nlohmann/json's `create<T, enable_if<...> =
/// 0>`): read as llvm-cxxfilt 19 prints them (the expected texts are its output).
#[test]
fn template_parameter_declarations_demangle_as_llvm_prints_them() {
    assert_eq!(
        demangle("_ZN8nlohmann16json_abi_v3_11_26detail12out_of_range6createIDnTnNSt9enable_ifIXsr21is_basic_json_contextIT_EE5valueEiE4typeELi0EEES2_iRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEES5_"),
        "nlohmann::json_abi_v3_11_2::detail::out_of_range nlohmann::json_abi_v3_11_2::detail::out_of_range::create<std::nullptr_t, 0>(int, std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char>> const&, std::nullptr_t)"
    );
    // Two declarations, a negative unsigned and a bool literal.
    assert_eq!(
        demangle("_Z1fIiTniLin3ETnbLb1EEvv"),
        "void f<int, -3, true>()"
    );
    // `Tn` in a source name is a name; a non-literal argument stays mangled.
    assert_eq!(demangle("_Z4aTnbv"), "aTnb()");
    assert_eq!(demangle("_Z1fITniXadL_Z1gvEEEvv"), "_Z1fITniXadL_Z1gvEEEvv");
}

/// A hostile name full of `Tn`s and literals costs a bounded number of parses (64) and one
/// scan, and stays as it is.
#[test]
fn template_parameter_declarations_are_bounded() {
    for name in [
        format!("_Z1fI{}Ev", "TnLi0ELi1E".repeat(2_000)),
        format!("_Z1fI{}Li0EEv", "Tn".repeat(30_000)),
    ] {
        assert_eq!(demangle(&name), name);
    }
}
