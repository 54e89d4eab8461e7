//! Every file and directory fdr-profiled creates, created safely: the daemon runs as root and
//! writes where other users may have prepared a symlink or may plant one while it runs.
//!
//! The guarantees, for every writer (trace files, `session.json`, `report.txt`, `trace.json`,
//! `convert -o`, `report -o`, the service's segments and snapshots):
//!
//! - files are created `0600` and directories `0700` whatever the umask: the mode is given at
//!   creation (the umask can only remove bits) and set again with `fchmod` on the descriptor;
//! - nothing below a directory we hold is reached by path: files are opened relative to the
//!   directory's descriptor with `openat(O_CREAT|O_EXCL|O_NOFOLLOW)`, subdirectories made with
//!   `mkdirat` and opened `O_DIRECTORY|O_NOFOLLOW`, renames done with `renameat` between
//!   descriptors, so a symlink planted at a name we create makes that one creation fail and is
//!   never followed, and a directory swapped for a symlink after we opened it changes nothing;
//! - nothing that exists is overwritten: a file name that is taken is refused (`O_EXCL`, or a
//!   rename with `RENAME_NOREPLACE`), an existing output directory must be empty;
//! - a directory writable by other users is refused, for the output directory itself and for
//!   the directory it is created in, unless it is sticky (`/tmp`): there, others can neither
//!   remove nor rename what we created, and cannot make our exclusive creations follow anything.
//!   An existing output directory in a sticky other-writable place must also be ours.
//!
//! The path the user gave is resolved as given up to the output directory's parent (the user
//! chose those components, symlinks included); everything we create below is ours.
use anyhow::{bail, Context as _, Result};
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags, CWD};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Permissions of every file we create.
pub const FILE_MODE: u32 = 0o600;
/// Permissions of every directory we create.
pub const DIR_MODE: u32 = 0o700;

/// A directory held open by descriptor; everything created in it is created through it.
#[derive(Debug)]
pub struct OutputDir {
    /// The path the user sees in messages.
    shown: PathBuf,
    fd: OwnedFd,
}

impl OutputDir {
    /// Creates the output directory `path` (`0700`, with its missing parents, also `0700`), or
    /// accepts an existing empty directory that is not a symlink. Refused: a non-empty
    /// directory (a session never mixes with an older one), a symlink, a directory writable by
    /// other users unless sticky and ours, and a new directory in a parent writable by other
    /// users that is not sticky.
    pub fn create_root(path: &Path) -> Result<OutputDir> {
        let shown = path.to_path_buf();
        let Some(name) = last_component(path) else {
            // ".", "/", "a/..": no name of its own to create; must be an existing directory.
            let fd = open_dir_following(CWD, path)
                .with_context(|| format!("cannot open output directory {}", path.display()))?;
            return OutputDir::accept_existing(shown, fd);
        };
        let parent = parent_of(path);
        let parent_fd = open_or_create_dirs(&parent)?;
        check_parent(&parent_fd, &parent)?;
        match rustix::fs::mkdirat(&parent_fd, name, Mode::from_raw_mode(DIR_MODE)) {
            Ok(()) => {
                let fd = open_dir_nofollow(&parent_fd, name)
                    .with_context(|| format!("cannot open {}", path.display()))?;
                make_private_dir(&fd, path)?;
                Ok(OutputDir { shown, fd })
            }
            Err(rustix::io::Errno::EXIST) => {
                let st = rustix::fs::statat(&parent_fd, name, AtFlags::SYMLINK_NOFOLLOW)
                    .with_context(|| format!("cannot use {}", path.display()))?;
                let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
                if kind == rustix::fs::FileType::Symlink {
                    bail!(
                        "output directory {} is a symlink; give a real directory",
                        path.display()
                    );
                }
                if kind != rustix::fs::FileType::Directory {
                    bail!("output path {} is not a directory", path.display());
                }
                let fd = open_dir_nofollow(&parent_fd, name)
                    .with_context(|| format!("cannot open output directory {}", path.display()))?;
                OutputDir::accept_existing(shown, fd)
            }
            Err(err) => Err(std::io::Error::from(err))
                .with_context(|| format!("cannot create output directory {}", path.display())),
        }
    }

