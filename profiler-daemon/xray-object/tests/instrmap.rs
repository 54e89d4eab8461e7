//! The instrumentation-map reader and the symbolizer against llvm-xray.
//!
//! Fixtures are built at test time (clang-19, rustc nightly) into a temporary directory. For
//! every fixture, `InstrMap::from_elf` must agree with `llvm-xray extract` (LLVM 19 and 14) on
//! every entry — function id, sled address, function address, kind, always-instrument flag and
//! version — and `SymbolTable::name_at` must agree with `llvm-xray extract --symbolize` on the
//! name of every function. File offsets are checked by reading the sled bytes they point at.
//!
//! Two llvm-xray limitations shape the tests:
//! * Neither llvm-xray 14 nor 19 reads maps with TYPED_EVENT (kind 5) entries: their loader's
//!   kind table stops at CUSTOM_EVENT and the whole file fails with "Exec format error". For
//!   such binaries llvm-xray reads a copy whose kind-5 bytes are rewritten to 4, and those
//!   entries are expected as `custom-event` there and as `TypedEvent` from us.
//! * clang-19 only emits version-2 (PC-relative) entries. Versions 0 and 1 (absolute addresses)
//!   are covered by rewriting real maps: a non-PIE binary's entries in place, and for a PIE the
//!   compiler's assembly, so that the linker itself emits the `R_X86_64_RELATIVE` relocations;
//!   the fields are then zeroed as lld leaves them (GNU ld also stores the value).
//!
//! Missing tools fail the tests with what to install; nothing is skipped.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use profiler_common::SledKind;
use xray_object::elf::ElfImage;
use xray_object::instrmap::InstrMap;
use xray_object::symbols::SymbolTable;
use xray_reference::{Sled, SledKind as LlvmKind};

const CLANG: &str = "clang++-19";
const INSTALL_LLVM: &str = "apt-get install clang-19 llvm-19 llvm";
const INSTALL_NIGHTLY: &str = "rustup toolchain install nightly";

// ---------------------------------------------------------------------------------------------
// Fixtures

const CPP_SOURCE: &str = r#"
#include <xray/xray_interface.h>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

__attribute__((noinline)) int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
__attribute__((noinline)) int leaf(int x) { asm volatile(""); return x * 3; }
// At -O2 the call becomes a jmp, preceded by a TAIL sled.
__attribute__((noinline)) int tailer(int x) { asm volatile(""); return leaf(x + 1); }
// clang only honours xray_log_args on always-instrumented functions.
[[clang::xray_always_instrument, clang::xray_log_args(1)]] __attribute__((noinline))
int logged(int x) { asm volatile(""); return x + 7; }
__attribute__((noinline)) void emit(const char *s) { __xray_customevent(s, strlen(s)); }
#ifndef NO_TYPED
__attribute__((noinline)) void emit_typed(const char *s) { __xray_typedevent(7, s, strlen(s)); }
#endif
namespace ns {
struct K { __attribute__((noinline)) int m(int y) const { asm volatile(""); return y + 1; } };
template <typename T> __attribute__((noinline)) T twice(T v) { asm volatile(""); return v + v; }
}
namespace { __attribute__((noinline)) int anon(int x) { asm volatile(""); return x ^ 5; } }
__attribute__((noinline)) size_t total(const std::vector<std::string> &v) {
  size_t n = 0;
  for (const auto &s : v) n += s.size();
  return n;
}
extern "C" __attribute__((noinline)) int plain_c(int x) { asm volatile(""); return x - 1; }
// Constructors (C1/C2 aliases at one address), operators, lambdas in std templates.
struct P {
  int v;
  __attribute__((noinline)) explicit P(int x) : v(x) { asm volatile(""); }
  __attribute__((noinline)) bool operator<(const P &o) const { return v < o.v; }
};
__attribute__((noinline)) int sorted_first(std::vector<int> v) {
  std::sort(v.begin(), v.end(), [](int a, int b) { return a > b; });
  return v.empty() ? 0 : v.front();
}

