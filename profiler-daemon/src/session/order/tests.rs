use super::*;
use profiler_common::SledKind;

fn ev(tid: u32, seq: u64, gap_lost: u32, kind: u8) -> Event {
    Event {
        header: EventHeader {
            tid,
            seq,
            gap_lost,
            kind,
            ..EventHeader::default()
        },
        args: [0; profiler_common::MAX_ARGS],
        nargs: 0,
        data: None,
    }
}

fn run(events: Vec<Event>) -> (Vec<(u32, u64, Option<Gap>)>, Sequencer) {
    let mut out = Vec::new();
    let mut s = Sequencer::default();
    let mut sink = |e: &mut Event, g: Option<Gap>| out.push((e.header.tid, e.header.seq, g));
    for mut e in events {
        s.push(&mut e, &mut sink);
    }
    (out, s)
}

const ENTRY: u8 = SledKind::Entry as u8;

#[test]
fn in_order_events_pass_straight_through() {
    let (out, s) = run((0..5).map(|i| ev(1, i, 0, ENTRY)).collect());
    assert_eq!(
        out.iter().map(|o| o.1).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
    assert_eq!(s.threads(), 1);
}

#[test]
fn a_migrated_thread_is_put_back_in_order() {
    // Buffer of CPU 1 drained first holds 2, 3; CPU 0's holds 0, 1, 4.
    let order = [2, 3, 0, 1, 4];
    let (out, _) = run(order.iter().map(|&i| ev(9, i, 0, ENTRY)).collect());
    assert_eq!(
        out.iter().map(|o| o.1).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
}

#[test]
fn losses_are_delivered_as_gaps_not_waited_for() {
    // 2 and 3 were lost; 4 says so.
    let (out, _) = run(vec![
        ev(1, 0, 0, ENTRY),
        ev(1, 1, 0, ENTRY),
        ev(1, 4, 2, ENTRY),
    ]);
    assert_eq!(out[2], (1, 4, Some(Gap { lost: 2 })));
    // An event after a gap that arrives before its predecessor still waits for it.
    let (out, _) = run(vec![
        ev(1, 4, 2, ENTRY),
        ev(1, 0, 0, ENTRY),
        ev(1, 1, 0, ENTRY),
    ]);
    assert_eq!(out.iter().map(|o| o.1).collect::<Vec<_>>(), vec![0, 1, 4]);
}

#[test]
fn threads_are_independent_and_end_with_their_exit_record() {
    let (out, s) = run(vec![
        ev(1, 1, 0, ENTRY),
        ev(2, 0, 0, ENTRY),
        ev(1, 2, 0, event_kind::THREAD_EXIT),
        ev(1, 0, 0, ENTRY),
    ]);
    assert_eq!(
        out,
        vec![(2, 0, None), (1, 0, None), (1, 1, None), (1, 2, None)]
    );
    assert_eq!(
        s.threads(),
        1,
        "thread 1 is forgotten after its exit record"
    );
    // A reused tid starts from 0 again.
    let (out, _) = run(vec![
        ev(1, 0, 0, event_kind::THREAD_EXIT),
        ev(1, 0, 0, ENTRY),
    ]);
    assert_eq!(out.len(), 2);
}

#[test]
fn stale_numbers_are_counted_and_dropped() {
    let (out, s) = run(vec![
        ev(1, 0, 0, ENTRY),
        ev(1, 0, 0, ENTRY),
        ev(1, 1, 5, ENTRY),
    ]);
    assert_eq!(out.len(), 1);
    assert_eq!(s.stale(), 2);
}

#[test]
fn finish_delivers_trailing_losses_and_stragglers() {
    let mut out = Vec::new();
    let mut s = Sequencer::default();
    let mut sink =
        |e: &mut Event, g: Option<Gap>| out.push((e.header.tid, e.header.seq, e.header.kind, g));
    s.push(&mut ev(1, 0, 0, ENTRY), &mut sink);
    s.push(&mut ev(2, 3, 0, ENTRY), &mut sink); // 0..3 of thread 2 never arrive
    let live = [(
        1,
        ThreadState {
            seq: 3,
            gap_lost: 2,
            ..ThreadState::default()
        },
    )];
    s.finish(&live, &mut sink);
    assert_eq!(
        out[1],
        (1, 3, event_kind::THREAD_EXIT, Some(Gap { lost: 2 }))
    );
    assert_eq!(out[2], (2, 3, ENTRY, Some(Gap { lost: 3 })));
    assert_eq!(s.threads(), 0);
}

#[test]
fn early_runs_from_several_rings_are_put_back_in_order_with_their_gaps() {
    // Thread 7 ran on three CPUs: the ring read first holds 20..=29 (25 and 26 lost before
    // 27), the second 10..=19 with thread 8's events between them, the last 0..=9 and then
    // 30 (after it came back). Two runs wait at once, one of them with a loss inside.
    let mut events: Vec<Event> = (20..30)
        .filter(|&i| i != 25 && i != 26)
        .map(|i| ev(7, i, if i == 27 { 2 } else { 0 }, ENTRY))
        .collect();
    for i in 10..20 {
        events.push(ev(7, i, 0, ENTRY));
        events.push(ev(8, i - 10, 0, ENTRY));
    }
    events.extend((0..10).map(|i| ev(7, i, 0, ENTRY)));
    events.push(ev(7, 30, 0, ENTRY));
    let (out, s) = run(events);
    let seven: Vec<(u64, Option<Gap>)> = out
        .iter()
        .filter(|o| o.0 == 7)
        .map(|o| (o.1, o.2))
        .collect();
    let expected: Vec<(u64, Option<Gap>)> = (0..31)
        .filter(|&i| i != 25 && i != 26)
        .map(|i| (i, (i == 27).then_some(Gap { lost: 2 })))
        .collect();
    assert_eq!(seven, expected);
    let eight: Vec<u64> = out.iter().filter(|o| o.0 == 8).map(|o| o.1).collect();
    assert_eq!(eight, (0..10).collect::<Vec<_>>());
    assert_eq!(s.stale(), 0);
}

#[test]
fn two_early_events_for_the_same_numbers_are_stale() {
    let (out, s) = run(vec![
        ev(1, 5, 0, ENTRY),
        ev(1, 5, 0, ENTRY),
        ev(1, 0, 0, ENTRY),
    ]);
    assert_eq!(s.stale(), 1);
    assert_eq!(out.len(), 1);
}

/// Runs that overlap (only corrupt records, or a thread id reused while its predecessor's
/// events still wait, can make them) end the session with the overlapping events counted as
/// stale, not delivered twice nor numbered backwards.
#[test]
fn overlapping_runs_are_counted_at_the_end_not_delivered() {
    let (mut out, mut s) = run(vec![
        ev(1, 10, 0, ENTRY),
        ev(1, 11, 0, ENTRY),
        ev(1, 20, 0, ENTRY),
        ev(1, 11, 0, ENTRY),
    ]);
    assert!(out.is_empty());
    s.finish(&[], &mut |e: &mut Event, g| {
        out.push((e.header.tid, e.header.seq, g))
    });
    assert_eq!(
        out,
        vec![
            (1, 10, Some(Gap { lost: 10 })),
            (1, 11, Some(Gap { lost: 0 })),
            (1, 20, Some(Gap { lost: 8 })),
        ]
    );
    assert_eq!(s.stale(), 1);
}
