//! The session's output directory, written as root into a place other users may reach.
//!
//! Every path component below the root is created by us with an exclusive create (`mkdir`,
//! `O_CREAT|O_EXCL`), which never follows a symlink, and addressed through a directory file
//! descriptor (via `/proc/self/fd/N`), so swapping a directory for a symlink after we opened it
//! cannot redirect a write.
use anyhow::{bail, Context as _, Result};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// A directory we created (or verified to be an empty real directory) and hold open.
#[derive(Debug)]
pub struct OutputDir {
    /// The path the user sees in messages.
    shown: PathBuf,
    fd: File,
}

impl OutputDir {
    /// Creates `path` (and missing parents), or accepts an existing empty directory that is not a
    /// symlink. A non-empty directory is refused so a session never mixes with an older one.
    pub fn create_root(path: &Path) -> Result<OutputDir> {
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                bail!(
                    "output directory {} is a symlink; give a real directory",
                    path.display()
                )
            }
            Ok(meta) if !meta.is_dir() => {
                bail!("output path {} is not a directory", path.display())
            }
            Ok(_) => {
                let mut entries = std::fs::read_dir(path)
                    .with_context(|| format!("cannot read output directory {}", path.display()))?;
                if entries.next().is_some() {
                    bail!("output directory {} is not empty", path.display());
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent)
                        .with_context(|| format!("cannot create {}", parent.display()))?;
                }
                std::fs::DirBuilder::new()
                    .mode(0o755)
                    .create(path)
                    .with_context(|| {
                        format!("cannot create output directory {}", path.display())
                    })?;
            }
            Err(err) => return Err(err).with_context(|| format!("cannot use {}", path.display())),
        }
        let fd = open_dir(path).with_context(|| format!("cannot open {}", path.display()))?;
        Ok(OutputDir {
            shown: path.to_path_buf(),
            fd,
        })
    }

    /// The directory's path as given by the user (for messages and the manifest).
    pub fn path(&self) -> &Path {
        &self.shown
    }

    /// Creates a new subdirectory `name` (a single component). If the name is taken, `name.1`,
    /// `name.2`, ... are tried, so a reused pid never overwrites an older process's files.
    pub fn create_subdir(&self, name: &str) -> Result<OutputDir> {
        check_component(name)?;
        for attempt in 0..1000 {
            let candidate = if attempt == 0 {
                name.to_owned()
            } else {
                format!("{name}.{attempt}")
            };
            match std::fs::DirBuilder::new()
                .mode(0o755)
                .create(self.inner(&candidate))
            {
                Ok(()) => {
                    let fd = open_dir(&self.inner(&candidate)).with_context(|| {
                        format!("cannot open {}", self.shown.join(&candidate).display())
                    })?;
                    return Ok(OutputDir {
                        shown: self.shown.join(candidate),
                        fd,
                    });
                }
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(err) => {
                    return Err(err).with_context(|| {
                        format!("cannot create {}", self.shown.join(&candidate).display())
                    })
                }
            }
        }
        bail!(
            "cannot find a free name for {} in {}",
            name,
            self.shown.display()
        )
    }

    /// Creates a new file `name` that must not exist yet (never follows a symlink).
    pub fn create_file(&self, name: &str) -> Result<File> {
        check_component(name)?;
        OpenOptions::new()
            .write(true)
            .read(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.inner(name))
            .with_context(|| format!("cannot create {}", self.shown.join(name).display()))
    }

    /// Writes `bytes` to `name` atomically: a fresh temporary file renamed over `name`, so readers
    /// never see half a file and a planted symlink at `name` is replaced, not followed.
    pub fn write_atomically(&self, name: &str, bytes: &[u8]) -> Result<PathBuf> {
        use std::io::Write as _;
        let tmp = format!(".{name}.tmp{}", std::process::id());
        let mut file = self.create_file(&tmp)?;
        file.write_all(bytes)
            .and_then(|()| file.sync_data())
            .with_context(|| format!("cannot write {}", self.shown.join(&tmp).display()))?;
        std::fs::rename(self.inner(&tmp), self.inner(name))
            .with_context(|| format!("cannot write {}", self.shown.join(name).display()))?;
        Ok(self.shown.join(name))
    }

    /// Gives the file `from` (created by [`OutputDir::create_file`]) its final name `to`, which
    /// must not exist: files are built under a hidden name and appear complete, so a kill
    /// between creating and initialising never leaves an empty or half-headed trace.
    pub fn publish(&self, from: &str, to: &str) -> Result<PathBuf> {
        use std::os::unix::ffi::OsStrExt as _;
        check_component(from)?;
        check_component(to)?;
        let c = |p: PathBuf| std::ffi::CString::new(p.as_os_str().as_bytes());
        let (src, dst) = (c(self.inner(from))?, c(self.inner(to))?);
        // SAFETY: two valid NUL-terminated paths; RENAME_NOREPLACE refuses to clobber anything,
        // a planted symlink included.
        let r = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                src.as_ptr(),
                libc::AT_FDCWD,
                dst.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("cannot create {}", self.shown.join(to).display()));
        }
        Ok(self.shown.join(to))
    }

    /// Path of `name` inside this directory, resolved through our open descriptor.
    fn inner(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}/{}", self.fd.as_raw_fd(), name))
    }
}

fn open_dir(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Names we create are single path components we built ourselves; refuse anything else.
fn check_component(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        bail!("invalid file name {name:?}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_non_empty_and_symlinked_roots() {
        let tmp = tempfile::tempdir().unwrap();
        let full = tmp.path().join("full");
        std::fs::create_dir(&full).unwrap();
        std::fs::write(full.join("x"), b"x").unwrap();
        let err = OutputDir::create_root(&full).unwrap_err().to_string();
        assert!(err.contains("not empty"), "{err}");

        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(tmp.path().join("elsewhere"), &link).unwrap();
        let err = OutputDir::create_root(&link).unwrap_err().to_string();
        assert!(err.contains("symlink"), "{err}");
    }

    #[test]
    fn never_follows_a_planted_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let root = OutputDir::create_root(&tmp.path().join("out")).unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, tmp.path().join("out").join("trace")).unwrap();
        assert!(root.create_file("trace").is_err());
        std::os::unix::fs::symlink(&victim, tmp.path().join("out").join("m.json")).unwrap();
        root.write_atomically("m.json", b"{}").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(
            std::fs::read(tmp.path().join("out").join("m.json")).unwrap(),
            b"{}"
        );
    }

    #[test]
    fn publish_never_replaces() {
        let tmp = tempfile::tempdir().unwrap();
        let root = OutputDir::create_root(&tmp.path().join("out")).unwrap();
        root.create_file(".a.tmp").unwrap();
        root.publish(".a.tmp", "a").unwrap();
        assert!(tmp.path().join("out/a").exists());
        root.create_file(".b.tmp").unwrap();
        assert!(root.publish(".b.tmp", "a").is_err());
    }

    #[test]
    fn subdir_names_do_not_collide() {
        let tmp = tempfile::tempdir().unwrap();
        let root = OutputDir::create_root(&tmp.path().join("out")).unwrap();
        let a = root.create_subdir("p-1").unwrap();
        let b = root.create_subdir("p-1").unwrap();
        assert_ne!(a.path(), b.path());
        assert!(root.create_subdir("../x").is_err());
    }
}