int main(int argc, char **argv) {
  emit("hello");
#ifndef NO_TYPED
  emit_typed("typed");
#endif
  ns::K k;
  std::vector<std::string> v(argv, argv + argc);
  v.push_back(std::string("more"));
  P p1(argc), p2(3);
  std::vector<int> ints{argc, 3, 1, 4};
  printf("%d %d\n", int(p1 < p2), sorted_first(ints));
  printf("%d %zu %d %g\n", fib(argc + 5) + tailer(argc) + logged(argc) + k.m(argc) + anon(argc),
         total(v) + ns::twice<size_t>(argc), plain_c(argc), ns::twice<double>(argc));
  return 0;
}
"#;

const RUST_SOURCE: &str = r#"
#[inline(never)]
fn fib(n: u64) -> u64 { if n < 2 { n } else { fib(n - 1) + fib(n - 2) } }
mod inner {
    pub struct W<T>(pub T);
    impl<T: Copy + Into<u64>> W<T> {
        #[inline(never)]
        pub fn get(&self) -> u64 { self.0.into() * 3 }
    }
    pub trait Speak { fn speak(&self) -> String; }
    impl Speak for W<u8> {
        #[inline(never)]
        fn speak(&self) -> String { format!("w{}", self.0) }
    }
}
use inner::Speak;
#[inline(never)]
fn tail(x: u64) -> u64 { fib(x + 1) }
fn main() {
    let n = std::env::args().count() as u64;
    let a = inner::W(n as u32);
    let b: Box<dyn Speak> = Box::new(inner::W(n as u8));
    let c = (0..n).map(|i| i * 2).sum::<u64>();
    println!("{} {} {} {}", fib(n + 10) + a.get(), b.speak(), c, tail(n));
}
"#;

/// Panics with an installation hint when `program` cannot be run at all.
fn run(program: &str, args: &[&str], hint: &str) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}; install it with `{hint}`"))
}

