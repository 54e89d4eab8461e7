//! The ELF objects a running process has mapped: `/proc/PID/maps` read into one entry per
//! file, each reachable through `/proc/PID/map_files`.
//!
//! A `map_files` link opens the very file the mapping was made from, even if it was deleted or
//! replaced on disk since, or lives in another mount namespace (a container); a uprobe placed
//! through it lands on that inode. Reading `map_files` needs CAP_SYS_ADMIN, which a tracer has;
//! `/proc/PID/root/PATH` (right for containers, wrong for deleted files) is the fallback.
use anyhow::{Context as _, Result};
use object::read::elf::ElfFile64;
use object::read::ReadCache;
use object::{LittleEndian, Object as _};
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;

/// A file identity: device and inode numbers as `stat` gives them through a map_files link.
pub type FileId = (u64, u64);

/// A file as `/proc/PID/maps` names it: `major:minor` and inode as the kernel prints them
/// (enough to tell a mapping already looked at without a system call).
pub type MapsKey = (String, u64);

/// One file mapped by a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedObject {
    /// The path as `/proc/PID/maps` shows it, without the kernel's ` (deleted)` suffix.
    pub path: String,
    /// The file was deleted or replaced on disk after it was mapped (`path` names another file
    /// or none).
    pub deleted: bool,
    /// Where the object's first byte (file offset 0) is mapped; the lowest mapping's start
    /// minus its offset when no mapping starts at offset 0.
    pub load_address: u64,
    /// A path that opens the mapped file itself (see the module comment).
    pub open_path: PathBuf,
    /// Device and inode of the mapped file.
    pub file_id: FileId,
    /// How `/proc/PID/maps` names the file.
    pub maps_key: MapsKey,
}

/// One line of `/proc/PID/maps` that maps a file.
#[derive(Debug, PartialEq, Eq)]
struct MapLine<'a> {
    start: u64,
    end: u64,
    offset: u64,
    /// `major:minor` and inode as the kernel prints them: groups a file's mappings.
    dev_inode: (&'a str, u64),
    path: &'a str,
}

/// One line of `/proc/PID/maps`, anonymous memory included.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// `rwxp` as the kernel prints them.
    pub perms: String,
    pub offset: u64,
    /// `major:minor` (hex) and inode as the kernel prints them; 0 for anonymous memory.
    pub dev: String,
    pub inode: u64,
    /// The file's path, `[stack]` and the like, or empty.
    pub path: String,
}

impl Mapping {
    /// Whether its memory may be executed.
    pub fn executable(&self) -> bool {
        self.perms.contains('x')
    }

    /// Its file's device number, as `stat` gives it.
    pub fn device(&self) -> Option<u64> {
        let (major, minor) = self.dev.split_once(':')?;
        Some(libc::makedev(
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        ))
    }

    /// Whether it maps the file `id` (device and inode).
    pub fn of_file(&self, id: FileId) -> bool {
        self.inode == id.1 && self.device() == Some(id.0)
    }
}

/// Every line of process `pid`'s `/proc/PID/maps`, in address order.
pub fn mappings(pid: u32) -> Result<Vec<Mapping>> {
    let maps_path = format!("/proc/{pid}/maps");
    let maps =
        std::fs::read_to_string(&maps_path).with_context(|| format!("reading {maps_path}"))?;
    Ok(maps
        .lines()
        .filter_map(|line| {
            let f = fields(line)?;
            Some(Mapping {
                start: f.start,
                end: f.end,
                perms: f.perms.to_owned(),
                offset: f.offset,
                dev: f.dev.to_owned(),
                inode: f.inode,
                path: f.path.to_owned(),
            })
        })
        .collect())
}

/// The fields of one line of `/proc/PID/maps`.
struct Fields<'a> {
    start: u64,
    end: u64,
    perms: &'a str,
    offset: u64,
    dev: &'a str,
    inode: u64,
    path: &'a str,
}

fn fields(line: &str) -> Option<Fields<'_>> {
    // start-end perms offset dev inode path; the path is the rest (it may contain spaces).
    let mut rest = line;
    let mut field = || {
        let trimmed = rest.trim_start();
        let end = trimmed.find(' ').unwrap_or(trimmed.len());
        let (f, r) = trimmed.split_at(end);
        rest = r;
        f
    };
    let range = field();
    let perms = field();
    let offset = u64::from_str_radix(field(), 16).ok()?;
    let dev = field();
    let inode: u64 = field().parse().ok()?;
    let path = rest.trim_start();
    let (start, end) = range.split_once('-')?;
    Some(Fields {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        perms,
        offset,
        dev,
        inode,
        path,
    })
}

