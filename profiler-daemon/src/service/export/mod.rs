//! `[export]`: every `interval`, the calls of each traced process that returned in it, as one
//! pprof profile per process, pushed where operators already look (Grafana Pyroscope's push
//! API; OTLP profiles to an OpenTelemetry Collector).
//!
//! - [`stacks`]: each binary's calls aggregated by interval, process and call stack, as the
//!   events are routed (exact intervals, bounded memory).
//! - [`push`]: a bounded queue per endpoint and the thread that sends it; nothing here ever
//!   waits for an endpoint.
//! - [`otlp`]: the profile re-encoded as OTLP profiles, for an OpenTelemetry Collector.
//!
//! A profile carries the same three sample types as `convert --format pprof` (calls, wall and
//! self time per stack) and the labels `service_name` (the target's name), `hostname`, `pid`,
//! `binary` and `build_id`.
pub mod otlp;
pub mod push;
pub mod stacks;

use crate::service::config::ExportConfig;
use base64::Engine as _;
use fdr_analysis::convert::pprof::{gzipped, FrameInfo, ObjectInfo, ProfileBuilder};
use fdr_analysis::replay::FUNCTION_ID_MASK;
use fdr_analysis::symbolize::ObjectSymbols;
use push::{Payload, PushCounts, Pusher};
use stacks::{CallStacks, Interval};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How long after an interval's end its profile waits for late events (those of calls that
/// returned before the end but were drained after it).
pub const GRACE: Duration = Duration::from_secs(1);
/// The Pyroscope push API's path (Connect protocol, JSON).
const PYROSCOPE_PUSH_PATH: &str = "/push.v1.PusherService/Push";
/// `__name__` of our series in Pyroscope: its profile types are `fdr_calls:<sample type>`.
pub const PYROSCOPE_PROFILE_NAME: &str = "fdr_calls";

/// One binary's side of the export: its calls, and how to name its functions.
pub struct BinaryExport {
    /// The calls, by interval.
    pub stacks: CallStacks,
    /// Object files by XRay object id (0: the executable), loaded when first named.
    symbols: HashMap<u32, Option<Arc<ObjectSymbols>>>,
}

impl BinaryExport {
    /// Aggregates over `interval`.
    pub fn new(interval: Duration) -> BinaryExport {
        BinaryExport {
            stacks: CallStacks::new(interval.as_nanos() as u64, realtime_offset_ns()),
            symbols: HashMap::new(),
        }
    }
}

/// Realtime minus monotonic, now (ns).
fn realtime_offset_ns() -> i128 {
    let now = |clock| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec; both clocks exist on Linux.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
    };
    now(libc::CLOCK_REALTIME) - now(libc::CLOCK_MONOTONIC)
}

/// What a binary's profiles say about it.
pub struct BinaryLabels<'a> {
    /// The target's name.
    pub service_name: &'a str,
    /// The executable's path and build-id.
    pub binary: &'a str,
    pub build_id: &'a str,
    /// Object files by XRay object id: the path to read each one's symbols from.
    pub objects: &'a dyn Fn(u32) -> Option<PathBuf>,
}

/// The endpoints, and what was sent.
pub struct Exporter {
    hostname: String,
    pyroscope: Option<Pusher>,
    otlp: Option<Pusher>,
    /// Profiles made, and calls left out of them (beyond the memory bounds).
    pub profiles: u64,
}

impl Exporter {
    /// Starts a sender per configured endpoint.
    pub fn start(config: &ExportConfig) -> anyhow::Result<Exporter> {
        let mut headers = Vec::new();
        if let Some(tenant) = &config.tenant {
            headers.push(("X-Scope-OrgID".to_owned(), tenant.clone()));
        }
        if let Some((user, password)) = &config.basic_auth {
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            headers.push(("Authorization".to_owned(), format!("Basic {token}")));
        }
        let pyroscope = match &config.pyroscope {
            Some(endpoint) => {
                let mut h = headers.clone();
                h.push(("Connect-Protocol-Version".to_owned(), "1".to_owned()));
                Some(Pusher::start("pyroscope", endpoint, h, config.queue)?)
            }
            None => None,
        };
        let otlp = match &config.otlp {
            Some(endpoint) => Some(Pusher::start("otlp", endpoint, headers, config.queue)?),
            None => None,
        };
        Ok(Exporter {
            hostname: hostname(),
            pyroscope,
            otlp,
            profiles: 0,
        })
    }

    /// Makes and queues the profiles of `export`'s intervals that are over (every interval
    /// when `all`, at the service's stop).
    pub fn tick(&mut self, export: &mut BinaryExport, labels: &BinaryLabels<'_>, all: bool) {
        let now = crate::session::monotonic_ns();
        for interval in export
            .stacks
            .take_finished(now, GRACE.as_nanos() as u64, all)
        {
            let profile = profile_of(export, &interval, labels);
            self.profiles += 1;
            if let Some(p) = &self.pyroscope {
                p.push(pyroscope_payload(
                    &profile,
                    &interval,
                    labels,
                    &self.hostname,
                ));
            }
            if let Some(p) = &self.otlp {
                let resource = otlp::ResourceLabels {
                    service_name: labels.service_name,
                    host_name: &self.hostname,
                    pid: interval.pid,
                    executable: labels.binary,
                    build_id: labels.build_id,
                };
                p.push(Payload {
                    path: otlp::PATH,
                    content_type: "application/x-protobuf",
                    body: otlp::request(&profile, &resource),
                    what: format!(
                        "the profiles of target {} process {} from {} s",
                        labels.service_name,
                        interval.pid,
                        interval.start_unix_ns / 1_000_000_000
                    ),
                });
            }
        }
    }

