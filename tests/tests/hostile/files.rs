//! Hostile input (issue 18, item 5): malformed ELF files given as the binary, and hostile
//! session manifests, each refused with one exact line on stderr and a non-zero exit status,
//! never a panic, a hang or unbounded memory. `arguments` covers the plainer cases (a missing
//! file, text, an ELF file without a map); `xray-fdr`'s `tests/bad_input.rs` the FDR reader.
//!
//! The malformed files are copies of the C++ fixture with one thing changed; where to change
//! it is found with the `object` crate, not with the code under test. Each is given to
//! `list BIN`, `--attach BIN` and `-- BIN`, and named as the binary of a session for `report`,
//! `convert` and `dump --session`.
//!
//! What the readers of a session open is documented in fdr-analysis's `replay::layout`: thread
//! files only inside the session directory and through no symbolic link, object paths only
//! when absolute, and of those only regular files whose ELF magic number is checked before the
//! rest is read; nothing of a refused file is printed, only its path and why.

use std::io::Cursor;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use object::read::elf::{ElfFile64, FileHeader, ProgramHeader, SectionHeader};
use object::LittleEndian as LE;
use tests::{
    cpp_fixture, fdr_profiled, parse_count_lines, private_copy, scratch_dir, Finished, Running,
};
use xray_fdr::{FunctionAction, ThreadWriter, WallClock};

/// Far more than any refusal takes; a hang (a FIFO opened for reading) would run into it.
const TIMEOUT: Duration = Duration::from_secs(60);

fn run(cmd: &mut Command) -> Finished {
    Running::spawn("fdr-profiled", cmd).finish(TIMEOUT)
}

/// The one stderr line of a refused command, after checking the exit status, that nothing
/// panicked and that the launched fixture never ran.
fn error_line(f: &Finished) -> String {
    assert!(
        !f.status.success(),
        "should fail: {}\n{}",
        f.status,
        f.stderr
    );
    assert!(!f.stderr.contains("panicked"), "panicked:\n{}", f.stderr);
    let lines: Vec<&str> = f.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "want one stderr line, got:\n{}", f.stderr);
    assert!(
        parse_count_lines(&f.stdout).is_empty(),
        "the fixture ran:\n{}",
        f.stdout
    );
    lines[0].to_owned()
}

/// `list BIN`, `--attach BIN` and `-- BIN` all refuse `bin` with `fdr-profiled: error: ` and
/// then exactly `expected`.
fn refused_as_binary(bin: &Path, expected: &str) {
    let scratch = scratch_dir("hostile-out");
    let out = scratch.path().join("out");
    let want = format!("fdr-profiled: error: {expected}");
    let mut list = Command::new(fdr_profiled());
    list.arg("list").arg(bin);
    assert_eq!(error_line(&run(&mut list)), want, "list");
    let mut attach = Command::new(fdr_profiled());
    attach
        .arg("--attach")
        .arg(bin)
        .arg("--out")
        .arg(&out)
        .args(["--duration", "1"]);
    assert_eq!(error_line(&run(&mut attach)), want, "--attach");
    let mut launch = Command::new(fdr_profiled());
    launch.arg("--out").arg(&out).arg("--").arg(bin);
    assert_eq!(error_line(&run(&mut launch)), want, "--");
    assert!(!out.exists(), "a refused recording leaves no output");
}

