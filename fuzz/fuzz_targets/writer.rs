//! Any sequence of writer calls (decoded from the input), in either version, with any commit
//! size: the file reads back, at every commit, with exactly the records the writer reported
//! writing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::io::Cursor;

use xray_fdr as fdr;

use fdr::reader::read;
use fdr::writer::{FdrVersion, FunctionAction, Recorded, ThreadWriter, WallClock};

fuzz_target!(|data: &[u8]| {
    let Some((&head, ops)) = data.split_first() else {
        return;
    };
    let version = if head & 1 == 0 {
        FdrVersion::V1
    } else {
        FdrVersion::V5
    };
    let commit_bytes = [0usize, 64, 1000, 1 << 16][usize::from(head >> 1) & 3];
    let mut w = ThreadWriter::with_version(
        Cursor::new(Vec::new()),
        u32::from(head) * 1000,
        7,
        1_000_000_000,
        WallClock::default(),
        version,
    )
    .unwrap()
    .with_commit_bytes(commit_bytes)
    .with_max_stack_depth(64);
    let mut tsc = 0u64;
    let mut written = 0usize;
    for chunk in ops.chunks(4) {
        let [op, a, b, c] = match *chunk {
            [op, a, b, c] => [op, a, b, c],
            _ => break,
        };
        tsc = tsc.wrapping_add(match a >> 6 {
            0 => 0,
            1 => u64::from(b),
            2 => 1 << 32,
            _ => u64::MAX / 4, // backwards: clamped by the writer
        });
        let cpu = u16::from(a & 3);
        let fid = u32::from(b % 16) + 1;
        let r = match op % 8 {
            0 | 1 => w.function(FunctionAction::Entry, fid, tsc, cpu),
            2 => w.function(FunctionAction::Exit, fid, tsc, cpu),
            3 => w.function(FunctionAction::TailExit, fid, tsc, cpu),
            4 => {
                let args: Vec<u64> = (0..c % 5).map(|i| u64::from(i) * 0x0101).collect();
                w.entry_with_args(fid, tsc, cpu, &args)
            }
            5 => w.custom_event(tsc, cpu, &vec![c; usize::from(c) * 3]),
            6 => w.typed_event(tsc, cpu, u16::from(c), &vec![b; usize::from(c)]),
            _ => w.flush().map(|()| Recorded::Written),
        }
        .unwrap();
        if op % 8 != 7 {
            written += match r {
                Recorded::Written | Recorded::WrittenAsCustomEvent => 1,
                Recorded::WrittenAfterUnwind { frames } => 1 + frames,
                _ => 0,
            };
        }
    }
    let (out, stats) = w.finish().unwrap();
    let bytes = out.into_inner();
    let t = read(&bytes).unwrap_or_else(|e| panic!("writer output unreadable: {e}"));
    assert_eq!(t.records.len(), written);
    assert_eq!(stats.bytes, bytes.len() as u64);
    assert_eq!(t.header.buffer_size, bytes.len() as u64 - 32);
});
