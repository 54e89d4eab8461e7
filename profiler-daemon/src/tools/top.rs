//! `fdr-profiled top`: the live view, as `perf top` and bpftop show it. Each function's calls
//! per second, time in its calls per second (inclusive: a recursive function's nested calls
//! count at every level, as `llvm-xray account` counts them), mean and p99 duration over the
//! last seconds, with the events per second and losses, redrawn every second in the terminal
//! (ratatui), sorted by a key.
//!
//! The [`Screen`] draws on its own thread what it is sent: [`LiveView`]s of a recording
//! (`--live`, or `top` with recording options: `record` sends them between its drains) or of
//! the service (`top` alone asks it over the control socket, [`service`]). While it draws,
//! the process's standard error goes into a pane under the table (a warning written to the
//! terminal would tear the screen), and out to the terminal once it is closed.
use crate::service::control::{ask, Request, DEFAULT_SOCKET};
use crate::session::live::{window, LiveView, Row, Window};
use anyhow::{bail, Context as _, Result};
use fdr_session::units::human_ns;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Table};
use std::collections::VecDeque;
use std::future::Future as _;
use std::io::{BufRead as _, IsTerminal as _};
use std::os::fd::{FromRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// Options of `top`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Keys: t c m p n sort by time, calls/s, mean, p99, name; + - widen or narrow the window; q quits."
)]
pub struct TopArgs {
    /// The service's control socket, when watching the service.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Watch a recording instead: its options, as `fdr-profiled` takes them (`--pid PID`,
    /// `--attach BIN`, `-- COMMAND ARGS`). Nothing is kept unless `--out` is given.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "RECORDING OPTIONS"
    )]
    pub recording: Vec<std::ffi::OsString>,
}

/// What the rows are sorted by (largest first, but names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortBy {
    Time,
    Calls,
    Mean,
    P99,
    Name,
}

impl SortBy {
    fn label(self) -> &'static str {
        match self {
            SortBy::Time => "time",
            SortBy::Calls => "calls/s",
            SortBy::Mean => "mean",
            SortBy::P99 => "p99",
            SortBy::Name => "name",
        }
    }

    /// Sorts `rows` by this key.
    pub fn sort(self, rows: &mut [Row]) {
        let by = |a: &Row, b: &Row| match self {
            SortBy::Time => b.busy.total_cmp(&a.busy),
            SortBy::Calls => b.calls_per_s.total_cmp(&a.calls_per_s),
            SortBy::Mean => b.mean_ns.cmp(&a.mean_ns),
            SortBy::P99 => b.p99_ns.cmp(&a.p99_ns),
            SortBy::Name => (&a.group, &a.name).cmp(&(&b.group, &b.name)),
        };
        rows.sort_by(|a, b| by(a, b).then_with(|| a.name.cmp(&b.name)));
    }
}

/// Views kept: the window reaches this many seconds back at most.
const MAX_WINDOW_S: usize = 60;
/// Lines of standard error kept for the pane (and for the terminal after).
const MAX_MESSAGES: usize = 1_000;

/// The live view on the terminal, drawn by a thread of its own.
pub struct Screen {
    views: mpsc::Sender<LiveView>,
    quit: Arc<tokio::sync::Notify>,
    done: Arc<AtomicBool>,
    drawer: Option<std::thread::JoinHandle<()>>,
    stderr: Arc<Captured>,
}

/// The process's standard error while the screen is up.
struct Captured {
    /// The terminal's standard error, put back at the end.
    terminal: OwnedFd,
    /// Lines written while the screen is up.
    lines: Mutex<VecDeque<String>>,
    /// Whether the screen is up: after, lines go straight to the terminal.
    up: AtomicBool,
}