fn run_ok(program: &str, args: &[&str], hint: &str) -> Output {
    let out = run(program, args, hint);
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}); if the tool is missing install it with `{hint}`\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn s(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

/// Builds the C++ fixture with clang-19 at -O2 with every function instrumented.
fn build_cpp(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let src = dir.join("fixture.cc");
    std::fs::write(&src, CPP_SOURCE).unwrap();
    let out = dir.join(name);
    let mut args = vec!["-O2", "-fxray-instrument", "-fxray-instruction-threshold=1"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[s(&src), "-o", s(&out)]);
    run_ok(CLANG, &args, INSTALL_LLVM);
    out
}

/// Builds the Rust fixture with nightly rustc and `-Zinstrument-xray=always`.
fn build_rust(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let src = dir.join("fixture.rs");
    std::fs::write(&src, RUST_SOURCE).unwrap();
    let out = dir.join(name);
    let mut args = vec![
        "+nightly",
        "-Zinstrument-xray=always",
        "-O",
        "--edition=2021",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[s(&src), "-o", s(&out)]);
    run_ok("rustc", &args, INSTALL_NIGHTLY);
    out
}

// ---------------------------------------------------------------------------------------------
// A minimal, independent ELF section reader for rewriting fixtures (the code under test is not
// used to prepare its own inputs).

fn u16_at(d: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(d[at..at + 2].try_into().unwrap())
}
fn u32_at(d: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(d[at..at + 4].try_into().unwrap())
}
fn u64_at(d: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(d[at..at + 8].try_into().unwrap())
}

/// `(sh_addr, sh_offset, sh_size)` of the section called `name`.
fn find_section(d: &[u8], name: &str) -> (u64, usize, usize) {
    let shoff = u64_at(d, 0x28) as usize;
    let shentsize = u16_at(d, 0x3a) as usize;
    let shnum = u16_at(d, 0x3c) as usize;
    let shstrndx = u16_at(d, 0x3e) as usize;
    let strtab = u64_at(d, shoff + shstrndx * shentsize + 0x18) as usize;
    for i in 0..shnum {
        let h = shoff + i * shentsize;
        let n = strtab + u32_at(d, h) as usize;
        let end = n + d[n..].iter().position(|&b| b == 0).unwrap();
        if &d[n..end] == name.as_bytes() {
            return (
                u64_at(d, h + 0x10),
                u64_at(d, h + 0x18) as usize,
                u64_at(d, h + 0x20) as usize,
            );
        }
    }
    panic!("no section {name}");
}

/// Calls `f(entry_va, entry_bytes)` for every entry of `xray_instr_map`.
fn for_each_entry(d: &mut [u8], mut f: impl FnMut(u64, &mut [u8])) -> usize {
    let (addr, off, size) = find_section(d, "xray_instr_map");
    assert_eq!(size % 32, 0);
    for i in 0..size / 32 {
        f(
            addr + 32 * i as u64,
            &mut d[off + 32 * i..off + 32 * (i + 1)],
        );
    }
    size / 32
}

/// A copy of `bin` in which every kind-5 (typed event) entry says kind 4, for llvm-xray.
fn typed_as_custom(bin: &Path) -> (PathBuf, usize) {
    let mut d = std::fs::read(bin).unwrap();
    let mut n = 0;
    for_each_entry(&mut d, |_, e| {
        if e[16] == 5 {
            e[16] = 4;
            n += 1;
        }
    });
    let out = bin.with_extension("typed-as-custom");
    std::fs::write(&out, d).unwrap();
    (out, n)
}

/// A copy of a non-PIE `bin` with every version-2 entry turned into an absolute one.
fn absolutize(bin: &Path, version: u8) -> PathBuf {
    let mut d = std::fs::read(bin).unwrap();
    for_each_entry(&mut d, |va, e| {
        assert_eq!(e[18], 2, "clang-19 emits version 2");
        let sled = va.wrapping_add(u64_at(e, 0));
        let function = (va + 8).wrapping_add(u64_at(e, 8));
        e[0..8].copy_from_slice(&sled.to_le_bytes());
        e[8..16].copy_from_slice(&function.to_le_bytes());
        e[18] = version;
    });
    let out = bin.with_extension(format!("v{version}"));
    std::fs::write(&out, d).unwrap();
    out
}

/// Rewrites clang's assembly so that the `xray_instr_map` entries are absolute (`.quad sym`)
/// with version 1, as LLVM before version 2 emitted them. Returns the text and the number of
/// entries rewritten.
fn absolutize_asm(asm: &str) -> (String, usize) {
    let mut in_map = false;
    let mut lines: Vec<String> = Vec::new();
    let (mut quads, mut versions) = (0, 0);
    for line in asm.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix(".section") {
            in_map = rest.trim_start().starts_with("xray_instr_map");
        } else if matches!(t, ".text" | ".data" | ".bss") || t.starts_with(".previous") {
            in_map = false;
        }
        let mut new = line.to_owned();
        if in_map {
            if let Some(operand) = t.strip_prefix(".quad") {
                // `.Lxray_sled_N-.LtmpM` and `.Lfunc_beginN-(.LtmpM+8)` become absolute.
                if let Some((symbol, _)) = operand.trim().split_once('-') {
                    new = format!("\t.quad\t{symbol}");
                    quads += 1;
                }
            } else if t.replace(char::is_whitespace, "") == ".zero13" {
                let prev = lines.last_mut().unwrap();
                assert_eq!(prev.trim().replace(char::is_whitespace, ""), ".byte0x02");
                *prev = "\t.byte\t0x01".to_owned();
                versions += 1;
            }
        }
        lines.push(new);
    }
    assert!(
        versions > 0,
        "clang's assembly has no xray_instr_map entries in the known form"
    );
    assert_eq!(
        quads,
        2 * versions,
        "clang's xray_instr_map assembly changed form"
    );
    (lines.join("\n") + "\n", versions)
}

// ---------------------------------------------------------------------------------------------
// llvm-xray extract (through the reference crate, `xray-reference`)

/// `llvm-xray extract --symbolize` of `bin` with LLVM `major` (the reference crate's reader),
/// or its error output.
fn llvm_extract(major: u32, bin: &Path) -> Result<Vec<Sled>, String> {
    xray_reference::try_extract_sleds(major, bin)
}

