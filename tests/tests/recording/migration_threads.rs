//! End to end: TWO threads hop between CPUs at the same time (the C fixture's `--threads 2
//! --hops-each N`: both loop threads meet at a barrier, then each makes N steps, step `i` of
//! thread `t` moving it with `sched_setaffinity` to the `(i + t) mod n`-th CPU, so the two are
//! on different CPUs at each step and change CPU at every step). Their events interleave in
//! the per-CPU rings; each thread's file must still hold that thread's records in exact
//! program order, every record of a step on the CPU the fixture saw itself on
//! (`sched_getcpu`), a NewCPUId record wherever the CPU changes, time never going back, as many
//! calls per function as the thread counted, and no event lost. In both exit modes; llvm-xray 14 and 19 read the same
//! records (kind, arguments, CPU) from each file.
//!
//! Needs root, BPF, llvm-xray 14/19, clang-19, 2 CPUs and a built daemon.

use std::collections::BTreeMap;
use std::time::Duration;

use tests::counts::{expected_calls, parse_count_lines};
use tests::cpu_records::{assert_cpu_changes_marked, hop_step_records, read_cpu_calls, CpuCall};
use tests::fixtures::workloads::{calls_fixture, CALLS_STEP, CALLS_TINY};
use tests::launched::{function_names, launch, Launched};
use tests::xray_yaml::{Converted, RecordKind};
use tests::LLVM_XRAY_VERSIONS;
use xray_fdr::FunctionAction;

const THREADS: usize = 2;
const HOPS: usize = 200;
const LOOP_CALLS: usize = 100;

/// What the fixture printed about one loop thread: `hop thread=<t> tid=<tid> step=<i>
/// cpu=<c>` lines.
#[derive(Debug, Default)]
struct Hops {
    tid: u32,
    /// The CPU of each step.
    cpus: Vec<u16>,
}

/// The `hop thread=...` lines, by thread index. Each thread's steps must be in order.
fn hop_lines(stdout: &str) -> Vec<Hops> {
    let mut by_thread: BTreeMap<usize, Hops> = BTreeMap::new();
    for line in stdout.lines() {
        let Some(rest) = line.strip_prefix("hop thread=") else {
            continue;
        };
        let field = |s: &str, key: &str| -> u64 {
            let v = s
                .split(' ')
                .find_map(|f| f.strip_prefix(key))
                .unwrap_or_else(|| panic!("no {key} in {line:?}"));
            v.parse()
                .unwrap_or_else(|e| panic!("{key} in {line:?}: {e}"))
        };
        let (index, rest) = rest.split_once(' ').expect("hop line");
        let index: usize = index.parse().expect("hop thread index");
        let (tid, step, cpu) = (
            field(rest, "tid=") as u32,
            field(rest, "step=") as usize,
            field(rest, "cpu=") as u16,
        );
        let h = by_thread.entry(index).or_default();
        if h.cpus.is_empty() {
            h.tid = tid;
        }
        assert_eq!(h.tid, tid, "thread {index}: one tid: {line:?}");
        assert_eq!(
            step,
            h.cpus.len(),
            "thread {index}: steps in order: {line:?}"
        );
        h.cpus.push(cpu);
    }
    assert_eq!(
        by_thread.keys().copied().collect::<Vec<_>>(),
        (0..THREADS).collect::<Vec<_>>(),
        "{stdout}"
    );
    let hops: Vec<Hops> = by_thread.into_values().collect();
    for (t, h) in hops.iter().enumerate() {
        assert_eq!(h.cpus.len(), HOPS, "thread {t}:\n{stdout}");
        assert!(
            h.cpus.windows(2).all(|w| w[0] != w[1]),
            "thread {t}: every step changes CPU: {:?}",
            h.cpus
        );
    }
    for i in 0..HOPS {
        assert_ne!(
            hops[0].cpus[i], hops[1].cpus[i],
            "step {i}: the two threads on different CPUs"
        );
    }
    hops
}

