//! Reading an fdr-profiled session back: the last stage of the pipeline, which needs no BPF
//! and no root, only the files a recording left behind.
//!
//! [`manifest`] names the files of a session directory; [`replay`] reads its threads' calls
//! in program order (streaming, record by record); [`symbolize`] names the functions (DWARF,
//! symbol tables, build-ids checked); [`report`] computes per-function statistics and
//! [`convert`] writes timelines and flame graphs; [`outputs`] writes the report and timeline a
//! recording leaves next to its traces.
//!
//! Nothing here depends on the recorder: the recorder depends on this crate for the names of
//! the files it writes ([`manifest`]) and to write its closing report.
pub mod convert;
pub mod manifest;
pub mod output_dir;
pub mod outputs;
pub mod replay;
pub mod report;
pub mod symbolize;
