//! The service's `[export]` to Pyroscope's push API, received by a local HTTP receiver and
//! decoded with the real consumer: each push is a `push.v1.PushRequest` (JSON) whose raw
//! profile `go tool pprof` reads.
//!
//! - Labels: `service_name` (the target), `hostname`, `pid`, `binary`, `build_id`.
//! - Intervals: each profile starts on a multiple of the 1 s interval and lasts one interval;
//!   a process's profiles cover distinct intervals within its run.
//! - Numbers: per function, the calls of a process summed over its profiles equal what the
//!   process counted.
//! - An endpoint that goes away: tracing goes on (the status counts every event of the runs
//!   made meanwhile), the queue stays at its bound and the oldest profiles are dropped and
//!   counted; when it is back, pushing resumes and every profile made is accounted for as
//!   pushed, dropped or queued.
//!
//! Needs root, BPF, clang-19, golang-go and a built daemon.
use base64::Engine as _;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tests::counts::{expected_calls, parse_count_lines};
use tests::fixtures::private_copy;
use tests::fixtures::workloads::calls_fixture;
use tests::pprof::{go_pprof, top};
use tests::receiver::{Receiver, Request};
use tests::run::Running;
use tests::service::{service_status, ServiceStart};
use tests::synthetic_session::build_id;

const TIMEOUT: Duration = Duration::from_secs(60);
const INTERVAL_NS: u64 = 1_000_000_000;
const QUEUE: usize = 2;

/// One decoded push.
#[derive(Debug)]
struct Push {
    labels: BTreeMap<String, String>,
    /// Calls per function, from `go tool pprof -top -sample_index=calls`.
    calls: BTreeMap<String, u64>,
    time_ns: u64,
    duration_ns: u64,
}

