//! Record mode: every event of a binary written, as a recording writes it, into sessions that
//! are closed and replaced by a new one past a size or an age: *segments*, each a complete
//! session directory (`OUTPUT/<target>/<UTC time>-segment[-<binary>]/`, its FDR files valid on
//! their own, with `session.json` and `report.txt`).
//!
//! A call that spans a segment boundary has its entry in one segment and its exit in the next,
//! where it is counted as an exit without entry, as in any session that starts mid-call. The
//! oldest segments and snapshots are deleted to stay under `max_disk` (never a segment being
//! written, this binary's or another target's). Writing stops while the filesystem has less
//! than `min_free` left: no segment is opened, and an open one is closed at the next tick
//! (once a second); the events that arrive meanwhile are counted as not written, and writing
//! starts again at the first tick that finds room. Each stop and each start is logged.
use crate::kernel::intake::Event;
use crate::plan::exits::ExitsChoice;
use crate::plan::objects::Executable;
use crate::plan::AttachPlan;
use crate::service::output::tree_bytes;
use crate::service::retention::{Retention, Writing};
use crate::session::order::Gap;
use crate::session::output::OutputDir;
use crate::session::{IntakeLosses, Session};
use anyhow::Result;
use fdr_analysis::symbolize::Symbolizer;
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use xray_fdr::FdrVersion;

/// What one binary's segments are made of.
pub struct SegmentSpec {
    /// The target's name: its segments are in `OUTPUT/<target>/`.
    pub target: String,
    /// Appended to each segment's name (`-<binary>` when a target has several).
    pub suffix: String,
    pub plan: AttachPlan,
    pub probes: usize,
    pub attached_ns: u64,
    /// The shared objects found in its processes so far: plan, probes per process, when
    /// first probed.
    pub libraries: Vec<(AttachPlan, usize, u64)>,
    pub exits: ExitsChoice,
    pub version: FdrVersion,
    /// A segment is closed once its files take this much ...
    pub max_bytes: u64,
    /// ... or it is this old.
    pub max_age: Duration,
}

/// The segment being written and what was done so far.
pub struct Segments {
    spec: SegmentSpec,
    retention: Retention,
    current: Option<Open>,
    /// Writing stopped (`min_free` crossed, or no segment could be opened): events are counted
    /// in `not_written` until a tick finds room again.
    stopped: Option<Stopped>,
    /// Opening a segment failed and is being tried again (quietly, once a tick, until it
    /// works).
    retrying: bool,
    /// Segments closed.
    pub closed: u64,
    /// Events not written because the filesystem was too full (or no segment could be opened).
    pub not_written: u64,
}

/// Why writing stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stopped {
    /// Less than `min_free` left on the output's filesystem.
    NoRoom,
    /// A segment could not be created; tried again at the next tick.
    OpenFailed,
}

struct Open {
    session: Session,
    dir: PathBuf,
    /// The segment's directory, held: measured through it, its report written through it.
    out: OutputDir,
    opened: Instant,
    /// Keeps every target's retention off it until it is closed.
    _writing: Writing,
}

impl Segments {
    pub fn new(spec: SegmentSpec, retention: Retention) -> Segments {
        Segments {
            spec,
            retention,
            current: None,
            stopped: None,
            retrying: false,
            closed: 0,
            not_written: 0,
        }
    }

    /// The budget stopped tracing `function_id` at `at_ns` (see `Session::dropped`): said to
    /// the segment open now.
    pub fn dropped(&mut self, function_id: u32, at_ns: u64) {
        if let Some(open) = &self.current {
            open.session.dropped(function_id, at_ns);
        }
    }

    /// Writes a thread's next event into the current segment, opening one if needed; while
    /// writing is stopped the event is counted as not written (free space is looked at again
    /// by [`Segments::tick`], not for every event).
    pub fn record(&mut self, event: &Event, gap: Option<Gap>) {
        if self.current.is_none() {
            if self.stopped.is_some() {
                self.not_written += 1;
                return;
            }
            if let Err(why) = self.retention.room() {
                self.stop(Stopped::NoRoom, &why);
                self.not_written += 1;
                return;
            }
            match self.open() {
                Ok(open) => {
                    if std::mem::take(&mut self.retrying) {
                        tracing::info!(
                            "{}: writing again: segment {} opened ({} events not written so far)",
                            self.shown_root().display(),
                            open.dir.display(),
                            self.not_written
                        );
                    }
                    self.current = Some(open);
                }
                Err(err) => {
                    if self.retrying {
                        self.stopped = Some(Stopped::OpenFailed);
                    } else {
                        self.stop(
                            Stopped::OpenFailed,
                            &format!("cannot open a segment: {err:#}"),
                        );
                    }
                    self.not_written += 1;
                    return;
                }
            }
        }
        if let Some(open) = &mut self.current {
            open.session.record(event, gap);
        }
    }

