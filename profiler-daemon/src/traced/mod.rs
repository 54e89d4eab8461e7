//! Stage 1, what is traced: a running process ([`process`]), the files it has mapped
//! ([`mappings`]), or a command launched with the probes in place before it runs
//! ([`launch`]). Nothing here knows about probes or traces.
pub mod launch;
pub mod mappings;
pub mod process;

/// The last component of `path`: the name of an object's file, for messages, summaries and
/// directory names.
pub fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}