    /// Opens an existing output directory again (a finished session directory, to add its
    /// report): not a symlink, and writable by nobody but its owner unless sticky and ours.
    pub fn open_existing(path: &Path) -> Result<OutputDir> {
        let fd = match last_component(path) {
            Some(name) => {
                let parent = parent_of(path);
                let parent_fd = open_dir_following(CWD, &parent)
                    .with_context(|| format!("cannot open {}", parent.display()))?;
                open_dir_nofollow(&parent_fd, name)
            }
            None => open_dir_following(CWD, path),
        }
        .with_context(|| {
            format!(
                "cannot open {} (not a directory, or a symlink)",
                path.display()
            )
        })?;
        check_dir(&fd, path)?;
        Ok(OutputDir {
            shown: path.to_path_buf(),
            fd,
        })
    }

    /// The directory to create the file `path` in, and the file's name: for an output file the
    /// user names (`convert -o`, `report -o`). The directory must not be writable by other
    /// users unless it is sticky; the file must not exist.
    pub fn for_new_file(path: &Path) -> Result<(OutputDir, String)> {
        let Some(name) = last_component(path).and_then(|n| n.to_str()) else {
            bail!(
                "output file {} has no file name (or one that is not UTF-8)",
                path.display()
            );
        };
        let parent = parent_of(path);
        let fd = open_dir_following(CWD, &parent)
            .with_context(|| format!("cannot open directory {}", parent.display()))?;
        check_parent(&fd, &parent)?;
        let dir = OutputDir { shown: parent, fd };
        dir.refuse_existing(name)?;
        Ok((dir, name.to_owned()))
    }

    /// Opens the directory `path` for files of our own (the service's control socket),
    /// creating what is missing of it `0700`; it must not be writable by other users unless
    /// sticky (and then, when it existed, ours).
    pub fn open_or_create(path: &Path) -> Result<OutputDir> {
        let fd = open_or_create_dirs(path)?;
        check_dir(&fd, path)?;
        Ok(OutputDir {
            shown: path.to_path_buf(),
            fd,
        })
    }

