//! Crash-safety tests of the commit protocols: replay a writer's sink operations and check every
//! state a SIGKILL could leave on disk (before each operation, and each write cut at each page
//! boundary inside it) with our reader, and a sample of them with llvm-xray 14 and 19.
use super::super::reader::{read, RecordKind, Trace};
use super::super::sink::{Op, OpLog};
use super::super::writer::{FdrVersion, FunctionAction, ThreadWriter, WallClock};
use super::*;
use xray_reference::both as llvm_xray;

/// xorshift64*: deterministic test input without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

const WALL: WallClock = WallClock {
    secs: 1_700_000_000,
    micros: 1,
};

/// Drives a writer with `steps` random records. Returns the operation log and, per flush, the
/// number of operations so far and the number of records the file must then hold.
fn random_session(version: FdrVersion, seed: u64, steps: usize) -> (OpLog, Vec<(usize, usize)>) {
    let mut rng = Rng(seed | 1);
    let commit_bytes = [0, 40, 700, 5000, 1 << 16][rng.below(5) as usize];
    let mut w = ThreadWriter::with_version(OpLog::default(), 42, 7, 1_000_000_000, WALL, version)
        .unwrap()
        .with_commit_bytes(commit_bytes);
    let mut tsc = 1000u64;
    let mut cpu = 0u16;
    let mut stack: Vec<u32> = Vec::new();
    let mut checkpoints = Vec::new();
    let max_payload = match version {
        FdrVersion::V1 => 6000,
        FdrVersion::V5 => V5_CRASH_SAFE_PAYLOAD as u64,
    };
    let mut expected = 0usize;
    for _ in 0..steps {
        tsc += if rng.chance(2) {
            1 << 33
        } else {
            rng.below(50)
        };
        if rng.chance(5) {
            cpu = rng.below(4) as u16;
        }
        let fid = 1 + rng.below(20) as u32;
        match rng.below(100) {
            0..=29 => {
                w.function(FunctionAction::Entry, fid, tsc, cpu).unwrap();
                stack.push(fid);
                expected += 1;
            }
            30..=39 => {
                let args: Vec<u64> = (0..rng.below(4)).map(|_| rng.next()).collect();
                w.entry_with_args(fid, tsc, cpu, &args).unwrap();
                stack.push(fid);
                expected += 1;
            }
            40..=69 => {
                if let Some(top) = stack.pop() {
                    let action = if rng.chance(20) {
                        FunctionAction::TailExit
                    } else {
                        FunctionAction::Exit
                    };
                    w.function(action, top, tsc, cpu).unwrap();
                    expected += 1;
                }
            }
            70..=84 => {
                let len = if rng.chance(5) {
                    1 + rng.below(max_payload)
                } else {
                    1 + rng.below(40)
                };
                let payload: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                w.custom_event(tsc, cpu, &payload).unwrap();
                expected += 1;
            }
            85..=94 => {
                let payload: Vec<u8> = (0..1 + rng.below(30)).map(|_| rng.next() as u8).collect();
                w.typed_event(tsc, cpu, rng.next() as u16, &payload)
                    .unwrap();
                expected += 1;
            }
            _ => {
                w.flush().unwrap();
                checkpoints.push((w.sink_mut().ops.len(), expected));
            }
        }
    }
    let (log, _) = w.finish().unwrap();
    checkpoints.push((log.ops.len(), expected));
    (log, checkpoints)
}

/// Checks one possible on-disk state: it reads, its records are a prefix of the final ones,
/// and it holds at least `must` of them.
fn check_state(bytes: &[u8], fin: &Trace, must: usize, what: &str) -> usize {
    let t = read(bytes).unwrap_or_else(|e| panic!("{what}: unreadable: {e}"));
    // The prefix `buffer_size` names is the data of the last finished commit: a trace itself.
    let named = 32 + t.header.buffer_size as usize;
    assert!(named <= bytes.len(), "{what}: buffer_size past the end");
    let committed = read(&bytes[..named]).unwrap_or_else(|e| panic!("{what}: prefix: {e}"));
    assert!(
        committed.records.len() >= must,
        "{what}: prefix lost records"
    );
    let n = t.records.len();
    assert!(n >= must, "{what}: {n} records, {must} were committed");
    for (i, (a, b)) in t.records.iter().zip(&fin.records).enumerate() {
        assert_eq!(
            a, b,
            "{what}: record {i} of {n} differs from the final file's"
        );
    }
    n
}

/// Every crash state of `log`. Returns the states (for llvm-xray sampling).
fn check_all_states(log: &OpLog, checkpoints: &[(usize, usize)], what: &str) -> Vec<Vec<u8>> {
    let fin = read(&log.data).unwrap_or_else(|e| panic!("{what}: final file: {e}"));
    let mut states = Vec::new();
    let mut data = Vec::new();
    for (k, op) in log.ops.iter().enumerate() {
        if k > 0 {
            let must = checkpoints
                .iter()
                .filter(|&&(ops, _)| ops <= k)
                .map(|&(_, n)| n)
                .max()
                .unwrap_or(0);
            check_state(&data, &fin, must, &format!("{what}, before op {k}"));
            states.push(data.clone());
            if let Op::Write { offset, bytes } = op {
                let end = offset + bytes.len() as u64;
                let mut q = (offset / GRANULE + 1) * GRANULE;
                while q < end {
                    let mut torn = data.clone();
                    OpLog::apply(&mut torn, op, Some(q));
                    check_state(&torn, &fin, must, &format!("{what}, op {k} cut at {q}"));
                    states.push(torn);
                    q += GRANULE;
                }
            }
        }
        OpLog::apply(&mut data, op, None);
    }
    assert_eq!(data, log.data);
    let n = check_state(&data, &fin, 0, what);
    assert_eq!(n, checkpoints.last().unwrap().1, "{what}: records lost");
    states
}

