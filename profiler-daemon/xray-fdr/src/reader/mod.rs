//! Reads FDR files of versions 1 to 5 and checks them against the format, reporting the first
//! violation with its byte offset and record kind.
//!
//! Two layers: [`framing`] cuts the data into records (lengths, kinds, version rules, segment
//! extents), [`check`] runs the grammar's state machine and the meaning checks (threads, time,
//! exits matching entries). [`Reader`] walks a file record by record (what `dump` uses, and a
//! streaming form for big files); [`read`] collects the events into a [`Trace`].
//!
//! Input is untrusted: every length is checked against the bytes present before use, so memory
//! use is bounded by a small multiple of the input size and no input panics (the fuzz target in
//! `fuzz/` exercises this).
#![warn(missing_docs)]

pub mod check;
mod error;
pub mod framing;

use crate::records::WallClock;
use crate::records::{FileHeader, FunctionAction, FDR_LOG_TYPE, HEADER_SIZE};
pub use check::Context;
pub use error::ReadError;
pub use framing::{EventTime, RawRecord};

/// What a function record or event says happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordKind {
    /// Function entry or exit; `args` holds the CallArgument values of an Entry_Args record.
    Function {
        /// Entry, Exit, Tail_Exit or Entry_Args.
        action: FunctionAction,
        /// The function id.
        function_id: u32,
        /// Arguments, in order.
        args: Vec<u64>,
    },
    /// A custom event's payload.
    CustomEvent {
        /// The payload.
        data: Vec<u8>,
    },
    /// A typed event (version 5).
    TypedEvent {
        /// Its type.
        event_type: u16,
        /// The payload.
        data: Vec<u8>,
    },
}

/// One function record or event, with everything its context says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Byte offset of the record (of the marker, for events).
    pub offset: u64,
    /// Thread id of its buffer.
    pub tid: u32,
    /// Process id (0 in version 1 files, which have none).
    pub pid: u32,
    /// CPU it ran on.
    pub cpu: u16,
    /// Absolute tick.
    pub tsc: u64,
    /// What happened.
    pub kind: RecordKind,
}

/// One thread buffer (NewBuffer block).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// Offset of its NewBuffer record.
    pub offset: u64,
    /// Thread id.
    pub tid: u32,
    /// Process id (0 before version 3, except version 2 where it is the tid, as in llvm-xray).
    pub pid: u32,
    /// Its WallClockTime.
    pub wall: WallClock,
}

/// A whole file, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The file header.
    pub header: FileHeader,
    /// Bytes after the header.
    pub data_len: u64,
    /// Thread buffers in file order.
    pub blocks: Vec<Block>,
    /// Function records and events in file order.
    pub records: Vec<Record>,
    /// Records after an EndOfBuffer (parsed, meaningless).
    pub ignored_records: u64,
}

/// One record of a file, checked, with its context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step<'a> {
    /// File offset of the record.
    pub offset: u64,
    /// The record.
    pub record: RawRecord<'a>,
    /// After EndOfBuffer: parsed but without meaning.
    pub ignored: bool,
    /// Absolute tick of a function record or event.
    pub tsc: Option<u64>,
    /// CPU of a function record or event.
    pub cpu: u16,
    /// For an exit: the open entries of its thread it closed besides its own, innermost
    /// first, because an exception or `longjmp` left them without an exit (see [`check`]).
    pub unwound: u32,
    /// The block's context after the record.
    pub context: Context,
}

/// Walks a file record by record, checking as it goes; stops at the first error.
pub struct Reader<'a> {
    header: FileHeader,
    framer: framing::Framer<'a>,
    checker: check::Checker,
    end: u64,
    done: bool,
}