    /// Listens on a unix socket `name` in this directory, made `0600`. A stale socket there
    /// (and only a socket) is replaced; anything else is refused. Bound through the
    /// directory's descriptor (`/proc/self/fd/N/name`), so no symlink on the way is followed.
    pub fn bind_socket(&self, name: &str) -> Result<std::os::unix::net::UnixListener> {
        check_component(name)?;
        let shown = self.shown.join(name);
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st)
                if rustix::fs::FileType::from_raw_mode(st.st_mode)
                    == rustix::fs::FileType::Socket =>
            {
                rustix::fs::unlinkat(&self.fd, name, AtFlags::empty())
                    .map_err(std::io::Error::from)
                    .with_context(|| format!("removing {}", shown.display()))?
            }
            Ok(_) => bail!(
                "{} exists and is not a socket: not replacing it",
                shown.display()
            ),
            Err(_) => {}
        }
        use std::os::fd::AsRawFd as _;
        let through_fd = format!("/proc/self/fd/{}/{name}", self.fd.as_raw_fd());
        let listener = std::os::unix::net::UnixListener::bind(&through_fd)
            .with_context(|| format!("listening on {}", shown.display()))?;
        // A socket's mode cannot be set on its descriptor; the name is ours (we just bound it
        // in a directory others cannot change, or a sticky one where they cannot remove it).
        rustix::fs::chmodat(
            &self.fd,
            name,
            Mode::from_raw_mode(FILE_MODE),
            AtFlags::empty(),
        )
        .map_err(std::io::Error::from)
        .with_context(|| format!("making {} private", shown.display()))?;
        Ok(listener)
    }

    /// A directory the caller opened and checked itself (the service's output root, reached
    /// through directories it trusts), held from now on by its descriptor `fd`; `shown` is
    /// its path for messages.
    pub fn held(shown: PathBuf, fd: OwnedFd) -> OutputDir {
        OutputDir { shown, fd }
    }

    /// Opens the subdirectory `name` (a single component), creating it `0700` if it is
    /// missing: a directory of our own that stays as it is from one session to the next (the
    /// service's `OUTPUT/<target>`). Refused: a symlink (never followed), anything but a
    /// directory, and a directory that is not ours or that other users can write.
    pub fn private_subdir(&self, name: &str) -> Result<OutputDir> {
        check_component(name)?;
        let shown = self.shown.join(name);
        let created = match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(DIR_MODE)) {
            Ok(()) => true,
            Err(rustix::io::Errno::EXIST) => false,
            Err(err) => {
                return Err(std::io::Error::from(err))
                    .with_context(|| format!("cannot create {}", shown.display()))
            }
        };
        let fd = open_dir_nofollow(&self.fd, name).with_context(|| {
            format!(
                "cannot open {} (not a directory, or a symlink)",
                shown.display()
            )
        })?;
        if created {
            make_private_dir(&fd, &shown)?;
        }
        let st = rustix::fs::fstat(&fd)
            .map_err(std::io::Error::from)
            .with_context(|| format!("cannot stat {}", shown.display()))?;
        let (others, _) = writable_by_others(st.st_mode);
        if st.st_uid != rustix::process::geteuid().as_raw() || others {
            bail!(
                "{} is not a private directory of ours (owner uid {}, mode {:04o}): not writing in it",
                shown.display(),
                st.st_uid,
                st.st_mode & 0o7777
            );
        }
        Ok(OutputDir { shown, fd })
    }

    /// A second handle on the same directory (its descriptor duplicated).
    pub fn try_clone(&self) -> Result<OutputDir> {
        Ok(OutputDir {
            shown: self.shown.clone(),
            fd: self
                .fd
                .try_clone()
                .with_context(|| format!("cannot duplicate {}", self.shown.display()))?,
        })
    }

    /// The directory's path as given by the user (for messages and the manifest).
    pub fn path(&self) -> &Path {
        &self.shown
    }

    /// Creates a new subdirectory `name` (a single component), `0700`. If the name is taken,
    /// `name.1`, `name.2`, ... are tried, so a reused pid never overwrites an older process's
    /// files.
    pub fn create_subdir(&self, name: &str) -> Result<OutputDir> {
        check_component(name)?;
        for attempt in 0..1000 {
            let candidate = if attempt == 0 {
                name.to_owned()
            } else {
                format!("{name}.{attempt}")
            };
            let shown = self.shown.join(&candidate);
            match rustix::fs::mkdirat(&self.fd, &*candidate, Mode::from_raw_mode(DIR_MODE)) {
                Ok(()) => {
                    let fd = open_dir_nofollow(&self.fd, &*candidate)
                        .with_context(|| format!("cannot open {}", shown.display()))?;
                    make_private_dir(&fd, &shown)?;
                    return Ok(OutputDir { shown, fd });
                }
                Err(rustix::io::Errno::EXIST) => continue,
                Err(err) => {
                    return Err(std::io::Error::from(err))
                        .with_context(|| format!("cannot create {}", shown.display()))
                }
            }
        }
        bail!(
            "cannot find a free name for {} in {}",
            name,
            self.shown.display()
        )
    }

    /// Creates a new file `name` (`0600`, read and write) that must not exist yet; a symlink
    /// at `name` is refused, never followed.
    pub fn create_file(&self, name: &str) -> Result<File> {
        check_component(name)?;
        let shown = self.shown.join(name);
        let fd = match rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(FILE_MODE),
        ) {
            Ok(fd) => fd,
            // Whatever is there (a symlink included) stays as it is.
            Err(rustix::io::Errno::EXIST) => bail!(
                "cannot create {}: it exists; not overwriting it",
                shown.display()
            ),
            Err(err) => {
                return Err(std::io::Error::from(err))
                    .with_context(|| format!("cannot create {}", shown.display()))
            }
        };
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(FILE_MODE))
            .map_err(std::io::Error::from)
            .with_context(|| format!("cannot make {} private", shown.display()))?;
        Ok(File::from(fd))
    }

    /// Writes `bytes` to `name`, replacing an earlier version of it atomically (a fresh file
    /// renamed over `name`, so readers never see half a file): for files this run rewrites,
    /// like `session.json`. A symlink planted at `name` is replaced, not followed.
    pub fn write_atomically(&self, name: &str, bytes: &[u8]) -> Result<PathBuf> {
        use std::io::Write as _;
        check_component(name)?;
        let tmp = format!(".{name}.tmp{}", std::process::id());
        let mut file = self.create_file(&tmp)?;
        let written = file
            .write_all(bytes)
            .and_then(|()| file.sync_data())
            .map_err(anyhow::Error::from)
            .and_then(|()| {
                rustix::fs::renameat(&self.fd, &*tmp, &self.fd, name)
                    .map_err(|e| std::io::Error::from(e).into())
            });
        if let Err(err) = written {
            let _ = rustix::fs::unlinkat(&self.fd, &*tmp, AtFlags::empty());
            return Err(err)
                .with_context(|| format!("cannot write {}", self.shown.join(name).display()));
        }
        Ok(self.shown.join(name))
    }

    /// Creates the new file `name` with what `write` puts in it, complete or not at all: it is
    /// written under a hidden name and given its own only when `write` succeeded (and the data
    /// is on disk), never replacing anything. On an error nothing is left behind.
    pub fn write_new<T>(
        &self,
        name: &str,
        write: impl FnOnce(&mut File) -> std::io::Result<T>,
    ) -> Result<T> {
        check_component(name)?;
        self.refuse_existing(name)?;
        let tmp = format!(".{name}.tmp{}", std::process::id());
        let mut file = self.create_file(&tmp)?;
        let result = write(&mut file)
            .and_then(|t| file.sync_all().map(|()| t))
            .map_err(anyhow::Error::from)
            .and_then(|t| self.publish(&tmp, name).map(|_| t));
        if result.is_err() {
            let _ = rustix::fs::unlinkat(&self.fd, &*tmp, AtFlags::empty());
        }
        result.with_context(|| format!("writing {}", self.shown.join(name).display()))
    }

    /// Gives the file `from` (created by [`OutputDir::create_file`]) its final name `to`, which
    /// must not exist: files are built under a hidden name and appear complete, so a kill
    /// between creating and initialising never leaves an empty or half-headed trace.
    pub fn publish(&self, from: &str, to: &str) -> Result<PathBuf> {
        check_component(from)?;
        check_component(to)?;
        // RENAME_NOREPLACE refuses to clobber anything, a planted symlink included.
        let renamed =
            match rustix::fs::renameat_with(&self.fd, from, &self.fd, to, RenameFlags::NOREPLACE) {
                // A file system without the flag (9p, as a virtual machine's shared folder
                // is): refused if `to` exists, then a plain rename. Between the two a writer of
                // the directory could plant `to`; the rename would replace it, never follow it.
                // (A hard link and an unlink would refuse to clobber atomically, but 9p loses
                // the open file with its first name.)
                Err(rustix::io::Errno::INVAL) => {
                    self.refuse_existing(to)?;
                    rustix::fs::renameat(&self.fd, from, &self.fd, to)
                }
                other => other,
            };
        renamed
            .map_err(std::io::Error::from)
            .with_context(|| format!("cannot create {}", self.shown.join(to).display()))?;
        Ok(self.shown.join(to))
    }

    /// One clear error when `name` exists in this directory (whatever it is).
    fn refuse_existing(&self, name: &str) -> Result<()> {
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => bail!(
                "{} exists; not overwriting it",
                self.shown.join(name).display()
            ),
            Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(err) => Err(std::io::Error::from(err))
                .with_context(|| format!("cannot use {}", self.shown.join(name).display())),
        }
    }

    /// An existing directory as output: empty, and writable by nobody else unless sticky and
    /// ours (its mode is the user's and left as it is; what we create in it is private).
    fn accept_existing(shown: PathBuf, fd: OwnedFd) -> Result<OutputDir> {
        check_dir(&fd, &shown)?;
        let entries = rustix::fs::Dir::read_from(&fd)
            .map_err(std::io::Error::from)
            .with_context(|| format!("cannot read output directory {}", shown.display()))?;
        for entry in entries {
            let entry = entry
                .map_err(std::io::Error::from)
                .with_context(|| format!("cannot read output directory {}", shown.display()))?;
            let n = entry.file_name().to_bytes();
            if n != b"." && n != b".." {
                bail!("output directory {} is not empty", shown.display());
            }
        }
        Ok(OutputDir { shown, fd })
    }
}