/// The kind llvm-xray prints for ours (`function-enter`, `tail-exit`, `log-args-enter`, ...).
fn llvm_kind(kind: SledKind) -> LlvmKind {
    match kind {
        SledKind::Entry => LlvmKind::Entry,
        SledKind::Exit => LlvmKind::Exit,
        SledKind::Tail => LlvmKind::Tail,
        SledKind::LogArgsEntry => LlvmKind::LogArgsEntry,
        SledKind::CustomEvent => LlvmKind::CustomEvent,
        SledKind::TypedEvent => LlvmKind::TypedEvent,
    }
}

/// The first bytes of an unpatched x86_64 sled of each kind.
fn sled_prefix(kind: SledKind) -> &'static [u8] {
    match kind {
        SledKind::Entry | SledKind::LogArgsEntry | SledKind::Tail => &[0xeb, 0x09],
        SledKind::Exit => &[0xc3],
        SledKind::CustomEvent => &[0xeb, 0x0f],
        SledKind::TypedEvent => &[0xeb, 0x14],
    }
}

/// rustc-demangle's legacy unescaping (`$LT$` → `<`, `..` → `::`, ...) applied to the
/// Itanium-style name LLVM prints for a legacy Rust symbol; see symbols.rs.
fn unescape_rust_legacy(name: &str) -> String {
    let mut out = String::new();
    for (i, segment) in name.split("::").enumerate() {
        if i > 0 {
            out.push_str("::");
        }
        // A leading `_` only protects a `$` at the start of the segment.
        let mut rest = if segment.starts_with("_$") {
            &segment[1..]
        } else {
            segment
        };
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix("..") {
                out.push_str("::");
                rest = r;
            } else if rest.starts_with('$') {
                let Some(end) = rest[1..].find('$') else {
                    break;
                };
                let escape = &rest[1..=end];
                let text = match escape {
                    "SP" => "@".to_owned(),
                    "BP" => "*".to_owned(),
                    "RF" => "&".to_owned(),
                    "LT" => "<".to_owned(),
                    "GT" => ">".to_owned(),
                    "LP" => "(".to_owned(),
                    "RP" => ")".to_owned(),
                    "C" => ",".to_owned(),
                    e if e.starts_with('u') => {
                        match u32::from_str_radix(&e[1..], 16)
                            .ok()
                            .and_then(char::from_u32)
                        {
                            Some(c) => c.to_string(),
                            None => break,
                        }
                    }
                    _ => break,
                };
                out.push_str(&text);
                rest = &rest[end + 2..];
            } else {
                let next = rest[1..].find(['$', '.']).map_or(rest.len(), |i| i + 1);
                out.push_str(&rest[..next]);
                rest = &rest[next..];
            }
        }
        out.push_str(rest);
    }
    out
}

#[derive(Clone, Copy, PartialEq)]
enum Names {
    /// Our names must equal llvm-xray's.
    Exact,
    /// llvm-xray's names are legacy-Rust Itanium demanglings; compare after unescaping.
    RustLegacy,
}

/// What a comparison covered.
#[derive(Debug, Default)]
struct Covered {
    entries: usize,
    functions: usize,
    kinds: Vec<SledKind>,
    /// llvm-xray could not read the file itself and read a kind-5 → 4 copy.
    typed_patched: usize,
}