/// Every function record of `tid`'s file, by our reader.
fn read_calls(run: &Launched, tid: u32, names: &BTreeMap<u32, String>) -> Vec<CpuCall> {
    let file = run
        .files()
        .into_iter()
        .find(|f| f.tid == tid)
        .unwrap_or_else(|| panic!("no file for thread {tid}"));
    read_cpu_calls(&file.path, names)
}

fn kind(action: FunctionAction) -> RecordKind {
    match action {
        FunctionAction::Entry => RecordKind::Enter,
        FunctionAction::EntryArgs => RecordKind::EnterArg,
        FunctionAction::Exit => RecordKind::Exit,
        FunctionAction::TailExit => RecordKind::TailExit,
    }
}

/// Checks thread `t`'s file; returns the tsc of each of its step records.
fn check_thread(
    mode: &str,
    run: &Launched,
    names: &BTreeMap<u32, String>,
    converted: &[(u32, BTreeMap<u32, Converted>)],
    t: usize,
    hops: &Hops,
) -> Vec<u64> {
    let what = format!("--exits {mode}, thread {t} (tid {})", hops.tid);
    let calls = read_calls(run, hops.tid, names);

    // Exact program order: main (thread 0 only), cx_loop, the steps, the loop, the report.
    use FunctionAction::{Entry, Exit, TailExit};
    let mut want: Vec<(&str, FunctionAction, Vec<u64>)> = Vec::new();
    if t == 0 {
        want.push(("main", Entry, vec![]));
    }
    want.push(("cx_loop", Entry, vec![]));
    let first_step = want.len();
    for i in 0..HOPS {
        want.extend(hop_step_records(i));
    }
    for _ in 0..LOOP_CALLS {
        want.push((CALLS_TINY, Entry, vec![]));
        want.push((CALLS_TINY, Exit, vec![]));
    }
    want.push(("cx_report", Entry, vec![]));
    let got: Vec<(&str, FunctionAction, Vec<u64>)> = calls
        .iter()
        .map(|c| (c.function.as_str(), c.action, c.args.clone()))
        .collect();
    let n = want.len();
    // After cx_report's entry: its exit (a tail call to fflush, or a return), cx_loop's exit,
    // and on thread 0 main's.
    let tail = if t == 0 { 3 } else { 2 };
    assert!(
        got.len() == n + tail,
        "{what}: {} records, want {}:\n{got:#?}",
        got.len(),
        n + tail
    );
    if let Some(k) = (0..n).find(|&k| got[k] != want[k]) {
        let lo = k.saturating_sub(6);
        let hi = (k + 6).min(n);
        panic!(
            "{what}: program order differs at record {k}:\n\
             got[{lo}..{hi}] = {:#?}\nwant[{lo}..{hi}] = {:#?}",
            &calls[lo..hi],
            &want[lo..hi]
        );
    }
    assert_eq!(got[n].0, "cx_report", "{what}");
    assert!(matches!(got[n].1, Exit | TailExit), "{what}: {:?}", got[n]);
    assert_eq!((got[n + 1].0, got[n + 1].1), ("cx_loop", Exit), "{what}");
    if t == 0 {
        assert_eq!((got[n + 2].0, got[n + 2].1), ("main", Exit), "{what}");
    }

    // CPUs: every record of step i on the CPU the fixture printed for this thread and step;
    // wherever the CPU changes, a NewCPUId naming the new CPU right before the record.
    for (i, cpu) in hops.cpus.iter().enumerate() {
        let at = first_step + 4 * i;
        for c in &calls[at..at + 4] {
            assert_eq!(c.cpu, *cpu, "{what}: step {i} record {c:?}");
        }
    }
    let hops_seen = assert_cpu_changes_marked(&calls, &what);
    assert!(
        hops_seen >= HOPS - 1,
        "{what}: {hops_seen} CPU changes for {HOPS} hops"
    );

    // Per function, as many entries and exits as the thread counted (main is not counted).
    let expected = expected_calls(&parse_count_lines(&run.done.stdout));
    let counted = expected
        .get(&hops.tid)
        .unwrap_or_else(|| panic!("{what}: no count lines:\n{}", run.done.stdout));
    assert_eq!(counted.get("cx_loop"), Some(&1), "{what}");
    assert_eq!(counted.get(CALLS_STEP), Some(&(HOPS as u64)), "{what}");
    assert_eq!(
        counted.get(CALLS_TINY),
        Some(&((HOPS + LOOP_CALLS) as u64)),
        "{what}"
    );
    let mut in_file: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for c in &calls {
        let e = in_file.entry(c.function.as_str()).or_default();
        if c.action.is_entry() {
            e.0 += 1;
        } else {
            e.1 += 1;
        }
    }
    if t == 0 {
        assert_eq!(in_file.remove("main"), Some((1, 1)), "{what}");
    }
    let in_file: BTreeMap<String, (u64, u64)> = in_file
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let want_counts: BTreeMap<String, (u64, u64)> =
        counted.iter().map(|(k, &n)| (k.clone(), (n, n))).collect();
    assert_eq!(
        in_file, want_counts,
        "{what}: (entries, exits) per function"
    );

    // llvm-xray reads the same records, arguments and CPUs.
    for (major, converted) in converted {
        let records = &converted[&hops.tid].records;
        let theirs: Vec<(&str, RecordKind, &[u64], u16)> = records
            .iter()
            .map(|r| (r.function.as_str(), r.kind.clone(), &r.args[..], r.cpu))
            .collect();
        let ours: Vec<(&str, RecordKind, &[u64], u16)> = calls
            .iter()
            .map(|c| (c.function.as_str(), kind(c.action), &c.args[..], c.cpu))
            .collect();
        assert_eq!(theirs, ours, "{what}: llvm-xray {major}");
    }

    calls[first_step..first_step + 4 * HOPS]
        .iter()
        .map(|c| c.tsc)
        .collect()
}