/// A session directory whose manifest names `binary` as the executable of pid 1, with one
/// thread file holding a call of function 1.
fn session_naming(dir: &Path, binary: &Path) -> PathBuf {
    let session = dir.join("session");
    let thread_dir = session.join("app-1");
    std::fs::create_dir_all(&thread_dir).unwrap();
    let mut w = ThreadWriter::new(
        Cursor::new(Vec::new()),
        1,
        1_000_000_000,
        WallClock::default(),
    )
    .unwrap();
    w.function(FunctionAction::Entry, 1, 10, 0).unwrap();
    w.function(FunctionAction::Exit, 1, 20, 0).unwrap();
    std::fs::write(
        thread_dir.join("tid-1.fdr"),
        w.finish().unwrap().0.into_inner(),
    )
    .unwrap();
    let manifest = serde_json::json!({"processes": [{
        "pid": 1,
        "binary": binary.as_os_str().to_str().unwrap(),
        "dir": "app-1",
        "threads": [{"tid": 1, "file": "app-1/tid-1.fdr"}],
    }]});
    std::fs::write(session.join("session.json"), manifest.to_string()).unwrap();
    session
}

/// `report`, `convert` and `dump --session` of `session` all fail with `fdr-profiled: error: `
/// and then exactly `expected`; returns everything they printed.
fn refused_session(session: &Path, expected: &str) -> String {
    let want = format!("fdr-profiled: error: {expected}");
    let mut printed = String::new();
    let mut commands: Vec<Command> = Vec::new();
    let mut report = Command::new(fdr_profiled());
    report.arg("report").arg(session);
    commands.push(report);
    for format in ["chrome", "folded"] {
        let mut convert = Command::new(fdr_profiled());
        convert.args(["convert", "--format", format]).arg(session);
        commands.push(convert);
    }
    for mut cmd in commands {
        let f = run(&mut cmd);
        assert_eq!(error_line(&f), want, "{cmd:?}");
        printed.push_str(&f.stdout);
        printed.push_str(&f.stderr);
    }
    printed
}

// ---------------------------------------------------------------------------------------------
// Malformed ELF files

/// The fixture's bytes and where its map and segments are.
struct Fixture {
    data: Vec<u8>,
    /// `sh_offset`, `sh_addr`, `sh_size` of `xray_instr_map`, and where its section header is.
    map_offset: usize,
    map_addr: u64,
    map_size: u64,
    map_header: usize,
    /// `(index, p_offset, p_filesz)` of each PT_LOAD, in order (index among all program
    /// headers).
    loads: Vec<(usize, u64, u64)>,
}

fn fixture() -> Fixture {
    let data = std::fs::read(cpp_fixture()).unwrap();
    let elf = ElfFile64::<LE>::parse(&data[..]).unwrap();
    let header = elf.elf_header();
    let sections = header.sections(LE, &data[..]).unwrap();
    let (index, map) = sections
        .iter()
        .enumerate()
        .find(|(_, s)| sections.section_name(LE, s) == Ok(b"xray_instr_map".as_slice()))
        .expect("the fixture has an xray_instr_map");
    let loads = header
        .program_headers(LE, &data[..])
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, p)| p.p_type(LE) == object::elf::PT_LOAD)
        .map(|(i, p)| (i, p.p_offset(LE), p.p_filesz(LE)))
        .collect();
    let map_header = header.e_shoff(LE) as usize + index * usize::from(header.e_shentsize(LE));
    Fixture {
        map_offset: map.sh_offset(LE) as usize,
        map_addr: map.sh_addr(LE),
        map_size: map.sh_size(LE),
        map_header,
        loads,
        data,
    }
}

impl Fixture {
    /// A copy of the file changed by `f`, written to `dir/name`.
    fn variant(&self, dir: &Path, name: &str, f: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
        let mut data = self.data.clone();
        f(&mut data);
        let path = dir.join(name);
        std::fs::write(&path, data).unwrap();
        path
    }

    /// The link-time address of entry `i`'s sled (version 2: relative to the field).
    fn sled_address(&self, i: usize) -> u64 {
        let at = self.map_offset + 32 * i;
        let field = u64::from_le_bytes(self.data[at..at + 8].try_into().unwrap());
        (self.map_addr + 32 * i as u64).wrapping_add(field)
    }

    /// Index of the first function-entry entry (kind 0).
    fn first_entry_sled(&self) -> usize {
        (0..self.map_size as usize / 32)
            .find(|&i| self.data[self.map_offset + 32 * i + 16] == 0)
            .unwrap()
    }
}

