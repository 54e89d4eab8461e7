//! The options of a recording session (`fdr-profiled [OPTIONS] [-- COMMAND]`).
use crate::plan::exits::ExitMode;
use clap::Args;
use profiler_common::DEFAULT_RING_BYTES;
use std::ffi::OsString;
use std::path::PathBuf;
use xray_fdr::FdrVersion;

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

    /// With --pid or a launched command: record the processes it forks too (and theirs), each
    /// from its first instruction, in a directory of its own; they are recorded until they
    /// end or the session does (which is when the traced process ends). Their probes are
    /// placed for every process using the traced objects and filtered in the kernel (a
    /// process not followed pays a breakpoint per probe it hits). Not with --exits repair.
    /// --attach records every process running the binary anyway.
    #[arg(long, conflicts_with = "attach")]
    pub follow_forks: bool,

    /// Directory for the trace (created; must be empty if it exists). One subdirectory per traced
    /// process, one FDR file per thread, and session.json.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// Stop after this many seconds (default: until Ctrl-C/SIGTERM, or until the launched command exits).
    #[arg(long, value_name = "SECS", value_parser = parse_duration)]
    pub duration: Option<std::time::Duration>,

    /// Bytes of the kernel's event ring buffers per CPU (a power of two), split into one ring
    /// per worker (see --workers); with `--engine inline`, of each thread's ring.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_RING_BYTES)]
    pub buffer_size: u32,

    /// Threads that order and write the events (default: one for every 4 CPUs, at most 8):
    /// each traced thread's events are handled by one of them, and written by the kernel to
    /// a ring of each CPU of that worker's own.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub workers: Option<u16>,

    /// FDR layout of the trace files: 1 (the spec's version, the default) or 5 (what today's
    /// compiler-rt writes: BufferExtents, Pid, typed events).
    #[arg(long, value_name = "VERSION", default_value = "1", value_parser = parse_fdr_version)]
    pub fdr_version: FdrVersion,

    /// How function exits are observed: `sleds` probes XRay's exit and tail sleds (exact, safe,
    /// but the kernel single-steps each `ret`: ~15x the cost of an entry probe); `return` uses
    /// return probes (cheap, but a C++ exception or Rust panic unwinding through a probed frame
    /// kills the program); `per-function` decides each function: return probes everywhere when
    /// no unwinding personality routine exists in the traced image, else a return probe where
    /// the function's machine code proves no exception can leave it and exit sleds elsewhere
    /// (`fdr-profiled list BIN` shows which and why); `repair` puts return probes everywhere
    /// and makes them safe for exceptions: fdr-profiled becomes each process's ptrace tracer
    /// and repairs its stack at each throw and catch, and lets a `--pid` or `--attach` process
    /// go at the end with no frame left hooked (under `--attach` a process is traced from a
    /// few milliseconds after it starts); `auto` is `repair` for a
    /// launched command that can unwind, `per-function` otherwise.
    #[arg(long, value_name = "MODE", value_enum, default_value_t = ExitMode::Auto)]
    pub exits: ExitMode,

    /// How hits are observed: `uprobes` (the default) places a uprobe on each sled, a kernel
    /// trap per hit (~0.6-1 us here, 10-30 us at an exit sled), and changes nothing in the
    /// process's memory; `inline` (with `--pid`, `-- CMD` or `--attach`; a process that starts
    /// is patched at its entry point)
    /// patches the sleds, as XRay's own runtime does, to call a handler fdr-profiled puts
    /// into the process, which writes each hit into memory it shares with fdr-profiled (tens
    /// of nanoseconds a hit); its keeper puts every sled back at the end, whatever happens to
    /// fdr-profiled.
    #[arg(long, value_name = "ENGINE", value_enum, default_value_t = Engine::Uprobes)]
    pub engine: Engine,

    /// Integer arguments recorded at functions marked `xray_log_args` (XRay records 1).
    #[arg(long = "args", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(0..=6))]
    pub args: u8,

    /// Bytes of a custom or typed event's payload copied from the program; longer payloads are
    /// truncated to this many bytes, and counted.
    #[arg(long, value_name = "BYTES", default_value_t = profiler_common::DEFAULT_MAX_EVENT_BYTES,
          value_parser = clap::value_parser!(u32).range(0..=profiler_common::MAX_EVENT_BYTES as i64))]
    pub max_event_bytes: u32,

    /// Show the live view while recording, as `fdr-profiled top` does: each function's calls
    /// per second, time in its calls (inclusive), mean and p99 over the last seconds, events and losses;
    /// `q` ends the recording. Standard output must be a terminal.
    #[arg(long)]
    pub live: bool,

    /// Do not write report.txt (per-function statistics with names) and trace.json (a
    /// Chrome/Perfetto timeline) into the session directory at the end.
    #[arg(long)]
    pub no_report: bool,

    /// Show the rare anomalies the kernel-side programs report as they happen (an event whose
    /// thread state could not be created, a custom event payload that could not be read, a
    /// throw that could not be repaired...), one `fdr-profiled: kernel:` line each. Every loss
    /// they cause is counted in the summary either way.
    #[arg(short, long)]
    pub verbose: bool,

    /// Keep what the probes cost the traced program under PCT (for example 5%): the
    /// slowdown they add to its threads that run. Every second, the functions whose calls
    /// cost the most stop being traced until the estimate fits, and come back when the load
    /// falls; the summary and session.json list each drop with its rate. Each function is
    /// traced over intervals, every call inside one complete. Default: no budget.
    #[arg(long, value_name = "PCT", value_parser = crate::budget::parse_percent)]
    pub max_overhead: Option<f64>,

    /// Benchmark baseline: attach empty programs on the same probes and record nothing.
    #[arg(long, hide = true)]
    pub floor: bool,

    /// Benchmark only: skip parts of the kernel-side work (bits: 1 ring write, 2 thread
    /// state, 4 clock; 8 write by copy, 16 write to per-CPU memory) to measure what each costs. Traces made with it are wrong.
    #[arg(long, hide = true, default_value_t = 0)]
    pub ablate: u32,

    /// Benchmark only: turn on the kernel's BPF run-time statistics for the session and report
    /// the time each recording program took per run (summary and `session.json`'s
    /// `kernel_programs`). While on, every BPF program of the system runs a little slower.
    #[arg(long, hide = true)]
    pub kernel_stats: bool,

    /// Place every probe as its own perf event, even where the kernel has uprobe_multi links
    /// (the fallback path; for tests and benchmarks).
    #[arg(long, hide = true)]
    pub no_uprobe_multi: bool,

    /// Trace only functions whose demangled name matches PATTERN (repeatable: any of them). A
    /// glob over the whole name (`'fx::*'`, `'*parse*'`, `'{a,b}'`), or after `re:` a regex
    /// that may match anywhere (`'re:^ns::(get|set)'`). Nameless functions are `#ID`.
    #[arg(long = "functions", value_name = "PATTERN")]
    pub functions: Vec<String>,

    /// Do not trace functions whose demangled name matches PATTERN (repeatable; same syntax as
    /// --functions, and wins over it).
    #[arg(long = "exclude", value_name = "PATTERN")]
    pub exclude: Vec<String>,

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

/// What observes the hits (`--engine`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// A uprobe on each sled.
    Uprobes,
    /// The sleds patched to call a handler in the process (`crate::inline`).
    Inline,
}
