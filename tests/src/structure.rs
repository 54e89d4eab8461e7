//! Per-thread call structure of a trace, as llvm-xray reads it, and its comparison with a
//! native XRay FDR trace of the same deterministic program (the reference the issue names:
//! "the per-thread call structure matches a native XRay FDR trace").
//!
//! A thread's structure is its sequence of [`Step`]s: function records by name and kind (the
//! first logged argument for `function-enter-arg`), custom events by payload. Timestamps, CPUs
//! and function ids are left out (the native build is a different binary). `main` is left out:
//! the native builds switch tracing on inside it.

use std::collections::BTreeMap;
use std::fmt;

use crate::xray_yaml::{Record, RecordKind};

/// One step of a thread's structure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A function record: name, kind, first argument of an enter-arg.
    Call(String, RecordKind, Option<u64>),
    /// A custom or typed event and its payload as llvm-xray prints it.
    Event(RecordKind, String),
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Call(name, kind, Some(arg)) => write!(f, "{kind:?} {name}({arg})"),
            Step::Call(name, kind, None) => write!(f, "{kind:?} {name}"),
            Step::Event(kind, data) => {
                let short: String = data.chars().take(40).collect();
                write!(f, "{kind:?} {:?} ({} chars)", short, data.len())
            }
        }
    }
}

/// How payloads compare: ours may be a truncated copy of the native one.
#[derive(Debug, Clone, Copy)]
pub struct Payloads {
    /// The daemon's `--max-event-bytes`: a native payload longer than this must appear
    /// truncated to it.
    pub max_bytes: usize,
}

/// The records of one thread's file, in file order, without the exits the daemon wrote to
/// close frames proven gone (native XRay writes none), exactly as its `session.json` lists them
/// for that thread ([`crate::trace::Session::closing_exits`]: runs of `[index among the file's
/// function records, count]`). Returns the records kept and, per thread and function, how
/// many exits were left out. Panics if a listed record is not an exit.
pub fn without_closing_exits<'a>(
    records: impl IntoIterator<Item = &'a Record>,
    runs: &[[u64; 2]],
) -> (Vec<&'a Record>, BTreeMap<(u32, String), u64>) {
    let closing = |index: u64| {
        runs.iter()
            .any(|&[first, count]| index >= first && index - first < count)
    };
    let mut kept = Vec::new();
    let mut dropped: BTreeMap<(u32, String), u64> = BTreeMap::new();
    let mut function_records = 0u64;
    for r in records {
        if r.kind.is_function() {
            let index = function_records;
            function_records += 1;
            if closing(index) {
                assert!(
                    r.kind.is_exit(),
                    "closing record {index} is not an exit: {r:?}"
                );
                *dropped.entry((r.thread, r.function.clone())).or_default() += 1;
                continue;
            }
        }
        kept.push(r);
    }
    (kept, dropped)
}

/// How many entries and how many exits (of every kind) of `function` `records` hold.
pub fn entries_and_exits<'a>(
    records: impl IntoIterator<Item = &'a Record>,
    function: &str,
) -> (u64, u64) {
    records
        .into_iter()
        .filter(|r| r.function == function)
        .fold((0, 0), |(entries, exits), r| {
            (
                entries + u64::from(r.kind.is_entry()),
                exits + u64::from(r.kind.is_exit()),
            )
        })
}

/// Per thread id: its steps in file order.
pub fn per_thread<'a>(records: impl IntoIterator<Item = &'a Record>) -> BTreeMap<u32, Vec<Step>> {
    let mut m: BTreeMap<u32, Vec<Step>> = BTreeMap::new();
    for r in records {
        if r.function == "main" && r.kind.is_function() {
            continue;
        }
        let step = if r.kind.is_function() {
            let arg = (r.kind == RecordKind::EnterArg)
                .then(|| r.args.first().copied())
                .flatten();
            Step::Call(r.function.clone(), r.kind.clone(), arg)
        } else {
            Step::Event(r.kind.clone(), r.data.clone())
        };
        m.entry(r.thread).or_default().push(step);
    }
    m
}