fn add_to_u64(data: &mut [u8], at: usize, delta: u64) {
    let v = u64::from_le_bytes(data[at..at + 8].try_into().unwrap());
    data[at..at + 8].copy_from_slice(&v.wrapping_add(delta).to_le_bytes());
}

fn set_u64(data: &mut [u8], at: usize, v: u64) {
    data[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// The fixture cut inside its map, and the error it gets (without `fdr-profiled: error: `).
fn truncated(dir: &Path) -> (PathBuf, String) {
    let fx = fixture();
    let cut = fx.map_offset + 40;
    let bin = fx.variant(dir, "truncated", |d| d.truncate(cut));
    // The first PT_LOAD that no longer fits is what is refused.
    let (i, offset, size) = fx
        .loads
        .iter()
        .copied()
        .find(|(_, o, s)| o + s > cut as u64)
        .expect("a segment lies past the cut");
    let path = bin.display();
    let error = format!("{path}: malformed ELF file: PT_LOAD program header {i} (offset {offset:#x}, size {size:#x}) extends past the end of the file");
    (bin, error)
}

#[test]
fn a_truncated_file_is_refused() {
    let dir = scratch_dir("hostile-truncated");
    let (bin, error) = truncated(dir.path());
    refused_as_binary(&bin, &error);
}

#[test]
fn a_map_section_past_the_end_of_the_file_is_refused() {
    let dir = scratch_dir("hostile-section");
    let fx = fixture();
    // sh_size: a whole number of entries, ending past the end of the file.
    let size = ((fx.data.len() - fx.map_offset) as u64 / 32 + 1) * 32;
    let bin = fx.variant(dir.path(), "section-past-end", |d| {
        set_u64(d, fx.map_header + 0x20, size)
    });
    refused_as_binary(
        &bin,
        &format!(
            "{}: xray_instr_map section (offset {:#x}, size {size:#x}) extends past the end of the file",
            bin.display(),
            fx.map_offset
        ),
    );
}

#[test]
fn huge_counts_are_refused_without_allocating() {
    let dir = scratch_dir("hostile-counts");
    let fx = fixture();
    // 2^40 bytes of entries (34 billion): refused before anything is sized by it.
    let huge_map = fx.variant(dir.path(), "huge-map", |d| {
        set_u64(d, fx.map_header + 0x20, 1 << 40)
    });
    refused_as_binary(
        &huge_map,
        &format!(
            "{}: xray_instr_map section (offset {:#x}, size 0x10000000000) extends past the end of the file",
            huge_map.display(),
            fx.map_offset
        ),
    );
    // 65,534 section headers (e_shnum) and program headers (e_phnum; 65,535 would say the
    // count is elsewhere).
    let sections = fx.variant(dir.path(), "huge-shnum", |d| {
        d[0x3c..0x3e].copy_from_slice(&0xfffeu16.to_le_bytes())
    });
    refused_as_binary(
        &sections,
        &format!(
            "{}: malformed ELF file: Invalid ELF section header offset/size/alignment",
            sections.display()
        ),
    );
    let programs = fx.variant(dir.path(), "huge-phnum", |d| {
        d[0x38..0x3a].copy_from_slice(&0xfffeu16.to_le_bytes())
    });
    refused_as_binary(
        &programs,
        &format!(
            "{}: malformed ELF file: Invalid ELF program header size or alignment",
            programs.display()
        ),
    );
}

#[test]
fn overlapping_map_entries_are_refused() {
    let dir = scratch_dir("hostile-overlap");
    let fx = fixture();
    // Entry 1 made a copy of entry 0: PC-relative fields, so 32 less to reach the same sled.
    let bin = fx.variant(dir.path(), "overlap", |d| {
        let e0 = d[fx.map_offset..fx.map_offset + 32].to_vec();
        let e1 = fx.map_offset + 32;
        d[e1..e1 + 32].copy_from_slice(&e0);
        add_to_u64(d, e1, 32u64.wrapping_neg());
        add_to_u64(d, e1 + 8, 32u64.wrapping_neg());
    });
    let sled = fx.sled_address(0);
    refused_as_binary(
        &bin,
        &format!(
            "{}: xray_instr_map entries 0 and 1 overlap (sleds at {sled:#x} and {sled:#x})",
            bin.display()
        ),
    );
}

#[test]
fn sleds_outside_executable_segments_are_refused() {
    let dir = scratch_dir("hostile-segment");
    let fx = fixture();
    // Far outside every segment.
    let outside = fx.variant(dir.path(), "out-of-segment", |d| {
        add_to_u64(d, fx.map_offset, 1 << 40)
    });
    refused_as_binary(
        &outside,
        &format!(
            "{}: xray_instr_map entry 0: sled address {:#x} is not in an executable PT_LOAD segment",
            outside.display(),
            fx.sled_address(0) + (1 << 40)
        ),
    );
    // In the map itself: a read-only, non-executable segment.
    let data = fx.variant(dir.path(), "non-exec", |d| set_u64(d, fx.map_offset, 0));
    refused_as_binary(
        &data,
        &format!(
            "{}: xray_instr_map entry 0: sled address {:#x} is not in an executable PT_LOAD segment",
            data.display(),
            fx.map_addr
        ),
    );
}

#[test]
fn a_sled_in_the_middle_of_an_instruction_is_refused() {
    let dir = scratch_dir("hostile-mid");
    let fx = fixture();
    let i = fx.first_entry_sled();
    // Three bytes into the entry sled: inside its 9-byte NOP.
    let bin = fx.variant(dir.path(), "mid-instruction", |d| {
        add_to_u64(d, fx.map_offset + 32 * i, 3)
    });
    refused_as_binary(
        &bin,
        &format!(
            "{}: xray_instr_map entry {i}: no Entry sled at {:#x}: the bytes there are not the sled's `jmp +9`",
            bin.display(),
            fx.sled_address(i) + 3
        ),
    );
}

#[test]
fn a_fifo_a_device_and_a_directory_are_refused_unopened() {
    let dir = scratch_dir("hostile-special");
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o700) }, 0);
    // Opening the FIFO for reading would block until a writer came: none ever does.
    refused_as_binary(&fifo, &format!("{}: not a regular file", fifo.display()));
    // Reading /dev/zero would never end.
    refused_as_binary(Path::new("/dev/zero"), "/dev/zero: not a regular file");
    let sub = dir.path().join("a-directory");
    std::fs::create_dir(&sub).unwrap();
    refused_as_binary(&sub, &format!("{}: not a regular file", sub.display()));
    // verify and dump are given FDR files: the same refusal.
    for path in [fifo.as_path(), Path::new("/dev/zero")] {
        for sub in ["verify", "dump"] {
            let f = run(Command::new(fdr_profiled()).arg(sub).arg(path));
            assert_eq!(
                error_line(&f),
                format!(
                    "fdr-profiled: error: {}: not a regular file",
                    path.display()
                ),
                "{sub}"
            );
        }
    }
}

