//! Keeping the service's output within its limits: at most `max_disk` bytes of snapshots under
//! `output` (the oldest deleted first), and no writing once the filesystem has less than
//! `min_free` left.
//!
//! Only directories the service itself names (`OUTPUT/<target>/<UTC time>-<trigger>`, the time
//! first, so that names sort by age) are ever deleted, never the one just written and never
//! one still being written (every target's open segment, a snapshot in progress: each holds a
//! [`Writing`] while it is written); nothing is followed through a symlink.
use crate::service::config::MinFree;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The directories this process is writing now, whichever target or retention they belong
/// to: no [`Retention`] deletes them.
static WRITING: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// A directory being written: retention spares it until this is dropped.
#[derive(Debug)]
pub struct Writing {
    dir: PathBuf,
}

impl Writing {
    /// Marks `dir` as being written.
    pub fn start(dir: &Path) -> Writing {
        writing().insert(dir.to_path_buf());
        Writing {
            dir: dir.to_path_buf(),
        }
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        writing().remove(&self.dir);
    }
}

/// The set of directories being written (a panic elsewhere does not make it unusable).
fn writing() -> std::sync::MutexGuard<'static, BTreeSet<PathBuf>> {
    WRITING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The limits of one output root.
#[derive(Clone, Debug)]
pub struct Retention {
    root: PathBuf,
    max_disk: u64,
    min_free: MinFree,
}

/// A snapshot directory and the bytes it takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub dir: PathBuf,
    pub bytes: u64,
}

impl Retention {
    pub fn new(root: &Path, max_disk: u64, min_free: MinFree) -> Retention {
        Retention {
            root: root.to_path_buf(),
            max_disk,
            min_free,
        }
    }

    /// Whether there is room to write: `Err` says why not.
    pub fn room(&self) -> Result<(), String> {
        let probe = nearest_existing(&self.root);
        let (free, total) = free_space(&probe)
            .ok_or_else(|| format!("cannot tell the free space of {}", probe.display()))?;
        let need = match self.min_free {
            MinFree::Bytes(b) => b,
            MinFree::Percent(p) => (total as f64 * p / 100.0) as u64,
        };
        if free <= need {
            return Err(format!(
                "{} has {free} bytes free, at most the {need} bytes min_free keeps free",
                probe.display()
            ));
        }
        Ok(())
    }

    /// Every snapshot under the root, oldest first.
    pub fn snapshots(&self) -> Vec<Snapshot> {
        let mut all = Vec::new();
        for target in read_real_dirs(&self.root) {
            for dir in read_real_dirs(&target) {
                if is_snapshot_name(&dir) {
                    let bytes = tree_bytes(&dir);
                    all.push(Snapshot { dir, bytes });
                }
            }
        }
        all.sort_by(|a, b| a.dir.file_name().cmp(&b.dir.file_name()));
        all
    }

    /// Bytes held by every snapshot and segment under the root, those being written included.
    pub fn disk_used(&self) -> u64 {
        self.snapshots().iter().map(|s| s.bytes).sum()
    }

    /// Deletes the oldest snapshots until all of them take at most `max_disk`, never `keep`
    /// and never a directory being written ([`Writing`]); returns what it deleted.
    pub fn enforce(&self, keep: &Path) -> Vec<Snapshot> {
        let all = self.snapshots();
        let mut total: u64 = all.iter().map(|s| s.bytes).sum();
        let mut deleted = Vec::new();
        for s in all {
            if total <= self.max_disk {
                break;
            }
            if s.dir == keep || writing().contains(&s.dir) {
                continue;
            }
            if std::fs::remove_dir_all(&s.dir).is_ok() {
                total -= s.bytes;
                deleted.push(s);
            }
        }
        deleted
    }
}

/// `<8 digits>T...`: a name the service gave (`20261124T132237.514Z-sigusr1`).
fn is_snapshot_name(dir: &Path) -> bool {
    let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    name.len() > 9 && name.as_bytes()[..8].iter().all(u8::is_ascii_digit) && &name[8..9] == "T"
}

