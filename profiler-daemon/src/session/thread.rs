//! One thread's trace: its events, in program order, applied to its FDR file.
//!
//! The writer keeps the file valid on its own (an exit must match an open frame; frames an
//! exception unwound are closed when a frame below them exits). This layer adds what only the
//! kernel's numbering can tell: after a gap of lost events, which frames were left during the
//! gap (closed here, so no frame stays open forever) and which later exits belong to entries
//! that were lost (dropped, so no Exit is written without its Entry).
use crate::kernel::intake::Event;
use crate::session::order::Gap;
use crate::session::summary::{CallTimer, FunctionTotals, ThreadReport};
use profiler_common::{event_flags, SledKind};
use std::collections::HashMap;
use std::fs::File;
use xray_fdr::records::FunctionAction;
use xray_fdr::writer::{Recorded, ThreadWriter};

/// Per-thread counters that end up in the session manifest.
#[derive(Debug, Default, Clone, Copy)]
pub struct ThreadCounts {
    /// Events received.
    pub events: u64,
    /// Events the kernel could not queue (buffer full).
    pub lost: u64,
    /// Frames closed because their exit was among the lost events (written at the time of the
    /// first event after the gap).
    pub frames_closed_by_loss: u64,
    /// Exits dropped because their entry was among the lost events.
    pub exits_of_lost_entries: u64,
    /// Frames left without an exit of their own (unwound by an exception, or beyond the
    /// kernel's return-probe depth): the file closes them at the exit of the frame below, at
    /// that time, so that it stays loadable.
    pub frames_unwound: u64,
    /// Events dropped because the file could not be written.
    pub dropped_write_errors: u64,
    /// Custom events written.
    pub custom_events: u64,
    /// Custom/typed events whose payload was cut to `--max-event-bytes`.
    pub custom_events_truncated: u64,
    /// Typed events written.
    pub typed_events: u64,
    /// Custom/typed events whose payload could not be read from the program (not written).
    pub unreadable_events: u64,
}

/// A thread's file and bookkeeping.
pub struct ThreadTrace {
    writer: Option<ThreadWriter<File>>,
    /// Path relative to the session directory.
    pub file: String,
    /// Call depth of each frame open in the writer, innermost last, in the kernel's count
    /// minus `drift`.
    levels: Vec<i32>,
    /// Frames the kernel still counts but that are gone: an exception unwound them, so their
    /// exit sleds never ran (exit-sled mode only; in return-probe mode the kernel side corrects
    /// its count itself).
    drift: i32,
    /// Exits observed at exit sleds (exceptions leave the kernel's depth count high).
    sleds_mode: bool,
    timer: CallTimer,
    last_ts: u64,
    /// Counters.
    pub counts: ThreadCounts,
}

impl ThreadTrace {
    /// Wraps a writer whose preamble is on disk as `file`.
    pub fn new(writer: ThreadWriter<File>, file: String, sleds_mode: bool) -> ThreadTrace {
        ThreadTrace {
            writer: Some(writer),
            file,
            levels: Vec::new(),
            drift: 0,
            sleds_mode,
            timer: CallTimer::default(),
            last_ts: 0,
            counts: ThreadCounts::default(),
        }
    }

    /// Applies the thread's next event. Write errors close the file as it stands (still valid)
    /// with a warning; later events are counted as dropped.
    pub fn apply(
        &mut self,
        event: &Event,
        gap: Option<Gap>,
        totals: &mut HashMap<u32, FunctionTotals>,
    ) {
        let h = &event.header;
        let ts = if h.ts_ns == 0 { self.last_ts } else { h.ts_ns };
        if let Some(gap) = gap {
            self.counts.lost += gap.lost;
        }
        if h.kind != profiler_common::event_kind::THREAD_EXIT {
            self.counts.events += 1;
        }
        let Some(mut writer) = self.writer.take() else {
            self.counts.dropped_write_errors += 1;
            return;
        };
        match self.write(&mut writer, event, gap, ts, totals) {
            Ok(()) => self.writer = Some(writer),
            Err(err) => {
                eprintln!(
                    "fdr-profiled: warning: writing {}: {err}; later events of thread {} are dropped",
                    self.file, h.tid
                );
                self.counts.dropped_write_errors += 1;
            }
        }
        self.last_ts = self.last_ts.max(ts);
    }

