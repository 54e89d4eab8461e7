//! End to end: a thread forced to hop between CPUs (`sched_setaffinity` between calls, the C
//! fixture's `--hops`) yields a file in exact program order, with a NewCPUId record at each
//! hop naming the CPU the fixture saw itself on (`sched_getcpu`), and every record of a step
//! carrying that CPU. In both exit modes; the file also loads in llvm-xray 14 and 19 with the
//! same records and CPUs.
//!
//! Needs root, BPF, llvm-xray 14/19, clang-19, 2 CPUs and a built daemon.

use std::time::Duration;

use tests::cpu_records::{assert_cpu_changes_marked, hop_step_records, read_cpu_calls};
use tests::fixtures::workloads::{calls_fixture, CALLS_TINY};
use tests::launched::{function_names, launch};
use tests::LLVM_XRAY_VERSIONS;
use xray_fdr::FunctionAction;

const HOPS: usize = 12;
const LOOP_CALLS: usize = 5;

/// `hop step=<i> cpu=<c>` lines: the CPU of each step.
fn hop_cpus(stdout: &str) -> Vec<u16> {
    let cpus: Vec<u16> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("hop step="))
        .enumerate()
        .map(|(i, rest)| {
            let (step, cpu) = rest.split_once(" cpu=").expect("hop line");
            assert_eq!(step.parse::<usize>().unwrap(), i, "steps in order");
            cpu.parse().unwrap()
        })
        .collect();
    assert_eq!(cpus.len(), HOPS, "{stdout}");
    cpus
}

fn hop(mode: &str) {
    let run = launch(
        &format!("migration-{mode}"),
        &calls_fixture(),
        &["--exits", mode],
        &[
            "--hops",
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
    let cpus = hop_cpus(&run.done.stdout);
    assert!(
        cpus.windows(2).all(|w| w[0] != w[1]),
        "every step changes CPU: {cpus:?}"
    );
    assert_eq!(run.session.events_lost, 0);
    let names = function_names(&run.bin);
    let pid = run.pid();
    let file = run
        .files()
        .into_iter()
        .find(|f| f.tid == pid)
        .expect("the main thread's file");

    // Our reader, record by record.
    let calls = read_cpu_calls(&file.path, &names);

    // Exact program order.
    use FunctionAction::{Entry, Exit, TailExit};
    let mut want: Vec<(&str, FunctionAction, Vec<u64>)> = vec![("main", Entry, vec![])];
    for i in 0..HOPS {
        want.extend(hop_step_records(i));
    }
    want.push(("cx_loop", Entry, vec![]));
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
    assert!(
        got.len() == n + 3,
        "--exits {mode}: {} records, want {}:\n{got:#?}",
        got.len(),
        n + 3
    );
    assert_eq!(&got[..n], &want[..], "--exits {mode}: program order");
    // cx_report leaves by a tail call to fflush (or an exit), then cx_loop and main exit.
    assert_eq!(got[n].0, "cx_report");
    assert!(matches!(got[n].1, Exit | TailExit));
    assert_eq!((got[n + 1].0, got[n + 1].1), ("cx_loop", Exit));
    assert_eq!((got[n + 2].0, got[n + 2].1), ("main", Exit));

    // CPUs: every record of step i on the CPU the fixture printed; wherever the CPU changes
    // (at each hop, and wherever the unpinned loop migrates), a NewCPUId naming the new CPU
    // right before the record.
    for (i, cpu) in cpus.iter().enumerate() {
        for c in &calls[1 + 4 * i..1 + 4 * (i + 1)] {
            assert_eq!(c.cpu, *cpu, "--exits {mode}: step {i} record {c:?}");
        }
    }
    let hops_seen = assert_cpu_changes_marked(&calls, &format!("--exits {mode}"));
    assert!(
        hops_seen >= HOPS - 1,
        "--exits {mode}: {hops_seen} CPU changes for {HOPS} hops"
    );

    // llvm-xray reads the same records on the same CPUs.
    for major in LLVM_XRAY_VERSIONS {
        let converted = run.converted(major);
        let records = &converted[&pid].records;
        let theirs: Vec<(&str, u16)> = records
            .iter()
            .map(|r| (r.function.as_str(), r.cpu))
            .collect();
        let ours: Vec<(&str, u16)> = calls.iter().map(|c| (c.function.as_str(), c.cpu)).collect();
        assert_eq!(theirs, ours, "--exits {mode}: llvm-xray {major}");
    }
}

#[test]
fn hops_with_return_probes() {
    hop("return");
}

#[test]
fn hops_with_exit_sleds() {
    hop("sleds");
}
