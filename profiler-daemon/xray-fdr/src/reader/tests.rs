//! Reader tests on hand-built files: every check, with the offset and record it reports.
use super::*;
use crate::records::{self as r, FunctionAction::*};

/// Builds a file: header of `version`, then `parts` back to back.
fn file(version: u16, parts: &[&[u8]]) -> Vec<u8> {
    let mut b = r::FileHeader::new(version, 1000, 0).encode().to_vec();
    for p in parts {
        b.extend_from_slice(p);
    }
    b
}

fn f(a: FunctionAction, id: u32, d: u32) -> [u8; 8] {
    r::function_record(a, id, d).unwrap()
}

fn v1_preamble() -> Vec<u8> {
    [r::new_buffer(7), r::wall_clock_time(1, 2)].concat()
}

fn v5_preamble(extent: u64) -> Vec<u8> {
    [
        r::buffer_extents(extent),
        r::new_buffer(7),
        r::wall_clock_time(1, 2),
        r::pid(99),
    ]
    .concat()
}

fn err(bytes: &[u8]) -> ReadError {
    read(bytes).expect_err("expected a read error")
}

#[test]
fn v1_roundtrip_with_everything() {
    let b = file(
        1,
        &[
            &v1_preamble(),
            &r::new_cpu_id(3, 100),
            &f(Entry, 1, 0),
            &f(EntryArgs, 2, 5),
            &r::call_argument(7),
            &r::call_argument(u64::MAX),
            &r::custom_event_marker_v1(3, 106).unwrap(),
            b"abc",
            &f(Exit, 2, 5),
            &r::tsc_wrap(1 << 40),
            &r::new_cpu_id(4, 1 << 41),
            &f(TailExit, 1, 1),
            &r::end_of_buffer(),
            &f(Exit, 9, 0), // ignored after EndOfBuffer
        ],
    );
    let t = read(&b).unwrap();
    assert_eq!(t.header.version, 1);
    assert_eq!(t.ignored_records, 1);
    assert_eq!(t.blocks.len(), 1);
    assert_eq!(t.blocks[0].tid, 7);
    assert_eq!(t.blocks[0].wall, WallClock { secs: 1, micros: 2 });
    let got: Vec<_> = t.records.iter().map(|x| (x.tsc, x.cpu, &x.kind)).collect();
    let fun = |action, function_id, args: Vec<u64>| RecordKind::Function {
        action,
        function_id,
        args,
    };
    assert_eq!(
        got,
        [
            (100, 3, &fun(Entry, 1, vec![])),
            (105, 3, &fun(EntryArgs, 2, vec![7, u64::MAX])),
            (
                106,
                3,
                &RecordKind::CustomEvent {
                    data: b"abc".to_vec()
                }
            ),
            (110, 3, &fun(Exit, 2, vec![])),
            ((1 << 41) + 1, 4, &fun(TailExit, 1, vec![])),
        ]
    );
    assert!(t.records.iter().all(|x| x.tid == 7 && x.pid == 0));
    assert_eq!(t.records[0].offset, 32 + 48);
}

#[test]
fn v5_segments_padding_and_events() {
    let body1 = [r::new_cpu_id(1, 100).to_vec(), f(Entry, 1, 0).to_vec()].concat();
    let body2 = [
        r::custom_event_marker_v5(2, 3).unwrap().to_vec(),
        b"hi".to_vec(),
        r::typed_event_marker(1, 2, 77).unwrap().to_vec(),
        b"!".to_vec(),
        f(Exit, 1, 4).to_vec(),
    ]
    .concat();
    let b = file(
        5,
        &[
            &v5_preamble(48 + body1.len() as u64),
            &body1,
            &[0; 5],
            &r::buffer_extents(body2.len() as u64),
            &body2,
        ],
    );
    let t = read(&b).unwrap();
    assert_eq!(t.blocks[0].pid, 99);
    let got: Vec<_> = t.records.iter().map(|x| (x.tsc, &x.kind)).collect();
    assert_eq!(got.len(), 4);
    assert_eq!(got[1].0, 103);
    assert_eq!(
        got[2],
        (
            105,
            &RecordKind::TypedEvent {
                event_type: 77,
                data: b"!".to_vec()
            }
        )
    );
    assert_eq!(got[3].0, 109);
    assert!(t.records.iter().all(|x| x.pid == 99 && x.cpu == 1));
    // Cut anywhere on a record boundary inside a segment: still valid (over-claiming extent).
    let cut = b.len() - body2.len() + 16 + 2;
    assert_eq!(read(&b[..cut]).unwrap().records.len(), 2);
    // But not inside the padding.
    let pad_at = 32 + 64 + body1.len();
    let e = err(&b[..pad_at + 3]);
    assert_eq!((e.offset, e.record), (pad_at as u64, "Padding"));
    // Nor with junk between segments.
    let mut junk = b.clone();
    junk[pad_at + 1] = 0x42;
    let e = err(&junk);
    assert_eq!((e.offset, e.record), (pad_at as u64 + 1, "BufferExtents"));
}