#[test]
fn a_session_naming_a_malformed_binary_is_refused() {
    let dir = scratch_dir("hostile-session-elf");
    let fx = fixture();
    let i = fx.first_entry_sled();
    let mid = fx.variant(dir.path(), "mid-instruction", |d| {
        add_to_u64(d, fx.map_offset + 32 * i, 3)
    });
    let session = session_naming(dir.path(), &mid);
    refused_session(
        &session,
        &format!(
            "mid-instruction (pid 1): {}: xray_instr_map entry {i}: no Entry sled at {:#x}: the bytes there are not the sled's `jmp +9`; refused",
            mid.display(),
            fx.sled_address(i) + 3
        ),
    );
    let f = run(Command::new(fdr_profiled())
        .arg("dump")
        .arg("--session")
        .arg(&session)
        .arg(session.join("app-1/tid-1.fdr")));
    assert_eq!(
        error_line(&f),
        format!(
            "fdr-profiled: error: {}: xray_instr_map entry {i}: no Entry sled at {:#x}: the bytes there are not the sled's `jmp +9`",
            mid.display(),
            fx.sled_address(i) + 3
        )
    );
    // A directory as the binary.
    let dir2 = scratch_dir("hostile-session-dir");
    let session = session_naming(dir2.path(), dir2.path());
    let name = dir2
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    refused_session(
        &session,
        &format!(
            "{name} (pid 1): {}: not a regular file; refused",
            dir2.path().display()
        ),
    );
    // A truncated file, a FIFO and a device as the binary.
    let dir3 = scratch_dir("hostile-session-special");
    let (cut, error) = truncated(dir3.path());
    let session = session_naming(&dir3.path().join("s1"), &cut);
    refused_session(&session, &format!("truncated (pid 1): {error}; refused"));
    let fifo = dir3.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o700) }, 0);
    for special in [fifo.as_path(), Path::new("/dev/zero")] {
        let session = session_naming(&dir3.path().join("s2"), special);
        let name = special.file_name().unwrap().to_str().unwrap();
        refused_session(
            &session,
            &format!(
                "{name} (pid 1): {}: not a regular file; refused",
                special.display()
            ),
        );
    }
    // The same session with the fixture itself: a report, as a control.
    let good = private_copy(&cpp_fixture(), dir.path());
    let session = session_naming(&dir.path().join("good"), &good);
    let f = run(Command::new(fdr_profiled()).arg("report").arg(&session));
    assert!(f.status.success(), "{}\n{}", f.status, f.stderr);
}