impl Screen {
    /// Takes the terminal (standard output must be one) and draws under `title`.
    pub fn start(title: String) -> Result<Screen> {
        check_terminal()?;
        let stderr = capture_stderr()?;
        let mut terminal = match ratatui::try_init() {
            Ok(t) => t,
            Err(err) => {
                restore_stderr(&stderr);
                bail!("cannot take the terminal: {err}");
            }
        };
        let (views, received) = mpsc::channel::<LiveView>();
        let quit = Arc::new(tokio::sync::Notify::new());
        let done = Arc::new(AtomicBool::new(false));
        let drawer = {
            let (quit, done, stderr) = (quit.clone(), done.clone(), stderr.clone());
            std::thread::Builder::new()
                .name("top".into())
                .spawn(move || {
                    let mut state = State {
                        title,
                        views: VecDeque::new(),
                        sort: SortBy::Time,
                        window_s: 5,
                    };
                    let mut quit_sent = false;
                    while !done.load(Ordering::Acquire) {
                        let mut changed = false;
                        while let Ok(view) = received.try_recv() {
                            state.views.push_back(view);
                            if state.views.len() > MAX_WINDOW_S + 1 {
                                state.views.pop_front();
                            }
                            changed = true;
                            // A launched command writes to the same terminal: a whole
                            // redraw once a second wipes what it wrote over the screen.
                            let _ = terminal.clear();
                        }
                        if let Ok(true) = event::poll(Duration::from_millis(100)) {
                            if let Ok(Event::Key(key)) = event::read() {
                                if key.kind != KeyEventKind::Release {
                                    changed = true;
                                    let ctrl_c = key.modifiers.contains(KeyModifiers::CONTROL)
                                        && key.code == KeyCode::Char('c');
                                    match key.code {
                                        _ if ctrl_c && !quit_sent => {
                                            quit.notify_one();
                                            quit_sent = true;
                                        }
                                        KeyCode::Char('q') | KeyCode::Esc if !quit_sent => {
                                            quit.notify_one();
                                            quit_sent = true;
                                        }
                                        code => state.key(code),
                                    }
                                }
                            }
                        }
                        if changed {
                            let messages =
                                stderr.lines.lock().map(|l| l.clone()).unwrap_or_default();
                            let _ = terminal.draw(|frame| state.draw(frame, &messages, quit_sent));
                        }
                    }
                })
                .context("starting the screen's thread")?
        };
        Ok(Screen {
            views,
            quit,
            done,
            drawer: Some(drawer),
            stderr,
        })
    }

    /// Shows `view` (sums at a moment: the screen takes the differences).
    pub fn show(&self, view: LiveView) {
        let _ = self.views.send(view);
    }

    /// Resolves once the user asked to quit (`q`, Esc, Ctrl-C).
    pub async fn quit_asked(&self) {
        self.quit.notified().await;
    }

    /// Whether the user asked to quit (for a loop that does not await).
    pub fn quit_now(&self) -> bool {
        let asked = self.quit.notified();
        tokio::pin!(asked);
        let waker = std::task::Waker::noop();
        asked
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
            .is_ready()
    }
}

impl Drop for Screen {
    /// Gives the terminal back, then writes what standard error said meanwhile to it.
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
        if let Some(drawer) = self.drawer.take() {
            let _ = drawer.join();
        }
        ratatui::restore();
        restore_stderr(&self.stderr);
    }
}

/// Refuses to draw where standard output is not a terminal.
pub fn check_terminal() -> Result<()> {
    if !std::io::stdout().is_terminal() {
        bail!("the live view draws in a terminal, and standard output is not one (for a machine-readable state: `fdr-profiled status --json`)");
    }
    Ok(())
}

/// What the screen shows: the views it was sent, how.
struct State {
    title: String,
    views: VecDeque<LiveView>,
    sort: SortBy,
    window_s: usize,
}

impl State {
    fn key(&mut self, code: KeyCode) {
        match code {
            KeyCode::Char('t') => self.sort = SortBy::Time,
            KeyCode::Char('c') => self.sort = SortBy::Calls,
            KeyCode::Char('m') => self.sort = SortBy::Mean,
            KeyCode::Char('p') => self.sort = SortBy::P99,
            KeyCode::Char('n') => self.sort = SortBy::Name,
            KeyCode::Char('+') => self.window_s = (self.window_s + 1).min(MAX_WINDOW_S),
            KeyCode::Char('-') => self.window_s = self.window_s.saturating_sub(1).max(1),
            _ => {}
        }
    }

