//! The service's configuration file (TOML): where sessions go, how much disk they may take,
//! and which programs to trace how.
//!
//! ```toml
//! output = "/var/lib/fdr-profiled"      # root of all sessions
//! max_disk = "2GiB"                      # retention cap over everything under output
//! min_free = "5%"                        # stop writing before the filesystem is this full
//! stop_timeout = "20s"                   # SIGTERM: files final within this, reports if time is left
//! [[target]]
//! binary = "/usr/bin/myserver"           # a path or a glob
//! mode = "flight-recorder"               # or "record"
//! window = "30s"
//! functions = ["ns::*"]
//! max_overhead = "2%"                    # the default; "none" traces every function always
//! [export]                               # optional: push profiles (see `export`)
//! pyroscope = "http://pyroscope:4040"
//! ```
//!
//! The file is read as hostile input (the service runs as root): bounded size, a regular file,
//! unknown keys refused. Every error names the file, line and column of what is wrong, so an
//! operator can fix it without guessing; a config with any error is refused whole.
use crate::plan::exits::ExitMode;
use crate::plan::select::FunctionFilter;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;
use xray_fdr::FdrVersion;

mod export;
mod values;
pub use export::{Endpoint, ExportConfig};
use values::{parse_duration, Located};

/// Largest configuration file read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Default flight-recorder window.
const DEFAULT_WINDOW: Duration = Duration::from_secs(30);
/// Default memory cap of the flight recorder of one binary of a target.
const DEFAULT_MAX_MEMORY: u64 = 256 << 20;
/// Default time SIGTERM gives the service to finish its files (under the unit's
/// `TimeoutStopSec=30s`).
const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest `stop_timeout` accepted.
const MAX_STOP_TIMEOUT: Duration = Duration::from_secs(3600);
/// Default shortest time between two crash snapshots of one binary.
const DEFAULT_CRASH_SNAPSHOT_INTERVAL: Duration = Duration::from_secs(10);
/// Default record-mode segment size and age.
const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;
const DEFAULT_SEGMENT_AGE: Duration = Duration::from_secs(600);

/// A configuration error, located in its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line and column of what is wrong (0 when the error concerns the whole file).
    pub line: usize,
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            0 => write!(f, "{}: {}", self.file.display(), self.message),
            line => write!(
                f,
                "{}:{line}:{}: {}",
                self.file.display(),
                self.column,
                self.message
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// How a target is recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Keep the last `window` of every thread's calls in memory; write it on a trigger.
    FlightRecorder,
    /// Write every call, in segments rotated by size and age.
    Record,
}

/// How a target's calls are observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetEngine {
    /// A uprobe at each sled (the default): nothing in the process changed.
    Uprobes,
    /// Each process's sleds patched to call a handler put into it (`crate::inline`): no
    /// kernel trap per call.
    Inline,
}

/// How much free space to leave on the output's filesystem.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MinFree {
    /// A share of the filesystem, in percent.
    Percent(f64),
    /// Bytes.
    Bytes(u64),
}

/// The whole configuration, validated.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// The file it was read from.
    pub path: PathBuf,
    /// Root directory of every session.
    pub output: PathBuf,
    /// Retention cap over everything under `output`, in bytes.
    pub max_disk: u64,
    /// Free space writing stops before crossing.
    pub min_free: MinFree,
    /// After SIGTERM, the open segments are closed within this: past it, what is left is made
    /// final without its `report.txt`.
    pub stop_timeout: Duration,
    /// The programs to trace.
    pub targets: Vec<TargetConfig>,
    /// `[export]`: profiles pushed every interval.
    pub export: Option<ExportConfig>,
}

