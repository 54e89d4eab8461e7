//! End to end: a C++ program that forks while its frames are hooked (tests/fixtures/forks.cpp),
//! launched with the defaults, which repair it.
//!
//! A forked child inherits the frames hooked at the fork, and the kernel hooks the child's own
//! calls as well (a return probe hooks a frame wherever its breakpoint fires, whatever process
//! the probe is filtered to): without a tracer that repairs the child, its first exception
//! through such a frame ends it in `std::terminate`. The repair keeper follows every fork:
//! - the children's output and exit statuses are those of the untraced run, also for the
//!   child that leaves by throwing through a frame it inherited, and for a grandchild;
//! - a child that calls `exec` at once runs its new program;
//! - the summary and `session.json` count every throw of every process, and the forks
//!   followed; only the launched process is recorded, its calls exactly.
//!
//! Needs root, BPF, clang-19, llvm-xray 14/19 and a built daemon.

use std::time::Duration;

use tests::fixtures::workloads::forks_fixture;
use tests::launched::launch;
use tests::structure::entries_and_exits;

const TIMEOUT: Duration = Duration::from_secs(300);

fn sorted_lines(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    lines
}

#[test]
fn forked_children_throw_through_hooked_frames_under_the_defaults() {
    let untraced = tests::tools::run_output(&mut std::process::Command::new(forks_fixture()));
    assert!(untraced.status.success(), "{untraced:?}");
    let untraced = String::from_utf8(untraced.stdout).unwrap();
    assert_eq!(untraced.lines().last(), Some("forks: done a=0 b=0"));

    let run = launch("repair-forks", &forks_fixture(), &[], &[], TIMEOUT);
    let stdout = &run.done.stdout;
    // Children write concurrently: the same lines, in any order.
    assert_eq!(sorted_lines(stdout), sorted_lines(&untraced), "{stdout}");
    assert_eq!(stdout.lines().last(), Some("forks: done a=0 b=0"));

    // The defaults repair the program (it can unwind, and forks).
    let line = run.exits_line();
    assert!(line.starts_with("return probes (auto: "), "{line}");
    assert_eq!(run.session_str("exits"), "repair");

    // Every throw of every process was repaired: the parent's 200 rounds, child A's 1000 and
    // its ChildDone, the grandchild's 10. The fork of child A, of child B (which execs) and
    // of the grandchild were followed.
    let (repair, throws) = tests::trace::repair_books(&run.session, &run.done.stderr);
    assert_eq!(throws, 200 + 1000 + 1 + 10, "{repair}");
    assert!(repair.contains(" 1211 catches ("), "{repair}");
    assert!(repair.contains(" 0 slots left alone;"), "{repair}");
    assert!(
        repair.contains("; 3 forked processes followed (repaired, not recorded)"),
        "{repair}"
    );
    let unrecorded = &run.session.json["repair_unrecorded_threads"];
    assert_eq!(unrecorded["throws"].as_u64(), Some(1011), "{unrecorded}");

    // Only the launched process is recorded: its 200 calls of fk_catcher, each returned.
    let pid = run.pid();
    let files = run.files();
    assert_eq!(files.len(), 1, "one thread of one process");
    assert_eq!(files[0].tid, pid);
    let converted = run.converted_both();
    let (entries, exits) = entries_and_exits(&converted[&pid].records, "fk_catcher");
    assert_eq!((entries, exits), (200, 200));
    assert_eq!(run.session.events_lost, 0, "{}", run.session.json);
    tests::assert_every_event_accounted(&run.session);
}
