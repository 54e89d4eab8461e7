//! Commands that work on binaries and recorded traces rather than recording.
pub mod bench_attach;
pub mod bench_rescan;
pub mod bench_unwinding;
pub mod convert;
pub mod diff;
pub mod dump;
pub mod list;
pub mod report;
pub mod top;
pub mod verify;

use std::path::{Path, PathBuf};

/// The whole of the file at `path`, if it is a regular file: a FIFO given as a trace would
/// block the read forever and a device (`/dev/zero`) never end it, so the type is checked on a
/// descriptor opened `O_NONBLOCK` before anything is read.
pub fn read_regular_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let cannot = |e: std::io::Error| anyhow::anyhow!("cannot read {}: {e}", path.display());
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    anyhow::ensure!(meta.is_file(), "{}: not a regular file", path.display());
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(usize::try_from(meta.len()).unwrap_or(usize::MAX))
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    file.read_to_end(&mut bytes).map_err(cannot)?;
    Ok(bytes)
}

/// Where `report` and `convert` read a recorded session from, and how they name its functions.
#[derive(Debug, clap::Args)]
pub struct SessionInput {
    /// The session directory (the recording's --out), or one FDR file, such as the trace
    /// XRay's own runtime writes with every thread in it (name its binary with --binary).
    pub dir: PathBuf,
    /// The instrumented binary, when the session does not record it (or it moved). It must
    /// be the same build the session recorded, if the session recorded a build-id.
    #[arg(long, value_name = "BIN")]
    pub binary: Option<PathBuf>,
    /// Directory searched for separate debug files (`.build-id/` and debug-link paths).
    #[arg(long, value_name = "DIR", default_value = fdr_analysis::symbolize::debuginfo::SYSTEM_DEBUG_ROOT)]
    pub debug_dir: PathBuf,
}

impl SessionInput {
    /// A symbolizer looking for debug files under `--debug-dir`.
    pub fn symbolizer(&self) -> fdr_analysis::symbolize::Symbolizer {
        fdr_analysis::symbolize::Symbolizer::new(vec![self.debug_dir.clone()])
    }

    /// Opens the session, its functions named by `symbolizer`.
    pub fn open(
        &self,
        symbolizer: &fdr_analysis::symbolize::Symbolizer,
    ) -> anyhow::Result<fdr_analysis::replay::Session> {
        fdr_analysis::replay::Session::open(&self.dir, self.binary.as_deref(), symbolizer)
    }
}
