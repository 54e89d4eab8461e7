use super::*;

const S: u64 = 1_000_000_000;

fn calls(n: u64) -> Counts {
    Counts {
        calls: n,
        stopped_ns: 0,
    }
}

fn busy(now_s: u64, threads: u32) -> Sample {
    Sample {
        now_ns: now_s * S,
        period_ns: S,
        threads,
        cpu_ns: u64::from(threads) * S,
        stopped_ns: 0,
    }
}

/// A leaf called a million times a second at 1 µs a call (the thread's whole time), and an
/// outer function a thousand times: at 5% the leaf goes, the outer function stays.
#[test]
fn drops_the_hottest_function_and_keeps_the_rest() {
    let mut c = Controller::new(0.05);
    let leaf = c.add(1000.0, calls(0));
    let outer = c.add(1000.0, calls(0));
    let counts = [1_000_000u64, 1_000];
    let (estimate, changes) = c.observe(&busy(1, 1), |i| calls(counts[i]), true);
    assert!(estimate.overhead > 1.0, "{estimate:?}");
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].function, leaf);
    assert!(changes[0].dropped);
    assert_eq!(changes[0].calls_per_second, 1e6);
    assert!(c.is_dropped(leaf) && !c.is_dropped(outer));
    // 1 ms of probes in a second of one thread: 0.1%.
    assert!(
        (estimate.overhead_after - 0.001 / 0.999).abs() < 1e-9,
        "{estimate:?}"
    );
}

/// Still busy after the hold: the dropped leaf would cost as much as before, so it stays
/// out; once the program goes quiet it comes back.
#[test]
fn readmits_when_the_load_falls_and_not_before() {
    let mut c = Controller::new(0.05);
    let leaf = c.add(1000.0, calls(0));
    let outer = c.add(1000.0, calls(0));
    let mut counts = [1_000_000u64, 1_000];
    c.observe(&busy(1, 1), |i| calls(counts[i]), true);
    assert!(c.is_dropped(leaf));
    for t in 2..20 {
        counts[outer] += 2_000; // faster without the leaf's probes
        let (_, changes) = c.observe(&busy(t, 1), |i| calls(counts[i]), true);
        assert!(changes.is_empty(), "at {t} s: {changes:?}");
    }
    // Quiet: 1% of a CPU used.
    counts[outer] += 20;
    let quiet = Sample {
        now_ns: 20 * S,
        period_ns: S,
        threads: 1,
        cpu_ns: S / 100,
        stopped_ns: 0,
    };
    let (_, changes) = c.observe(&quiet, |i| calls(counts[i]), true);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert!(!changes[0].dropped && changes[0].function == leaf);
    assert!(!c.is_dropped(leaf));
}

/// Not within the hold: a function dropped a moment ago stays dropped even if the program
/// went quiet at once.
#[test]
fn holds_a_dropped_function_out_for_a_while() {
    let mut c = Controller::new(0.05);
    let leaf = c.add(1000.0, calls(0));
    c.observe(&busy(1, 1), |_| calls(1_000_000), true);
    let quiet = Sample {
        now_ns: 5 * S,
        period_ns: S,
        threads: 1,
        cpu_ns: S / 100,
        stopped_ns: 0,
    };
    let (_, changes) = c.observe(&quiet, |_| calls(1_000_000), true);
    assert!(changes.is_empty());
    assert!(c.is_dropped(leaf));
}

/// Under the limit nothing changes; more threads mean more time for the probes.
#[test]
fn within_the_budget_nothing_is_dropped() {
    let mut c = Controller::new(0.05);
    c.add(1000.0, calls(0));
    // 40 ms of probes in 1 s of one thread: 4.2%.
    let (estimate, changes) = c.observe(&busy(1, 1), |_| calls(40_000), true);
    assert!(changes.is_empty(), "{estimate:?}");
    assert!((estimate.overhead - 0.04 / 0.96).abs() < 1e-9);
    // 80 ms over two busy threads: the same share of each.
    let (estimate, changes) = c.observe(&busy(2, 2), |_| calls(120_000), true);
    assert!(changes.is_empty());
    assert!(
        (estimate.overhead - 0.04 / 0.96).abs() < 1e-9,
        "{estimate:?}"
    );
}