#[test]
fn every_crash_state_reads_v1() {
    let mut states = 0;
    for seed in 0..24u64 {
        let (log, cps) = random_session(FdrVersion::V1, 0x1000 + seed, 700);
        states += check_all_states(&log, &cps, &format!("v1 seed {seed}")).len();
    }
    eprintln!("version 1: {states} crash states checked");
    assert!(states > 2000, "{states}");
}

#[test]
fn every_crash_state_reads_v5() {
    let mut states = 0;
    for seed in 0..24u64 {
        let (log, cps) = random_session(FdrVersion::V5, 0x5000 + seed, 700);
        states += check_all_states(&log, &cps, &format!("v5 seed {seed}")).len();
    }
    eprintln!("version 5: {states} crash states checked");
    assert!(states > 1000, "{states}");
}

/// A function record as llvm-xray prints it: (func-id, kind, tsc, cpu, thread).
type FnRecord = (u32, String, u64, u16, u32);

/// The function records of a file as llvm-xray prints them.
fn function_records(t: &Trace) -> Vec<FnRecord> {
    t.records
        .iter()
        .filter_map(|r| match &r.kind {
            RecordKind::Function {
                action,
                function_id,
                ..
            } => Some((
                *function_id,
                match action {
                    FunctionAction::Entry => "function-enter",
                    FunctionAction::Exit => "function-exit",
                    FunctionAction::TailExit => "function-tail-exit",
                    FunctionAction::EntryArgs => "function-enter-arg",
                }
                .to_string(),
                r.tsc,
                r.cpu,
                r.tid,
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn sampled_crash_states_load_in_llvm_xray() {
    let dir = tempfile::tempdir().unwrap();
    for (version, seed) in [(FdrVersion::V1, 77), (FdrVersion::V5, 78)] {
        let (log, cps) = random_session(version, seed, 500);
        let states = check_all_states(&log, &cps, "sample");
        let stride = (states.len() / 12).max(1);
        for (i, s) in states.iter().enumerate().step_by(stride) {
            let path = dir.path().join(format!("v{version}-{i}.fdr"));
            std::fs::write(&path, s).unwrap();
            let mut want = function_records(&read(s).unwrap());
            // llvm-xray sorts by time (stably); so do we for the comparison.
            want.sort_by_key(|r| r.2);
            let got: Vec<FnRecord> = llvm_xray::load_records(&path)
                .into_iter()
                .filter(|r| r.kind.name().starts_with("function"))
                .map(|r| {
                    let id = u32::try_from(r.func_id).unwrap_or_else(|e| panic!("{r:?}: {e}"));
                    (id, r.kind.name().to_string(), r.tsc, r.cpu, r.thread)
                })
                .collect();
            assert_eq!(got, want, "{}", path.display());
        }
    }
}

#[test]
fn granule_helpers() {
    assert!(!crosses_granule(4080, 16));
    assert!(crosses_granule(4081, 16));
    assert!(!crosses_granule(4096, 4096));
    assert!(crosses_granule(4095, 2));
    assert!(!crosses_granule(4095, 1));
    assert!(!in_tail_zone(4080));
    assert!(in_tail_zone(4081));
    assert!(in_tail_zone(4095));
    assert!(!in_tail_zone(4096));
}

/// Hand-made layouts: a record that would cross a page boundary moves to the next page behind
/// a BufferExtents that ends exactly on the boundary, pulling along earlier records that leave
/// less than 16 bytes before it; the end never lands in the last 15 bytes of a page.
#[test]
fn v5_layout_breaks_at_boundaries() {
    let mut p = Pending::default();
    let recs: Vec<[u8; 8]> = (1..=3u8).map(|i| [2 * i; 8]).collect();
    for r in &recs {
        p.push(&[r]);
    }
    let all = recs.concat();
    let mut out = Vec::new();
    // Fits exactly up to the boundary.
    layout_v5(GRANULE - 40, &p, &mut out);
    assert_eq!(out, [&records::buffer_extents(24)[..], &all].concat());
    // Would end 8 bytes before the boundary: the last record moves behind a new extent.
    layout_v5(GRANULE - 48, &p, &mut out);
    let want = [
        &records::buffer_extents(16)[..],
        &all[..16],
        &records::buffer_extents(8),
        &all[16..],
    ]
    .concat();
    assert_eq!(out, want);
    // The third record would cross; no record boundary is 16 bytes before the boundary, so
    // all three move and the first extent is dropped for padding.
    layout_v5(GRANULE - 39, &p, &mut out);
    let want = [&[0u8; 23][..], &records::buffer_extents(24), &all].concat();
    assert_eq!(out, want);
}
