//! A traced process's memory compared with its files: what a tracer that writes into the
//! process (`--engine inline`) must leave as it found it.

/// The bytes of `pid`'s executable mappings of `bin` that differ from the file's.
pub fn code_differences(pid: u32, bin: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::FileExt as _;
    let file = std::fs::read(bin).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let name = bin.file_name().unwrap().to_str().unwrap();
    let mut differences = Vec::new();
    let mut compared = 0;
    for line in maps.lines().filter(|l| l.ends_with(name)) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if !f[1].contains('x') {
            continue;
        }
        let (start, end) = f[0].split_once('-').unwrap();
        let start = u64::from_str_radix(start, 16).unwrap();
        let end = u64::from_str_radix(end, 16).unwrap();
        let offset = usize::from_str_radix(f[2], 16).unwrap();
        let len = ((end - start) as usize).min(file.len() - offset);
        let mut now = vec![0u8; len];
        mem.read_exact_at(&mut now, start).unwrap();
        let want = &file[offset..offset + len];
        compared += len;
        for (i, (a, b)) in now.iter().zip(want).enumerate() {
            if a != b {
                differences.push(format!("{:#x}: {a:#04x}, file {b:#04x}", start + i as u64));
            }
        }
    }
    assert!(
        compared > 0,
        "no code of {name} found in process {pid}:\n{maps}"
    );
    differences
}