/// One `[[target]]`, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetConfig {
    /// Its name: directory names, logs, `fdr-profiled snapshot NAME`. Defaults to the binary's
    /// file name.
    pub name: String,
    /// The executable: a path, or a glob over paths.
    pub binary: String,
    pub mode: Mode,
    /// Flight recorder: at least this much of every thread's most recent calls is kept.
    pub window: Duration,
    /// Flight recorder: memory held at most for each binary the target's pattern matches (each
    /// has a recorder and a budget of its own; older records are evicted first, and counted).
    pub max_memory: u64,
    /// `--functions` / `--exclude` patterns.
    pub functions: Vec<String>,
    pub exclude: Vec<String>,
    pub exits: ExitMode,
    pub engine: TargetEngine,
    /// `engine = "inline"`: each traced thread's ring in its process (a power of two).
    pub ring_size: u64,
    /// `--args`.
    pub args: u8,
    /// `--max-event-bytes`.
    pub max_event_bytes: u32,
    pub fdr_version: FdrVersion,
    /// Flight recorder: a call of a function matching `trigger_functions` slower than this
    /// triggers a snapshot.
    pub trigger_slower_than: Option<Duration>,
    pub trigger_functions: Vec<String>,
    /// Flight recorder: at most one crash snapshot of a binary per this much time; the crashes
    /// in between are covered by the next one, written when it is over (0: every crash its
    /// own).
    pub crash_snapshot_interval: Duration,
    /// Record mode: a segment is closed past this size or age.
    pub segment_bytes: u64,
    pub segment_age: Duration,
    /// The overhead budget (a fraction; see `crate::budget`): [`DEFAULT_MAX_OVERHEAD`]
    /// unless `max_overhead = "none"`.
    pub max_overhead: Option<f64>,
}

/// `engine = "inline"`: each traced thread's ring unless `ring_size` says otherwise, what its
/// process holds for it once the ring has gone round (less than a recording's 8 MiB: an
/// always-on target may have many threads): 131,072 hits, 10 ms (a drain's period) of 13M
/// calls a second.
pub const DEFAULT_RING_SIZE: u64 = 4 << 20;
const MIN_RING_SIZE: u64 = 64 << 10;
const MAX_RING_SIZE: u64 = 1 << 30;

/// A target's budget unless it says otherwise: the probes may add 2% to its threads' time.
pub const DEFAULT_MAX_OVERHEAD: f64 = 0.02;

/// The file's shape, as serde reads it (values still unchecked, with their spans).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    output: Spanned<String>,
    max_disk: Option<Spanned<String>>,
    min_free: Option<Spanned<String>>,
    stop_timeout: Option<Spanned<String>>,
    #[serde(rename = "target", default)]
    targets: Vec<Spanned<RawTarget>>,
    export: Option<Spanned<export::RawExport>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    name: Option<Spanned<String>>,
    binary: Spanned<String>,
    mode: Option<Spanned<Mode>>,
    window: Option<Spanned<String>>,
    max_memory: Option<Spanned<String>>,
    #[serde(default)]
    functions: Vec<Spanned<String>>,
    #[serde(default)]
    exclude: Vec<Spanned<String>>,
    exits: Option<Spanned<String>>,
    engine: Option<Spanned<TargetEngine>>,
    ring_size: Option<Spanned<String>>,
    args: Option<Spanned<i64>>,
    max_event_bytes: Option<Spanned<i64>>,
    fdr_version: Option<Spanned<i64>>,
    trigger_slower_than: Option<Spanned<String>>,
    #[serde(default)]
    trigger_functions: Vec<Spanned<String>>,
    crash_snapshot_interval: Option<Spanned<String>>,
    segment_size: Option<Spanned<String>>,
    segment_age: Option<Spanned<String>>,
    max_overhead: Option<Spanned<String>>,
}

