//! Any bytes: the reader returns a trace or an error, never panics, never allocates more than
//! a small multiple of the input, and its streaming and collecting forms agree.
#![no_main]

use libfuzzer_sys::fuzz_target;

use xray_fdr as fdr;

use fdr::reader::{read, RawRecord, Reader};

fuzz_target!(|data: &[u8]| {
    let trace = read(data);
    let mut functions = 0usize;
    let mut stream_error = None;
    match Reader::new(data) {
        Err(e) => stream_error = Some(e),
        Ok(reader) => {
            for step in reader {
                match step {
                    Ok(s) => {
                        if !s.ignored && matches!(s.record, RawRecord::Function { .. }) {
                            functions += 1;
                        }
                        // Offsets only move forward and stay inside the input.
                        assert!((s.offset as usize) < data.len());
                    }
                    Err(e) => {
                        stream_error = Some(e);
                        break;
                    }
                }
            }
        }
    }
    match (&trace, &stream_error) {
        (Ok(t), None) => {
            let n = t
                .records
                .iter()
                .filter(|r| matches!(r.kind, fdr::RecordKind::Function { .. }))
                .count();
            assert_eq!(n, functions);
            // Records are in file order and never go back in time within a block.
            for w in t.records.windows(2) {
                assert!(w[0].offset < w[1].offset);
            }
        }
        (Err(a), Some(b)) => {
            assert_eq!(a, b);
            assert!(a.offset <= data.len() as u64);
        }
        _ => panic!("read and Reader disagree: {trace:?} vs {stream_error:?}"),
    }
});
