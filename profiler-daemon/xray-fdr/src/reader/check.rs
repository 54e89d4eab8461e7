//! The state machine of the grammar, plus the meaning checks: thread identity, CPU, absolute
//! time, and that exits match entries.
//!
//! Per thread buffer (one NewBuffer block):
//! ```text
//! Block := NewBuffer WallClockTime Pid(v3+) NewCPUId Body* EndOfBuffer(v1, optional)
//! Body  := NewCPUId | TSCWrap | Entry | Exit | Tail_Exit | Entry_Args CallArgument*
//!        | CustomEventMarker | TypedEventMarker(v5)
//! ```
//! after EndOfBuffer records are parsed but ignored until the next NewBuffer (as llvm-xray does;
//! the v1 spec says a reader skips them). BufferExtents and padding are framing (see
//! [`super::framing`]) and do not take part. Checked meaning, beyond what llvm-xray checks:
//! - timed records (function records and events) never go back in time within a block, and
//!   applying a delta never overflows 64 bits;
//! - per thread (pid, tid), across its blocks: an Exit or Tail_Exit closes the innermost open
//!   entry of the same function. Open entries above it are closed with it, as unwound: an
//!   exception or `longjmp` left them without running their exit sleds, and XRay's own runtime
//!   writes exactly that (`llvm-xray convert` reads such files; `llvm-xray account` refuses them,
//!   "Error processing record", unless given `-keep-going`). An exit of a function
//!   that is not open at all is an error. Open entries at the end are fine (the trace may end
//!   first).
#![warn(missing_docs)]

use std::collections::HashMap;

use super::error::ReadError;
use super::framing::{EventTime, RawRecord};
use crate::records::FunctionAction;

/// Where in the grammar the reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No NewBuffer yet.
    Start,
    AfterNewBuffer,
    AfterWallClock,
    AfterPid,
    /// In the body; `args_ok` after Entry_Args or CallArgument.
    Body {
        args_ok: bool,
    },
    /// After EndOfBuffer, until the next NewBuffer.
    Ignoring,
}

/// What the records so far say about the current block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Context {
    /// Thread id of the block.
    pub tid: u32,
    /// Process id (0 before a Pid record, and in version 1 files; the tid in version 2, as
    /// llvm-xray does).
    pub pid: u32,
    /// CPU of the last NewCPUId.
    pub cpu: u16,
    /// Delta base.
    pub base: u64,
    /// Tick of the latest timed record in the block (0 before any).
    pub last: u64,
}

/// What applying one record established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Applied {
    /// The record came after EndOfBuffer and means nothing.
    pub ignored: bool,
    /// Absolute tick of a function record or event.
    pub tsc: Option<u64>,
    /// CPU of a timed record (the version 4 custom event's own field, else the current CPU).
    pub cpu: u16,
    /// Open entries an exit closed besides its own (see the module documentation).
    pub unwound: u32,
}

/// The checker's state.
pub(crate) struct Checker {
    version: u16,
    state: State,
    ctx: Context,
    block_offset: u64,
    /// Open entries per (pid, tid).
    stacks: HashMap<(u32, u32), Vec<u32>>,
}

impl Checker {
    pub fn new(version: u16) -> Self {
        Checker {
            version,
            state: State::Start,
            ctx: Context::default(),
            block_offset: 0,
            stacks: HashMap::new(),
        }
    }

    /// The current block's context.
    pub fn context(&self) -> Context {
        self.ctx
    }