/// Checks our reading of `bin` against `llvm-xray extract` of LLVM `major` entry by entry.
fn compare(bin: &Path, major: u32, names: Names) -> Covered {
    let xray = format!("llvm-xray {major}");
    let image = ElfImage::open(bin).unwrap_or_else(|e| panic!("{e}"));
    let map = InstrMap::from_elf(&image).unwrap_or_else(|e| panic!("{e}"));
    // Every sled the compilers emit is where the map says (what the tracer checks first).
    map.check_sleds(&image).unwrap_or_else(|e| panic!("{e}"));
    let symbols = SymbolTable::from_elf(&image);
    let has_typed = map.sleds.iter().any(|s| s.kind == SledKind::TypedEvent);
    let mut covered = Covered::default();
    let llvm = match llvm_extract(major, bin) {
        Ok(l) => l,
        Err(e) if has_typed => {
            let (copy, n) = typed_as_custom(bin);
            covered.typed_patched = n;
            llvm_extract(major, &copy).unwrap_or_else(|e2| {
                panic!(
                    "{xray} extract fails on {bin:?} ({e}) and on its typed-as-custom copy: {e2}"
                )
            })
        }
        Err(e) => panic!("{xray} extract {bin:?} failed: {e}"),
    };
    assert_eq!(
        map.sleds.len(),
        llvm.len(),
        "{bin:?}: entry count vs {xray}"
    );
    for (i, (ours, theirs)) in map.sleds.iter().zip(&llvm).enumerate() {
        let ctx = format!("{bin:?} entry {i} vs {xray}: ours {ours:?}, llvm {theirs:?}");
        assert_eq!(ours.function_id, theirs.id, "{ctx}");
        assert_eq!(ours.address, theirs.address, "{ctx}");
        assert_eq!(ours.function_address, theirs.function, "{ctx}");
        let expected_kind = if covered.typed_patched > 0 && ours.kind == SledKind::TypedEvent {
            LlvmKind::CustomEvent
        } else {
            llvm_kind(ours.kind)
        };
        assert_eq!(expected_kind, theirs.kind, "{ctx}");
        assert_eq!(ours.always_instrument, theirs.always_instrument, "{ctx}");
        assert_eq!(ours.version, theirs.version, "{ctx}");
        // The file offset points at the sled's bytes.
        let at = ours.file_offset as usize;
        let prefix = sled_prefix(ours.kind);
        assert_eq!(
            &image.data[at..at + prefix.len()],
            prefix,
            "{ctx}: bytes at file offset"
        );
        if !covered.kinds.contains(&ours.kind) {
            covered.kinds.push(ours.kind);
        }
    }
    // Functions: contiguous runs, ids 1..=n, names as llvm-xray symbolizes them.
    let mut mismatches = Vec::new();
    for (i, f) in map.functions.iter().enumerate() {
        assert_eq!(f.id as usize, i + 1);
        assert_eq!(map.function(f.id), Some(f));
        assert!(!f.sleds.is_empty());
        for s in &map.sleds[f.sleds.clone()] {
            assert_eq!((s.function_id, s.function_address), (f.id, f.address));
        }
        let theirs = &llvm[f.sleds.start].function_name;
        let mut expected = match names {
            Names::RustLegacy => unescape_rust_legacy(theirs),
            _ => theirs.clone(),
        };
        if major == 14 {
            // LLVM 14's demangler still wrote `vector<basic_string<char> >`; we print what
            // LLVM 19 prints.
            expected = expected.replace("> >", ">>").replace("> >", ">>");
        }
        let ours = symbols.name_at(f.address).unwrap_or("<none>");
        if theirs.is_empty() || ours != expected {
            mismatches.push(format!(
                "  id {} at {:#x}: ours {ours:?}, llvm {theirs:?}",
                f.id, f.address
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{bin:?}: {} of {} function names differ from {xray} --symbolize:\n{}",
        mismatches.len(),
        map.functions.len(),
        mismatches.join("\n")
    );
    covered.entries = map.sleds.len();
    covered.functions = map.functions.len();
    covered
}

fn both(bin: &Path, names: Names) -> [Covered; 2] {
    [compare(bin, 19, names), compare(bin, 14, names)]
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn cpp_pie_matches_llvm_xray() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_cpp(dir.path(), "cpp_pie", &[]);
    let image = ElfImage::open(&bin).unwrap();
    assert_eq!(image.file_type().unwrap(), 3, "PIE is ET_DYN");
    assert!(image.build_id().is_some_and(|id| id.len() >= 16));
    for covered in both(&bin, Names::Exact) {
        let mut kinds = covered.kinds.clone();
        kinds.sort();
        assert_eq!(
            kinds,
            [
                SledKind::Entry,
                SledKind::Exit,
                SledKind::Tail,
                SledKind::LogArgsEntry,
                SledKind::CustomEvent,
                SledKind::TypedEvent
            ],
            "the C++ fixture covers all six kinds"
        );
        // Both llvm-xray versions refuse kind 5 (see the module documentation).
        assert_eq!(covered.typed_patched, 1, "{covered:?}");
        assert!(covered.functions > 10, "{covered:?}");
    }
    // The symbols llvm-xray shows for the fixture's own functions.
    let symbols = SymbolTable::from_elf(&image);
    let map = InstrMap::from_elf(&image).unwrap();
    let names: Vec<&str> = map
        .functions
        .iter()
        .filter_map(|f| symbols.name_at(f.address))
        .collect();
    for expected in [
        "fib(int)",
        "tailer(int)",
        "logged(int)",
        "emit(char const*)",
        "emit_typed(char const*)",
        "ns::K::m(int) const",
        "unsigned long ns::twice<unsigned long>(unsigned long)",
        "(anonymous namespace)::anon(int)",
        "plain_c",
        "main",
    ] {
        assert!(
            names.contains(&expected),
            "{expected:?} not among {names:?}"
        );
    }
}

#[test]
fn cpp_pie_without_typed_events_matches_llvm_xray_unmodified() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_cpp(dir.path(), "cpp_pie_untyped", &["-DNO_TYPED"]);
    for covered in both(&bin, Names::Exact) {
        assert_eq!(covered.typed_patched, 0);
        assert_eq!(covered.kinds.len(), 5, "{covered:?}");
    }
}

#[test]
fn cpp_non_pie_matches_llvm_xray() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_cpp(dir.path(), "cpp_nopie", &["-fno-pie", "-no-pie"]);
    assert_eq!(
        ElfImage::open(&bin).unwrap().file_type().unwrap(),
        2,
        "ET_EXEC"
    );
    for covered in both(&bin, Names::Exact) {
        assert_eq!(covered.kinds.len(), 6, "{covered:?}");
    }
}

#[test]
fn rust_v0_matches_llvm_xray() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_rust(dir.path(), "rust_v0", &[]);
    for covered in both(&bin, Names::Exact) {
        assert!(covered.kinds.contains(&SledKind::Tail), "{covered:?}");
        assert!(covered.functions > 5, "{covered:?}");
    }
    let image = ElfImage::open(&bin).unwrap();
    let symbols = SymbolTable::from_elf(&image);
    let map = InstrMap::from_elf(&image).unwrap();
    let names: Vec<&str> = map
        .functions
        .iter()
        .filter_map(|f| symbols.name_at(f.address))
        .collect();
    for expected in [
        "fixture::fib",
        "fixture::main",
        "<fixture::inner::W<u32>>::get",
    ] {
        assert!(
            names.contains(&expected),
            "{expected:?} not among {names:?}"
        );
    }
}