impl AsFd for OutputDir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Whether a directory with this `st_mode` lets users other than its owner create and remove
/// names in it (group or other write), and whether it is sticky.
fn writable_by_others(mode: u32) -> (bool, bool) {
    (mode & 0o022 != 0, mode & 0o1000 != 0)
}

/// The directory we create the output in: not writable by other users unless sticky.
fn check_parent(fd: &OwnedFd, shown: &Path) -> Result<()> {
    let st = rustix::fs::fstat(fd)
        .map_err(std::io::Error::from)
        .with_context(|| format!("cannot stat {}", shown.display()))?;
    let (others, sticky) = writable_by_others(st.st_mode);
    if others && !sticky {
        bail!(
            "{} is writable by other users (mode {:04o}, not sticky): choose an output directory elsewhere",
            shown.display(),
            st.st_mode & 0o7777
        );
    }
    Ok(())
}

/// An existing output directory: writable by nobody but its owner, or sticky and ours. (Its
/// owner may plant symlinks in it whenever they like; nothing we do follows them.)
fn check_dir(fd: &OwnedFd, shown: &Path) -> Result<()> {
    let st = rustix::fs::fstat(fd)
        .map_err(std::io::Error::from)
        .with_context(|| format!("cannot stat {}", shown.display()))?;
    let mine = st.st_uid == rustix::process::geteuid().as_raw();
    let (others, sticky) = writable_by_others(st.st_mode);
    if others && !(sticky && mine) {
        bail!(
            "output directory {} is writable by other users (mode {:04o}{}): give a directory only its owner can write",
            shown.display(),
            st.st_mode & 0o7777,
            if sticky { ", not ours" } else { ", not sticky" }
        );
    }
    Ok(())
}

