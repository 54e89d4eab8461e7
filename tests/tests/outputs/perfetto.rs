//! Perfetto's own format: a recording too large for a JSON timeline writes
//! `trace.perfetto-trace`, and every packet of it decodes with the protos of Perfetto's own
//! Python package (`perfetto` from PyPI, its generated `perfetto_trace_pb2`, installed by
//! `cargo xtask setup`): one track per process and per thread, slices that nest on each
//! thread's track, every begin with its end, times that never go back, and per thread as many
//! slices of each function as the program counted calls and `report` counts.
//!
//! The recording's FDR files are read by llvm-xray 14 and 19 too.
//!
//! Needs root, BPF, clang-19, llvm-xray 14/19, python3 with the `perfetto` package and a built
//! daemon.
use std::process::Command;
use std::time::Duration;

use tests::counts::{expected_calls, parse_count_lines};
use tests::fixtures::workloads::calls_fixture;
use tests::launched::launch;

/// Where `cargo xtask setup` installs Perfetto's Python package.
fn perfetto_py() -> std::path::PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| "/root".into(), std::path::PathBuf::from);
    let dir = home.join(".cache/fdr-profiled/perfetto-py");
    assert!(
        dir.join("perfetto/protos/perfetto/trace/perfetto_trace_pb2.py")
            .is_file(),
        "Perfetto's Python package is not in {}: run `cargo xtask setup`",
        dir.display()
    );
    dir
}

/// Decodes a Perfetto trace with Perfetto's own protos; prints what it found as JSON.
const DECODE: &str = r#"
import collections, json, sys
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
trace = pb.Trace()
with open(sys.argv[1], "rb") as f:
    trace.ParseFromString(f.read())
threads, processes, names = {}, {}, {}
stacks = collections.defaultdict(list)
last = {}
slices = collections.Counter()
problems = []
for p in trace.packet:
    seq = p.trusted_packet_sequence_id
    if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
        names[seq] = {}
    for n in p.interned_data.event_names:
        names.setdefault(seq, {})[n.iid] = n.name
    if p.HasField("track_descriptor"):
        d = p.track_descriptor
        if d.HasField("thread"):
            threads[d.uuid] = d.thread.tid
            if d.parent_uuid not in processes:
                problems.append("thread %d before its process" % d.thread.tid)
        elif d.HasField("process"):
            processes[d.uuid] = d.process.pid
    if not p.HasField("track_event"):
        continue
    e = p.track_event
    track = e.track_uuid
    if track not in threads:
        problems.append("event on an undescribed track %d" % track)
        continue
    if p.timestamp < last.get(track, 0):
        problems.append("time goes back on track %d at %d" % (track, p.timestamp))
    last[track] = p.timestamp
    if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
        name = names.get(seq, {}).get(e.name_iid)
        if name is None:
            problems.append("name %d not interned on sequence %d" % (e.name_iid, seq))
        stacks[track].append(name)
    elif e.type == pb.TrackEvent.TYPE_SLICE_END:
        if not stacks[track]:
            problems.append("an end without its begin on track %d" % track)
            continue
        slices["%d %s" % (threads[track], stacks[track].pop())] += 1
print(json.dumps({
    "packets": len(trace.packet),
    "processes": sorted(processes.values()),
    "threads": sorted(threads.values()),
    "open": sum(len(s) for s in stacks.values()),
    "problems": problems[:20],
    "slices": slices,
}))
"#;

#[test]
fn a_recording_too_large_for_json_has_a_perfetto_timeline_perfetto_s_protos_decode() {
    // 1,100,000 calls of the tiny function and a few others: 2.2M events, above the JSON limit.
    let run = launch(
        "perfetto",
        &calls_fixture(),
        &[],
        &["--iterations", "1100000"],
        Duration::from_secs(600),
    );
    let stderr = &run.done.stderr;
    assert_eq!(run.session.events_lost, 0, "{stderr}");
    assert!(run.session.events > 2_000_000, "{}", run.session.events);
    // The trace files themselves, as the reference readers take them.
    run.account_all(&[]);
    let trace = run.out.join("trace.perfetto-trace");
    assert!(
        stderr.contains("trace.perfetto-trace (Perfetto's format"),
        "{stderr}"
    );
    assert!(!run.out.join("trace.json").exists());
    // `convert` writes the same bytes.
    let converted = run.scratch.path().join("converted.perfetto-trace");
    let out = tests::tools::run_output(
        Command::new(tests::fdr_profiled())
            .arg("convert")
            .arg(&run.out)
            .args(["--format", "perfetto", "-o"])
            .arg(&converted),
    );
    assert!(out.status.success(), "{out:?}");
    assert!(
        std::fs::read(&trace).unwrap() == std::fs::read(&converted).unwrap(),
        "convert --format perfetto and the recording's timeline differ"
    );

    let decoded = tests::tools::run_output(
        Command::new("python3")
            .arg("-c")
            .arg(DECODE)
            .arg(&trace)
            .env("PYTHONPATH", perfetto_py()),
    );
    assert!(decoded.status.success(), "{decoded:?}");
    let found: serde_json::Value = serde_json::from_slice(&decoded.stdout).unwrap();
    assert_eq!(found["problems"], serde_json::json!([]), "{found}");
    assert_eq!(found["open"], 0, "every begin has its end: {found}");
    // Each thread's slices per function: the program's own counts, and `report`'s.
    let counted = expected_calls(&parse_count_lines(&run.done.stdout));
    let tids: Vec<u32> = counted.keys().copied().collect();
    assert_eq!(found["threads"], serde_json::json!(tids), "{found}");
    assert_eq!(found["processes"].as_array().unwrap().len(), 1, "{found}");
    let slices = found["slices"].as_object().unwrap();
    for (tid, functions) in &counted {
        for (function, n) in functions {
            assert_eq!(
                slices
                    .get(&format!("{tid} {function}"))
                    .and_then(|v| v.as_u64()),
                Some(*n),
                "thread {tid} {function}: {found}"
            );
        }
    }
    let (report, _) = tests::synthetic_session::report_json(&run.out, &[]);
    let functions = report["functions"].as_array().unwrap();
    assert!(!functions.is_empty(), "{report}");
    for f in functions {
        let name = f["name"].as_str().unwrap();
        let sliced: u64 = slices
            .iter()
            .filter(|(k, _)| k.split_once(' ').is_some_and(|(_, n)| n == name))
            .map(|(_, v)| v.as_u64().unwrap())
            .sum();
        assert_eq!(Some(sliced), f["calls"].as_u64(), "{name}: {f}");
    }
    eprintln!(
        "perfetto: {} events, {} packets, {} bytes",
        run.session.events,
        found["packets"],
        std::fs::metadata(&trace).unwrap().len()
    );
}