    /// The window: the newest view against the newest one at least `window_s` seconds older
    /// (or the oldest there is, while the recording is younger than that).
    fn window(&self) -> Option<Window> {
        let now = self.views.back()?;
        let since = now
            .at_ns
            .saturating_sub(self.window_s as u64 * 1_000_000_000);
        let before = (self.views.iter().rev().skip(1))
            .find(|v| v.at_ns <= since)
            .or_else(|| self.views.iter().next().filter(|v| v.at_ns < now.at_ns))?;
        Some(window(before, now))
    }

    fn draw(&self, frame: &mut ratatui::Frame, messages: &VecDeque<String>, quitting: bool) {
        let shown = messages.len().min(4) as u16;
        let [head, body, foot] = Layout::vertical([
            Constraint::Length(2),
            Constraint::Min(3),
            Constraint::Length(shown),
        ])
        .areas(frame.area());
        let window = self.window();
        let summary = match &window {
            Some(w) => format!(
                "{:.0} events/s, {} lost in the last {:.1} s (total {} events, {} lost)",
                w.events_per_s,
                w.lost,
                w.seconds,
                self.views.back().map_or(0, |v| v.events),
                self.views.back().map_or(0, |v| v.lost),
            ),
            None => "waiting for the first seconds of calls".to_owned(),
        };
        let keys = if quitting {
            "quitting...".to_owned()
        } else {
            format!(
                "sorted by {} · window {} s · keys: t c m p n sort, + - window, q quit",
                self.sort.label(),
                self.window_s
            )
        };
        frame.render_widget(
            Paragraph::new(vec![
                Line::from(format!("fdr-profiled top — {} — {summary}", self.title)),
                Line::from(keys),
            ]),
            head,
        );
        let mut rows = window.map(|w| w.rows).unwrap_or_default();
        self.sort.sort(&mut rows);
        let header =
            ratatui::widgets::Row::new(["CALLS/S", "TIME%", "MEAN", "P99", "CALLS", "FUNCTION"])
                .style(Style::default().add_modifier(Modifier::REVERSED));
        let lines = rows.iter().take(usize::from(body.height)).map(|r| {
            let name = if r.group.is_empty() {
                r.name.clone()
            } else {
                format!("[{}] {}", r.group, r.name)
            };
            ratatui::widgets::Row::new([
                format!("{:.0}", r.calls_per_s),
                format!("{:.1}", r.busy * 100.0),
                human_ns(r.mean_ns),
                human_ns(r.p99_ns),
                r.calls.to_string(),
                name,
            ])
        });
        let widths = [
            Constraint::Length(11),
            Constraint::Length(7),
            Constraint::Length(11),
            Constraint::Length(11),
            Constraint::Length(11),
            Constraint::Min(10),
        ];
        frame.render_widget(Table::new(lines, widths).header(header), body);
        let last: Vec<Line> = (messages.iter().skip(messages.len() - usize::from(shown)))
            .map(|m| Line::from(m.as_str()))
            .collect();
        frame.render_widget(Paragraph::new(last), foot);
    }
}

/// Sends what is written to standard error into a pipe, read by a thread of its own: kept
/// for the screen's pane while it is up, and written on to the terminal after (a process
/// that inherited the pipe, such as a keeper, must never block on it).
fn capture_stderr() -> Result<Arc<Captured>> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .context("a pipe for standard error")?;
    let terminal = rustix::io::dup(std::io::stderr()).context("keeping standard error")?;
    move_to_stderr(&write).context("sending standard error to the screen")?;
    drop(write);
    let captured = Arc::new(Captured {
        terminal,
        lines: Mutex::new(VecDeque::new()),
        up: AtomicBool::new(true),
    });
    let reader = captured.clone();
    let started = std::thread::Builder::new()
        .name("top-stderr".into())
        .spawn(move || {
            let mut lines = std::io::BufReader::new(std::fs::File::from(read));
            let mut line = String::new();
            while matches!(lines.read_line(&mut line), Ok(n) if n > 0) {
                let mut kept = reader.lines.lock().unwrap_or_else(|e| e.into_inner());
                if reader.up.load(Ordering::Acquire) {
                    kept.push_back(line.trim_end().to_owned());
                    if kept.len() > MAX_MESSAGES {
                        kept.pop_front();
                    }
                } else {
                    drop(kept);
                    write_all(&reader.terminal, line.as_bytes());
                }
                line.clear();
            }
        });
    if let Err(err) = started {
        restore_stderr(&captured);
        return Err(err).context("starting the standard error reader");
    }
    Ok(captured)
}

