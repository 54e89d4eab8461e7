//! `--live` (and `top` with recording options): the live view on the terminal while the
//! recording runs, sent the session's calls by function once a second between drains.
use super::args::RecordArgs;
use crate::session::Session;
use crate::tools::top::Screen;
use anyhow::Result;
use std::time::{Duration, Instant};

/// How often the screen is sent the session's sums.
const EVERY: Duration = Duration::from_secs(1);

/// The screen and when it was last sent a view.
pub struct Live {
    screen: Screen,
    sent: Option<Instant>,
}

impl Live {
    /// Takes the terminal under `--live`: the session's parts made from now on keep each
    /// function's durations. Call it after a launched command has its standard streams.
    pub fn start(cli: &RecordArgs, session: &mut Session) -> Result<Option<Live>> {
        if !cli.live {
            return Ok(None);
        }
        let title = match (&cli.attach, cli.pid) {
            (Some(bin), _) => format!("every process of {}", bin.display()),
            (None, Some(pid)) => format!("process {pid}"),
            (None, None) => format!(
                "{}",
                cli.command
                    .first()
                    .map_or("".into(), |c| c.to_string_lossy())
            ),
        };
        session.keep_latencies();
        Ok(Some(Live {
            screen: Screen::start(title)?,
            sent: None,
        }))
    }
}

/// Refuses `--live` without a terminal, before anything is traced.
pub fn check(cli: &RecordArgs) -> Result<()> {
    if cli.live {
        crate::tools::top::check_terminal()?;
    }
    Ok(())
}

/// Sends the screen the session's sums, if a second went by.
pub fn tick(live: Option<&mut Live>, session: &Session) {
    let Some(live) = live else { return };
    if live.sent.is_none_or(|at| at.elapsed() >= EVERY) {
        live.screen.show(session.live_view());
        live.sent = Some(Instant::now());
    }
}

/// Resolves when the user asked to quit the screen; never without one.
pub async fn quit_asked(live: Option<&Live>) {
    match live {
        Some(live) => live.screen.quit_asked().await,
        None => std::future::pending().await,
    }
}