impl<'a> Reader<'a> {
    /// Checks the header: 32 bytes, type FDR, version 1 to 5.
    pub fn new(bytes: &'a [u8]) -> Result<Self, ReadError> {
        let head: &[u8; HEADER_SIZE] = bytes
            .get(..HEADER_SIZE)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(|| {
                ReadError::new(
                    0,
                    "FileHeader",
                    format!(
                        "the file has {} bytes; an FDR file starts with a {HEADER_SIZE}-byte header",
                        bytes.len()
                    ),
                )
            })?;
        let header = FileHeader::decode(head);
        if header.log_type != FDR_LOG_TYPE {
            return Err(ReadError::new(
                2,
                "FileHeader",
                format!(
                    "log type {} is not flight data recorder ({FDR_LOG_TYPE})",
                    header.log_type
                ),
            ));
        }
        if !(1..=5).contains(&header.version) {
            return Err(ReadError::new(
                0,
                "FileHeader",
                format!(
                    "unsupported FDR version {} (versions 1 to 5 exist)",
                    header.version
                ),
            ));
        }
        Ok(Reader {
            header,
            framer: framing::Framer::new(bytes, header.version, HEADER_SIZE),
            checker: check::Checker::new(header.version),
            end: bytes.len() as u64,
            done: false,
        })
    }

    /// The file header.
    pub fn header(&self) -> &FileHeader {
        &self.header
    }

    /// The next record, `None` at the end of a valid file.
    pub fn next_step(&mut self) -> Result<Option<Step<'a>>, ReadError> {
        if self.done {
            return Ok(None);
        }
        let result = self.advance();
        if !matches!(result, Ok(Some(_))) {
            self.done = true;
        }
        result
    }

    fn advance(&mut self) -> Result<Option<Step<'a>>, ReadError> {
        let Some((offset, record)) = self.framer.next()? else {
            self.checker.finish(self.end)?;
            return Ok(None);
        };
        let applied = self.checker.apply(offset, &record)?;
        Ok(Some(Step {
            offset,
            record,
            ignored: applied.ignored,
            tsc: applied.tsc,
            cpu: applied.cpu,
            unwound: applied.unwound,
            context: self.checker.context(),
        }))
    }
}

impl<'a> Iterator for Reader<'a> {
    type Item = Result<Step<'a>, ReadError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_step().transpose()
    }
}

/// Reads and checks a whole file.
pub fn read(bytes: &[u8]) -> Result<Trace, ReadError> {
    let mut reader = Reader::new(bytes)?;
    let mut trace = Trace {
        header: *reader.header(),
        data_len: (bytes.len() - HEADER_SIZE) as u64,
        blocks: Vec::new(),
        records: Vec::new(),
        ignored_records: 0,
    };
    while let Some(step) = reader.next_step()? {
        if step.ignored {
            trace.ignored_records += 1;
            continue;
        }
        let ctx = step.context;
        let kind = match step.record {
            RawRecord::NewBuffer { tid } => {
                trace.blocks.push(Block {
                    offset: step.offset,
                    tid,
                    pid: ctx.pid,
                    wall: WallClock::default(),
                });
                continue;
            }
            RawRecord::WallClock { secs, micros } => {
                if let Some(b) = trace.blocks.last_mut() {
                    b.wall = WallClock { secs, micros };
                }
                continue;
            }
            RawRecord::Pid { pid } => {
                if let Some(b) = trace.blocks.last_mut() {
                    b.pid = pid;
                }
                continue;
            }
            RawRecord::CallArgument { value } => {
                // The grammar check guarantees the previous record is this Entry_Args.
                if let Some(Record {
                    kind: RecordKind::Function { args, .. },
                    ..
                }) = trace.records.last_mut()
                {
                    args.push(value);
                }
                continue;
            }
            RawRecord::Function {
                action,
                function_id,
                ..
            } => RecordKind::Function {
                action,
                function_id,
                args: Vec::new(),
            },
            RawRecord::CustomEvent { data, .. } => RecordKind::CustomEvent {
                data: data.to_vec(),
            },
            RawRecord::TypedEvent {
                event_type, data, ..
            } => RecordKind::TypedEvent {
                event_type,
                data: data.to_vec(),
            },
            _ => continue,
        };
        trace.records.push(Record {
            offset: step.offset,
            tid: ctx.tid,
            pid: ctx.pid,
            cpu: step.cpu,
            tsc: step.tsc.unwrap_or(ctx.base),
            kind,
        });
    }
    Ok(trace)
}

#[cfg(test)]
mod tests;