/// The subdirectories of `dir` that are real directories (not symlinks).
fn read_real_dirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// Bytes of the regular files under `dir`, symlinks not followed.
fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                total += e.metadata().map_or(0, |m| m.len());
            }
        }
    }
    total
}

/// `path` or its nearest ancestor that exists.
fn nearest_existing(path: &Path) -> PathBuf {
    let mut at = path;
    while !at.exists() {
        match at.parent() {
            Some(p) => at = p,
            None => break,
        }
    }
    at.to_path_buf()
}

/// (bytes available to us, total bytes) of the filesystem holding `path`.
fn free_space(path: &Path) -> Option<(u64, u64)> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs writes only into the struct it is given.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a valid out pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let unit = st.f_frsize as u64;
    Some((st.f_bavail as u64 * unit, st.f_blocks as u64 * unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(root: &Path, target: &str, name: &str, bytes: usize) -> PathBuf {
        let dir = root.join(target).join(name);
        std::fs::create_dir_all(dir.join("prog-1")).unwrap();
        std::fs::write(dir.join("prog-1").join("tid-1.fdr"), vec![0u8; bytes]).unwrap();
        dir
    }

    #[test]
    fn the_oldest_snapshots_of_all_targets_go_first_never_the_newest() {
        let root = tempfile::tempdir().unwrap();
        let a = snapshot(root.path(), "a", "20260101T000000.000Z-sigusr1", 1000);
        let b = snapshot(root.path(), "b", "20260101T000001.000Z-sigusr1", 1000);
        let c = snapshot(root.path(), "a", "20260101T000002.000Z-sigsegv-7", 1000);
        let foreign = root.path().join("a").join("notes");
        std::fs::create_dir_all(&foreign).unwrap();
        std::fs::write(foreign.join("big"), vec![0u8; 5000]).unwrap();
        let r = Retention::new(root.path(), 2500, MinFree::Percent(0.0));
        let deleted = r.enforce(&c);
        assert_eq!(deleted.iter().map(|s| &s.dir).collect::<Vec<_>>(), [&a]);
        assert!(!a.exists() && b.exists() && c.exists() && foreign.exists());
        // A cap below the newest alone keeps the newest.
        let r = Retention::new(root.path(), 10, MinFree::Percent(0.0));
        r.enforce(&c);
        assert!(!b.exists() && c.exists());
    }

    #[test]
    fn a_directory_being_written_is_never_deleted() {
        let root = tempfile::tempdir().unwrap();
        // Another target's open segment: the oldest of all.
        let open = snapshot(root.path(), "b", "20260101T000000.000Z-segment", 1000);
        let old = snapshot(root.path(), "a", "20260101T000001.000Z-segment", 1000);
        let new = snapshot(root.path(), "a", "20260101T000002.000Z-segment", 1000);
        let r = Retention::new(root.path(), 10, MinFree::Percent(0.0));
        let writing = Writing::start(&open);
        let deleted = r.enforce(&new);
        assert_eq!(deleted.iter().map(|s| &s.dir).collect::<Vec<_>>(), [&old]);
        assert!(open.exists() && !old.exists() && new.exists());
        assert_eq!(r.disk_used(), 2000);
        // Closed, it is the oldest and goes first.
        drop(writing);
        r.enforce(&new);
        assert!(!open.exists() && new.exists());
        assert_eq!(r.disk_used(), 1000);
    }

    #[test]
    fn room_follows_min_free() {
        let root = tempfile::tempdir().unwrap();
        assert!(Retention::new(root.path(), u64::MAX, MinFree::Percent(0.0))
            .room()
            .is_ok());
        let err = Retention::new(root.path(), u64::MAX, MinFree::Bytes(u64::MAX))
            .room()
            .unwrap_err();
        assert!(err.contains("min_free"), "{err}");
    }
}
