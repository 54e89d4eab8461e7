//! The session's output directory, written as root into a place other users may reach: the
//! one module every writer of fdr-profiled uses (trace files, `session.json`, reports,
//! conversions, the service's segments and snapshots), in `fdr-analysis` so that the session
//! readers' outputs (`report.txt`, `trace.json`, `convert -o`) go through it too. Its
//! guarantees (modes 0600/0700 whatever the umask, no symlink followed below the output
//! directory, nothing overwritten, no directory others can write) are documented and tested
//! there.
pub use fdr_session::output_dir::OutputDir;

/// Longest part of a directory name taken from a name fdr-profiled did not choose.
pub const MAX_NAME_PART: usize = 64;

/// `name` (a binary's file name: whoever named the file chose it) as part of a directory name:
/// a character other than an ASCII letter, digit, `.`, `_`, `-` or `+` becomes `_`, and a
/// name longer than [`MAX_NAME_PART`] is cut, ending with a hash of the whole name so that
/// long names that start alike stay apart. Directory names then never exceed the file
/// system's 255 bytes (`<time>-<trigger>-<name>`, `<name>-<pid>`) nor hold a newline.
pub fn name_part(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-+".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.len() <= MAX_NAME_PART {
        return safe;
    }
    // FNV-1a: stable across runs and releases (a directory name must not change with them).
    let hash = name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("{}-{hash:08x}", &safe[..MAX_NAME_PART - 9])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_made_safe_and_short() {
        assert_eq!(name_part("calls-c"), "calls-c");
        assert_eq!(name_part("g++"), "g++");
        assert_eq!(
            name_part("nl\nfdr-profiled: service: FAKE"),
            "nl_fdr-profiled__service__FAKE"
        );
        let long = "x".repeat(250);
        let a = name_part(&long);
        let b = name_part(&format!("{long}y"));
        assert_eq!(a.len(), MAX_NAME_PART);
        assert_eq!(b.len(), MAX_NAME_PART);
        assert_ne!(a, b, "long names that start alike stay apart");
        assert_eq!(name_part(&long), a, "stable");
        assert!(name_part("é".repeat(100).as_str()).is_ascii());
    }
}