impl ServiceConfig {
    /// Reads and validates the configuration file at `path`.
    pub fn load(path: &Path) -> Result<ServiceConfig, ConfigError> {
        let whole = |message: String| ConfigError {
            file: path.to_path_buf(),
            line: 0,
            column: 0,
            message,
        };
        let meta = std::fs::metadata(path).map_err(|e| whole(format!("cannot read: {e}")))?;
        if !meta.is_file() {
            return Err(whole("not a regular file".into()));
        }
        if meta.len() > MAX_CONFIG_BYTES {
            return Err(whole(format!(
                "{} bytes: larger than a configuration file can be ({MAX_CONFIG_BYTES})",
                meta.len()
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| whole(format!("cannot read: {e}")))?;
        ServiceConfig::parse(path, &text)
    }

    /// Validates `text`, the contents of the file `path` names.
    pub fn parse(path: &Path, text: &str) -> Result<ServiceConfig, ConfigError> {
        let at = |span: std::ops::Range<usize>, message: String| {
            let (line, column) = line_column(text, span.start);
            ConfigError {
                file: path.to_path_buf(),
                line,
                column,
                message,
            }
        };
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let message = e.message().trim().to_owned();
            match e.span() {
                Some(span) => at(span, message),
                None => at(0..0, message),
            }
        })?;
        let output = PathBuf::from(raw.output.get_ref());
        if !output.is_absolute() {
            return Err(at(
                raw.output.span(),
                format!("output must be an absolute path, not {:?}", output),
            ));
        }
        if let Err(why) = writable_dir(&output) {
            return Err(at(
                raw.output.span(),
                format!("output {} is not writable: {why}", output.display()),
            ));
        }
        // Only root (or the service's user) may be able to change any directory on the way:
        // another user who could would decide where root writes.
        if let Err(err) = crate::service::output::OutputRoot::check(&output) {
            return Err(at(raw.output.span(), format!("{err:#}")));
        }
        let max_disk = match &raw.max_disk {
            Some(v) => size(v).map_err(|m| at(v.span(), m))?,
            None => u64::MAX,
        };
        let min_free = match &raw.min_free {
            Some(v) => parse_min_free(v.get_ref()).map_err(|m| at(v.span(), m))?,
            None => MinFree::Percent(5.0),
        };
        let stop_timeout = match &raw.stop_timeout {
            Some(v) => match parse_duration(v.get_ref()) {
                Ok(d) if d <= MAX_STOP_TIMEOUT => d,
                Ok(_) => {
                    return Err(at(
                        v.span(),
                        format!("stop_timeout {:?} is longer than an hour", v.get_ref()),
                    ))
                }
                Err(m) => return Err(at(v.span(), m)),
            },
            None => DEFAULT_STOP_TIMEOUT,
        };
        if raw.targets.is_empty() {
            return Err(at(
                0..0,
                "no [[target]]: name at least one program to trace".into(),
            ));
        }
        let mut targets: Vec<TargetConfig> = Vec::new();
        for t in &raw.targets {
            let target = target(t.get_ref()).map_err(|(span, m)| at(span, m))?;
            if targets.iter().any(|o| o.name == target.name) {
                let span = t.get_ref().name.as_ref().map_or(t.span(), |n| n.span());
                return Err(at(
                    span,
                    format!(
                        "two targets are named {:?}: give one a distinct `name`",
                        target.name
                    ),
                ));
            }
            targets.push(target);
        }
        let export = match &raw.export {
            Some(e) => Some(export::export(e.get_ref()).map_err(|(span, m)| {
                // Errors about the section as a whole point at it.
                at(if span == (0..0) { e.span() } else { span }, m)
            })?),
            None => None,
        };
        Ok(ServiceConfig {
            path: path.to_path_buf(),
            output,
            max_disk,
            min_free,
            stop_timeout,
            targets,
            export,
        })
    }
}

/// `r`, its error located at `v`.
fn located<T>(v: &Spanned<String>, r: Result<T, String>) -> Located<T> {
    r.map_err(|m| (v.span(), m))
}

/// Validates one target.
fn target(raw: &RawTarget) -> Located<TargetConfig> {
    let binary = raw.binary.get_ref().clone();
    if binary.is_empty() {
        return Err((raw.binary.span(), "binary is empty".into()));
    }
    if !binary.starts_with('/') {
        return Err((
            raw.binary.span(),
            format!("binary must be an absolute path or glob, not {binary:?}"),
        ));
    }
    if let Err(e) = globset::Glob::new(&binary) {
        return Err((raw.binary.span(), format!("bad glob {binary:?}: {e}")));
    }
    let name = match &raw.name {
        Some(n) => {
            let name = n.get_ref().clone();
            if name.is_empty()
                || name.len() > 64
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                || name.starts_with('.')
            {
                return Err((
                    n.span(),
                    format!(
                        "name {name:?}: use 1 to 64 letters, digits, '-', '_' or '.' (not first)"
                    ),
                ));
            }
            name
        }
        None => default_name(&binary),
    };
    // Each pattern on its own, so that the error points at the bad one.
    for p in raw
        .functions
        .iter()
        .chain(&raw.exclude)
        .chain(&raw.trigger_functions)
    {
        located(
            p,
            FunctionFilter::new(std::slice::from_ref(p.get_ref()), &[])
                .map(drop)
                .map_err(|e| format!("{e:#}")),
        )?;
    }
    let strings = |v: &[Spanned<String>]| v.iter().map(|s| s.get_ref().clone()).collect();
    let duration = |v: &Option<Spanned<String>>, default: Duration| -> Located<Duration> {
        match v {
            Some(v) => located(v, parse_duration(v.get_ref())),
            None => Ok(default),
        }
    };
    let size_or = |v: &Option<Spanned<String>>, default: u64| -> Located<u64> {
        match v {
            Some(v) => size(v).map_err(|m| (v.span(), m)),
            None => Ok(default),
        }
    };
    let exits = match &raw.exits {
        None => ExitMode::Auto,
        Some(v) => match v.get_ref().as_str() {
            "auto" => ExitMode::Auto,
            "per-function" => ExitMode::PerFunction,
            "sleds" => ExitMode::Sleds,
            "return" => ExitMode::Return,
            "repair" => ExitMode::Repair,
            other => {
                return Err((
                    v.span(),
                    format!("exits must be \"auto\", \"per-function\", \"sleds\", \"return\" or \"repair\", not {other:?}"),
                ))
            }
        },
    };
    let int = |v: &Option<Spanned<i64>>,
               default: i64,
               range: std::ops::RangeInclusive<i64>,
               what: &str| {
        match v {
            None => Ok(default),
            Some(v) if range.contains(v.get_ref()) => Ok(*v.get_ref()),
            Some(v) => Err((
                v.span(),
                format!(
                    "{what} must be between {} and {}, not {}",
                    range.start(),
                    range.end(),
                    v.get_ref()
                ),
            )),
        }
    };
    let args = int(&raw.args, 1, 0..=6, "args")? as u8;
    let max_event_bytes = int(
        &raw.max_event_bytes,
        i64::from(profiler_common::DEFAULT_MAX_EVENT_BYTES),
        0..=i64::from(profiler_common::MAX_EVENT_BYTES),
        "max_event_bytes",
    )? as u32;
    let fdr_version = match int(&raw.fdr_version, 1, 1..=5, "fdr_version")? {
        1 => FdrVersion::V1,
        5 => FdrVersion::V5,
        _ => {
            let v = raw.fdr_version.as_ref().map_or(0..0, |v| v.span());
            return Err((v, "fdr_version must be 1 or 5".into()));
        }
    };
    let max_overhead = match &raw.max_overhead {
        None => Some(DEFAULT_MAX_OVERHEAD),
        Some(v) if v.get_ref().trim() == "none" => None,
        Some(v) => Some(
            crate::budget::parse_percent(v.get_ref())
                .map_err(|e| (v.span(), format!("max_overhead: {e} (or \"none\")")))?,
        ),
    };
    let engine = raw
        .engine
        .as_ref()
        .map_or(TargetEngine::Uprobes, |e| *e.get_ref());
    // The inline engine observes every exit at its patched sled, and has no probe a budget
    // could remove (yet).
    let ring_size = size_or(&raw.ring_size, DEFAULT_RING_SIZE)?;
    if let Some(v) = &raw.ring_size {
        if engine != TargetEngine::Inline {
            return Err((
                v.span(),
                "ring_size is the inline engine's: engine = \"inline\" uses it".into(),
            ));
        }
        if !ring_size.is_power_of_two() || !(MIN_RING_SIZE..=MAX_RING_SIZE).contains(&ring_size) {
            return Err((
                v.span(),
                format!("ring_size must be a power of two from {MIN_RING_SIZE} to {MAX_RING_SIZE} bytes (\"64KiB\" to \"1GiB\"), not {ring_size}"),
            ));
        }
    }
    let max_overhead = if engine == TargetEngine::Inline {
        let not_sleds = !matches!(exits, ExitMode::Auto | ExitMode::Sleds);
        if let Some(v) = raw.exits.as_ref().filter(|_| not_sleds) {
            return Err((
                v.span(),
                "engine = \"inline\" observes every exit at its patched sled: exits must be \"auto\" or \"sleds\"".into(),
            ));
        }
        if let Some(v) = raw.max_overhead.as_ref().filter(|_| max_overhead.is_some()) {
            return Err((
                v.span(),
                "max_overhead budgets uprobes: not with engine = \"inline\" (or \"none\")".into(),
            ));
        }
        None
    } else {
        max_overhead
    };
    let window = duration(&raw.window, DEFAULT_WINDOW)?;
    if window.is_zero() {
        let span = raw.window.as_ref().map_or(0..0, |w| w.span());
        return Err((span, "window must be longer than 0".into()));
    }
    let trigger_slower_than = match &raw.trigger_slower_than {
        Some(v) => Some(located(v, parse_duration(v.get_ref()))?),
        None => None,
    };
    if trigger_slower_than.is_none() && !raw.trigger_functions.is_empty() {
        return Err((
            raw.trigger_functions[0].span(),
            "trigger_functions needs trigger_slower_than".into(),
        ));
    }
    Ok(TargetConfig {
        name,
        binary,
        mode: raw
            .mode
            .as_ref()
            .map_or(Mode::FlightRecorder, |m| *m.get_ref()),
        window,
        max_memory: size_or(&raw.max_memory, DEFAULT_MAX_MEMORY)?,
        functions: strings(&raw.functions),
        exclude: strings(&raw.exclude),
        exits,
        engine,
        ring_size,
        args,
        max_event_bytes,
        fdr_version,
        trigger_slower_than,
        trigger_functions: strings(&raw.trigger_functions),
        crash_snapshot_interval: duration(
            &raw.crash_snapshot_interval,
            DEFAULT_CRASH_SNAPSHOT_INTERVAL,
        )?,
        segment_bytes: size_or(&raw.segment_size, DEFAULT_SEGMENT_BYTES)?,
        segment_age: duration(&raw.segment_age, DEFAULT_SEGMENT_AGE)?,
        max_overhead,
    })
}

/// The name of a target given by `binary` alone: its file name, made safe for a directory.
fn default_name(binary: &str) -> String {
    let file = binary.rsplit('/').next().unwrap_or(binary);
    let name: String = file
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    match name.trim_start_matches('.') {
        "" => "target".to_owned(),
        n => n.to_owned(),
    }
}

/// A size such as `2GiB`, `512 MiB` or `1000000`.
fn size(v: &Spanned<String>) -> Result<u64, String> {
    v.get_ref()
        .trim()
        .parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|_| {
            format!(
                "{:?} is not a size (write e.g. \"2GiB\", \"500MB\" or a number of bytes)",
                v.get_ref()
            )
        })
}