fn decode(r: &Request, scratch: &Path, n: usize) -> Push {
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/push.v1.PusherService/Push");
    assert_eq!(
        r.headers.get("content-type").map(String::as_str),
        Some("application/json")
    );
    assert_eq!(
        r.headers.get("x-scope-orgid").map(String::as_str),
        Some("fleet-test")
    );
    let json: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    let series = json["series"].as_array().unwrap();
    assert_eq!(series.len(), 1, "{json}");
    let labels: BTreeMap<String, String> = series[0]["labels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap().to_owned(),
                l["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let samples = series[0]["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 1);
    let id = samples[0]["ID"].as_str().unwrap();
    assert!(
        id.len() == 36 && id.chars().filter(|&c| c == '-').count() == 4,
        "a UUID-shaped sample id: {id}"
    );
    let raw = base64::engine::general_purpose::STANDARD
        .decode(samples[0]["rawProfile"].as_str().unwrap())
        .unwrap();
    let file = scratch.join(format!("push-{n}.pb.gz"));
    std::fs::write(&file, raw).unwrap();
    let calls = top(&file, "calls")
        .into_iter()
        .filter(|(_, (flat, _))| *flat > 0)
        .map(|(name, (flat, _))| (name, flat))
        .collect();
    // The profile's start (`-raw`'s Time line) and duration (`-top`'s header, e.g.
    // `Duration: 1s, Total samples = ...`).
    let time_ns = go_pprof(&["-raw"], &file)
        .lines()
        .find_map(|l| l.strip_prefix("Time: "))
        .map(|t| unix_ns(t.trim()))
        .expect("a Time line");
    let duration_ns = go_pprof(&["-top", "-sample_index=calls"], &file)
        .lines()
        .find_map(|l| l.strip_prefix("Duration: "))
        .map(|d| go_duration_ns(d.split(',').next().unwrap().trim()))
        .expect("a Duration line");
    Push {
        labels,
        calls,
        time_ns,
        duration_ns,
    }
}

/// A duration as go prints it with one unit (`1s`, `36.39ms`), in ns.
fn go_duration_ns(d: &str) -> u64 {
    let split = d
        .find(|c: char| c.is_ascii_alphabetic() || c == '\u{b5}')
        .unwrap_or_else(|| panic!("no unit in {d:?}"));
    let (number, unit) = d.split_at(split);
    let scale = match unit {
        "ns" => 1.0,
        "us" | "\u{b5}s" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        other => panic!("unit {other:?} in {d:?}"),
    };
    (number
        .parse::<f64>()
        .unwrap_or_else(|e| panic!("{d:?}: {e}"))
        * scale)
        .round() as u64
}

/// `2026-11-25 15:47:10 +0000 UTC` (go's time format) in ns since the epoch.
fn unix_ns(stamp: &str) -> u64 {
    let out = Command::new("date")
        .args(["-u", "-d", stamp.trim_end_matches(" UTC"), "+%s%N"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{stamp}: {e}"))
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// Runs the calls fixture to its end: (pid, calls per function summed over its threads).
fn run_calls(bin: &Path, iterations: u32) -> (u32, BTreeMap<String, u64>) {
    let r = Running::spawn(
        "calls",
        Command::new(bin).args(["--iterations", &iterations.to_string()]),
    );
    let pid = r.pid();
    let done = r.finish(TIMEOUT);
    assert!(done.status.success());
    let mut total: BTreeMap<String, u64> = BTreeMap::new();
    for per_thread in expected_calls(&parse_count_lines(&done.stdout)).values() {
        for (f, n) in per_thread {
            *total.entry(f.clone()).or_default() += n;
        }
    }
    assert!(!total.is_empty(), "{}", done.stdout);
    // main is traced too; the fixture counts only the functions it calls.
    total.insert("main".to_owned(), 1);
    (pid, total)
}

/// Waits until `until` holds for the requests received, up to `within`.
fn wait_for(
    requests: &Arc<Mutex<Vec<Request>>>,
    within: Duration,
    what: &str,
    until: impl Fn(&[Request]) -> bool,
) {
    let deadline = Instant::now() + within;
    while !until(&requests.lock().unwrap()) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Per function, the calls of `pid` over all its pushes; checks the labels and intervals.
fn calls_of(pushes: &[Push], pid: u32, bin: &Path, ran: (u64, u64)) -> BTreeMap<String, u64> {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let mine: Vec<&Push> = pushes
        .iter()
        .filter(|p| p.labels.get("pid") == Some(&pid.to_string()))
        .collect();
    assert!(!mine.is_empty(), "no push for pid {pid}");
    let mut starts = Vec::new();
    let mut calls: BTreeMap<String, u64> = BTreeMap::new();
    for p in &mine {
        let want: BTreeMap<String, String> = [
            ("__name__", "fdr_calls".to_owned()),
            ("service_name", "calls".to_owned()),
            ("hostname", hostname.trim().to_owned()),
            ("pid", pid.to_string()),
            ("binary", bin.display().to_string()),
            ("build_id", build_id(bin)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(p.labels, want);
        assert_eq!(p.time_ns % INTERVAL_NS, 0, "{p:?}: on the interval's grid");
        assert_eq!(p.duration_ns, INTERVAL_NS, "{p:?}: one interval");
        assert!(
            p.time_ns + INTERVAL_NS >= ran.0 && p.time_ns <= ran.1,
            "{p:?}: within the run [{}, {}]",
            ran.0,
            ran.1
        );
        starts.push(p.time_ns);
        for (f, n) in &p.calls {
            *calls.entry(f.clone()).or_default() += n;
        }
    }
    let n = starts.len();
    starts.sort_unstable();
    starts.dedup();
    assert_eq!(starts.len(), n, "one profile per interval of the process");
    calls
}

/// Starts the service on the calls fixture `bin` as target `calls`, with `export` as its
/// `[export]` section; returns it ready, and its control socket.
fn start_exporting(scratch: &Path, bin: &Path, export: &str) -> (Running, std::path::PathBuf) {
    let start = ServiceStart::written(
        scratch,
        &format!(
            "output = \"{}\"\n[[target]]\nname = \"calls\"\nbinary = \"{}\"\n[export]\n{export}",
            scratch.join("out").display(),
            bin.display()
        ),
    );
    (start.start(), start.socket_path().to_path_buf())
}

#[test]
fn every_interval_is_pushed_to_pyroscope_and_an_absent_endpoint_never_stops_tracing() {
    let scratch = tests::scratch_dir("service-export");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let receiver = Receiver::start(0, requests.clone());
    let port = receiver.port;
    let (service, socket) = start_exporting(
        scratch.path(),
        &bin,
        &format!(
            "pyroscope = \"http://127.0.0.1:{port}\"\ninterval = \"1s\"\ntenant = \"fleet-test\"\nqueue = {QUEUE}\n"
        ),
    );

    // 1. Pushed, with the process's exact calls.
    let before = now_ns();
    let (pid1, counted1) = run_calls(&bin, 1000);
    let after = now_ns();
    let pid_pushes = |rs: &[Request], pid: u32| {
        rs.iter()
            .filter(|r| String::from_utf8_lossy(&r.body).contains(&format!("\"value\":\"{pid}\"")))
            .count()
    };
    // The process's last interval is pushed a grace second after it ends.
    wait_for(
        &requests,
        Duration::from_secs(10),
        "pid 1's profiles",
        |rs| pid_pushes(rs, pid1) > 0,
    );
    std::thread::sleep(Duration::from_millis(2500));
    let pushes: Vec<Push> = requests
        .lock()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, r)| decode(r, scratch.path(), i))
        .collect();
    let got = calls_of(&pushes, pid1, &bin, (before, after));
    assert_eq!(
        got, counted1,
        "calls per function, over the process's profiles"
    );
    let pushed_before_outage = requests.lock().unwrap().len();

    // 2. The endpoint goes away: processes keep being traced, the queue stays bounded.
    receiver.stop();
    let events_before = service_status(&socket)["events"].as_u64().unwrap();
    let mut runs = Vec::new();
    for _ in 0..5 {
        runs.push(run_calls(&bin, 200));
        std::thread::sleep(Duration::from_millis(1100));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let s = service_status(&socket);
    // Every run's events were routed: main, cx_loop, 200 cx_tiny, cx_report, entries and
    // exits (the thread's end is no event).
    assert_eq!(
        s["events"].as_u64().unwrap() - events_before,
        5 * (2 * 203),
        "tracing went on: {s}"
    );
    let counts = &s["export"]["pyroscope"]["counts"];
    assert!(counts["failed_attempts"].as_u64().unwrap() >= 1, "{s}");
    assert!(
        counts["queued"].as_u64().unwrap() <= QUEUE as u64,
        "the queue stays at its bound: {s}"
    );
    assert!(
        counts["dropped"].as_u64().unwrap() >= 1,
        "five intervals' profiles into a queue of {QUEUE}: the oldest dropped: {s}"
    );
    assert!(s["export"]["pyroscope"]["last_error"].is_string(), "{s}");

    // 3. Back: the held profiles are pushed (the newest, the oldest having been dropped).
    let receiver = Receiver::start(port, requests.clone());
    wait_for(
        &requests,
        Duration::from_secs(40),
        "the pushes after the endpoint came back",
        |rs| rs.len() > pushed_before_outage,
    );
    let last_pid = runs.last().unwrap().0;
    wait_for(
        &requests,
        Duration::from_secs(40),
        "the last run's profile",
        |rs| pid_pushes(rs, last_pid) > 0,
    );
    std::thread::sleep(Duration::from_millis(500));
    let s = service_status(&socket);
    let counts = &s["export"]["pyroscope"]["counts"];
    let made = s["export"]["profiles"].as_u64().unwrap();
    let accounted = ["pushed", "dropped", "queued", "rejected"]
        .iter()
        .map(|k| counts[k].as_u64().unwrap())
        .sum::<u64>();
    assert_eq!(
        made, accounted,
        "every profile made is pushed, dropped or queued: {s}"
    );
    assert_eq!(
        counts["pushed"].as_u64().unwrap() as usize,
        requests.lock().unwrap().len(),
        "{s}"
    );
    // The last run's profiles, received after the outage, hold its exact calls.
    let pushes: Vec<Push> = requests
        .lock()
        .unwrap()
        .iter()
        .enumerate()
        .skip(pushed_before_outage)
        .map(|(i, r)| decode(r, scratch.path(), i))
        .collect();
    let (last_pid, last_counted) = runs.last().unwrap();
    let got = calls_of(&pushes, *last_pid, &bin, (before, now_ns()));
    assert_eq!(&got, last_counted);

    // 4. The end: a last line accounts for every profile.
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    let line = done
        .stderr
        .lines()
        .find(|l| l.contains("export: "))
        .unwrap_or_else(|| panic!("no export line:\n{}", done.stderr));
    assert!(
        line.contains("profiles made") && line.contains("pushed"),
        "{line}"
    );
    receiver.stop();
}

/// One OTLP request, decoded with the OpenTelemetry proto definitions: the resource's
/// attributes, and per profile (sample type) its start, duration and the values summed by
/// leaf function.
struct OtlpPush {
    resource: BTreeMap<String, String>,
    profiles: BTreeMap<String, (u64, u64, BTreeMap<String, i64>)>,
}

fn decode_otlp(r: &Request) -> OtlpPush {
    use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use prost::Message as _;
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/v1development/profiles");
    assert_eq!(
        r.headers.get("content-type").map(String::as_str),
        Some("application/x-protobuf")
    );
    let req = ExportProfilesServiceRequest::decode(&r.body[..]).expect("an OTLP profiles request");
    let dict = req.dictionary.expect("a dictionary");
    let s = |i: i32| dict.string_table[i as usize].clone();
    // Each table starts with its zero value.
    assert_eq!(s(0), "");
    assert_eq!(dict.function_table[0], Default::default());
    assert_eq!(dict.stack_table[0], Default::default());
    assert_eq!(req.resource_profiles.len(), 1);
    let rp = &req.resource_profiles[0];
    let resource = rp
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                other => panic!("{}: {other:?}", kv.key),
            };
            (kv.key.clone(), v)
        })
        .collect();
    let mut profiles = BTreeMap::new();
    for sp in &rp.scope_profiles {
        assert_eq!(sp.scope.as_ref().unwrap().name, "fdr-profiled");
        for p in &sp.profiles {
            let t = p.sample_type.as_ref().unwrap();
            let mut by_leaf: BTreeMap<String, i64> = BTreeMap::new();
            for sample in &p.samples {
                let stack = &dict.stack_table[sample.stack_index as usize];
                let leaf = &dict.location_table[stack.location_indices[0] as usize];
                let f = &dict.function_table[leaf.lines[0].function_index as usize];
                *by_leaf.entry(s(f.name_strindex)).or_default() += sample.values[0];
            }
            profiles.insert(
                format!("{}/{}", s(t.type_strindex), s(t.unit_strindex)),
                (p.time_unix_nano, p.duration_nano, by_leaf),
            );
        }
    }
    OtlpPush { resource, profiles }
}

#[test]
fn every_interval_is_exported_as_otlp_profiles() {
    let scratch = tests::scratch_dir("service-export-otlp");
    let bin = private_copy(&calls_fixture(), scratch.path());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let receiver = Receiver::start(0, requests.clone());
    let (service, _) = start_exporting(
        scratch.path(),
        &bin,
        &format!(
            "otlp = \"http://127.0.0.1:{}\"\ninterval = \"1s\"\n",
            receiver.port
        ),
    );
    let (pid, counted) = run_calls(&bin, 1000);
    // Everything of the run is in once the interval after its end is pushed.
    std::thread::sleep(Duration::from_millis(3500));
    service.signal(libc::SIGTERM);
    let done = service.finish(TIMEOUT);
    assert!(done.status.success(), "{}", done.stderr);
    receiver.stop();

    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let mut calls: BTreeMap<String, i64> = BTreeMap::new();
    let mut pushes = 0;
    for r in requests.lock().unwrap().iter() {
        let push = decode_otlp(r);
        if push.resource.get("process.pid") != Some(&pid.to_string()) {
            continue;
        }
        pushes += 1;
        let want: BTreeMap<String, String> = [
            ("service.name", "calls".to_owned()),
            ("host.name", hostname.trim().to_owned()),
            ("process.pid", pid.to_string()),
            ("process.executable.path", bin.display().to_string()),
            ("process.executable.build_id.gnu", build_id(&bin)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(push.resource, want);
        assert_eq!(
            push.profiles.keys().collect::<Vec<_>>(),
            ["calls/count", "self/nanoseconds", "wall/nanoseconds"]
        );
        for (start, duration, _) in push.profiles.values() {
            assert_eq!(start % INTERVAL_NS, 0, "on the interval's grid");
            assert_eq!(*duration, INTERVAL_NS);
        }
        for (f, n) in &push.profiles["calls/count"].2 {
            *calls.entry(f.clone()).or_default() += n;
        }
        let wall: i64 = push.profiles["wall/nanoseconds"].2.values().sum();
        assert!(wall > 0, "wall time in every profile");
    }
    assert!(pushes > 0, "no OTLP push for pid {pid}");
    let counted: BTreeMap<String, i64> = counted.into_iter().map(|(k, v)| (k, v as i64)).collect();
    assert_eq!(
        calls, counted,
        "calls per leaf function over the process's profiles"
    );
}