fn parse_line(line: &str) -> Option<MapLine<'_>> {
    let Fields {
        start,
        end,
        offset,
        dev,
        inode,
        path,
        ..
    } = fields(line)?;
    // Anonymous memory, [heap], [stack], [vdso] and memfd/anon-inode files have no path
    // starting with '/', or inode 0.
    if inode == 0 || !path.starts_with('/') || end <= start {
        return None;
    }
    Some(MapLine {
        start,
        end,
        offset,
        dev_inode: (dev, inode),
        path,
    })
}

/// Every file `pid` has mapped, in the order of their lowest address.
pub fn mapped_objects(pid: u32) -> Result<Vec<MappedObject>> {
    mapped_objects_except(pid, &HashSet::new())
}

/// [`mapped_objects`] without the files `known` names (they are not even looked at: a
/// periodic rescan only pays for what is new).
pub fn mapped_objects_except(pid: u32, known: &HashSet<MapsKey>) -> Result<Vec<MappedObject>> {
    let maps_path = format!("/proc/{pid}/maps");
    let maps =
        std::fs::read_to_string(&maps_path).with_context(|| format!("reading {maps_path}"))?;
    Ok(objects_of(pid, &maps, known))
}

fn objects_of(pid: u32, maps: &str, known: &HashSet<MapsKey>) -> Vec<MappedObject> {
    let mut order = Vec::new();
    let mut by_file: HashMap<(&str, u64), Vec<MapLine<'_>>> = HashMap::new();
    for line in maps.lines().filter_map(parse_line) {
        let (dev, inode) = line.dev_inode;
        if !known.is_empty() && known.contains(&(dev.to_owned(), inode)) {
            continue;
        }
        let lines = by_file.entry(line.dev_inode).or_default();
        if lines.is_empty() {
            order.push(line.dev_inode);
        }
        lines.push(line);
    }
    let mut out = Vec::new();
    for key in order {
        let lines = &by_file[&key];
        let first = &lines[0];
        let load_address = lines
            .iter()
            .find(|l| l.offset == 0)
            .map(|l| l.start)
            .unwrap_or_else(|| first.start.saturating_sub(first.offset));
        let (path, deleted) = match first.path.strip_suffix(" (deleted)") {
            Some(p) => (p, true),
            None => (first.path, false),
        };
        let link = PathBuf::from(format!(
            "/proc/{pid}/map_files/{:x}-{:x}",
            first.start, first.end
        ));
        // stat follows the magic link to the mapped file itself.
        let (open_path, meta) = match std::fs::metadata(&link) {
            Ok(meta) => (link, meta),
            Err(_) if !deleted => {
                let rooted = PathBuf::from(format!("/proc/{pid}/root{path}"));
                match std::fs::metadata(&rooted) {
                    Ok(meta) => (rooted, meta),
                    Err(_) => continue,
                }
            }
            Err(_) => continue,
        };
        if !meta.is_file() {
            continue;
        }
        out.push(MappedObject {
            path: path.to_owned(),
            deleted,
            load_address,
            open_path,
            file_id: (meta.dev(), meta.ino()),
            maps_key: (key.0.to_owned(), key.1),
        });
    }
    out
}

/// Device and inode of the file `path` names (following links, `/proc` magic ones included).
pub fn file_id(path: &std::path::Path) -> Option<FileId> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.dev(), meta.ino()))
}

/// Which file `address` of process `pid` is mapped from, and at what offset in it: the file
/// (device and inode) and the offset. `None` when it is not in a file's mapping (or the
/// process is gone).
pub fn file_offset_of(pid: u32, address: u64) -> Option<(FileId, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let line = maps
        .lines()
        .filter_map(parse_line)
        .find(|l| l.start <= address && address < l.end)?;
    let link = format!("/proc/{pid}/map_files/{:x}-{:x}", line.start, line.end);
    let id = file_id(std::path::Path::new(&link))?;
    Some((id, address - line.start + line.offset))
}

/// Device and inode of `/proc/PID/exe`: which mapped object is the executable.
pub fn executable_id(pid: u32) -> Option<FileId> {
    file_id(std::path::Path::new(&format!("/proc/{pid}/exe")))
}