/// `5%` or a size.
fn parse_min_free(text: &str) -> Result<MinFree, String> {
    if let Some(p) = text.trim().strip_suffix('%') {
        return match p.trim().parse::<f64>() {
            Ok(p) if (0.0..100.0).contains(&p) => Ok(MinFree::Percent(p)),
            _ => Err(format!("{text:?} is not a percentage below 100")),
        };
    }
    text.trim()
        .parse::<bytesize::ByteSize>()
        .map(|b| MinFree::Bytes(b.as_u64()))
        .map_err(|_| format!("{text:?} is neither a percentage (\"5%\") nor a size (\"10GiB\")"))
}

/// Whether the service could write under `dir`: it exists as a directory it can write, or its
/// nearest existing ancestor is one (the service creates the rest).
fn writable_dir(dir: &Path) -> Result<(), String> {
    let mut at = dir;
    loop {
        match std::fs::symlink_metadata(at) {
            Ok(meta) if meta.is_dir() => break,
            Ok(_) => return Err(format!("{} is not a directory", at.display())),
            Err(_) => match at.parent() {
                Some(parent) => at = parent,
                None => return Err("no existing ancestor".into()),
            },
        }
    }
    let c = std::ffi::CString::new(at.as_os_str().as_encoded_bytes())
        .map_err(|_| "a NUL byte in the path".to_owned())?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        return Err(format!(
            "{}: {}",
            at.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// 1-based line and column (in characters) of byte `offset` of `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..text.floor_char_boundary(offset)];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests;
