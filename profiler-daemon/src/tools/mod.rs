//! Commands that work on binaries and recorded traces rather than recording.
pub mod bench_attach;
pub mod bench_rescan;
pub mod bench_unwinding;
pub mod convert;
pub mod dump;
pub mod list;
pub mod report;
pub mod verify;

use std::path::PathBuf;

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
