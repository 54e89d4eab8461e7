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

/// Asserts that process `pid` is as the inline engine found it: its code of `bin` the file's
/// byte for byte, and the engine's shared memory (shown as `/dev/zero`) no longer mapped.
/// `context` heads the failure message.
pub fn assert_put_back(pid: u32, bin: &std::path::Path, context: &str) {
    let differences = code_differences(pid, bin);
    assert!(
        differences.is_empty(),
        "{context}: the code of process {pid} was not put back: {differences:?}"
    );
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        !maps.contains("/dev/zero"),
        "{context}: the shared memory is still mapped in process {pid}:\n{maps}"
    );
}

/// Whether fdr-profiled's log `stderr` says the inline engine took process `pid` only past its
/// entry point (it ran on between its exec holder and its keeper, on a loaded host): its first
/// calls are then not in the trace, said in one line.
pub fn taken_late(stderr: &str, pid: u32) -> bool {
    stderr.lines().any(|l| {
        (l.contains(&format!(" sleds patched in process {pid};"))
            && l.contains("taken past its entry point"))
            || l.contains(&format!("process {pid} traced from where it was found"))
    })
}
