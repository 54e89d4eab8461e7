//! Keeping the service's output within its limits: at most `max_disk` bytes of snapshots under
//! `output` (the oldest deleted first), and no writing once the filesystem has less than
//! `min_free` left.
//!
//! Only directories the service itself names (`OUTPUT/<target>/<UTC time>-<trigger>`, the time
//! first, so that names sort by age) are ever deleted, never the one just written and never
//! one still being written (every target's open segment, a snapshot in progress: each holds a
//! [`Writing`] while it is written). Everything is measured and deleted through the output
//! root the service holds open ([`OutputRoot`]), nothing followed through a symlink.
use crate::service::config::MinFree;
use crate::service::output::{OutputRoot, Stored};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::rc::Rc;
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
    root: Rc<OutputRoot>,
    max_disk: u64,
    min_free: MinFree,
}

/// A snapshot directory and the bytes it takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Its path as messages show it.
    pub dir: PathBuf,
    pub bytes: u64,
    stored: Stored,
}

impl Retention {
    pub fn new(root: Rc<OutputRoot>, max_disk: u64, min_free: MinFree) -> Retention {
        Retention {
            root,
            max_disk,
            min_free,
        }
    }

    /// The output root it keeps.
    pub fn root(&self) -> &Rc<OutputRoot> {
        &self.root
    }

    /// Whether there is room to write: `Err` says why not.
    pub fn room(&self) -> Result<(), String> {
        let (free, total) = self.root.free_space().ok_or_else(|| {
            format!(
                "cannot tell the free space of {}",
                self.root.path().display()
            )
        })?;
        let need = match self.min_free {
            MinFree::Bytes(b) => b,
            MinFree::Percent(p) => (total as f64 * p / 100.0) as u64,
        };
        if free <= need {
            return Err(format!(
                "{} has {free} bytes free, at most the {need} bytes min_free keeps free",
                self.root.path().display()
            ));
        }
        Ok(())
    }

    /// Every snapshot under the root, oldest first.
    pub fn snapshots(&self) -> Vec<Snapshot> {
        let mut all: Vec<Snapshot> = self
            .root
            .sessions(is_snapshot_name)
            .into_iter()
            .map(|stored| Snapshot {
                dir: self.root.shown(&stored),
                bytes: stored.bytes,
                stored,
            })
            .collect();
        all.sort_by(|a, b| a.stored.name.cmp(&b.stored.name));
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
            match self.root.remove(&s.stored) {
                Ok(()) => {
                    total -= s.bytes;
                    deleted.push(s);
                }
                Err(err) => tracing::warn!("{err:#}"),
            }
        }
        deleted
    }
}

/// `<8 digits>T...`: a name the service gave (`20261124T132237.514Z-sigusr1`).
fn is_snapshot_name(name: &str) -> bool {
    name.len() > 9 && name.as_bytes()[..8].iter().all(u8::is_ascii_digit) && &name[8..9] == "T"
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

    fn retention(root: &Path, max_disk: u64, min_free: MinFree) -> Retention {
        Retention::new(Rc::new(OutputRoot::open(root).unwrap()), max_disk, min_free)
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
        let r = retention(root.path(), 2500, MinFree::Percent(0.0));
        let deleted = r.enforce(&c);
        assert_eq!(deleted.iter().map(|s| &s.dir).collect::<Vec<_>>(), [&a]);
        assert!(!a.exists() && b.exists() && c.exists() && foreign.exists());
        // A cap below the newest alone keeps the newest.
        let r = retention(root.path(), 10, MinFree::Percent(0.0));
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
        let r = retention(root.path(), 10, MinFree::Percent(0.0));
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
        assert!(retention(root.path(), u64::MAX, MinFree::Percent(0.0))
            .room()
            .is_ok());
        let err = retention(root.path(), u64::MAX, MinFree::Bytes(u64::MAX))
            .room()
            .unwrap_err();
        assert!(err.contains("min_free"), "{err}");
    }
}