/// Whether our step matches the native one (payloads: ours is the native one cut to
/// `payloads.max_bytes`).
fn same(ours: &Step, native: &Step, payloads: Payloads) -> bool {
    match (ours, native) {
        (Step::Event(k1, d1), Step::Event(k2, d2)) => {
            let cut: String = d2.chars().take(payloads.max_bytes).collect();
            k1 == k2 && *d1 == cut
        }
        _ => ours == native,
    }
}

/// The first index where two sequences differ (or the shorter length), `None` if they match.
fn first_difference(ours: &[Step], native: &[Step], payloads: Payloads) -> Option<usize> {
    let n = ours.len().min(native.len());
    (0..n)
        .find(|&i| !same(&ours[i], &native[i], payloads))
        .or((ours.len() != native.len()).then_some(n))
}

/// Panics unless every thread of `ours` has a thread of `native` with exactly the same steps
/// (threads are matched by content: tids differ between runs), and both have as many threads.
pub fn assert_same_structure(
    what: &str,
    ours: &BTreeMap<u32, Vec<Step>>,
    native: &BTreeMap<u32, Vec<Step>>,
    payloads: Payloads,
) {
    assert_eq!(
        ours.len(),
        native.len(),
        "{what}: threads in our trace {:?} and in the native one {:?}",
        ours.keys().collect::<Vec<_>>(),
        native.keys().collect::<Vec<_>>()
    );
    let mut unused: Vec<(&u32, &Vec<Step>)> = native.iter().collect();
    for (tid, steps) in ours {
        if let Some(pos) = unused
            .iter()
            .position(|(_, n)| first_difference(steps, n, payloads).is_none())
        {
            unused.remove(pos);
            continue;
        }
        // Report against the native thread that agrees longest.
        let (ntid, nsteps) = unused
            .iter()
            .max_by_key(|(_, n)| first_difference(steps, n, payloads).unwrap_or(usize::MAX))
            .unwrap_or_else(|| panic!("{what}: no native thread left for ours {tid}"));
        let i = first_difference(steps, nsteps, payloads).unwrap_or(0);
        let show = |s: &[Step]| -> String {
            s.iter()
                .enumerate()
                .skip(i.saturating_sub(3))
                .take(7)
                .map(|(k, st)| format!("    {k}: {st}\n"))
                .collect()
        };
        panic!(
            "{what}: our thread {tid} ({} steps) matches no native thread; closest is native \
             thread {ntid} ({} steps), first difference at step {i}:\n  ours:\n{}  native:\n{}",
            steps.len(),
            nsteps.len(),
            show(steps),
            show(nsteps)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, kind: RecordKind) -> Step {
        Step::Call(name.to_owned(), kind, None)
    }

    #[test]
    fn matches_threads_by_content_and_cuts_payloads() {
        let a = vec![call("f", RecordKind::Enter), call("f", RecordKind::Exit)];
        let b = vec![
            call("g", RecordKind::Enter),
            Step::Event(RecordKind::CustomEvent, "abcdef".into()),
        ];
        let ours = BTreeMap::from([(1, a.clone()), (2, b.clone())]);
        let mut b_native = b.clone();
        b_native[1] = Step::Event(RecordKind::CustomEvent, "abcdefgh".into());
        let native = BTreeMap::from([(7, b_native), (9, a)]);
        assert_same_structure("t", &ours, &native, Payloads { max_bytes: 6 });
        let r = std::panic::catch_unwind(|| {
            assert_same_structure("t", &ours, &native, Payloads { max_bytes: 8 })
        });
        assert!(r.is_err(), "an uncut payload must differ");
    }

    #[test]
    fn a_missing_exit_is_a_difference() {
        let full = vec![call("f", RecordKind::Enter), call("f", RecordKind::Exit)];
        let cut = vec![call("f", RecordKind::Enter)];
        let p = Payloads { max_bytes: 0 };
        assert_eq!(first_difference(&cut, &full, p), Some(1));
        assert_eq!(first_difference(&full, &full, p), None);
    }
}
