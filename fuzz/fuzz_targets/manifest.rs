//! Any bytes as a session's `session.json`: read as a manifest they give a layout or a
//! one-line error, never a panic; every thread file of the layout is inside the session
//! directory, and every object id is one a trace can hold.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use fdr_analysis::replay::layout::MAX_OBJECT_ID;
use fdr_analysis::replay::Layout;
use libfuzzer_sys::fuzz_target;

/// A session directory with what manifests may name: a thread file, a symbolic link to a file
/// outside (`p-1/tid-2.fdr`) and one to a directory (`q-2` to `p-1`).
fn session_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("fdr-fuzz-manifest-{}", std::process::id()));
        let p1 = dir.join("p-1");
        std::fs::create_dir_all(&p1).unwrap();
        std::fs::write(p1.join("tid-1.fdr"), b"").unwrap();
        let _ = std::os::unix::fs::symlink("/etc/passwd", p1.join("tid-2.fdr"));
        let _ = std::os::unix::fs::symlink("p-1", dir.join("q-2"));
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = session_dir();
    match Layout::from_manifest(dir, data) {
        Ok(layout) => {
            for p in &layout.processes {
                for t in &p.threads {
                    // Inside the directory, and reached through no symbolic link.
                    assert!(t.path.starts_with(dir));
                    let rel = t.path.strip_prefix(dir).unwrap();
                    let mut at = dir.to_path_buf();
                    for c in rel.components() {
                        at.push(c);
                        let meta = std::fs::symlink_metadata(&at).unwrap();
                        assert!(!meta.file_type().is_symlink(), "{at:?}");
                    }
                }
                for o in &p.objects {
                    assert!(o.id <= MAX_OBJECT_ID);
                    assert!(o.path.as_ref().is_none_or(|p| p.is_absolute()));
                }
            }
            for w in &layout.warnings {
                assert!(!w.is_empty());
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
