//! Command-line interface of `fdr-profiled`: the commands and their arguments, each command's
//! own argument struct living with the command (`record::RecordArgs`, `tools::*::*Args`).
//! Only `main` uses this module.
use crate::record::RecordArgs;
use clap::{Parser, Subcommand};

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
    /// Per-function statistics of a session: calls, total and self time, min, median, p90,
    /// p99, max (as `llvm-xray account`), over all threads and processes or per thread.
    ///
    /// Percentiles marked `~` come from a histogram (3 significant digits): past a number of
    /// calls a function's durations are not all kept.
    Report(crate::tools::report::ReportArgs),
    /// Compare two sessions (or FDR files), function by function matched by name: calls,
    /// total, self and p99 time in each and the change, the largest change in self time
    /// first. For flame graphs of the change: `convert --format pprof` both and
    /// `go tool pprof -diff_base A.pb.gz B.pb.gz`.
    Diff(crate::tools::diff::DiffArgs),
    /// Convert a session to a Chrome/Perfetto trace, a speedscope profile, folded stacks, a
    /// flame graph SVG or a pprof profile.
    Convert(crate::tools::convert::ConvertArgs),
    /// Run as a service tracing the programs a configuration file names (flight recorder or
    /// record mode, snapshots on SIGUSR1, request, crash or slow call; retention; reload on
    /// SIGHUP), or check such a file.
    Service(crate::service::ServiceArgs),
    /// Ask the running service for a snapshot of every target (or of TARGET) now; prints the
    /// directories written.
    Snapshot(crate::service::control::SnapshotArgs),
    /// The running service's state: events and events/s, losses, disk used, last snapshot;
    /// per target and binary its threads, events held, segments and processes.
    Status {
        #[command(flatten)]
        socket: crate::service::control::SocketArg,
        /// Print the service's JSON reply as it is.
        #[arg(long)]
        json: bool,
    },
    /// The live view: each function's calls/s, time in its calls (inclusive), mean and p99 over the last
    /// seconds, events and losses, redrawn every second and sorted by a key (as perf top).
    /// Alone it watches the running service; with recording options it records and watches
    /// that (`top --pid PID`, `top --attach BIN`, `top -- COMMAND`), keeping the files only
    /// with `--out`.
    Top(crate::tools::top::TopArgs),
    /// Benchmark: time attaching and detaching every probe of a binary (`cargo xtask bench attach`).
    #[command(hide = true)]
    BenchAttach(crate::tools::bench_attach::BenchAttachArgs),
    /// Benchmark: time finding a running process's objects (`cargo xtask bench attach`).
    #[command(hide = true)]
    BenchRescan(crate::tools::bench_rescan::BenchRescanArgs),
    /// Benchmark: how much of each file's code the per-function exit analysis proves safe for
    /// a return probe, by rule (`cargo xtask bench unwinding`).
    #[command(hide = true)]
    BenchUnwinding(crate::tools::bench_unwinding::BenchUnwindingArgs),
}
