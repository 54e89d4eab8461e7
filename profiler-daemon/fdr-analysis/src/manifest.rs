//! The names a session directory is laid out by: what the recorder writes and the readers look
//! for. The directory holds [`MANIFEST`] and one `<binary>-<pid>/tid-<tid>.fdr` file per
//! thread that ran instrumented code (see `replay::layout` for what is read back).

/// Name of the session manifest in the output directory.
pub const MANIFEST: &str = "session.json";
