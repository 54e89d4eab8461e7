//! Where exceptions and panics are caught. Every C++ catch handler first calls the runtime's
//! `__cxa_begin_catch`; Rust's `catch_unwind` calls `__rust_panic_cleanup` on the payload it
//! caught. A probe there (an `event_kind::CATCH` event) tells, with the stack pointer, which
//! traced frames the unwinding left, at the moment it is caught. Without it those frames are
//! still closed, by the next traced event of the thread (see `session::thread`), only later.
use object::{Object as _, ObjectSymbol as _};
use std::path::Path;
use xray_object::elf::ElfImage;

/// The C++ runtime function every catch handler calls first.
pub const CXX_CATCH: &str = "__cxa_begin_catch";

/// The end of the (mangled, std-internal) name of the function `catch_unwind` calls on the
/// payload it caught (`_RNv..7___rustc20___rust_panic_cleanup` in v0 mangling).
pub const RUST_CATCH_SUFFIX: &str = "__rust_panic_cleanup";

/// `endbr64`. A probe on it is single-stepped by the kernel (platform.md: ~50 µs a hit); the
/// instruction after it leaves the stack pointer as it was at the call.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// A catch function of an object: its name and the file offset to probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatchPoint {
    /// The symbol, as the object names it.
    pub name: String,
    /// Where to probe: the function's first instruction, past an `endbr64`.
    pub file_offset: u64,
}

fn is_catch_function(name: &str) -> bool {
    name == CXX_CATCH || name.ends_with(RUST_CATCH_SUFFIX)
}

/// The unwinder's functions that start unwinding (libgcc's and LLVM libunwind's names alike):
/// a throw, a rethrow, a forced unwind (thread cancellation). `_Unwind_Resume` is not one: it
/// continues an unwinding that entered through one of these.
pub const THROW_FUNCTIONS: &[&str] = &[
    "_Unwind_RaiseException",
    "_Unwind_Resume_or_Rethrow",
    "_Unwind_ForcedUnwind",
];

/// The catch functions `path` defines (none if it defines none or cannot be read), each once.
pub fn catch_points(path: &Path) -> Vec<CatchPoint> {
    points(path, is_catch_function)
}

/// The throw functions ([`THROW_FUNCTIONS`]) `path` defines, each once.
pub fn throw_points(path: &Path) -> Vec<CatchPoint> {
    points(path, |name| THROW_FUNCTIONS.contains(&name))
}

/// The functions `path` defines whose names `wanted` accepts, each once, at their first
/// instruction past an `endbr64`.
fn points(path: &Path, wanted: impl Fn(&str) -> bool) -> Vec<CatchPoint> {
    let Ok(image) = ElfImage::open(path) else {
        return Vec::new();
    };
    let Ok(file) = image.parse() else {
        return Vec::new();
    };
    let mut points: Vec<CatchPoint> = Vec::new();
    for symbol in file.dynamic_symbols().chain(file.symbols()) {
        let Ok(name) = symbol.name() else { continue };
        if !symbol.is_definition() || symbol.address() == 0 || !wanted(name) {
            continue;
        }
        let Some(offset) = image.file_offset(symbol.address()) else {
            continue;
        };
        let Some(first) = usize::try_from(offset)
            .ok()
            .and_then(|at| image.data.get(at..at.checked_add(4)?))
        else {
            continue;
        };
        let file_offset = if first == ENDBR64 { offset + 4 } else { offset };
        if !points.iter().any(|p| p.file_offset == file_offset) {
            points.push(CatchPoint {
                name: name.to_owned(),
                file_offset,
            });
        }
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_catch_function_of_the_cxx_runtime() {
        // Debian's libstdc++ defines it (the tests need clang-19 and libstdc++ anyway).
        let lib = Path::new("/usr/lib/x86_64-linux-gnu/libstdc++.so.6");
        let points = catch_points(lib);
        assert_eq!(points.len(), 1, "{points:?}");
        assert_eq!(points[0].name, CXX_CATCH);
        let image = ElfImage::open(lib).unwrap();
        let at = points[0].file_offset as usize;
        assert_ne!(
            image.data[at..at + 4],
            ENDBR64,
            "the probe must not sit on endbr64"
        );
        // libc has no C++ runtime.
        assert_eq!(
            catch_points(Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6")),
            []
        );
    }

    #[test]
    fn finds_the_throw_functions_of_the_unwinder() {
        // Debian's libgcc_s defines all three (libstdc++ calls them).
        let lib = Path::new("/usr/lib/x86_64-linux-gnu/libgcc_s.so.1");
        let mut names: Vec<String> = throw_points(lib).into_iter().map(|p| p.name).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "_Unwind_ForcedUnwind",
                "_Unwind_RaiseException",
                "_Unwind_Resume_or_Rethrow"
            ]
        );
        assert_eq!(
            throw_points(Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6")),
            []
        );
    }

    #[test]
    fn recognises_the_rust_catch_function_by_its_mangled_name() {
        assert!(is_catch_function(
            "_RNvCseulmdZsCeCG_7___rustc20___rust_panic_cleanup"
        ));
        assert!(is_catch_function("__rust_panic_cleanup"));
        assert!(!is_catch_function(
            "_RNvNvNtCsi4IsKQVxMg0_3std9panicking12catch_unwind7cleanup"
        ));
        assert!(!is_catch_function("__cxa_end_catch"));
    }
}
