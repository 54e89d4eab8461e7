//! Where exceptions are caught. Every C++ catch handler first calls the runtime's
//! `__cxa_begin_catch`; a probe there (an `event_kind::CATCH` event) tells, with the stack
//! pointer, which traced frames the exception left, at the moment it is caught. Without it
//! those frames are still closed, by the next traced event of the thread (see
//! `session::thread`), only later.
use object::{Object as _, ObjectSymbol as _};
use std::path::Path;
use xray_object::elf::ElfImage;

/// The function every catch handler calls first.
pub const CATCH_FUNCTION: &str = "__cxa_begin_catch";

/// `endbr64`. A probe on it is single-stepped by the kernel (platform.md: ~50 µs a hit); the
/// instruction after it leaves the stack pointer as it was at the call.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// The file offset to probe in `path` for catches: where [`CATCH_FUNCTION`] is defined (past
/// its `endbr64`); `None` if the object does not define it or cannot be read.
pub fn catch_point(path: &Path) -> Option<u64> {
    let image = ElfImage::open(path).ok()?;
    let file = image.parse().ok()?;
    let address = file
        .dynamic_symbols()
        .chain(file.symbols())
        .find(|s| s.is_definition() && s.address() != 0 && s.name() == Ok(CATCH_FUNCTION))?
        .address();
    let offset = image.file_offset(address)?;
    let start = usize::try_from(offset).ok()?;
    let first = image.data.get(start..start.checked_add(4)?)?;
    Some(if first == ENDBR64 { offset + 4 } else { offset })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_catch_function_of_the_cxx_runtime() {
        // Debian's libstdc++ defines it (the tests need clang-19 and libstdc++ anyway).
        let lib = Path::new("/usr/lib/x86_64-linux-gnu/libstdc++.so.6");
        let offset = catch_point(lib).expect("libstdc++ defines __cxa_begin_catch");
        let image = ElfImage::open(lib).unwrap();
        let at = offset as usize;
        assert_ne!(
            image.data[at..at + 4],
            ENDBR64,
            "the probe must not sit on endbr64"
        );
        // libc has no C++ runtime.
        assert_eq!(
            catch_point(Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6")),
            None
        );
    }
}
