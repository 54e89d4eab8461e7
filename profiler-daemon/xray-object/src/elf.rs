//! Loading and validating the ELF file of a traced program.
//!
//! The daemon runs as root and reads whatever file the user points it at, so every file is
//! treated as hostile: sizes are bounded before anything is allocated, all header fields are
//! checked before they are used, and every offset computation is checked. The parsing itself
//! goes through the `object` crate's low-level ELF API, which bounds-checks every access; this
//! module adds the policy (which files are acceptable at all) and the few questions the rest of
//! the daemon asks about the file (where does an address live in the file, what is its build id).

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt};
use std::path::{Path, PathBuf};

use object::elf;
use object::read::elf::{
    ElfFile64, FileHeader, NoteIterator, ProgramHeader, SectionHeader, SectionTable,
};
use object::LittleEndian;

/// The largest file [`ElfImage::open`] accepts. The whole file is read into memory, so the limit
/// bounds what a hostile path (a huge sparse file, say) can make the daemon allocate.
pub const MAX_FILE_SIZE: u64 = 4 << 30;

/// Whether [`open_regular_file`] follows a symbolic link at the path's last component.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Follow {
    /// As any open does (`/proc/PID/map_files/...` are links of the kernel's to follow).
    Links,
    /// A link there is refused (`O_NOFOLLOW`): for paths found in directories other users
    /// may write, where a link could be swapped in at any moment.
    NoLinks,
}

/// Opens `path` for reading if it is a regular file, deciding on the descriptor, never on the
/// path: the path is opened `O_PATH` (no device is opened, no FIFO waited for, whatever it
/// names), that descriptor's type checked (`fstat`), then the same file opened for reading
/// through it (`/proc/self/fd/N`, `O_NONBLOCK`). A file swapped in at the path between the two
/// opens is not the one opened.
pub fn open_regular_file(path: &Path, follow: Follow) -> Result<File, ElfError> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    let io = |source| ElfError::Io {
        path: path.to_path_buf(),
        source,
    };
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
    let flags = libc::O_PATH
        | libc::O_CLOEXEC
        | match follow {
            Follow::Links => 0,
            Follow::NoLinks => libc::O_NOFOLLOW,
        };
    // SAFETY: a valid NUL-terminated path; the descriptor returned is owned from here on.
    let raw = unsafe { libc::open(c.as_ptr(), flags) };
    if raw < 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor of ours.
    let handle = File::from(unsafe { OwnedFd::from_raw_fd(raw) });
    let checked = handle.metadata().map_err(io)?;
    if !checked.is_file() {
        // A symlink (with `NoLinks`) is refused here too: the descriptor is the link's own.
        return Err(ElfError::NotRegularFile {
            path: path.to_path_buf(),
        });
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
        .map_err(io)?;
    let opened = file.metadata().map_err(io)?;
    if !opened.is_file() || (opened.dev(), opened.ino()) != (checked.dev(), checked.ino()) {
        return Err(ElfError::NotRegularFile {
            path: path.to_path_buf(),
        });
    }
    Ok(file)
}

/// The ELF file header type of every file this module accepts (64-bit, little-endian).
pub type FileHeader64 = elf::FileHeader64<LittleEndian>;

/// The section table type of every file this module accepts.
pub type Sections<'a> = SectionTable<'a, FileHeader64, &'a [u8]>;

/// Why an ELF file was refused. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// The file could not be opened, inspected or read.
    #[error("{}: cannot read", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The path names a directory, device, FIFO or socket.
    #[error("{}: not a regular file", path.display())]
    NotRegularFile {
        /// The file.
        path: PathBuf,
    },
    /// The file is larger than [`MAX_FILE_SIZE`].
    #[error("{}: file is larger than the {} MiB limit", path.display(), MAX_FILE_SIZE >> 20)]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The file does not start with the ELF magic number.
    #[error("{}: not an ELF file", path.display())]
    NotElf {
        /// The file.
        path: PathBuf,
    },
    /// The file is a 32-bit ELF file.
    #[error("{}: 32-bit ELF files are not supported (only 64-bit x86_64 and aarch64)", path.display())]
    Not64Bit {
        /// The file.
        path: PathBuf,
    },
    /// The file is a big-endian ELF file.
    #[error("{}: big-endian ELF files are not supported (only little-endian x86_64 and aarch64)", path.display())]
    BigEndian {
        /// The file.
        path: PathBuf,
    },
    /// The file is for a machine other than x86_64 or aarch64.
    #[error("{}: unsupported ELF machine {machine} (only x86_64 and aarch64)", path.display())]
    UnsupportedMachine {
        /// The file.
        path: PathBuf,
        /// The raw `e_machine` value.
        machine: u16,
    },
    /// A header, table or offset in the file is inconsistent or points outside the file.
    #[error("{}: malformed ELF file: {reason}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong, in a few words.
        reason: String,
    },
}

