//! The session's output directory, written as root into a place other users may reach: the
//! one module every writer of fdr-profiled uses (trace files, `session.json`, reports,
//! conversions, the service's segments and snapshots), in `fdr-analysis` so that the session
//! readers' outputs (`report.txt`, `trace.json`, `convert -o`) go through it too. Its
//! guarantees (modes 0600/0700 whatever the umask, no symlink followed below the output
//! directory, nothing overwritten, no directory others can write) are documented and tested
//! there.
pub use fdr_analysis::output_dir::OutputDir;
