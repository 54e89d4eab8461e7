//! One thread's function records with the CPU each ran on, read back with the daemon's FDR
//! reader, and the checks the migration tests share: a NewCPUId record right before every
//! record on another CPU, time never going back, and the calls fixture's hop steps in order.

use std::collections::BTreeMap;
use std::path::Path;

use xray_fdr::reader::{RawRecord, Reader};
use xray_fdr::FunctionAction;

use crate::fixtures::workloads::{CALLS_STEP, CALLS_TINY};

/// One function record of a thread's file, as our reader saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuCall {
    pub function: String,
    pub action: FunctionAction,
    pub args: Vec<u64>,
    pub cpu: u16,
    pub tsc: u64,
    /// The CPU named by the last NewCPUId record before it (and after the previous function
    /// record), if any.
    pub new_cpu_before: Option<u16>,
}

/// Every function record of the FDR file at `path`, named through `names` (function id →
/// name). Panics on a file our reader refuses.
pub fn read_cpu_calls(path: &Path, names: &BTreeMap<u32, String>) -> Vec<CpuCall> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = Reader::new(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut calls: Vec<CpuCall> = Vec::new();
    let mut new_cpu: Option<u16> = None;
    while let Some(step) = reader
        .next_step()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    {
        if step.ignored {
            continue;
        }
        match step.record {
            RawRecord::NewCpuId { cpu, .. } => new_cpu = Some(cpu),
            RawRecord::Function {
                action,
                function_id,
                ..
            } => calls.push(CpuCall {
                function: names
                    .get(&function_id)
                    .unwrap_or_else(|| {
                        panic!("{}: unknown function id {function_id}", path.display())
                    })
                    .clone(),
                action,
                args: Vec::new(),
                cpu: step.cpu,
                tsc: step.tsc.expect("a function record has a tsc"),
                new_cpu_before: new_cpu.take(),
            }),
            RawRecord::CallArgument { value } => calls
                .last_mut()
                .expect("argument after a record")
                .args
                .push(value),
            _ => {}
        }
    }
    calls
}

/// Checks that a NewCPUId record names the CPU before the first record and right before every
/// record on another CPU than the one before it (and never names another CPU than the
/// record's), and that time never goes back. Returns how many times the CPU changed.
pub fn assert_cpu_changes_marked(calls: &[CpuCall], what: &str) -> usize {
    assert!(
        calls.first().is_some_and(|c| c.new_cpu_before.is_some()),
        "{what}: a NewCPUId before the first record"
    );
    for (k, w) in calls.windows(2).enumerate() {
        let (prev, c) = (&w[0], &w[1]);
        if c.cpu != prev.cpu {
            assert_eq!(
                c.new_cpu_before,
                Some(c.cpu),
                "{what}: record {} moved from CPU {} without a NewCPUId: {c:?}",
                k + 1,
                prev.cpu
            );
        } else {
            assert_eq!(
                c.new_cpu_before.unwrap_or(c.cpu),
                c.cpu,
                "{what}: record {}: {c:?}",
                k + 1
            );
        }
        assert!(
            c.tsc >= prev.tsc,
            "{what}: record {} goes back in time: {prev:?} then {c:?}",
            k + 1
        );
    }
    calls
        .windows(2)
        .filter(|w| w[1].new_cpu_before.is_some_and(|n| n != w[0].cpu))
        .count()
}

/// The four records of the calls fixture's hop step `i` (`cx_step(i)` leaving by a tail call
/// to `cx_tiny`), as (function, action, arguments).
pub fn hop_step_records(i: usize) -> [(&'static str, FunctionAction, Vec<u64>); 4] {
    use FunctionAction::{Entry, EntryArgs, Exit, TailExit};
    [
        (CALLS_STEP, EntryArgs, vec![i as u64]),
        (CALLS_STEP, TailExit, vec![]),
        (CALLS_TINY, Entry, vec![]),
        (CALLS_TINY, Exit, vec![]),
    ]
}