// ---------------------------------------------------------------------------------------------
// Hostile manifests

/// Lines of /etc/shadow long enough to be recognised if any part of the file were printed.
fn shadow_lines() -> Vec<String> {
    let text = std::fs::read_to_string("/etc/shadow")
        .expect("/etc/shadow is readable: the tests run as root");
    text.lines()
        .map(str::to_owned)
        .filter(|l| l.len() >= 8)
        .collect()
}

#[test]
fn a_manifest_naming_etc_shadow_is_refused_and_nothing_of_it_printed() {
    let dir = scratch_dir("hostile-shadow");
    let secret = shadow_lines();
    assert!(!secret.is_empty(), "/etc/shadow has entries");
    // Absolute, and through `..` from the session directory.
    let through = dir
        .path()
        .join("../".repeat(dir.path().components().count()))
        .join("etc/shadow");
    for (n, binary) in [PathBuf::from("/etc/shadow"), through].iter().enumerate() {
        let session = session_naming(&dir.path().join(format!("s{n}")), binary);
        let printed = refused_session(
            &session,
            &format!(
                "shadow (pid 1): {}: not an ELF file; refused",
                binary.display()
            ),
        );
        let f = run(Command::new(fdr_profiled())
            .arg("dump")
            .arg("--session")
            .arg(&session)
            .arg(session.join("app-1/tid-1.fdr")));
        assert_eq!(
            error_line(&f),
            format!("fdr-profiled: error: {}: not an ELF file", binary.display())
        );
        for line in &secret {
            for field in line.split(':').filter(|f| f.len() >= 8) {
                assert!(
                    !printed.contains(field) && !f.stdout.contains(field),
                    "a field of /etc/shadow was printed"
                );
            }
        }
    }
    // Relative: refused before anything is opened.
    let session = session_naming(&dir.path().join("rel"), Path::new("../../etc/shadow"));
    refused_session(
        &session,
        r#"session.json: pid 1: binary "../../etc/shadow" is not an absolute path; refused"#,
    );
    let f = run(Command::new(fdr_profiled())
        .arg("dump")
        .arg("--session")
        .arg(&session)
        .arg(session.join("app-1/tid-1.fdr")));
    assert_eq!(
        error_line(&f),
        format!(
            r#"fdr-profiled: error: {}: binary "../../etc/shadow" is not an absolute path; refused"#,
            session.join("session.json").display()
        )
    );
}