    /// Applies one record at `offset`.
    pub fn apply(&mut self, offset: u64, rec: &RawRecord<'_>) -> Result<Applied, ReadError> {
        let err = |problem: String| ReadError::new(offset, rec.name(), problem);
        let mut out = Applied {
            ignored: false,
            tsc: None,
            cpu: self.ctx.cpu,
            unwound: 0,
        };
        match rec {
            RawRecord::BufferExtents { .. } | RawRecord::Padding { .. } => return Ok(out),
            RawRecord::NewBuffer { tid } => {
                self.check_block_end(offset)?;
                self.state = State::AfterNewBuffer;
                self.block_offset = offset;
                self.ctx = Context {
                    tid: *tid,
                    pid: if self.version == 2 { *tid } else { 0 },
                    ..Context::default()
                };
                return Ok(out);
            }
            _ => {}
        }
        match self.state {
            State::Start => {
                return Err(err(
                    "the data must start with a NewBuffer record (a thread buffer)".into(),
                ))
            }
            State::Ignoring => {
                out.ignored = true;
                return Ok(out);
            }
            State::AfterNewBuffer => {
                if !matches!(rec, RawRecord::WallClock { .. }) {
                    return Err(err(
                        "the record after NewBuffer must be WallClockTime".into()
                    ));
                }
                self.state = State::AfterWallClock;
                return Ok(out);
            }
            State::AfterWallClock if self.version >= 3 => {
                let RawRecord::Pid { pid } = rec else {
                    return Err(err(format!(
                        "the record after WallClockTime must be Pid in version {}",
                        self.version
                    )));
                };
                self.ctx.pid = *pid;
                self.state = State::AfterPid;
                return Ok(out);
            }
            State::AfterWallClock | State::AfterPid => {
                if !matches!(rec, RawRecord::NewCpuId { .. }) {
                    let prev = if self.state == State::AfterPid {
                        "Pid"
                    } else {
                        "WallClockTime"
                    };
                    return Err(err(format!("the record after {prev} must be NewCPUId")));
                }
            }
            State::Body { .. } => {}
        }
        let args_ok = matches!(self.state, State::Body { args_ok: true });
        let mut next_args_ok = false;
        match *rec {
            RawRecord::NewCpuId { cpu, tsc } => {
                self.ctx.cpu = cpu;
                self.ctx.base = tsc;
            }
            RawRecord::TscWrap { tsc } => self.ctx.base = tsc,
            RawRecord::Function {
                action,
                function_id,
                delta,
            } => {
                let tsc = self.ctx.base.checked_add(u64::from(delta)).ok_or_else(|| {
                    err(format!(
                        "delta {delta} from base {} overflows 64 bits",
                        self.ctx.base
                    ))
                })?;
                self.timed(tsc).map_err(err)?;
                self.ctx.base = tsc;
                out.unwound = self.stack_step(action, function_id).map_err(err)?;
                out.tsc = Some(tsc);
                next_args_ok = action == FunctionAction::EntryArgs;
            }
            RawRecord::CallArgument { .. } => {
                if !args_ok {
                    return Err(err(
                        "CallArgument must follow an Entry_Args record or another CallArgument"
                            .into(),
                    ));
                }
                next_args_ok = true;
            }
            RawRecord::CustomEvent { time, cpu, .. } => {
                let tsc = match time {
                    EventTime::Absolute(tsc) => tsc,
                    EventTime::Delta(d) => self.apply_signed_delta(d).map_err(err)?,
                };
                self.timed(tsc).map_err(err)?;
                out.tsc = Some(tsc);
                out.cpu = cpu.unwrap_or(self.ctx.cpu);
            }
            RawRecord::TypedEvent { delta, .. } => {
                let tsc = self.apply_signed_delta(delta).map_err(err)?;
                self.timed(tsc).map_err(err)?;
                out.tsc = Some(tsc);
            }
            RawRecord::EndOfBuffer => {
                self.state = State::Ignoring;
                return Ok(out);
            }
            RawRecord::WallClock { .. } => {
                return Err(err("WallClockTime may only follow NewBuffer".into()))
            }
            RawRecord::Pid { .. } => return Err(err("Pid may only follow WallClockTime".into())),
            RawRecord::NewBuffer { .. }
            | RawRecord::BufferExtents { .. }
            | RawRecord::Padding { .. } => unreachable!("handled above"),
        }
        self.state = State::Body {
            args_ok: next_args_ok,
        };
        Ok(out)
    }

    /// Checks the end of the data at `offset`.
    pub fn finish(&mut self, offset: u64) -> Result<(), ReadError> {
        self.check_block_end(offset)
    }

    /// A block may end (at the next NewBuffer or the end of the data) only once it has a
    /// NewCPUId: llvm-xray rejects anything shorter as a malformed block.
    fn check_block_end(&self, offset: u64) -> Result<(), ReadError> {
        let missing = match self.state {
            State::Start | State::Body { .. } | State::Ignoring => return Ok(()),
            State::AfterNewBuffer => "WallClockTime",
            State::AfterWallClock if self.version >= 3 => "Pid",
            State::AfterWallClock | State::AfterPid => "NewCPUId",
        };
        Err(ReadError::new(
            offset,
            "NewBuffer",
            format!(
                "the buffer of thread {} that starts at offset {} ends before its {missing} record",
                self.ctx.tid, self.block_offset
            ),
        ))
    }

    fn apply_signed_delta(&mut self, delta: i32) -> Result<u64, String> {
        let tsc = self
            .ctx
            .base
            .checked_add_signed(i64::from(delta))
            .ok_or_else(|| {
                format!(
                    "delta {delta} from base {} leaves the 64-bit tick range",
                    self.ctx.base
                )
            })?;
        self.ctx.base = tsc;
        Ok(tsc)
    }

    fn timed(&mut self, tsc: u64) -> Result<(), String> {
        if tsc < self.ctx.last {
            return Err(format!(
                "time goes backwards: tick {tsc} after an earlier record's tick {}",
                self.ctx.last
            ));
        }
        self.ctx.last = tsc;
        Ok(())
    }

    /// Applies a function record to its thread's open entries; returns how many open entries
    /// above the exiting one it closed as unwound.
    fn stack_step(&mut self, action: FunctionAction, function_id: u32) -> Result<u32, String> {
        let key = (self.ctx.pid, self.ctx.tid);
        let stack = self.stacks.entry(key).or_default();
        if action.is_entry() {
            stack.push(function_id);
            return Ok(0);
        }
        match stack.iter().rposition(|&open| open == function_id) {
            Some(at) => {
                let unwound = stack.len() - at - 1;
                stack.truncate(at);
                Ok(unwound as u32)
            }
            None => Err(format!(
                "exit of function {function_id}, which thread {} has not entered",
                self.ctx.tid
            )),
        }
    }
}