/// Sets a directory we just created to exactly `0700` (the umask may have removed bits).
fn make_private_dir(fd: &OwnedFd, shown: &Path) -> Result<()> {
    rustix::fs::fchmod(fd, Mode::from_raw_mode(DIR_MODE))
        .map_err(std::io::Error::from)
        .with_context(|| format!("cannot make {} private", shown.display()))
}

/// Opens the directory `path` as the user gave it (symlinks in it are theirs to choose),
/// creating what is missing of it, each new directory `0700` and made relative to its parent's
/// descriptor. A directory we create in must not be writable by others unless sticky.
fn open_or_create_dirs(path: &Path) -> Result<OwnedFd> {
    match open_dir_following(CWD, path) {
        Ok(fd) => return Ok(fd),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err).with_context(|| format!("cannot open {}", path.display())),
    }
    let Some(name) = last_component(path) else {
        bail!("cannot open {}", path.display());
    };
    let parent = parent_of(path);
    let parent_fd = open_or_create_dirs(&parent)?;
    check_parent(&parent_fd, &parent)?;
    let created = match rustix::fs::mkdirat(&parent_fd, name, Mode::from_raw_mode(DIR_MODE)) {
        Ok(()) => true,
        // Created by someone else meanwhile: used if it is a real directory (opened without
        // following), like one that was there before.
        Err(rustix::io::Errno::EXIST) => false,
        Err(err) => {
            return Err(std::io::Error::from(err))
                .with_context(|| format!("cannot create {}", path.display()))
        }
    };
    let fd = open_dir_nofollow(&parent_fd, name)
        .with_context(|| format!("cannot open {}", path.display()))?;
    if created {
        make_private_dir(&fd, path)?;
    }
    Ok(fd)
}

fn open_dir_following(dir: impl AsFd, path: &Path) -> std::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(Into::into)
}

fn open_dir_nofollow(dir: impl AsFd, name: impl rustix::path::Arg) -> std::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(Into::into)
}

/// The last component of `path` when it is a name (not `.`, `..` or a root).
fn last_component(path: &Path) -> Option<&std::ffi::OsStr> {
    match path.components().next_back()? {
        std::path::Component::Normal(n) => Some(n),
        _ => None,
    }
}

/// The directory `path` is in (`.` for a bare name).
fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Names we create are single path components we built ourselves; refuse anything else.
fn check_component(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        bail!("invalid file name {name:?}");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
