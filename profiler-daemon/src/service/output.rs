//! The service's output root, held by its descriptor: the one way the service reaches what it
//! writes, measures and deletes.
//!
//! The service runs as root, unattended, for months; its `output` may sit under directories
//! other users can reach. A path walked again for every segment would let a user who can
//! rename one of its directories point root's writes anywhere (a symlink `OUTPUT/<target>`
//! to `/root/...`). So:
//!
//! - the path is resolved once, at start, one component at a time, through directories that
//!   only root (or the service's own user) can change: each is owned by root or by us, and
//!   writable by nobody else unless sticky (`/tmp`); a symbolic link on the way is followed
//!   only when a trusted user made it. What is missing is created `0700`;
//! - the root is then held open, and everything below it is reached through descriptors
//!   ([`OutputDir`]: `mkdirat`, `openat(O_NOFOLLOW)`, the target directories checked to be
//!   ours and private), the disk-usage walk and the deletions of retention included;
//! - before each new segment or snapshot, [`OutputRoot::verify`] resolves the path again the
//!   same way: if it does not lead to the directory held (it was moved or replaced) or a
//!   directory on the way became untrusted, the segment or snapshot is refused, said in one
//!   line when that starts and when it ends, and counted. Nothing is ever written where the
//!   path leads then, and what is held keeps being measured.
use anyhow::{bail, Context as _, Result};
use fdr_session::output_dir::OutputDir;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, CWD};
use std::cell::{Cell, RefCell};
use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

/// Symbolic links followed at most while resolving the output path (the kernel's own limit).
const MAX_LINKS: u32 = 40;

/// Depth of the walks under the root: `<target>/<session>/<process>/<file>`, and some slack.
const MAX_DEPTH: u32 = 6;

/// The output root, held open.
#[derive(Debug)]
pub struct OutputRoot {
    dir: OutputDir,
    /// Device and inode of the directory held.
    id: (u64, u64),
    /// Why the last [`OutputRoot::verify`] refused the path (said once, until it passes again).
    refused: RefCell<Option<String>>,
    /// Segments and snapshots not written because the path was refused.
    refusals: Cell<u64>,
}

impl OutputRoot {
    /// Resolves `path` through trusted directories (see the module), creating what is missing
    /// of it `0700`, and holds the directory it names.
    pub fn open(path: &Path) -> Result<OutputRoot> {
        let fd = match resolve(path, true)? {
            Resolved::Dir(fd) => fd,
            Resolved::Missing(at) => {
                bail!("output {}: {} is missing", path.display(), at.display())
            }
        };
        let st = rustix::fs::fstat(&fd)
            .map_err(std::io::Error::from)
            .with_context(|| format!("output {}", path.display()))?;
        Ok(OutputRoot {
            dir: OutputDir::held(path.to_path_buf(), fd),
            id: (st.st_dev, st.st_ino),
            refused: RefCell::new(None),
            refusals: Cell::new(0),
        })
    }

    /// Whether the service could use `path` as its output (`--check-config`, and a reload,
    /// before anything is created): every directory of it that exists is trusted; the rest
    /// would be created.
    pub fn check(path: &Path) -> Result<()> {
        resolve(path, false).map(drop)
    }

    /// The configured path, for messages and the manifest.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The directory held (the disk-usage walk and retention start there).
    pub fn dir(&self) -> &OutputDir {
        &self.dir
    }

    /// Whether the configured path still leads, through trusted directories, to the directory
    /// held. A refusal is said once (an error line) until the path passes again (an info
    /// line); `Err` says why.
    pub fn verify(&self) -> Result<(), String> {
        let result = match resolve(self.path(), false) {
            Ok(Resolved::Dir(fd)) => match rustix::fs::fstat(&fd) {
                Ok(st) if (st.st_dev, st.st_ino) == self.id => Ok(()),
                Ok(_) => Err(format!(
                    "output {} is no longer the directory the service opened (it was moved or replaced)",
                    self.path().display()
                )),
                Err(err) => Err(format!("output {}: {err}", self.path().display())),
            },
            Ok(Resolved::Missing(at)) => Err(format!(
                "output {}: {} is gone (moved or removed)",
                self.path().display(),
                at.display()
            )),
            Err(err) => Err(format!("{err:#}")),
        };
        let mut refused = self.refused.borrow_mut();
        match &result {
            Ok(()) => {
                if refused.take().is_some() {
                    tracing::info!(
                        fdr_output = %self.path().display(),
                        "output {} is usable again: writing there again",
                        self.path().display()
                    );
                }
            }
            Err(why) => {
                if refused.as_deref() != Some(why) {
                    tracing::error!(
                        fdr_output = %self.path().display(),
                        "{why}: nothing is written there until it is back (segments and snapshots are counted as not written)"
                    );
                    *refused = Some(why.clone());
                }
            }
        }
        result
    }