    fn write(
        &mut self,
        writer: &mut ThreadWriter<File>,
        event: &Event,
        gap: Option<Gap>,
        ts: u64,
        totals: &mut HashMap<u32, FunctionTotals>,
    ) -> std::io::Result<()> {
        let h = &event.header;
        let cpu = h.cpu;
        if let Some(gap) = gap {
            // Frames at the gap's lowest depth or deeper were left during the gap.
            let low = gap.low.saturating_sub(self.drift);
            while self.levels.last().is_some_and(|&l| l >= low) {
                let Some(fid) = writer.top() else { break };
                writer.function(FunctionAction::Exit, fid, ts, cpu)?;
                self.timer.exit(fid, ts, totals);
                self.levels.truncate(writer.depth());
                self.counts.frames_closed_by_loss += 1;
            }
        }
        match SledKind::from_u8(h.kind) {
            Some(kind @ (SledKind::Entry | SledKind::LogArgsEntry)) => {
                let r = if kind == SledKind::LogArgsEntry {
                    writer.entry_with_args(h.function_id, ts, cpu, &event.args[..event.nargs])?
                } else {
                    writer.function(FunctionAction::Entry, h.function_id, ts, cpu)?
                };
                if matches!(r, Recorded::Written) && writer.depth() > self.levels.len() {
                    self.levels.push(h.depth.saturating_sub(self.drift));
                    self.timer.enter(h.function_id, ts);
                }
            }
            Some(kind @ (SledKind::Exit | SledKind::Tail)) => {
                let target = h.depth.saturating_sub(1).saturating_sub(self.drift);
                if self.levels.last().is_some_and(|&top| target > top) {
                    // The frame this exit leaves was entered during a gap: not written.
                    self.counts.exits_of_lost_entries += 1;
                } else {
                    let action = if kind == SledKind::Tail {
                        FunctionAction::TailExit
                    } else {
                        FunctionAction::Exit
                    };
                    let r = writer.function(action, h.function_id, ts, cpu)?;
                    if let Recorded::WrittenAfterUnwind { frames } = r {
                        // Frames above the one exiting never returned: an exception unwound
                        // them, and their exit sleds never ran.
                        if self.sleds_mode {
                            self.drift = self.drift.saturating_add(frames as i32);
                        }
                        self.counts.frames_unwound += frames as u64;
                    }
                    if matches!(r, Recorded::Written | Recorded::WrittenAfterUnwind { .. }) {
                        self.timer.exit(h.function_id, ts, totals);
                    }
                    self.levels.truncate(writer.depth());
                }
            }
            Some(kind @ (SledKind::CustomEvent | SledKind::TypedEvent)) => {
                write_event(writer, &mut self.counts, kind, event, ts)?;
            }
            None => {}
        }
        Ok(())
    }

    /// Makes the file on disk a complete trace of what was recorded so far.
    pub fn flush(&mut self) {
        if let Some(writer) = self.writer.as_mut() {
            if let Err(err) = writer.flush() {
                eprintln!("fdr-profiled: warning: flushing {}: {err}", self.file);
            }
        }
    }

    /// Finalizes the file (closing it) and returns the thread's line of the manifest.
    pub fn finish(self, tid: u32) -> ThreadReport {
        let mut records = 0;
        let mut dropped_unmatched_exits = 0;
        let mut dropped_write_errors = self.counts.dropped_write_errors;
        if let Some(writer) = self.writer {
            match writer.finish() {
                Ok((_, stats)) => {
                    records = stats.records;
                    dropped_unmatched_exits = stats.dropped_unmatched_exits;
                }
                Err(err) => {
                    eprintln!("fdr-profiled: warning: finishing {}: {err}", self.file);
                    dropped_write_errors += 1;
                }
            }
        }
        let c = self.counts;
        ThreadReport {
            tid,
            file: self.file,
            records,
            events: c.events,
            events_lost: c.lost,
            frames_closed_by_loss: c.frames_closed_by_loss,
            exits_of_lost_entries: c.exits_of_lost_entries,
            frames_unwound: c.frames_unwound,
            dropped_unmatched_exits,
            dropped_write_errors,
            custom_events: c.custom_events,
            custom_events_truncated: c.custom_events_truncated,
            typed_events: c.typed_events,
            unreadable_events: c.unreadable_events,
        }
    }
}

/// Writes a custom or typed event.
fn write_event(
    writer: &mut ThreadWriter<File>,
    counts: &mut ThreadCounts,
    kind: SledKind,
    event: &Event,
    ts: u64,
) -> std::io::Result<()> {
    let Some(data) = event.data.as_deref() else {
        return Ok(());
    };
    if event.header.flags & event_flags::UNREADABLE != 0 {
        counts.unreadable_events += 1;
        return Ok(());
    }
    if (data.bytes.len() as u64) < data.size {
        counts.custom_events_truncated += 1;
    }
    let cpu = event.header.cpu;
    let r = if kind == SledKind::TypedEvent {
        writer.typed_event(ts, cpu, data.event_type as u16, &data.bytes)?
    } else {
        writer.custom_event(ts, cpu, &data.bytes)?
    };
    if matches!(r, Recorded::Written | Recorded::WrittenAsCustomEvent) {
        if kind == SledKind::TypedEvent {
            counts.typed_events += 1;
        } else {
            counts.custom_events += 1;
        }
    }
    Ok(())
}