/// The instruction sets the tracer knows the XRay sled layouts of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Machine {
    /// `EM_X86_64`.
    X86_64,
    /// `EM_AARCH64`.
    Aarch64,
}

/// One `PT_LOAD` program header: a piece of the file mapped at a link-time address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    /// Link-time virtual address of the first byte (`p_vaddr`).
    pub vaddr: u64,
    /// Bytes the segment occupies in memory (`p_memsz`).
    pub memsz: u64,
    /// File offset of the first byte (`p_offset`).
    pub offset: u64,
    /// Bytes the segment takes from the file (`p_filesz`); the rest of `memsz` is zero-filled.
    pub filesz: u64,
    /// `PF_R`/`PF_W`/`PF_X` bits (`p_flags`).
    pub flags: u32,
}

impl LoadSegment {
    /// Whether the segment is mapped executable: only there can code, and so sleds, live.
    pub fn is_executable(&self) -> bool {
        self.flags & elf::PF_X != 0
    }

    /// File offset of `vaddr`, if `vaddr` lies in the file-backed part of the segment.
    ///
    /// The zero-filled tail (`filesz..memsz`) has no file offset, and uprobes are attached by
    /// file offset, so it does not count.
    pub fn file_offset(&self, vaddr: u64) -> Option<u64> {
        let delta = vaddr.checked_sub(self.vaddr)?;
        if delta >= self.filesz {
            return None;
        }
        self.offset.checked_add(delta)
    }
}

/// An ELF file read into memory, known to be a 64-bit little-endian x86_64 or aarch64 ELF file
/// whose program and section header tables lie inside the file.
///
/// The fields are public so that tests can build images from bytes; every method re-checks
/// what it relies on, so an image built by hand with bad data yields errors, not panics.
#[derive(Clone, Debug)]
pub struct ElfImage {
    /// The path the file was read from, used in error messages.
    pub path: PathBuf,
    /// The whole file.
    pub data: Vec<u8>,
}