    /// Creates a new session directory `OUTPUT/<target>/<name>` (or `<name>.1`, ... if that is
    /// taken), after [`OutputRoot::verify`]: the target's directory is ours and private,
    /// the session's is new. A refusal is counted.
    pub fn create_session(&self, target: &str, name: &str) -> Result<OutputDir> {
        if let Err(why) = self.verify() {
            self.refusals.set(self.refusals.get() + 1);
            bail!("{why}");
        }
        self.dir.private_subdir(target)?.create_subdir(name)
    }

    /// Why the path is refused now, if it is.
    pub fn refused(&self) -> Option<String> {
        self.refused.borrow().clone()
    }

    /// Segments and snapshots not written because the path was refused.
    pub fn refusals(&self) -> u64 {
        self.refusals.get()
    }

    /// (bytes available to us, total bytes) of the filesystem the root is on.
    pub fn free_space(&self) -> Option<(u64, u64)> {
        let st = rustix::fs::fstatvfs(&self.dir).ok()?;
        Some((st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize))
    }

    /// The service's session directories, `<target>/<name>` with `name` accepted by `keep`,
    /// each with the bytes of its files; reached through the held root, nothing followed.
    pub fn sessions(&self, keep: impl Fn(&str) -> bool) -> Vec<Stored> {
        let mut all = Vec::new();
        for target in subdirs(self.dir.as_fd()) {
            let Ok(target_fd) = open_nofollow(self.dir.as_fd(), &target) else {
                continue;
            };
            for name in subdirs(target_fd.as_fd()) {
                let Some(text) = name.to_str().filter(|n| keep(n)) else {
                    continue;
                };
                let Ok(fd) = open_nofollow(target_fd.as_fd(), &name) else {
                    continue;
                };
                all.push(Stored {
                    target: target.to_string_lossy().into_owned(),
                    name: text.to_owned(),
                    bytes: tree_bytes(fd.as_fd(), 0),
                });
            }
        }
        all
    }

    /// The path of a stored session as messages show it.
    pub fn shown(&self, stored: &Stored) -> PathBuf {
        self.path().join(&stored.target).join(&stored.name)
    }

    /// Deletes a stored session and everything under it, through the held root: `std`'s
    /// `remove_dir_all` walks with `openat(O_NOFOLLOW)` and `unlinkat` from the path
    /// `/proc/self/fd/<target's descriptor>/<name>`, whose only link is the kernel's to the
    /// directory we hold.
    pub fn remove(&self, stored: &Stored) -> Result<()> {
        use std::os::fd::AsRawFd as _;
        let target = open_nofollow(self.dir.as_fd(), std::ffi::OsStr::new(&stored.target))
            .with_context(|| format!("opening {}", self.path().join(&stored.target).display()))?;
        if stored.name.contains('/') || stored.name.starts_with('.') {
            bail!("not a session name: {:?}", stored.name);
        }
        let through = format!("/proc/self/fd/{}/{}", target.as_raw_fd(), stored.name);
        std::fs::remove_dir_all(&through)
            .with_context(|| format!("deleting {}", self.shown(stored).display()))
    }
}

/// A session directory under the root and the bytes its files take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub target: String,
    pub name: String,
    pub bytes: u64,
}

/// Bytes of the regular files in the directory `dir` and below it, nothing followed.
pub fn tree_bytes(dir: BorrowedFd<'_>, depth: u32) -> u64 {
    let mut total = 0;
    for (name, kind, size) in entries(dir) {
        match kind {
            FileType::RegularFile => total += size,
            FileType::Directory if depth < MAX_DEPTH => {
                if let Ok(fd) = open_nofollow(dir, &name) {
                    total += tree_bytes(fd.as_fd(), depth + 1);
                }
            }
            _ => {}
        }
    }
    total
}

/// The real subdirectories (not symlinks) of `dir`, by name.
fn subdirs(dir: BorrowedFd<'_>) -> Vec<OsString> {
    entries(dir)
        .into_iter()
        .filter(|(_, kind, _)| *kind == FileType::Directory)
        .map(|(name, _, _)| name)
        .collect()
}

/// Every entry of `dir` but `.` and `..`: name, type and size as `lstat` sees them.
fn entries(dir: BorrowedFd<'_>) -> Vec<(OsString, FileType, u64)> {
    let Ok(listing) = rustix::fs::Dir::read_from(dir) else {
        return Vec::new();
    };
    listing
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_bytes();
            if name == b"." || name == b".." {
                return None;
            }
            let st = rustix::fs::statat(dir, e.file_name(), AtFlags::SYMLINK_NOFOLLOW).ok()?;
            Some((
                std::ffi::OsStr::from_bytes(name).to_owned(),
                FileType::from_raw_mode(st.st_mode),
                st.st_size as u64,
            ))
        })
        .collect()
}