#[test]
fn rust_legacy_mangling_matches_llvm_xray_after_unescaping() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_rust(
        dir.path(),
        "rust_legacy",
        &["-Csymbol-mangling-version=legacy", "-Zunstable-options"],
    );
    both(&bin, Names::RustLegacy);
    let image = ElfImage::open(&bin).unwrap();
    let symbols = SymbolTable::from_elf(&image);
    let map = InstrMap::from_elf(&image).unwrap();
    let names: Vec<&str> = map
        .functions
        .iter()
        .filter_map(|f| symbols.name_at(f.address))
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("fixture::inner::W<T>::get::h")),
        "{names:?}"
    );
}

#[test]
fn absolute_entries_of_a_non_pie_binary_match_llvm_xray() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_cpp(
        dir.path(),
        "cpp_nopie",
        &["-fno-pie", "-no-pie", "-DNO_TYPED"],
    );
    let original = InstrMap::from_elf(&ElfImage::open(&bin).unwrap()).unwrap();
    for version in [0u8, 1] {
        let copy = absolutize(&bin, version);
        both(&copy, Names::Exact);
        let map = InstrMap::from_elf(&ElfImage::open(&copy).unwrap()).unwrap();
        assert!(map.sleds.iter().all(|s| s.version == version));
        // Same sleds, functions and ids as the PC-relative original.
        assert_eq!(map.functions, original.functions);
        for (a, b) in map.sleds.iter().zip(&original.sleds) {
            assert_eq!(
                (
                    a.address,
                    a.function_address,
                    a.kind,
                    a.function_id,
                    a.file_offset
                ),
                (
                    b.address,
                    b.function_address,
                    b.kind,
                    b.function_id,
                    b.file_offset
                )
            );
        }
    }
}