impl ElfImage {
    /// Reads and validates the file at `path`.
    ///
    /// Refuses a missing file, anything that is not a regular file, files larger than
    /// [`MAX_FILE_SIZE`], and anything that is not a 64-bit little-endian x86_64 or aarch64 ELF
    /// file with in-bounds program and section header tables.
    pub fn open(path: &Path) -> Result<ElfImage, ElfError> {
        let io = |source| ElfError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = open_regular_file(path, Follow::Links)?;
        let meta = file.metadata().map_err(io)?;
        if meta.len() > MAX_FILE_SIZE {
            return Err(ElfError::TooLarge {
                path: path.to_path_buf(),
            });
        }
        // The magic number first: of a file that is not ELF (a path in a hostile manifest may
        // name `/etc/shadow`) no more than these bytes is read, and none is ever shown.
        let mut data = Vec::new();
        (&file)
            .take(elf::ELFMAG.len() as u64)
            .read_to_end(&mut data)
            .map_err(io)?;
        if data[..] != elf::ELFMAG[..] {
            return Err(ElfError::NotElf {
                path: path.to_path_buf(),
            });
        }
        let expected = usize::try_from(meta.len()).map_err(|_| ElfError::TooLarge {
            path: path.to_path_buf(),
        })?;
        // try_reserve: a failed allocation becomes an error instead of aborting the daemon.
        data.try_reserve_exact(expected)
            .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::OutOfMemory, e)))?;
        // The file may grow while we read it; `take` keeps that bounded too.
        file.take(MAX_FILE_SIZE + 1)
            .read_to_end(&mut data)
            .map_err(io)?;
        if data.len() as u64 > MAX_FILE_SIZE {
            return Err(ElfError::TooLarge {
                path: path.to_path_buf(),
            });
        }
        ElfImage::from_bytes(path.to_path_buf(), data)
    }

    /// Validates `data` as [`ElfImage::open`] does, without touching the file system.
    /// `path` is only used in error messages.
    pub fn from_bytes(path: PathBuf, data: Vec<u8>) -> Result<ElfImage, ElfError> {
        if data.len() as u64 > MAX_FILE_SIZE {
            return Err(ElfError::TooLarge { path });
        }
        let image = ElfImage { path, data };
        image.header()?;
        image.load_segments()?;
        image.sections()?;
        Ok(image)
    }

    fn malformed(&self, reason: impl Into<String>) -> ElfError {
        ElfError::Malformed {
            path: self.path.clone(),
            reason: reason.into(),
        }
    }

    /// The ELF file header, after checking the identification bytes and the machine.
    pub fn header(&self) -> Result<&FileHeader64, ElfError> {
        let path = || self.path.clone();
        let data = &self.data[..];
        if data.get(..4) != Some(&elf::ELFMAG[..]) {
            return Err(ElfError::NotElf { path: path() });
        }
        // e_ident is 16 bytes: magic, class, data encoding, version, ABI, padding.
        let (Some(&class), Some(&encoding)) = (data.get(4), data.get(5)) else {
            return Err(self.malformed("truncated ELF header"));
        };
        match class {
            elf::ELFCLASS64 => {}
            elf::ELFCLASS32 => return Err(ElfError::Not64Bit { path: path() }),
            other => return Err(self.malformed(format!("invalid ELF class {other}"))),
        }
        match encoding {
            elf::ELFDATA2LSB => {}
            elf::ELFDATA2MSB => return Err(ElfError::BigEndian { path: path() }),
            other => return Err(self.malformed(format!("invalid ELF data encoding {other}"))),
        }
        let header = FileHeader64::parse(data).map_err(|_| {
            if data.len() < std::mem::size_of::<FileHeader64>() {
                self.malformed("truncated ELF header")
            } else {
                self.malformed("unsupported ELF header version")
            }
        })?;
        let machine = header.e_machine(LittleEndian);
        if machine_of(machine).is_none() {
            return Err(ElfError::UnsupportedMachine {
                path: path(),
                machine,
            });
        }
        Ok(header)
    }

    /// File offset of the entry point (`e_entry`), where a process that runs the executable
    /// starts after its dynamic loader; `None` for a file without one (a shared library).
    pub fn entry_file_offset(&self) -> Option<u64> {
        let entry = self.header().ok()?.e_entry(LittleEndian);
        if entry == 0 {
            return None;
        }
        self.file_offset(entry)
    }

    /// The instruction set of the file (checked when the image was made).
    pub fn machine(&self) -> Result<Machine, ElfError> {
        let header = self.header()?;
        machine_of(header.e_machine(LittleEndian)).ok_or_else(|| {
            // Unreachable after header() succeeded; kept as an error rather than a panic.
            self.malformed("unsupported machine")
        })
    }

    /// The ELF file type (`ET_EXEC`, `ET_DYN`, `ET_REL`, ...).
    pub fn file_type(&self) -> Result<u16, ElfError> {
        Ok(self.header()?.e_type(LittleEndian))
    }

    /// Parses the file with the `object` crate's high-level API.
    ///
    /// This also parses the symbol tables and relocation sections, so it fails on files whose
    /// symbol tables are broken even when what the caller wants is intact; the modules of this
    /// crate use [`ElfImage::sections`] and [`ElfImage::load_segments`] instead.
    pub fn parse(&self) -> Result<ElfFile64<'_, LittleEndian>, ElfError> {
        self.header()?;
        ElfFile64::parse(&self.data[..]).map_err(|e| self.malformed(e.to_string()))
    }

    /// The section header table, with its string table. Empty when the file has no section
    /// headers (a stripped-to-the-bone file is still a valid executable).
    pub fn sections(&self) -> Result<Sections<'_>, ElfError> {
        let header = self.header()?;
        header
            .sections(LittleEndian, &self.data[..])
            .map_err(|e| self.malformed(e.to_string()))
    }

    /// All `PT_LOAD` program headers, in file order.
    ///
    /// Fails when a segment's file range runs past the end of the file or its address range
    /// wraps around: such a file cannot be loaded, and it would make offset arithmetic lie.
    pub fn load_segments(&self) -> Result<Vec<LoadSegment>, ElfError> {
        let header = self.header()?;
        let data = &self.data[..];
        let phdrs = header
            .program_headers(LittleEndian, data)
            .map_err(|e| self.malformed(e.to_string()))?;
        let mut out = Vec::new();
        for (i, ph) in phdrs.iter().enumerate() {
            if ph.p_type(LittleEndian) != elf::PT_LOAD {
                continue;
            }
            let seg = LoadSegment {
                vaddr: ph.p_vaddr(LittleEndian),
                memsz: ph.p_memsz(LittleEndian),
                offset: ph.p_offset(LittleEndian),
                filesz: ph.p_filesz(LittleEndian),
                flags: ph.p_flags(LittleEndian),
            };
            let file_end = seg.offset.checked_add(seg.filesz);
            if file_end.is_none_or(|end| end > data.len() as u64) {
                return Err(self.malformed(format!(
                    "PT_LOAD program header {i} (offset {:#x}, size {:#x}) extends past the end of the file",
                    seg.offset, seg.filesz
                )));
            }
            if seg.vaddr.checked_add(seg.memsz.max(seg.filesz)).is_none() {
                return Err(self.malformed(format!(
                    "PT_LOAD program header {i} (address {:#x}, size {:#x}) wraps around the address space",
                    seg.vaddr, seg.memsz
                )));
            }
            out.push(seg);
        }
        Ok(out)
    }

    /// The `PT_LOAD` segment whose file-backed part contains `vaddr` (the first one, should a
    /// hostile file have overlapping segments).
    pub fn load_segment_of(&self, vaddr: u64) -> Option<LoadSegment> {
        self.load_segments()
            .ok()?
            .into_iter()
            .find(|seg| seg.file_offset(vaddr).is_some())
    }

    /// Maps a link-time virtual address to a file offset through the PT_LOAD header that
    /// contains it: `vaddr - p_vaddr + p_offset`. `None` when no segment's file-backed part
    /// contains the address.
    pub fn file_offset(&self, vaddr: u64) -> Option<u64> {
        self.load_segment_of(vaddr)?.file_offset(vaddr)
    }

    /// GNU build-id as lowercase hex, if present.
    ///
    /// Looks at note sections first and then at `PT_NOTE` segments, so it works for files with
    /// and without section headers. Malformed notes are skipped, not reported: the build id is
    /// informational.
    pub fn build_id(&self) -> Option<String> {
        let header = self.header().ok()?;
        let data = &self.data[..];
        if let Ok(sections) = self.sections() {
            for section in sections.iter() {
                if let Ok(Some(notes)) = section.notes(LittleEndian, data) {
                    if let Some(id) = find_build_id(notes) {
                        return Some(id);
                    }
                }
            }
        }
        let phdrs = header.program_headers(LittleEndian, data).ok()?;
        for ph in phdrs {
            if let Ok(Some(notes)) = ph.notes(LittleEndian, data) {
                if let Some(id) = find_build_id(notes) {
                    return Some(id);
                }
            }
        }
        None
    }
}

fn machine_of(e_machine: u16) -> Option<Machine> {
    match e_machine {
        elf::EM_X86_64 => Some(Machine::X86_64),
        elf::EM_AARCH64 => Some(Machine::Aarch64),
        _ => None,
    }
}

fn find_build_id(mut notes: NoteIterator<'_, FileHeader64>) -> Option<String> {
    while let Ok(Some(note)) = notes.next() {
        if note.name() == elf::ELF_NOTE_GNU
            && note.n_type(LittleEndian) == elf::NT_GNU_BUILD_ID
            && !note.desc().is_empty()
        {
            return Some(note.desc().iter().map(|b| format!("{b:02x}")).collect());
        }
    }
    None
}

/// Builders of small, valid ELF files for the unit tests of this crate.
#[cfg(test)]
pub(crate) mod testelf;

#[cfg(test)]
mod tests;
