//! The live view of a recording, looked at as a person would: `fdr-profiled top -- CMD` in a
//! terminal (tmux), keys sent, the screen read. The program calls `pc_hot` at a steady rate
//! and says each second how many calls it made: sorted by calls (`c`), `pc_hot` is the top
//! row with that rate to within 10%; `q` ends the recording, whose summary then reaches the
//! terminal, and nothing is left behind without `--out`.

use std::time::Duration;
use tests::fixtures::workloads::paced_fixture;
use tests::tmux::{hot_function_on_top, quit_top, Terminal};

#[test]
fn top_shows_a_launched_program_s_hot_function_at_its_own_rate() {
    let scratch = tests::scratch_dir("top-launched");
    let report = scratch.path().join("rates.txt");
    let command = format!(
        "{} top -- {} --rate 20000 --seconds 40 --report {}; echo top-exit=$?; sleep 120",
        tests::fdr_profiled().display(),
        paced_fixture().display(),
        report.display()
    );
    let terminal = Terminal::start("top-launched", 160, 40, &command);
    hot_function_on_top(&terminal, &report, "pc_hot");
    let screen = terminal.screen();
    assert!(
        screen.iter().any(|l| l.contains("pc_warm")),
        "{}",
        screen.join("\n")
    );
    // `q`: the recording ends, its summary is on the terminal, its files are gone.
    let end = quit_top(&terminal, Duration::from_secs(60));
    assert!(end.contains("top-exit=0"), "{end}");
    assert!(end.contains("session summary"), "{end}");
    assert!(end.contains("the recording was not kept"), "{end}");
    let dir = end
        .lines()
        .find_map(|l| l.trim().strip_prefix("files written: 1 in "))
        .expect("the summary names the directory");
    assert!(
        !std::path::Path::new(dir.trim()).exists(),
        "{dir} was removed"
    );
    // The launched program goes on, untraced, to its end.
    let _ = std::process::Command::new("pkill")
        .args(["-f", &report.display().to_string()])
        .status();
}

/// Without a terminal the live view refuses in one line, before anything is launched.
#[test]
fn top_without_a_terminal_is_one_line_and_nothing_runs() {
    let scratch = tests::scratch_dir("top-no-terminal");
    let report = scratch.path().join("rates.txt");
    for args in [&["top", "--"][..], &["--live", "--"][..]] {
        let out = tests::tools::run_output(
            std::process::Command::new(tests::fdr_profiled())
                .args(args)
                .arg(paced_fixture())
                .args(["--seconds", "1", "--report"])
                .arg(&report)
                .stdout(std::process::Stdio::piped()),
        );
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("draws in a terminal"), "{stderr}");
        assert!(!report.exists(), "the command never ran");
    }
}
