//! Command-line interface of `fdr-profiled`.
use crate::fdr::FdrVersion;
use clap::{Args, Parser, Subcommand};
use profiler_common::DEFAULT_RING_BYTES;
use std::ffi::OsString;
use std::path::PathBuf;

/// Traces programs built with LLVM XRay, from the outside, into XRay FDR trace files.
///
/// Examples:
///   fdr-profiled --out trace/ -- ./bin args     launch ./bin and trace it until it exits
///   fdr-profiled --attach ./bin --out trace/    trace every process running ./bin until Ctrl-C
///   fdr-profiled --pid 1234 --out trace/        trace one running process until Ctrl-C or its exit
#[derive(Debug, Parser)]
#[command(
    name = "fdr-profiled",
    version,
    verbatim_doc_comment,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    /// A tool to run instead of recording.
    #[command(subcommand)]
    pub tool: Option<Tool>,

    /// Recording (the default when no tool is named).
    #[command(flatten)]
    pub record: RecordArgs,
}

/// Tools that work on recorded traces.
#[derive(Debug, Subcommand)]
pub enum Tool {
    /// List the instrumented functions of a binary or of a running process (given by pid):
    /// XRay function ids, addresses, sled counts and kinds, names.
    List {
        /// A path to an ELF file, or the pid of a running process.
        target: String,
    },
    /// Print every record of an FDR file, one per line (like `llvm-xray fdr-dump`), with file
    /// offsets, absolute timestamps and, given --binary or --session, function names.
    Dump(crate::tools::dump::DumpArgs),
    /// Check FDR files (or every *.fdr file under directories) against the format; exit status 0
    /// only if all are valid, else each problem is printed with its byte offset.
    Verify(crate::tools::verify::VerifyArgs),
}

/// Options of a recording session.
#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Trace every process running this binary: those already running and those started later.
    #[arg(
        long,
        value_name = "BIN",
        conflicts_with_all = ["command", "pid"],
        required_unless_present_any = ["command", "pid"]
    )]
    pub attach: Option<PathBuf>,

    /// Trace this running process (all its threads, including new ones) until Ctrl-C/SIGTERM,
    /// --duration, or its exit. The process is left running untouched.
    #[arg(long, value_name = "PID", conflicts_with = "command")]
    pub pid: Option<u32>,

    /// Directory for the trace (created; must be empty if it exists). One subdirectory per traced
    /// process, one FDR file per thread, and session.json.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// Stop after this many seconds (default: until Ctrl-C/SIGTERM, or until the launched command exits).
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub duration: Option<std::time::Duration>,

    /// Size in bytes of the kernel's event ring buffer (a power of two).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_RING_BYTES)]
    pub buffer_size: u32,

    /// FDR layout of the trace files: 1 (the spec's version, the default) or 5 (what today's
    /// compiler-rt writes: BufferExtents, Pid, typed events).
    #[arg(long, value_name = "VERSION", default_value = "1", value_parser = parse_fdr_version)]
    pub fdr_version: FdrVersion,

    /// How many functions the summary lists.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top: usize,

    /// The command to launch and trace (after `--`).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

fn parse_fdr_version(s: &str) -> Result<FdrVersion, String> {
    s.parse::<FdrVersion>().map_err(|e| e.to_string())
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("not a number of seconds: {s}"))?;
    std::time::Duration::try_from_secs_f64(secs).map_err(|_| format!("not a valid duration: {s}"))
}

impl RecordArgs {
    /// The output directory: `--out`, or `fdr-profiled.<unix time>` in the current directory.
    pub fn out_dir(&self) -> PathBuf {
        self.out.clone().unwrap_or_else(|| {
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            PathBuf::from(format!("fdr-profiled.{secs}"))
        })
    }
}
