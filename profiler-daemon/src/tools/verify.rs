//! `fdr-profiled verify FILE...`: checks FDR files with the reader and says, per file, either a
//! summary or the first violation (offset, record kind, problem). Directories stand for every
//! `*.fdr` file under them. The exit status is 0 only if every file is valid.
use anyhow::Result;
use std::path::{Path, PathBuf};
use xray_fdr::reader::{RawRecord, Reader};

/// Options of `verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// FDR files, or directories to search for `*.fdr` files.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// What a valid file holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Format version.
    pub version: u16,
    /// NewBuffer blocks.
    pub buffers: u64,
    /// Function records.
    pub functions: u64,
    /// Custom and typed events.
    pub events: u64,
    /// Open entries closed by the exit of a caller (an exception or `longjmp` left them).
    pub unwound: u64,
}

/// Checks one file's bytes without collecting its records (memory stays at the file's size).
pub fn check(bytes: &[u8]) -> Result<Summary, xray_fdr::ReadError> {
    let mut reader = Reader::new(bytes)?;
    let mut s = Summary {
        version: reader.header().version,
        ..Summary::default()
    };
    while let Some(step) = reader.next_step()? {
        if step.ignored {
            continue;
        }
        match step.record {
            RawRecord::NewBuffer { .. } => s.buffers += 1,
            RawRecord::Function { .. } => {
                s.functions += 1;
                s.unwound += u64::from(step.unwound);
            }
            RawRecord::CustomEvent { .. } | RawRecord::TypedEvent { .. } => s.events += 1,
            _ => {}
        }
    }
    Ok(s)
}

/// Runs `verify`; returns the exit code (1 if any file is invalid or unreadable).
pub fn run(args: &VerifyArgs) -> Result<u8> {
    let mut failed = 0usize;
    let mut files = Vec::new();
    for path in &args.files {
        if path.is_dir() {
            let before = files.len();
            collect_fdr_files(path, &mut files);
            if files.len() == before {
                errln!(
                    "fdr-profiled: error: {}: no .fdr files in this directory",
                    path.display()
                );
                failed += 1;
            }
        } else {
            files.push(path.clone());
        }
    }
    for file in &files {
        let result = super::read_regular_file(file)
            .map_err(|e| {
                // The error names the file; the line below does too.
                let text = e.to_string();
                let own = format!("{}: ", file.display());
                text.strip_prefix(&own).map(str::to_owned).unwrap_or(text)
            })
            .and_then(|bytes| check(&bytes).map_err(|e| e.to_string()));
        match result {
            Ok(s) => {
                let unwound = if s.unwound > 0 {
                    format!(", {} frames closed by a caller's exit (unwound)", s.unwound)
                } else {
                    String::new()
                };
                outln!(
                    "{}: ok: version {}, {} thread buffer(s), {} function records, {} events{unwound}",
                    file.display(),
                    s.version,
                    s.buffers,
                    s.functions,
                    s.events
                )
            }
            Err(problem) => {
                errln!("fdr-profiled: error: {}: {problem}", file.display());
                failed += 1;
            }
        }
    }
    Ok(u8::from(failed > 0))
}

/// Every `*.fdr` file under `dir`, sorted (unreadable directories are skipped: the files that
/// can be reached are still checked). Symbolic links are not followed: two links to `.` made
/// the walk endless (2^40 paths before the kernel's link limit), and one to a file outside
/// would have been read as a trace.
fn collect_fdr_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut found: Vec<(PathBuf, std::fs::FileType)> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            Some((e.path(), e.file_type().ok()?))
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    for (p, kind) in found {
        if kind.is_dir() {
            collect_fdr_files(&p, out);
        } else if kind.is_file() && p.extension().is_some_and(|e| e == "fdr") {
            out.push(p);
        }
    }
}
