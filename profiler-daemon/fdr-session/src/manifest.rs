//! The names a session directory is laid out by: what the recorder writes and the readers look
//! for. The directory holds [`MANIFEST`] and one `<binary>-<pid>/tid-<tid>.fdr` file per
//! thread that ran instrumented code (see `replay::layout` for what is read back). [`read`]
//! reads a manifest the way every reader must: the file may have been planted by anyone.
use std::path::Path;

/// Name of the session manifest in the output directory.
pub const MANIFEST: &str = "session.json";

/// Largest `session.json` read: a manifest lists processes, objects and threads, far less
/// than this; the limit bounds what a hostile one makes the reader allocate.
pub const MAX_MANIFEST_SIZE: u64 = 64 << 20;

/// The bytes of the manifest at `path`; `None` when there is none. Refuses a symbolic link
/// (opened with `O_NOFOLLOW`: a recorder never makes one, and one planted in a session
/// directory could make a reader running as root read any file), anything but a regular file
/// (checked on the descriptor, which was opened `O_NONBLOCK`, so a FIFO does not hang), and a
/// file larger than [`MAX_MANIFEST_SIZE`].
pub fn read(path: &Path) -> anyhow::Result<Option<Vec<u8>>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => anyhow::bail!(
            "{} is a symbolic link; refused (a recorder never writes one)",
            path.display()
        ),
        Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
    };
    let meta = file
        .metadata()
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    anyhow::ensure!(
        meta.is_file(),
        "{} is not a regular file; refused",
        path.display()
    );
    anyhow::ensure!(
        meta.len() <= MAX_MANIFEST_SIZE,
        "{} is larger than the {} MiB a manifest may be; refused",
        path.display(),
        MAX_MANIFEST_SIZE >> 20
    );
    let mut bytes = Vec::new();
    // `take`: the file may grow while it is read.
    file.take(MAX_MANIFEST_SIZE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    anyhow::ensure!(
        bytes.len() as u64 <= MAX_MANIFEST_SIZE,
        "{} is larger than the {} MiB a manifest may be; refused",
        path.display(),
        MAX_MANIFEST_SIZE >> 20
    );
    Ok(Some(bytes))
}
