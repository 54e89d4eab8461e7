//! Unit tests of `elf`: hostile inputs must give errors, never panics.
use super::testelf::{build, build_id_note, Segment};
use super::*;

fn image(data: Vec<u8>) -> Result<ElfImage, ElfError> {
    ElfImage::from_bytes(PathBuf::from("./x"), data)
}

fn minimal() -> Vec<u8> {
    build(
        elf::ET_EXEC,
        elf::EM_X86_64,
        &[
            Segment {
                vaddr: 0x40_0000,
                offset: 0,
                size: 0x100,
                flags: elf::PF_R,
            },
            Segment {
                vaddr: 0x40_1100,
                offset: 0x100,
                size: 0x80,
                flags: elf::PF_R | elf::PF_X,
            },
        ],
        &[build_id_note(&[0xde, 0xad, 0xbe, 0xef])],
    )
}

#[test]
fn accepts_minimal_file_and_maps_addresses() {
    let img = image(minimal()).unwrap();
    assert_eq!(img.machine().unwrap(), Machine::X86_64);
    assert_eq!(img.file_offset(0x40_0010), Some(0x10));
    assert_eq!(img.file_offset(0x40_1100), Some(0x100));
    assert_eq!(img.file_offset(0x40_117f), Some(0x17f));
    assert_eq!(img.file_offset(0x40_1180), None);
    assert_eq!(img.file_offset(0), None);
    assert_eq!(img.file_offset(u64::MAX), None);
    assert!(img.load_segment_of(0x40_1100).unwrap().is_executable());
    assert_eq!(img.build_id().as_deref(), Some("deadbeef"));
    assert!(img.parse().is_ok());
}

#[test]
fn refuses_non_elf_and_truncated_files() {
    let msg = |r: Result<ElfImage, ElfError>| r.unwrap_err().to_string();
    assert_eq!(msg(image(Vec::new())), "./x: not an ELF file");
    assert_eq!(msg(image(b"#!/bin/sh\n".to_vec())), "./x: not an ELF file");
    assert_eq!(
        msg(image(b"\x7fELF".to_vec())),
        "./x: malformed ELF file: truncated ELF header"
    );
    let full = minimal();
    for len in 0..full.len() {
        // Every prefix must be refused or accepted without panicking; prefixes that cut a
        // table referenced by the header must be refused.
        let r = image(full[..len].to_vec());
        if len < 64 {
            assert!(r.is_err(), "prefix of {len} bytes accepted");
        }
        if let Ok(img) = r {
            let _ = img.build_id();
            let _ = img.file_offset(0x40_1100);
        }
    }
}

#[test]
fn refuses_wrong_class_endianness_and_machine() {
    let mut d = minimal();
    d[4] = elf::ELFCLASS32;
    assert!(matches!(image(d).unwrap_err(), ElfError::Not64Bit { .. }));
    let mut d = minimal();
    d[5] = elf::ELFDATA2MSB;
    assert!(matches!(image(d).unwrap_err(), ElfError::BigEndian { .. }));
    let mut d = minimal();
    d[18..20].copy_from_slice(&elf::EM_RISCV.to_le_bytes());
    assert_eq!(
        image(d).unwrap_err().to_string(),
        format!(
            "./x: unsupported ELF machine {} (only x86_64 and aarch64)",
            elf::EM_RISCV
        )
    );
    let mut d = minimal();
    d[18..20].copy_from_slice(&elf::EM_AARCH64.to_le_bytes());
    assert_eq!(image(d).unwrap().machine().unwrap(), Machine::Aarch64);
}

#[test]
fn refuses_tables_outside_the_file() {
    // e_phoff pointing past the end.
    let mut d = minimal();
    d[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(image(d).unwrap_err(), ElfError::Malformed { .. }));
    // e_shoff pointing past the end.
    let mut d = minimal();
    d[0x28..0x30].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(image(d).unwrap_err(), ElfError::Malformed { .. }));
    // A PT_LOAD whose file range runs past the end of the file (p_filesz of segment 1).
    let mut d = minimal();
    let filesz = 64 + 56 + 32;
    d[filesz..filesz + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let err = image(d).unwrap_err().to_string();
    assert!(err.contains("extends past the end of the file"), "{err}");
    // A PT_LOAD whose address range wraps.
    let mut d = minimal();
    let vaddr = 64 + 56 + 16;
    d[vaddr..vaddr + 8].copy_from_slice(&(u64::MAX - 4).to_le_bytes());
    let err = image(d).unwrap_err().to_string();
    assert!(err.contains("wraps around"), "{err}");
}

#[test]
fn hand_built_images_with_garbage_do_not_panic() {
    let img = ElfImage {
        path: PathBuf::from("./x"),
        data: vec![0x7f, b'E', b'L', b'F', 2, 1, 1],
    };
    assert!(img.header().is_err());
    assert!(img.parse().is_err());
    assert!(img.load_segments().is_err());
    assert_eq!(img.file_offset(0), None);
    assert_eq!(img.build_id(), None);
}

#[test]
fn open_refuses_missing_files_and_directories() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let err = ElfImage::open(&missing).unwrap_err();
    assert!(matches!(err, ElfError::Io { .. }));
    assert!(err.to_string().starts_with(&missing.display().to_string()));
    assert!(matches!(
        ElfImage::open(dir.path()).unwrap_err(),
        ElfError::NotRegularFile { .. }
    ));
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    assert_eq!(
        ElfImage::open(&empty).unwrap_err().to_string(),
        format!("{}: not an ELF file", empty.display())
    );
    let good = dir.path().join("good");
    std::fs::write(&good, minimal()).unwrap();
    assert_eq!(ElfImage::open(&good).unwrap().data, minimal());
}

#[test]
fn open_refuses_fifos_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert!(matches!(
        ElfImage::open(&fifo).unwrap_err(),
        ElfError::NotRegularFile { .. }
    ));
}