    /// `status --json`'s `export`.
    pub fn status(&self) -> serde_json::Value {
        let endpoint = |p: &Option<Pusher>| {
            p.as_ref().map(|p| {
                serde_json::json!({
                    "counts": p.counts(),
                    "last_error": p.last_error(),
                })
            })
        };
        serde_json::json!({
            "profiles": self.profiles,
            "pyroscope": endpoint(&self.pyroscope),
            "otlp": endpoint(&self.otlp),
        })
    }

    /// Sends what is left for at most `within`; returns one line for the log.
    pub fn finish(self, within: Duration) -> String {
        let mut parts = vec![format!("{} profiles made", self.profiles)];
        for p in [self.pyroscope, self.otlp].into_iter().flatten() {
            let name = p.name();
            let c: PushCounts = p.finish(within);
            parts.push(format!(
                "{name}: {} pushed, {} dropped (queue full or stopped), {} refused, {} failed attempts",
                c.pushed, c.dropped, c.rejected, c.failed_attempts
            ));
        }
        format!("export: {}", parts.join("; "))
    }
}

/// The pprof profile of one interval of one process.
fn profile_of(
    export: &mut BinaryExport,
    interval: &Interval,
    labels: &BinaryLabels<'_>,
) -> fdr_analysis::convert::pprof::proto::Profile {
    let mut builder: ProfileBuilder<u32> = ProfileBuilder::default();
    let mut nodes: Vec<(&u32, &fdr_analysis::convert::pprof::StackValues)> =
        interval.calls.iter().collect();
    nodes.sort_unstable_by_key(|(n, _)| **n);
    for (&node, &values) in nodes {
        let mut locations = Vec::new();
        for function_id in export.stacks.stack(node).collect::<Vec<_>>() {
            let symbols = &mut export.symbols;
            locations
                .push(builder.location(function_id, || frame_info(symbols, labels, function_id)));
        }
        builder.sample(locations, values, &[]);
    }
    let comments = [format!(
        "fdr-profiled service: target {}, process {}",
        labels.service_name, interval.pid
    )];
    builder.finish(
        i64::try_from(interval.start_unix_ns).unwrap_or(i64::MAX),
        i64::try_from(interval.length_ns).unwrap_or(i64::MAX),
        &comments,
    )
}

/// A function of the binary's objects, named from its object's symbols (loaded once).
fn frame_info(
    symbols: &mut HashMap<u32, Option<Arc<ObjectSymbols>>>,
    labels: &BinaryLabels<'_>,
    function_id: u32,
) -> FrameInfo {
    let object_id = function_id >> 24;
    let path = (labels.objects)(object_id);
    let loaded = symbols
        .entry(object_id)
        .or_insert_with(|| {
            let path = path.as_ref()?;
            match ObjectSymbols::load(path, &[]) {
                Ok(s) => Some(Arc::new(s)),
                Err(err) => {
                    tracing::warn!("export: {}: functions named by id: {err:#}", path.display());
                    None
                }
            }
        })
        .clone();
    let object = ObjectInfo::new(
        match object_id {
            0 => labels.binary.to_owned(),
            _ => path.map(|p| p.display().to_string()).unwrap_or_default(),
        },
        loaded.as_deref(),
    );
    match loaded {
        Some(s) => FrameInfo::of_function(&s.function(function_id & FUNCTION_ID_MASK), object),
        None => FrameInfo {
            name: format!("#{function_id}"),
            object,
            ..FrameInfo::default()
        },
    }
}

/// The Pyroscope push request (`push.v1.PushRequest`, Connect's JSON encoding) for one profile:
/// one series with our labels and the gzipped pprof as its raw profile.
fn pyroscope_payload(
    profile: &fdr_analysis::convert::pprof::proto::Profile,
    interval: &Interval,
    labels: &BinaryLabels<'_>,
    hostname: &str,
) -> Payload {
    let label = |name: &str, value: &str| serde_json::json!({ "name": name, "value": value });
    let pid = interval.pid.to_string();
    let body = serde_json::json!({
        "series": [{
            "labels": [
                label("__name__", PYROSCOPE_PROFILE_NAME),
                label("service_name", labels.service_name),
                label("hostname", hostname),
                label("pid", &pid),
                label("binary", labels.binary),
                label("build_id", labels.build_id),
            ],
            "samples": [{
                "rawProfile": base64::engine::general_purpose::STANDARD.encode(gzipped(profile)),
                "ID": sample_id(hostname, interval),
            }],
        }],
    });
    Payload {
        path: PYROSCOPE_PUSH_PATH,
        content_type: "application/json",
        body: body.to_string().into_bytes(),
        what: format!(
            "the profile of target {} process {} from {} s",
            labels.service_name,
            interval.pid,
            interval.start_unix_ns / 1_000_000_000
        ),
    }
}

/// The push's sample id, in UUID form: the same for a profile sent again after a failure (the
/// host, the process and the interval hashed), so a back end can tell a retry from new data.
fn sample_id(hostname: &str, interval: &Interval) -> String {
    use std::hash::{Hash, Hasher};
    let half = |salt: u64| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (salt, hostname, interval.pid, interval.start_unix_ns).hash(&mut h);
        h.finish()
    };
    let (a, b) = (half(1), half(2));
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

/// This host's name (`hostname` label, OTLP's `host.name`).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}
