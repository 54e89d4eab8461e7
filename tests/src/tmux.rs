//! A terminal the tests can read: a command run in a tmux session of its own (its own server
//! socket, so nothing of a user's tmux is touched), keys sent to it, its screen captured as
//! text, as a person would look at it. Panics saying what to install if tmux is missing.
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// A command running in a detached tmux session; the session (and the server) are killed
/// when this is dropped.
pub struct Terminal {
    socket: String,
}

fn tmux() -> PathBuf {
    let path = PathBuf::from("/usr/bin/tmux");
    assert!(
        path.is_file(),
        "tmux not found at /usr/bin/tmux: install it (apt-get install tmux; `cargo xtask setup` does)"
    );
    path
}

impl Terminal {
    /// Runs `shell_command` (`sh -c`) in a `width` x `height` terminal.
    pub fn start(name: &str, width: u16, height: u16, shell_command: &str) -> Terminal {
        let socket = format!("fdr-test-{name}-{}", std::process::id());
        let status = Command::new(tmux())
            .args([
                "-L",
                &socket,
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-s",
                "test",
            ])
            .args(["-x", &width.to_string(), "-y", &height.to_string()])
            .arg(shell_command)
            .env_remove("TMUX")
            .status()
            .expect("running tmux");
        assert!(status.success(), "tmux new-session failed: {status}");
        Terminal { socket }
    }

    /// The screen now, one string per line.
    pub fn screen(&self) -> Vec<String> {
        let out = Command::new(tmux())
            .args(["-L", &self.socket, "capture-pane", "-p", "-t", "test"])
            .output()
            .expect("running tmux capture-pane");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Sends keys (tmux's names: `c`, `q`, `Enter`, `C-c`).
    pub fn keys(&self, keys: &str) {
        let status = Command::new(tmux())
            .args(["-L", &self.socket, "send-keys", "-t", "test", keys])
            .status()
            .expect("running tmux send-keys");
        assert!(status.success(), "tmux send-keys {keys} failed");
    }

    /// Waits until `ready` accepts the screen, for at most `timeout`; returns that screen, or
    /// panics showing the last one.
    pub fn wait_for<T>(
        &self,
        timeout: Duration,
        mut ready: impl FnMut(&[String]) -> Option<T>,
    ) -> T {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if let Some(found) = ready(&screen) {
                return found;
            }
            if start.elapsed() > timeout {
                panic!(
                    "the screen did not show what was awaited within {timeout:?}:\n{}",
                    screen.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = Command::new(tmux())
            .args(["-L", &self.socket, "kill-server"])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Sends `q` to `fdr-profiled top` run as `top ...; echo top-exit=$?; ...`, and waits (at most
/// `timeout`) for the exit line; returns the screen then.
pub fn quit_top(terminal: &Terminal, timeout: Duration) -> String {
    terminal.keys("q");
    terminal.wait_for(timeout, |s| {
        s.iter()
            .any(|l| l.starts_with("top-exit="))
            .then(|| s.join("\n"))
    })
}

/// A row of `fdr-profiled top`'s table.
#[derive(Debug, Clone, PartialEq)]
pub struct TopRow {
    pub calls_per_s: f64,
    pub function: String,
}

/// What `fdr-profiled top` shows: the window's length in seconds (from its first line) and
/// the rows of its table, top first; `None` before it shows a window.
pub fn top_screen(screen: &[String]) -> Option<(f64, Vec<TopRow>)> {
    let seconds: f64 = screen
        .iter()
        .find_map(|l| l.split(" in the last ").nth(1))?
        .split(" s")
        .next()?
        .parse()
        .ok()?;
    let header = screen.iter().position(|l| l.starts_with("CALLS/S"))?;
    let rows = screen[header + 1..]
        .iter()
        .map_while(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let calls_per_s = words.first()?.parse().ok()?;
            // CALLS/S CPU% MEAN(2 words) P99(2 words) CALLS FUNCTION...
            let function = words.get(7..)?.join(" ");
            Some(TopRow {
                calls_per_s,
                function,
            })
        })
        .collect();
    Some((seconds, rows))
}

/// The program's own rates, calls a second, in order.
pub fn reported_rates(report: &std::path::Path) -> Vec<f64> {
    std::fs::read_to_string(report)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("rate function=pc_hot calls_per_s="))
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// Waits for a screen of `top` sorted by calls whose top row is `function` at the rate the
/// program reported over about the window's seconds (within 10%); a screen caught between
/// two seconds may disagree, so up to 8 screens are read, a second apart.
pub fn hot_function_on_top(terminal: &Terminal, report: &std::path::Path, function: &str) {
    // A window of 3 s or more: the rates settle.
    terminal.wait_for(Duration::from_secs(60), |s| {
        top_screen(s).filter(|(seconds, rows)| *seconds >= 3.0 && !rows.is_empty())
    });
    terminal.keys("c");
    std::thread::sleep(Duration::from_millis(1500));
    let mut seen = Vec::new();
    for _ in 0..8 {
        let screen = terminal.screen();
        let (seconds, rows) = top_screen(&screen).expect("the table");
        assert!(
            screen.iter().any(|l| l.contains("sorted by calls/s")),
            "{}",
            screen.join("\n")
        );
        let TopRow {
            calls_per_s,
            function: top,
        } = rows[0].clone();
        assert_eq!(
            top,
            function,
            "the hot function is the top row:\n{}",
            screen.join("\n")
        );
        let rates = reported_rates(report);
        let last = &rates[rates
            .len()
            .saturating_sub(seconds.round().max(1.0) as usize)..];
        let program = last.iter().sum::<f64>() / last.len() as f64;
        if (calls_per_s - program).abs() <= program * 0.10 {
            return;
        }
        seen.push(format!(
            "top {calls_per_s}/s over {seconds} s, the program {program}/s ({last:?})"
        ));
        std::thread::sleep(Duration::from_secs(1));
    }
    panic!("the screen's rate never came within 10% of the program's: {seen:#?}");
}