/// Whether the ELF file at `path` has an `xray_instr_map` section. Reads only the headers and
/// the section name table, so screening a process's libraries stays cheap; anything that is
/// not a readable 64-bit little-endian ELF file has none.
pub fn has_instrumentation_map(path: &std::path::Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt as _;
    // Look before opening (opening a device can have side effects), then open without
    // blocking and check again on the descriptor, which cannot be swapped under us.
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return false;
    }
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    else {
        return false;
    };
    match file.metadata() {
        Ok(meta) if meta.is_file() && meta.len() <= xray_object::elf::MAX_FILE_SIZE => {}
        _ => return false,
    }
    let cache = ReadCache::new(file);
    let Ok(elf) = ElfFile64::<LittleEndian, _>::parse(&cache) else {
        return false;
    };
    elf.section_by_name(xray_object::instrmap::SECTION_NAME)
        .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234                       /tmp/x/app
55d0c0a01000-55d0c0a02000 r-xp 00001000 fd:01 1234                       /tmp/x/app
7f00aa000000-7f00aa001000 r--p 00000000 fd:01 99                         /tmp/x/lib with space.so (deleted)
7f00aa001000-7f00aa003000 r-xp 00001000 fd:01 99                         /tmp/x/lib with space.so (deleted)
7f00ab000000-7f00ab021000 rw-p 00000000 00:00 0                          [heap]
7f00ac000000-7f00ac001000 r-xp 00002000 fd:01 77                         /tmp/x/partial.so
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn parses_file_mappings_only() {
        let lines: Vec<MapLine<'_>> = MAPS.lines().filter_map(parse_line).collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[2].path, "/tmp/x/lib with space.so (deleted)");
        assert_eq!(lines[2].dev_inode, ("fd:01", 99));
        assert_eq!(lines[4].offset, 0x2000);
        assert_eq!(parse_line("garbage"), None);
        assert_eq!(parse_line("1-0 r-xp 0 fd:01 5 /x"), None);
    }

    #[test]
    fn every_line_is_a_mapping_with_its_file_s_device() {
        let all: Vec<Fields<'_>> = MAPS.lines().filter_map(fields).collect();
        assert_eq!(all.len(), 7);
        assert_eq!(
            (all[4].inode, all[4].path, all[4].perms),
            (0, "[heap]", "rw-p")
        );
        let ours = mappings(std::process::id()).expect("read our own maps");
        let exe = file_id(&std::env::current_exe().unwrap()).unwrap();
        assert!(
            ours.iter().any(|m| m.executable() && m.of_file(exe)),
            "{ours:?}"
        );
        assert!(ours.iter().any(|m| m.path == "[stack]" && !m.executable()));
        let m = Mapping {
            dev: "fd:01".into(),
            ..ours[0].clone()
        };
        assert_eq!(m.device(), Some(libc::makedev(0xfd, 0x01)));
        assert_eq!(
            Mapping {
                dev: "x".into(),
                ..m
            }
            .device(),
            None
        );
    }

    #[test]
    fn an_address_of_our_code_is_in_our_executable_at_its_file_offset() {
        let me = std::process::id();
        let address = parses_file_mappings_only as fn() as usize as u64;
        let (id, offset) = file_offset_of(me, address).expect("our own code is file-mapped");
        assert_eq!(Some(id), executable_id(me));
        // The same bytes in the file at that offset as in memory.
        let file = std::fs::read("/proc/self/exe").expect("read our executable");
        let at = usize::try_from(offset).expect("offset");
        // SAFETY: 16 bytes of our own mapped code.
        let memory = unsafe { std::slice::from_raw_parts(address as *const u8, 16) };
        assert_eq!(&file[at..at + 16], memory);
        assert_eq!(file_offset_of(me, 8), None);
    }

    #[test]
    fn our_own_process_maps_our_executable() {
        let me = std::process::id();
        let objects = mapped_objects(me).expect("read our own maps");
        let exe = executable_id(me).expect("stat /proc/self/exe");
        let ours = objects
            .iter()
            .find(|o| o.file_id == exe)
            .expect("the executable is among the mapped objects");
        assert!(ours.load_address > 0);
        assert!(std::fs::metadata(&ours.open_path).is_ok());
        // Unit-test binaries are not instrumented.
        assert!(!has_instrumentation_map(&ours.open_path));
    }

    #[test]
    fn load_address_without_an_offset_zero_mapping() {
        // Nothing opens in a pid that cannot exist, so nothing is returned; the arithmetic is
        // checked on the parsed lines.
        assert!(objects_of(1 << 23, MAPS, &HashSet::new()).is_empty());
        let l = parse_line(MAPS.lines().nth(5).unwrap()).unwrap();
        assert_eq!(l.start.saturating_sub(l.offset), 0x7f00abffe000);
    }
}