#[test]
fn v4_custom_event_cpu() {
    let b = file(
        4,
        &[
            &r::buffer_extents(48 + 16 + 16 + 1),
            &r::new_buffer(7),
            &r::wall_clock_time(1, 2),
            &r::pid(5),
            &r::new_cpu_id(1, 10),
            &r::custom_event_marker_v4(1, 20, 9).unwrap(),
            b"z",
        ],
    );
    let t = read(&b).unwrap();
    assert_eq!((t.records[0].tsc, t.records[0].cpu), (20, 9));
}

#[test]
fn header_errors() {
    assert_eq!(err(&[1, 0, 1]).record, "FileHeader");
    let mut b = file(1, &[]);
    b[0] = 6;
    assert!(err(&b).problem.contains("version 6"));
    let mut b = file(1, &[]);
    b[2] = 0;
    let e = err(&b);
    assert_eq!((e.offset, e.record), (2, "FileHeader"));
    // A header alone is an empty but valid trace (llvm-xray loads it too).
    assert!(read(&file(1, &[])).unwrap().records.is_empty());
}

#[test]
fn framing_errors_name_offset_and_kind() {
    let pre = v1_preamble();
    let cpu = r::new_cpu_id(0, 0);
    let base = 32 + pre.len() as u64 + 16;
    let cases: Vec<(Vec<u8>, &str, u64, &str)> = vec![
        // Truncated function record.
        (
            f(Entry, 1, 0)[..5].to_vec(),
            "Function",
            base,
            "needs 8 bytes",
        ),
        // Truncated metadata record.
        (cpu[..9].to_vec(), "NewCPUId", base, "needs 16 bytes"),
        // Unknown function record type 5.
        (
            vec![5 << 1, 0, 0, 0, 0, 0, 0, 0],
            "Function",
            base,
            "type 5",
        ),
        // Unknown metadata kind 10.
        (
            [&[21u8][..], &[0; 15]].concat(),
            "metadata record",
            base,
            "kind 10",
        ),
        // Custom event sizes: zero, negative, past the end.
        (
            [&[11u8][..], &0i32.to_le_bytes(), &[0; 11]].concat(),
            "CustomEventMarker",
            base,
            "not positive",
        ),
        (
            [&[11u8][..], &(-5i32).to_le_bytes(), &[0; 11]].concat(),
            "CustomEventMarker",
            base,
            "not positive",
        ),
        (
            [&[11u8][..], &i32::MAX.to_le_bytes(), &[0; 11], b"abc"].concat(),
            "CustomEventMarker",
            base,
            "runs past the end",
        ),
        // Records of later versions.
        (r::pid(1).to_vec(), "Pid", base, "from version 3"),
        (
            r::buffer_extents(1).to_vec(),
            "BufferExtents",
            base,
            "from version 2",
        ),
        (
            [&r::typed_event_marker(1, 0, 1).unwrap()[..], b"x"].concat(),
            "TypedEventMarker",
            base,
            "from version 5",
        ),
    ];
    for (tail, record, offset, needle) in cases {
        let e = err(&file(1, &[&pre, &cpu, &tail]));
        assert_eq!((e.record, e.offset), (record, offset), "{e}");
        assert!(e.problem.contains(needle), "{e}");
    }
    // EndOfBuffer in version 5.
    let e = err(&file(
        5,
        &[&v5_preamble(64 + 16), &cpu, &r::end_of_buffer()],
    ));
    assert_eq!(e.record, "EndOfBuffer");
    assert!(e.problem.contains("only in version 1"), "{e}");
    // A record crossing its segment's end.
    let e = err(&file(5, &[&v5_preamble(64 + 4), &cpu, &f(Entry, 1, 0)]));
    assert_eq!((e.record, e.offset), ("Function", 32 + 80));
    assert!(e.problem.contains("cross the end"), "{e}");
}

#[test]
fn grammar_errors() {
    let nb = r::new_buffer(1);
    let wc = r::wall_clock_time(1, 0);
    let cpu = r::new_cpu_id(0, 10);
    let check = |parts: &[&[u8]], record: &str, needle: &str| {
        let e = err(&file(1, parts));
        assert_eq!(e.record, record, "{e}");
        assert!(e.problem.contains(needle), "{e}");
        e
    };
    check(&[&cpu], "NewCPUId", "start with a NewBuffer");
    check(&[&nb, &cpu], "NewCPUId", "must be WallClockTime");
    check(&[&nb, &wc, &f(Entry, 1, 0)], "Function", "must be NewCPUId");
    let e = check(&[&nb, &wc], "NewBuffer", "before its NewCPUId");
    assert_eq!(e.offset, 64);
    check(&[&nb, &wc, &nb], "NewBuffer", "before its NewCPUId");
    check(
        &[&nb, &wc, &cpu, &wc],
        "WallClockTime",
        "only follow NewBuffer",
    );
    check(
        &[&nb, &wc, &cpu, &f(Entry, 1, 0), &r::call_argument(1)],
        "CallArgument",
        "must follow an Entry_Args",
    );
    check(
        &[
            &nb,
            &wc,
            &cpu,
            &f(EntryArgs, 1, 0),
            &cpu,
            &r::call_argument(1),
        ],
        "CallArgument",
        "must follow an Entry_Args",
    );
    // Version 5 needs Pid after WallClockTime.
    let e = err(&file(5, &[&r::buffer_extents(48), &nb, &wc, &cpu]));
    assert!(e.problem.contains("must be Pid"), "{e}");
}