#[test]
fn parses_budgets() {
    assert_eq!(parse_percent("5%").unwrap(), 0.05);
    assert_eq!(parse_percent(" 50 ").unwrap(), 0.5);
    assert!((parse_percent("0.5%").unwrap() - 0.005).abs() < 1e-12);
    for bad in ["", "%", "0%", "-1%", "abc", "20000%", "NaN"] {
        assert!(parse_percent(bad).is_err(), "{bad}");
    }
}

/// Stops for the repair are the cost of the functions whose hooked frames caused them: an
/// outer function called rarely but thrown through goes when its stops take the budget.
#[test]
fn the_repairs_stops_are_the_hooking_functions_cost() {
    let mut c = Controller::new(0.05);
    let outer = c.add(1000.0, calls(0));
    let plain = c.add(1000.0, calls(0));
    let counts = |i: usize| Counts {
        calls: 1_000,
        stopped_ns: if i == outer { S / 5 } else { 0 },
    };
    let (estimate, changes) = c.observe(&busy(1, 1), counts, true);
    assert!(
        (estimate.overhead - 0.202 / 0.798).abs() < 1e-9,
        "{estimate:?}"
    );
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].function, outer);
    assert!(!c.is_dropped(plain));
}

/// A function whose frame lives long (a server's loop: called once) is charged its share of
/// every stop: dropped for it though it makes no calls.
#[test]
fn a_long_lived_frame_is_charged_its_stops_without_calls() {
    let mut c = Controller::new(0.05);
    let outer = c.add(1000.0, calls(1));
    let counts = |_| Counts {
        calls: 1,
        stopped_ns: S / 5,
    };
    let (_, changes) = c.observe(&busy(1, 1), counts, true);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert!(changes[0].dropped && changes[0].function == outer);
    assert_eq!(changes[0].calls_per_second, 0.0);
}

/// A function dropped for its share of the repair's stops is predicted to cost that share
/// again: under the same load it stays out, whatever its traps alone would cost. Stops its
/// frames still cause once dropped (a removed return probe leaves them hooked until they
/// return) are counted, though no drop removes them.
#[test]
fn a_function_dropped_for_its_stops_stays_out_under_the_same_load() {
    let mut c = Controller::new(0.2);
    let outer = c.add(1000.0, calls(0));
    let n = 10_000u64;
    // 10 ms of traps, 400 ms of stops in a second of one thread.
    let (_, changes) = c.observe(
        &busy(1, 1),
        |_| Counts {
            calls: n,
            stopped_ns: 2 * S / 5,
        },
        true,
    );
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert!(c.is_dropped(outer));
    // Its frames still hooked stop the thread for 100 ms more in the next second.
    let (estimate, changes) = c.observe(
        &busy(2, 1),
        |_| Counts {
            calls: n,
            stopped_ns: S / 2,
        },
        true,
    );
    assert!(changes.is_empty(), "{changes:?}");
    assert!((estimate.overhead - 0.1 / 0.9).abs() < 1e-9, "{estimate:?}");
    for t in 3..30 {
        // No calls counted while it is dropped; the thread as busy as before.
        let (_, changes) = c.observe(
            &busy(t, 1),
            |_| Counts {
                calls: n,
                stopped_ns: S / 2,
            },
            true,
        );
        assert!(changes.is_empty(), "at {t} s: {changes:?}");
    }
}

/// While the last changes take effect (their probes still being removed, or the period they
/// were removed in), nothing is decided: what that period cost is not what is traced now.
#[test]
fn nothing_is_decided_while_changes_take_effect() {
    let mut c = Controller::new(0.05);
    let leaf = c.add(1000.0, calls(0));
    let (estimate, changes) = c.observe(&busy(1, 1), |_| calls(1_000_000), false);
    assert!(changes.is_empty() && !c.is_dropped(leaf));
    assert!(estimate.overhead > 1.0);
    // The counts were taken: the next period's are its own.
    let (estimate, changes) = c.observe(&busy(2, 1), |_| calls(1_500_000), true);
    assert!(
        (estimate.calls_per_second - 500_000.0).abs() < 1e-6,
        "{estimate:?}"
    );
    assert_eq!(changes.len(), 1);
}
