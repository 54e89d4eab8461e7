//! Writing a snapshot: one binary's flight-recorder window as a session of its own, into a new
//! directory `OUTPUT/<target>/<UTC time>-<trigger>[-<binary>]/` created through the output
//! root the service holds, with its `session.json` and `report.txt`; then retention.
use super::targets::{Target, Watched};
use crate::plan::objects::Executable;
use crate::service::retention::{Retention, Writing};
use crate::session::output::{name_part, OutputDir};
use crate::session::{IntakeLosses, Session};
use anyhow::Result;
use fdr_analysis::symbolize::Symbolizer;
use std::path::PathBuf;

/// Now in UTC, for directory names: `20261124T132237.514Z`.
pub(super) fn utc_stamp() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now())
        .to_string()
        .replace([':', '-'], "")
}

/// Writes `w`'s window into `OUTPUT/<target>/<stamp>-<trigger>[-<binary>]/`, saying where;
/// returns that directory when it was written.
pub(super) fn snapshot_binary(
    retention: &Retention,
    target: &Target,
    w: &Watched,
    stamp: &str,
    trigger: &str,
) -> Option<PathBuf> {
    let mut name = format!("{stamp}-{trigger}");
    if target.binaries.len() > 1 {
        name = format!("{name}-{}", name_part(&w.label));
    }
    let shown = retention
        .root()
        .path()
        .join(&target.config.name)
        .join(&name);
    if let Err(why) = retention.room() {
        w.snapshots_not_written
            .set(w.snapshots_not_written.get() + 1);
        tracing::error!(
            fdr_target = %target.config.name,
            fdr_trigger = trigger,
            "target {}: snapshot not written: {why}",
            target.config.name
        );
        return None;
    }
    let written = retention
        .root()
        .create_session(&target.config.name, &name)
        .and_then(|out| {
            let dir = out.path().to_path_buf();
            let _writing = Writing::start(&dir);
            snapshot(out, target, w).map(|()| dir)
        });
    match written {
        Ok(dir) => {
            // Retention first: the snapshot line says everything is done.
            for gone in retention.enforce(&dir) {
                tracing::info!(
                    fdr_deleted = %gone.dir.display(),
                    fdr_bytes = gone.bytes,
                    "deleted {} ({} bytes) to stay under max_disk",
                    gone.dir.display(),
                    gone.bytes
                );
            }
            tracing::info!(
                fdr_target = %target.config.name,
                fdr_snapshot = %dir.display(),
                fdr_trigger = trigger,
                "target {}: snapshot {}",
                target.config.name,
                dir.display()
            );
            Some(dir)
        }
        Err(err) => {
            w.snapshots_not_written
                .set(w.snapshots_not_written.get() + 1);
            tracing::error!(
                fdr_target = %target.config.name,
                fdr_snapshot = %shown.display(),
                "target {}: snapshot {} failed: {err:#}",
                target.config.name,
                shown.display()
            );
            None
        }
    }
}

/// Writes one binary's window as a session into `out` (new, empty), its report too.
fn snapshot(out: OutputDir, target: &Target, w: &Watched) -> Result<()> {
    let held = out.try_clone()?;
    let executable = Executable {
        name: w.plan.exe_name.clone(),
        path: w.plan.display_path.clone(),
        deleted: false,
    };
    let mut session = Session::new(out, executable, target.config.fdr_version, w.exits.clone());
    session.add_object(w.plan.clone(), w.probes, w.attached_ns);
    for library in &w.libraries.objects {
        session.add_object(library.plan.clone(), library.probes, library.attached_ns);
    }
    if let Some(budget) = &w.budget {
        // Which functions the window may lack, and since when; before the replay, so that the
        // frames the drops left open are counted as theirs.
        session.set_budget(budget.probes.report());
    }
    w.recorder.replay(|event, gap| session.record(event, gap));
    session.set_window(w.recorder.stats(), w.recorder.thread_windows());
    session.finish(IntakeLosses::default())?;
    if let Err(err) = fdr_analysis::outputs::write_report_in(&held, &Symbolizer::default()) {
        tracing::warn!("{}: no report: {err:#}", held.path().display());
    }
    Ok(())
}