#[test]
fn absolute_entries_of_a_pie_with_relative_relocations_match_llvm_xray() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("fixture.cc");
    std::fs::write(&src, CPP_SOURCE).unwrap();
    let asm = dir.path().join("fixture.s");
    run_ok(
        CLANG,
        &[
            "-O2",
            "-fxray-instrument",
            "-fxray-instruction-threshold=1",
            "-DNO_TYPED",
            "-S",
            s(&src),
            "-o",
            s(&asm),
        ],
        INSTALL_LLVM,
    );
    let (text, entries) = absolutize_asm(&std::fs::read_to_string(&asm).unwrap());
    let asm_v1 = dir.path().join("fixture_v1.s");
    std::fs::write(&asm_v1, text).unwrap();
    let linked = dir.path().join("cpp_pie_v1");
    // -fxray-instrument links the XRay runtime, which the event sleds call.
    run_ok(
        CLANG,
        &["-fxray-instrument", s(&asm_v1), "-o", s(&linked)],
        INSTALL_LLVM,
    );

    // As linked, GNU ld stores each value in the field as well as in the relocation.
    let as_linked = InstrMap::from_elf(&ElfImage::open(&linked).unwrap()).unwrap();
    assert_eq!(as_linked.sleds.len(), entries);
    assert!(as_linked.sleds.iter().all(|s| s.version == 1));
    both(&linked, Names::Exact);

    // Zero every address field, as lld leaves them: only the relocations know the values now.
    let mut d = std::fs::read(&linked).unwrap();
    for_each_entry(&mut d, |_, e| e[0..16].fill(0));
    let zeroed = dir.path().join("cpp_pie_v1_zeroed");
    std::fs::write(&zeroed, d).unwrap();
    both(&zeroed, Names::Exact);
    let map = InstrMap::from_elf(&ElfImage::open(&zeroed).unwrap()).unwrap();
    assert_eq!(map, as_linked);
}

#[test]
fn corrupted_real_binaries_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_cpp(dir.path(), "cpp_pie", &[]);
    let data = std::fs::read(&bin).unwrap();
    let (_, map_off, map_size) = find_section(&data, "xray_instr_map");
    let shoff = u64_at(&data, 0x28) as usize;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let regions = [
        (0usize, 0x400usize),
        (map_off, map_size),
        (shoff, data.len() - shoff),
    ];
    let probe = |d: Vec<u8>| {
        if let Ok(image) = ElfImage::from_bytes(PathBuf::from("corrupt"), d) {
            let _ = image.build_id();
            let _ = image.file_offset(0x1000);
            let symbols = SymbolTable::from_elf(&image);
            if let Ok(map) = InstrMap::from_elf(&image) {
                for f in map.functions.iter().take(8) {
                    let _ = symbols.name_at(f.address);
                }
            }
        }
    };
    for round in 0..1500 {
        let mut d = data.clone();
        let (start, len) = regions[round % regions.len()];
        for _ in 0..1 + next() % 8 {
            let at = start + (next() as usize) % len;
            d[at] = match next() % 4 {
                0 => 0,
                1 => 0xff,
                _ => next() as u8,
            };
        }
        probe(d);
    }
    for _ in 0..200 {
        let len = (next() as usize) % data.len();
        probe(data[..len].to_vec());
    }
}

#[test]
fn legacy_unescaping_helper_follows_rustc_demangle() {
    assert_eq!(
        unescape_rust_legacy("r::inner::W$LT$T$GT$::get::h70e1d8cdf02118a5"),
        "r::inner::W<T>::get::h70e1d8cdf02118a5"
    );
    assert_eq!(
        unescape_rust_legacy(
            "_$LT$alloc..string..String$u20$as$u20$core..fmt..Display$GT$::fmt::h1"
        ),
        "<alloc::string::String as core::fmt::Display>::fmt::h1"
    );
    assert_eq!(
        unescape_rust_legacy("std::rt::lang_start::_$u7b$$u7b$closure$u7d$$u7d$::h4"),
        "std::rt::lang_start::{{closure}}::h4"
    );
}