#[test]
fn a_symlinked_manifest_is_refused() {
    let dir = scratch_dir("hostile-symlink");
    let good = private_copy(&cpp_fixture(), dir.path());
    let session = session_naming(dir.path(), &good);
    let manifest = session.join("session.json");
    let elsewhere = dir.path().join("elsewhere.json");
    std::fs::rename(&manifest, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &manifest).unwrap();
    let expected = format!(
        "{} is a symbolic link; refused (a recorder never writes one)",
        manifest.display()
    );
    refused_session(&session, &expected);
    let f = run(Command::new(fdr_profiled())
        .arg("dump")
        .arg("--session")
        .arg(&session)
        .arg(session.join("app-1/tid-1.fdr")));
    assert_eq!(error_line(&f), format!("fdr-profiled: error: {expected}"));
}

#[test]
fn a_manifest_missing_its_fields_is_an_error_not_an_empty_report() {
    let dir = scratch_dir("hostile-fields");
    let good = private_copy(&cpp_fixture(), dir.path());
    let session = session_naming(dir.path(), &good);
    let manifest = session.join("session.json");
    for (text, problem) in [
        ("{}", "missing field `processes` at line 1 column 2"),
        (
            r#"{"processes": [{"binary": "/bin/true"}]}"#,
            "missing field `pid` at line 1 column 38",
        ),
        (
            r#"{"processes": "#,
            "EOF while parsing a value at line 1 column 14",
        ),
    ] {
        std::fs::write(&manifest, text).unwrap();
        refused_session(
            &session,
            &format!(
                "{} is not a valid session manifest: {problem}",
                manifest.display()
            ),
        );
    }
}

#[test]
fn a_huge_manifest_is_refused_unread() {
    let dir = scratch_dir("hostile-huge");
    let good = private_copy(&cpp_fixture(), dir.path());
    let session = session_naming(dir.path(), &good);
    let manifest = session.join("session.json");
    // 64 MiB + 1 of holes: no disk used, and the reader must not allocate it.
    std::fs::File::create(&manifest)
        .unwrap()
        .set_len((64 << 20) + 1)
        .unwrap();
    refused_session(
        &session,
        &format!(
            "{} is larger than the 64 MiB a manifest may be; refused",
            manifest.display()
        ),
    );
}

// ---------------------------------------------------------------------------------------------
// Hostile FDR files

/// A version 1 file's header and first buffer, then `tail`.
fn fdr_file(version: u16, tail: &[u8]) -> Vec<u8> {
    use xray_fdr::records as r;
    [
        &r::FileHeader::new(version, 1000, 0).encode()[..],
        &r::new_buffer(1),
        &r::wall_clock_time(0, 0),
        &r::new_cpu_id(0, 0),
        tail,
    ]
    .concat()
}

#[test]
fn hostile_fdr_files_get_one_line_each() {
    use xray_fdr::records as r;
    let dir = scratch_dir("hostile-fdr");
    // A custom event claiming 2 GiB: refused, nothing allocated for it.
    let mut marker = r::custom_event_marker_v1(1, 0).unwrap();
    marker[1..5].copy_from_slice(&i32::MAX.to_le_bytes());
    let cases = [
        ("version.fdr", fdr_file(0xffff, &[])),
        ("event.fdr", fdr_file(1, &[&marker[..], b"xy"].concat())),
    ];
    for (name, bytes) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        let problem = match xray_fdr::read(&bytes) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{name} reads"),
        };
        let want = format!("fdr-profiled: error: {}: {problem}", path.display());
        for sub in ["verify", "dump"] {
            let f = run(Command::new(fdr_profiled()).arg(sub).arg(&path));
            assert_eq!(error_line(&f), want, "{sub} {name}");
        }
    }
    // report and convert of the file itself: the header is checked before anything else.
    let path = dir.path().join("version.fdr");
    let problem = xray_fdr::read(&fdr_file(0xffff, &[]))
        .unwrap_err()
        .to_string();
    for args in [&["report"][..], &["convert", "--format", "chrome"]] {
        let f = run(Command::new(fdr_profiled()).args(args).arg(&path));
        assert_eq!(
            error_line(&f),
            format!("fdr-profiled: error: {}: {problem}", path.display()),
            "{args:?}"
        );
    }
}

