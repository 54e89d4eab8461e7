//! The XRay FDR trace format (see `shared/docs/fdr-format.md`).
pub mod records;
pub mod writer;
