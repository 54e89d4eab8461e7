//! Reading an fdr-profiled session back: the last stage of the pipeline, which needs no BPF
//! and no root, only the files a recording left behind.
//!
//! What a session is on disk (`session.json`'s types, the file names, the output directory) is
//! the `fdr-session` crate's, shared with the recorder. [`replay`] reads its threads' calls
//! in program order (streaming, record by record); [`symbolize`] names the functions (DWARF,
//! symbol tables, build-ids checked); [`report`] computes per-function statistics and
//! [`convert`] writes timelines and flame graphs; [`diff`] compares two sessions' reports; [`outputs`] writes the report and timeline a
//! recording leaves next to its traces.
//!
//! Nothing here depends on the recorder; the recorder depends on this crate only to write its
//! closing report and for the tools that read sessions back.
pub mod convert;
pub mod diff;
pub mod outputs;
pub mod replay;
pub mod report;
pub mod symbolize;