fn hop_together(mode: &str) {
    let run = launch(
        &format!("migration-threads-{mode}"),
        &calls_fixture(),
        // Two workers: the threads' consecutive ids put them in different ones, each reading
        // the rings of every CPU the threads hop across.
        &["--exits", mode, "--workers", "2"],
        &[
            "--threads",
            &THREADS.to_string(),
            "--hops-each",
            &HOPS.to_string(),
            "--iterations",
            &LOOP_CALLS.to_string(),
        ],
        Duration::from_secs(120),
    );
    assert!(run.exits_line().starts_with(if mode == "return" {
        "return probes"
    } else {
        "exit sleds"
    }));
    assert_eq!(run.session.events_lost, 0, "--exits {mode}: events lost");
    let hops = hop_lines(&run.done.stdout);
    let pid = run.pid();
    assert_eq!(hops[0].tid, pid, "loop thread 0 is the main thread");
    let mut tids: Vec<u32> = run.files().iter().map(|f| f.tid).collect();
    tids.sort_unstable();
    let mut want_tids: Vec<u32> = hops.iter().map(|h| h.tid).collect();
    want_tids.sort_unstable();
    assert_eq!(tids, want_tids, "--exits {mode}: one file per thread");

    let names = function_names(&run.bin);
    let converted: Vec<(u32, BTreeMap<u32, Converted>)> = LLVM_XRAY_VERSIONS
        .into_iter()
        .map(|major| (major, run.converted(major)))
        .collect();
    let mut steps: Vec<(u64, usize)> = Vec::new();
    for (t, h) in hops.iter().enumerate() {
        let tscs = check_thread(mode, &run, &names, &converted, t, h);
        steps.extend(tscs.into_iter().map(|tsc| (tsc, t)));
    }
    // The two threads really hopped at the same time: merged by time, their step records
    // alternate between the threads many times (about 400 of a possible 1600 here; two
    // threads one after the other would switch once).
    steps.sort_unstable();
    let switches = steps.windows(2).filter(|w| w[0].1 != w[1].1).count();
    assert!(
        switches >= HOPS / 10,
        "--exits {mode}: the threads' steps alternate only {switches} times in time"
    );
}

#[test]
fn two_threads_hop_with_return_probes() {
    hop_together("return");
}

#[test]
fn two_threads_hop_with_exit_sleds() {
    hop_together("sleds");
}