#[test]
fn an_empty_symbol_name_is_no_name() {
    use fdr_analysis::symbolize::{NameSource, ObjectSymbols};
    use object::read::elf::Sym;
    let dir = scratch_dir("hostile-empty-name");
    let fx = fixture();
    let image = xray_object::ElfImage::open(&cpp_fixture()).unwrap();
    let function = xray_object::InstrMap::from_elf(&image).unwrap().functions[0].address;
    let bin = fx.variant(dir.path(), "empty-name", |d| {
        // No DWARF: `.debug_info` renamed, so names come from the symbol table.
        let at = d
            .windows(12)
            .position(|w| w == b".debug_info\0")
            .expect("the fixture has DWARF");
        d[at + 1] = b'x';
        // The function's symbol named by offset 0 of the string table: "".
        let elf = ElfFile64::<LE>::parse(&fx.data[..]).unwrap();
        let header = elf.elf_header();
        let sections = header.sections(LE, &fx.data[..]).unwrap();
        let symtab = sections
            .iter()
            .find(|s| s.sh_type(LE) == object::elf::SHT_SYMTAB)
            .unwrap();
        let symbols = sections
            .symbols(LE, &fx.data[..], object::elf::SHT_SYMTAB)
            .unwrap();
        let index = symbols
            .iter()
            .position(|s| s.st_value(LE) == function && s.st_type() == object::elf::STT_FUNC)
            .expect("the function has a symbol");
        let entry = symtab.sh_offset(LE) as usize + 24 * index;
        d[entry..entry + 4].fill(0);
    });
    let object = ObjectSymbols::load(&bin, &[]).unwrap();
    assert!(object.debug_file.is_none());
    let info = object.function(1);
    assert_eq!(info.source, NameSource::Address, "{info:?}");
    assert_eq!(info.name, format!("empty-name+{function:#x}"));
}

/// Runs `cmd` to its end; returns its exit status, output and peak resident set (bytes), as
/// wait4 reports them for that process alone.
#[allow(clippy::zombie_processes)] // reaped by the wait4 below, which std cannot do with rusage
fn run_measured(cmd: &mut Command) -> (std::process::ExitStatus, String, u64) {
    use std::io::Read as _;
    use std::os::unix::process::ExitStatusExt as _;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let mut status = 0;
    // SAFETY: wait4 on our own child, with valid pointers; std never waits for it after this.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    assert_eq!(unsafe { libc::wait4(pid, &mut status, 0, &mut usage) }, pid);
    (
        std::process::ExitStatus::from_raw(status),
        stdout,
        usage.ru_maxrss as u64 * 1024,
    )
}