/// Makes `fd` the process's standard error (fd 2).
fn move_to_stderr(fd: &impl std::os::fd::AsFd) -> std::io::Result<()> {
    // SAFETY: fd 2 is the process's standard error for its whole life; the OwnedFd made of it
    // is never dropped (forgotten below), so nothing closes it.
    let mut stderr = std::mem::ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(2) });
    rustix::io::dup2(fd, &mut stderr)?;
    Ok(())
}

fn write_all(fd: &OwnedFd, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(0) | Err(_) => return,
            Ok(n) => bytes = &bytes[n..],
        }
    }
}

/// Puts the terminal's standard error back, then writes the lines kept meanwhile to it.
fn restore_stderr(captured: &Captured) {
    let _ = move_to_stderr(&captured.terminal);
    let mut kept = captured.lines.lock().unwrap_or_else(|e| e.into_inner());
    captured.up.store(false, Ordering::Release);
    for line in kept.drain(..) {
        write_all(&captured.terminal, format!("{line}\n").as_bytes());
    }
}

/// `fdr-profiled top` on the running service: asks it for its calls every second.
pub fn service(socket: Option<&Path>) -> Result<u8> {
    let socket = socket.unwrap_or(Path::new(DEFAULT_SOCKET));
    let ask_view = || -> Result<LiveView> {
        let reply = ask(socket, &Request::Top)?;
        serde_json::from_value(reply["top"].clone()).context("the service's reply to top")
    };
    // Asked once before the terminal is taken: a service that is not there is one line.
    let first = ask_view()?;
    check_terminal()?;
    let screen = Screen::start(format!("the service at {}", socket.display()))?;
    screen.show(first);
    loop {
        for _ in 0..10 {
            if screen.quit_now() {
                return Ok(0);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        match ask_view() {
            Ok(view) => screen.show(view),
            Err(err) => {
                drop(screen);
                return Err(err.context("the service stopped answering"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::live::LiveFunction;

    fn view(second: u64, hot: u64, slow: u64) -> LiveView {
        let function = |name: &str, calls: u64, ns: u64| {
            let mut f = LiveFunction {
                name: name.into(),
                ..LiveFunction::default()
            };
            (0..calls).for_each(|_| f.ended(ns));
            f
        };
        LiveView {
            at_ns: second * 1_000_000_000,
            events: 2 * (hot + slow),
            lost: 0,
            functions: vec![function("hot", hot, 100), function("slow", slow, 1_000_000)],
        }
    }

    #[test]
    fn the_window_reaches_back_its_seconds_and_the_keys_sort() {
        let mut state = State {
            title: String::new(),
            views: VecDeque::new(),
            sort: SortBy::Time,
            window_s: 5,
        };
        assert!(state.window().is_none());
        // 1,000 hot calls a second for 10 s; 10 slow calls a second.
        for s in 0..=10 {
            state.views.push_back(view(s, 1_000 * s, 10 * s));
        }
        let w = state.window().unwrap();
        assert_eq!(w.seconds, 5.0);
        let mut rows = w.rows;
        state.sort.sort(&mut rows);
        assert_eq!(rows[0].name, "slow", "1% of a CPU against 0.01%");
        state.key(KeyCode::Char('c'));
        state.sort.sort(&mut rows);
        assert_eq!(
            (rows[0].name.as_str(), rows[0].calls_per_s),
            ("hot", 1_000.0)
        );
        state.key(KeyCode::Char('-'));
        state.key(KeyCode::Char('-'));
        assert_eq!(state.window().unwrap().seconds, 3.0);
        // Younger than the window: since the first view.
        state.views.drain(..8);
        assert_eq!(state.window().unwrap().seconds, 2.0);
    }
}