    /// Makes the files complete on disk; closes the segment when it is too big or too old, or
    /// when the filesystem has less than `min_free` left (writing then stops until a tick
    /// finds room again).
    pub fn tick(&mut self) {
        let Some(open) = &mut self.current else {
            if let Some(why) = self.stopped {
                if let Ok(()) = self.retention.room() {
                    self.stopped = None;
                    match why {
                        Stopped::NoRoom => tracing::info!(
                            "{}: writing again: above min_free ({} events not written so far)",
                            self.shown_root().display(),
                            self.not_written
                        ),
                        Stopped::OpenFailed => self.retrying = true,
                    }
                }
            }
            return;
        };
        open.session.flush();
        if let Err(why) = self.retention.room() {
            self.stop(Stopped::NoRoom, &why);
            self.close();
            return;
        }
        let full = tree_bytes(open.out.as_fd(), 0) >= self.spec.max_bytes;
        if full || open.opened.elapsed() >= self.spec.max_age {
            self.close();
        }
    }

    /// Stops writing, saying why, unless it already stopped for the same reason.
    fn stop(&mut self, why: Stopped, message: &str) {
        if self.stopped == Some(why) {
            return;
        }
        self.stopped = Some(why);
        tracing::error!(
            "{}: not writing: {message} ({} events not written so far)",
            self.shown_root().display(),
            self.not_written
        );
    }

    /// Closes the current segment: its files final, `session.json` and `report.txt` written;
    /// then the oldest output is deleted past `max_disk`.
    pub fn close(&mut self) {
        self.close_by(None);
    }

    /// [`Segments::close`], at shutdown: once `deadline` has passed, the files are made final
    /// and `session.json` written, but not `report.txt` (reading the whole segment back can
    /// take longer than the service may still run); a report begun before the deadline is
    /// finished.
    pub fn close_by(&mut self, deadline: Option<Instant>) {
        let Some(open) = self.current.take() else {
            return;
        };
        let dir = open.dir.clone();
        match open.session.finish(IntakeLosses::default()) {
            Ok(_) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    tracing::warn!(
                        fdr_segment = %dir.display(),
                        "{}: report.txt not written: past the stop deadline (stop_timeout)",
                        dir.display()
                    );
                } else if let Err(err) =
                    fdr_analysis::outputs::write_report_in(&open.out, &Symbolizer::default())
                {
                    tracing::warn!("{}: no report: {err:#}", dir.display());
                }
                self.closed += 1;
                tracing::info!(fdr_segment = %dir.display(), "segment {}", dir.display());
            }
            Err(err) => tracing::error!("closing segment {}: {err:#}", dir.display()),
        }
        for gone in self.retention.enforce(&dir) {
            tracing::info!(
                fdr_deleted = %gone.dir.display(),
                fdr_bytes = gone.bytes,
                "deleted {} ({} bytes) to stay under max_disk",
                gone.dir.display(),
                gone.bytes
            );
        }
    }

    /// A shared object found in one of the binary's processes: named in the current segment
    /// and the ones after it.
    pub fn add_library(&mut self, plan: AttachPlan, probes: usize, attached_ns: u64) {
        if let Some(open) = &mut self.current {
            open.session.add_object(plan.clone(), probes, attached_ns);
        }
        self.spec.libraries.push((plan, probes, attached_ns));
    }

    /// Names this binary's segments `...-segment<suffix>` (a target with several binaries).
    pub fn set_suffix(&mut self, suffix: String) {
        self.spec.suffix = suffix;
    }

    /// The directory being written, if any.
    pub fn current(&self) -> Option<&Path> {
        self.current.as_ref().map(|o| o.dir.as_path())
    }

    /// `OUTPUT/<target>`, as messages show it.
    fn shown_root(&self) -> PathBuf {
        self.retention.root().path().join(&self.spec.target)
    }

    fn open(&self) -> Result<Open> {
        let stamp = humantime::format_rfc3339_millis(std::time::SystemTime::now())
            .to_string()
            .replace([':', '-'], "");
        let out = self.retention.root().create_session(
            &self.spec.target,
            &format!("{stamp}-segment{}", self.spec.suffix),
        )?;
        let dir = out.path().to_path_buf();
        let writing = Writing::start(&dir);
        let held = out.try_clone()?;
        let plan = &self.spec.plan;
        let mut session = Session::new(
            out,
            Executable {
                name: plan.exe_name.clone(),
                path: plan.display_path.clone(),
                deleted: false,
            },
            self.spec.version,
            self.spec.exits.clone(),
        );
        session.add_object(plan.clone(), self.spec.probes, self.spec.attached_ns);
        for (library, probes, attached_ns) in &self.spec.libraries {
            session.add_object(library.clone(), *probes, *attached_ns);
        }
        Ok(Open {
            session,
            dir,
            out: held,
            opened: Instant::now(),
            _writing: writing,
        })
    }
}
