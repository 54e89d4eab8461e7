//! What llvm-xray 14 and 19 say about an FDR file, in a form that can be compared with our own
//! reader (`xray_fdr::reader`): [`agree`] record for record, [`agree_on_counts`] for big files.
//!
//! Used by the end-to-end tests that check the files the daemon left (killed, disk full, a
//! native trace) and, included by path, by `xray-fdr`'s own `tests/roundtrip.rs`: it uses only
//! `xray-fdr` and `xray-reference`, never another module of this crate, so that the format's
//! tests build without the daemon and its eBPF programs.

use std::collections::BTreeMap;
use std::path::Path;

use xray_fdr::reader::{Record, RecordKind, Trace};
use xray_fdr::FunctionAction;
use xray_reference::{parse_convert_yaml, try_convert_text, LLVM_XRAY_VERSIONS};

/// A function record as both readers can report it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FnRec {
    pub process: u32,
    pub thread: u32,
    pub tsc: u64,
    pub cpu: u16,
    pub func_id: u32,
    /// llvm-xray's kind name: `function-enter`, `function-exit`, ...
    pub kind: &'static str,
    pub args: Vec<u64>,
}

/// llvm-xray's name of a function record kind.
pub fn kind_name(a: FunctionAction) -> &'static str {
    match a {
        FunctionAction::Entry => "function-enter",
        FunctionAction::Exit => "function-exit",
        FunctionAction::TailExit => "function-tail-exit",
        FunctionAction::EntryArgs => "function-enter-arg",
    }
}

fn kind_static(s: &str) -> Option<&'static str> {
    [
        "function-enter",
        "function-exit",
        "function-tail-exit",
        "function-enter-arg",
    ]
    .into_iter()
    .find(|k| *k == s)
}

/// Our reader's function records.
pub fn ours(trace: &Trace) -> Vec<FnRec> {
    trace.records.iter().filter_map(fn_rec).collect()
}

fn fn_rec(r: &Record) -> Option<FnRec> {
    let RecordKind::Function {
        action,
        function_id,
        args,
    } = &r.kind
    else {
        return None;
    };
    Some(FnRec {
        process: r.pid,
        thread: r.tid,
        tsc: r.tsc,
        cpu: r.cpu,
        func_id: *function_id,
        kind: kind_name(*action),
        args: args.clone(),
    })
}

/// Runs `llvm-xray convert --output-format=yaml FILE` of LLVM `major`; on success returns the
/// function records and the number of event records. Event lines are not parsed (their data
/// can be any bytes); they are only counted. If the tool rejects the file, the error says why
/// (its stderr and `fdr-dump`).
pub fn llvm(major: u32, file: &Path) -> Result<(Vec<FnRec>, usize), String> {
    let text = try_convert_text(major, file, &[])?;
    let mut events = 0;
    let kept: String = text
        .lines()
        .filter(|l| {
            let record = l.trim_start().starts_with("- {");
            if record && !l.contains(" kind: function-") {
                events += 1;
                return false;
            }
            true
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let converted = parse_convert_yaml(&kept).map_err(|e| format!("llvm-xray {major}: {e}"))?;
    let recs = converted
        .records
        .iter()
        .map(|r| {
            Ok(FnRec {
                process: r.process,
                thread: r.thread,
                tsc: r.tsc,
                cpu: r.cpu,
                func_id: u32::try_from(r.func_id).map_err(|e| e.to_string())?,
                kind: kind_static(match &r.kind {
                    xray_reference::RecordKind::Enter => "function-enter",
                    xray_reference::RecordKind::Exit => "function-exit",
                    xray_reference::RecordKind::TailExit => "function-tail-exit",
                    xray_reference::RecordKind::EnterArg => "function-enter-arg",
                    other => return Err(format!("unexpected kind {other:?}")),
                })
                .unwrap(),
                args: r.args.clone(),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok((recs, events))
}

/// Records grouped by (process, thread), each thread's in time order (stable: llvm-xray sorts
/// all records by tsc with a stable sort).
pub fn by_thread(mut v: Vec<FnRec>) -> BTreeMap<(u32, u32), Vec<FnRec>> {
    v.sort_by_key(|r| r.tsc);
    let mut m: BTreeMap<(u32, u32), Vec<FnRec>> = BTreeMap::new();
    for r in v {
        m.entry((r.process, r.thread)).or_default().push(r);
    }
    m
}

/// Checks `file` with both llvm-xray versions against our reader's `trace`: both must load it
/// and report the same function records (id, kind, absolute tsc, cpu, thread, process, args)
/// per thread, and as many events. Returns an error message instead of panicking, so callers
/// can add context.
pub fn agree(file: &Path, trace: &Trace) -> Result<(), String> {
    let want = by_thread(ours(trace));
    let want_events = trace.records.len() - want.values().map(Vec::len).sum::<usize>();
    for major in LLVM_XRAY_VERSIONS {
        let (got, events) = llvm(major, file)?;
        let got = by_thread(got);
        if got != want {
            let first = want
                .iter()
                .find(|(k, v)| got.get(k) != Some(v))
                .map(|(k, v)| {
                    let g = got.get(k).cloned().unwrap_or_default();
                    let i = v.iter().zip(&g).take_while(|(a, b)| a == b).count();
                    format!(
                        "thread {k:?}: record {i}: ours {:?}, llvm-xray {:?} ({} vs {} records)",
                        v.get(i),
                        g.get(i),
                        v.len(),
                        g.len()
                    )
                })
                .unwrap_or_else(|| "llvm-xray has extra threads".into());
            return Err(format!(
                "llvm-xray {major} and our reader disagree on {}: {first}",
                file.display()
            ));
        }
        if events != want_events {
            return Err(format!(
                "llvm-xray {major} sees {events} events in {}, our reader {want_events}",
                file.display()
            ));
        }
    }
    Ok(())
}

/// For big files: both llvm-xray versions must load `file` (`convert`) and count as many function
/// records and events as our reader; the records themselves are not parsed.
pub fn agree_on_counts(file: &Path, trace: &Trace) -> Result<(), String> {
    let functions = ours(trace).len();
    let events = trace.records.len() - functions;
    for major in LLVM_XRAY_VERSIONS {
        let text = try_convert_text(major, file, &[])?;
        let records = text.lines().filter(|l| l.trim_start().starts_with("- {"));
        let (mut f, mut e) = (0, 0);
        for l in records {
            if l.contains(" kind: function-") {
                f += 1;
            } else {
                e += 1;
            }
        }
        if (f, e) != (functions, events) {
            return Err(format!(
                "llvm-xray {major} counts {f} function records and {e} events in {}, our reader \
                 {functions} and {events}",
                file.display()
            ));
        }
    }
    Ok(())
}

/// Runs `f` on every item with `threads` worker threads; returns the failures.
pub fn parallel<T: Sync, F: Fn(&T) -> Result<(), String> + Sync>(
    items: &[T],
    threads: usize,
    f: F,
) -> Vec<String> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let errors = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                if let Err(e) = f(item) {
                    errors.lock().unwrap().push(e);
                }
            });
        }
    });
    errors.into_inner().unwrap()
}