#[test]
fn meaning_errors() {
    let pre = [v1_preamble(), r::new_cpu_id(0, 10).to_vec()].concat();
    let check = |parts: &[&[u8]], needle: &str| {
        let e = err(&file(1, &[&pre, parts.concat().as_slice()]));
        assert!(e.problem.contains(needle), "{e}");
        e
    };
    check(&[&f(Exit, 1, 0)], "has not entered");
    let e = check(
        &[&f(Entry, 1, 0), &f(Entry, 2, 0), &f(Exit, 3, 0)],
        "has not entered",
    );
    assert_eq!(e.offset, 32 + 64);
    check(
        &[&f(Entry, 1, 5), &r::new_cpu_id(1, 12), &f(Exit, 1, 0)],
        "backwards",
    );
    check(
        &[
            &f(Entry, 1, 0),
            &r::custom_event_marker_v1(1, 5).unwrap(),
            b"x",
        ],
        "backwards",
    );
    check(&[&r::tsc_wrap(u64::MAX), &f(Entry, 1, 1)], "overflows");
    // Version 5 deltas below zero.
    let b = file(
        5,
        &[
            &v5_preamble(1000),
            &r::new_cpu_id(0, 1),
            &r::custom_event_marker_v5(1, -2).unwrap(),
            b"x",
        ],
    );
    assert!(err(&b).problem.contains("64-bit tick range"));
    // Exits are matched per thread across blocks: thread 1 may exit what it entered earlier.
    let b2 = file(
        1,
        &[
            &pre,
            &f(Entry, 1, 0),
            &r::new_buffer(2),
            &r::wall_clock_time(1, 0),
            &r::new_cpu_id(0, 20),
            &f(Entry, 3, 0),
            &r::new_buffer(7),
            &r::wall_clock_time(1, 0),
            &r::new_cpu_id(0, 30),
            &f(Exit, 1, 0),
        ],
    );
    let t = read(&b2).unwrap();
    assert_eq!(t.blocks.len(), 3);
    assert_eq!(
        t.records.iter().map(|x| x.tid).collect::<Vec<_>>(),
        [7, 2, 7]
    );
}

#[test]
fn reader_streams_every_record() {
    let b = file(
        1,
        &[
            &v1_preamble(),
            &r::new_cpu_id(0, 10),
            &f(Entry, 1, 0),
            &r::end_of_buffer(),
            &[0; 16],
        ],
    );
    let steps: Vec<_> = Reader::new(&b).unwrap().map(Result::unwrap).collect();
    let names: Vec<_> = steps.iter().map(|s| s.record.name()).collect();
    assert_eq!(
        names,
        [
            "NewBuffer",
            "WallClockTime",
            "NewCPUId",
            "Function",
            "EndOfBuffer",
            "Function",
            "Function"
        ]
    );
    assert_eq!(steps[3].tsc, Some(10));
    assert!(steps[5].ignored && steps[6].ignored && !steps[4].ignored);
    // The iterator stops after an error.
    let mut it = Reader::new(&b[..b.len() - 3]).unwrap();
    assert!(it.by_ref().any(|s| s.is_err()));
    assert!(it.next().is_none());
}

#[test]
fn exits_past_unwound_frames_close_them() {
    // As XRay's runtime writes a call an exception left: 2 and 3 have no exit of their own, and
    // 1's exit closes them (llvm-xray convert reads such files too); a tail exit can do it too.
    let pre = [v1_preamble(), r::new_cpu_id(0, 10).to_vec()].concat();
    let body = [
        f(Entry, 1, 0),
        f(Entry, 2, 1),
        f(Entry, 3, 1),
        f(Exit, 1, 1),
        f(Entry, 4, 1),
        f(Entry, 5, 1),
        f(TailExit, 4, 1),
        f(Entry, 1, 1),
        f(Exit, 1, 1),
    ]
    .concat();
    let bytes = file(1, &[&pre, &body]);
    let unwound: Vec<(u64, u32)> = Reader::new(&bytes)
        .unwrap()
        .map(|s| s.unwrap())
        .filter(|s| matches!(s.record, RawRecord::Function { .. }))
        .map(|s| (s.tsc.unwrap(), s.unwound))
        .collect();
    assert_eq!(
        unwound,
        [
            (10, 0),
            (11, 0),
            (12, 0),
            (13, 2),
            (14, 0),
            (15, 0),
            (16, 1),
            (17, 0),
            (18, 0)
        ]
    );
    assert_eq!(read(&bytes).unwrap().records.len(), 9);
}