#[test]
fn a_compressed_debug_section_claiming_too_much_is_not_inflated() {
    use std::io::Write as _;
    const BOMB: u64 = 512 << 20;
    let dir = scratch_dir("hostile-zip-bomb");
    let src = dir.path().join("tiny.c");
    std::fs::write(
        &src,
        "__attribute__((noinline)) int leaf(int x) { asm volatile(\"\"); return x * 3; }\n\
         int main(int argc, char **argv) { return leaf(argc); }\n",
    )
    .unwrap();
    let bin = dir.path().join("bomb");
    let out = Command::new("clang-19")
        .args([
            "-O2",
            "-g",
            "-gz=zlib",
            "-fxray-instrument",
            "-fxray-instruction-threshold=1",
        ])
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .output()
        .expect("clang-19 runs (apt-get install clang-19)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut data = std::fs::read(&bin).unwrap();
    // 512 MiB of zeros: half a megabyte of zlib, a thousand times smaller.
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..BOMB >> 20 {
        z.write_all(&zeros).unwrap();
    }
    let stream = z.finish().unwrap();
    // Elf64_Chdr: ELFCOMPRESS_ZLIB, reserved, ch_size, ch_addralign; then the stream, at the
    // end of the file, and .debug_info's header pointed at it.
    let mut section = Vec::new();
    section.extend_from_slice(&1u32.to_le_bytes());
    section.extend_from_slice(&0u32.to_le_bytes());
    section.extend_from_slice(&BOMB.to_le_bytes());
    section.extend_from_slice(&1u64.to_le_bytes());
    section.extend_from_slice(&stream);
    let header = {
        let elf = ElfFile64::<LE>::parse(&data[..]).unwrap();
        let h = elf.elf_header();
        let sections = h.sections(LE, &data[..]).unwrap();
        let (index, info) = sections
            .iter()
            .enumerate()
            .find(|(_, s)| sections.section_name(LE, s) == Ok(b".debug_info".as_slice()))
            .expect("clang wrote .debug_info");
        assert_ne!(
            info.sh_flags(LE) & u64::from(object::elf::SHF_COMPRESSED),
            0,
            "-gz=zlib compresses it"
        );
        h.e_shoff(LE) as usize + index * usize::from(h.e_shentsize(LE))
    };
    data.resize(data.len().next_multiple_of(8), 0);
    let offset = data.len() as u64;
    data.extend_from_slice(&section);
    set_u64(&mut data, header + 0x18, offset);
    set_u64(&mut data, header + 0x20, section.len() as u64);
    std::fs::write(&bin, &data).unwrap();

    let session = session_naming(dir.path(), &bin);
    let (status, stdout, rss) =
        run_measured(Command::new(fdr_profiled()).arg("report").arg(&session));
    assert!(status.success(), "{status}");
    // Named from the symbol table instead.
    assert!(stdout.contains("leaf"), "{stdout}");
    assert!(
        rss < BOMB / 4,
        "report reached {} MiB: the section was inflated",
        rss >> 20
    );
}

#[test]
fn verify_of_a_directory_follows_no_symbolic_link() {
    let dir = scratch_dir("hostile-verify-links");
    let root = dir.path().join("session");
    std::fs::create_dir(&root).unwrap();
    let mut w = ThreadWriter::new(
        Cursor::new(Vec::new()),
        1,
        1_000_000_000,
        WallClock::default(),
    )
    .unwrap();
    w.function(FunctionAction::Entry, 1, 10, 0).unwrap();
    w.function(FunctionAction::Exit, 1, 20, 0).unwrap();
    let real = root.join("tid-1.fdr");
    std::fs::write(&real, w.finish().unwrap().0.into_inner()).unwrap();
    // Two links to the directory itself (2^40 paths to walk if followed), and traces that
    // are links to a device and to a file outside.
    std::os::unix::fs::symlink(".", root.join("a")).unwrap();
    std::os::unix::fs::symlink(".", root.join("b")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", root.join("tid-2.fdr")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("tid-3.fdr")).unwrap();
    let f = run(Command::new(fdr_profiled()).arg("verify").arg(&root));
    assert!(f.status.success(), "{}\n{}", f.status, f.stderr);
    assert_eq!(
        f.stdout.lines().collect::<Vec<_>>(),
        [format!(
            "{}: ok: version 1, 1 thread buffer(s), 2 function records, 0 events",
            real.display()
        )]
    );
}