fn open_nofollow(dir: BorrowedFd<'_>, name: &std::ffi::OsStr) -> std::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(Into::into)
}

/// Where [`resolve`] got to.
enum Resolved {
    /// The directory the path names.
    Dir(OwnedFd),
    /// It does not exist from this component on (only when not creating).
    Missing(PathBuf),
}

/// Whether a directory whose owner is `uid` and mode `mode` can be changed only by root or by
/// us: owned by one of them, and writable by no one else unless sticky (where others can
/// create names but neither remove nor rename ours).
fn trusted(uid: u32, mode: u32) -> Result<(), String> {
    let us = rustix::process::geteuid().as_raw();
    if uid != 0 && uid != us {
        return Err(format!(
            "owned by uid {uid}, neither root nor the service's user"
        ));
    }
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(format!(
            "writable by other users (mode {:04o}, not sticky)",
            mode & 0o7777
        ));
    }
    Ok(())
}

fn check_trusted(fd: &OwnedFd, shown: &Path, output: &Path) -> Result<()> {
    let st = rustix::fs::fstat(fd)
        .map_err(std::io::Error::from)
        .with_context(|| format!("output {}: {}", output.display(), shown.display()))?;
    trusted(st.st_uid, st.st_mode).map_err(|why| {
        anyhow::anyhow!(
            "output {}: {} is {why}: give an output whose every directory only root can change",
            output.display(),
            shown.display()
        )
    })
}

/// Resolves the absolute `path` one component at a time from `/`, every directory looked in
/// trusted ([`trusted`]), a symbolic link followed only if its owner is root or us (whoever
/// may write the trusted directory it is in made it, or, in a sticky one, its owner); the
/// directory reached must be trusted too. With `create`, missing directories are made `0700`
/// (what appears meanwhile at the same name is used only if it is a trusted directory);
/// without, a missing component ends the walk.
fn resolve(path: &Path, create: bool) -> Result<Resolved> {
    if !path.is_absolute() {
        bail!("output {} is not an absolute path", path.display());
    }
    let mut pending: std::collections::VecDeque<OsString> = std::collections::VecDeque::new();
    push_front(&mut pending, path);
    let mut at = open_root()?;
    let mut shown = PathBuf::from("/");
    check_trusted(&at, &shown, path)?;
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            at = rustix::fs::openat(
                &at,
                "..",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(std::io::Error::from)
            .with_context(|| format!("output {}", path.display()))?;
            shown.pop();
            check_trusted(&at, &shown, path)?;
            continue;
        }
        let here = shown.join(&name);
        let st = match rustix::fs::statat(&at, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) if !create => return Ok(Resolved::Missing(here)),
            Err(rustix::io::Errno::NOENT) => {
                match rustix::fs::mkdirat(&at, &name, Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(err) => {
                        return Err(std::io::Error::from(err)).with_context(|| {
                            format!(
                                "output {}: cannot create {}",
                                path.display(),
                                here.display()
                            )
                        })
                    }
                }
                // Looked at again: a directory now (ours, or one that appeared meanwhile and
                // is checked like any other).
                pending.push_front(name);
                continue;
            }
            Err(err) => {
                return Err(std::io::Error::from(err))
                    .with_context(|| format!("output {}: {}", path.display(), here.display()))
            }
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                if let Err(why) = trusted(st.st_uid, 0) {
                    bail!(
                        "output {}: {} is a symbolic link {why}: not followed",
                        path.display(),
                        here.display()
                    );
                }
                links += 1;
                if links > MAX_LINKS {
                    bail!("output {}: too many symbolic links", path.display());
                }
                let target = rustix::fs::readlinkat(&at, &name, Vec::new())
                    .map_err(std::io::Error::from)
                    .with_context(|| format!("output {}: {}", path.display(), here.display()))?;
                let target = PathBuf::from(std::ffi::OsStr::from_bytes(target.as_bytes()));
                push_front(&mut pending, &target);
                if target.is_absolute() {
                    at = open_root()?;
                    shown = PathBuf::from("/");
                }
            }
            FileType::Directory => {
                at = open_nofollow(at.as_fd(), &name)
                    .with_context(|| format!("output {}: {}", path.display(), here.display()))?;
                shown = here;
                check_trusted(&at, &shown, path)?;
            }
            _ => bail!(
                "output {}: {} is not a directory",
                path.display(),
                here.display()
            ),
        }
    }
    Ok(Resolved::Dir(at))
}

/// Puts the components of `path` (`.` and the root left out) in front of `pending`.
fn push_front(pending: &mut std::collections::VecDeque<OsString>, path: &Path) {
    let names: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect();
    for name in names.into_iter().rev() {
        pending.push_front(name);
    }
}

fn open_root() -> Result<OwnedFd> {
    rustix::fs::openat(
        CWD,
        "/",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(std::io::Error::from)
    .context("opening /")
}

#[cfg(test)]
mod tests;
