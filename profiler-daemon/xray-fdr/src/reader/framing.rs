//! Framing: cutting the data after the header into records, as the version's layout says.
//!
//! Versions 1 and 2 are a plain sequence of records. From version 3 on, data comes in segments,
//! each a BufferExtents record followed by the number of bytes it names; between segments only
//! zero bytes may appear (llvm-xray skips any byte up to the next BufferExtents introducer; this
//! reader is stricter, since no writer puts anything but zeros there). A record may not cross
//! the end of its segment, and the file may not end in padding, but it may end before the last
//! segment's extent (at a record boundary), which is where a cut-short file ends.
//!
//! Every length comes from the input and is checked against the bytes that are there before
//! anything is sliced, so no input can make this code allocate or panic.
#![warn(missing_docs)]

use super::error::ReadError;
use crate::records::{
    le_u16, le_u32, le_u64, FunctionAction, MetadataKind, FUNCTION_RECORD_SIZE,
    METADATA_RECORD_SIZE,
};

/// When an event happened, as its marker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventTime {
    /// An absolute tick (custom events of versions 1 to 4).
    Absolute(u64),
    /// A signed delta from the current base, which then moves to the event (version 5).
    Delta(i32),
}

/// One record as it is in the file, before any context is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawRecord<'a> {
    /// An Entry, Exit, Tail_Exit or Entry_Args record.
    Function {
        /// What happened.
        action: FunctionAction,
        /// The 28-bit function id.
        function_id: u32,
        /// Ticks since the delta base.
        delta: u32,
    },
    /// Start of a thread buffer.
    NewBuffer {
        /// Thread id (the i32 on disk, as its bit pattern).
        tid: u32,
    },
    /// End of a version-1 thread buffer.
    EndOfBuffer,
    /// CPU change; `tsc` becomes the delta base.
    NewCpuId {
        /// The CPU.
        cpu: u16,
        /// Absolute tick.
        tsc: u64,
    },
    /// New delta base.
    TscWrap {
        /// Absolute tick.
        tsc: u64,
    },
    /// Wall-clock time of the buffer's start.
    WallClock {
        /// Seconds since the Unix epoch.
        secs: u64,
        /// Microseconds within the second.
        micros: u32,
    },
    /// A custom event and its payload.
    CustomEvent {
        /// Its time.
        time: EventTime,
        /// The CPU field of version 4 markers.
        cpu: Option<u16>,
        /// The payload.
        data: &'a [u8],
    },
    /// One argument of the preceding Entry_Args record.
    CallArgument {
        /// The argument.
        value: u64,
    },
    /// Start of a segment (version 2 and later) of `size` bytes after this record.
    BufferExtents {
        /// Bytes in the segment after this record.
        size: u64,
    },
    /// A typed event and its payload (version 5).
    TypedEvent {
        /// Signed delta from the base, which then moves to the event.
        delta: i32,
        /// The event type.
        event_type: u16,
        /// The payload.
        data: &'a [u8],
    },
    /// The process id (version 3 and later).
    Pid {
        /// The pid (the i32 on disk, as its bit pattern).
        pid: u32,
    },
    /// Zero bytes between segments (version 3 and later).
    Padding {
        /// How many.
        len: u64,
    },
}

impl RawRecord<'_> {
    /// The record kind's name, as error messages and `dump` use it.
    pub fn name(&self) -> &'static str {
        match self {
            RawRecord::Function { .. } => "Function",
            RawRecord::NewBuffer { .. } => "NewBuffer",
            RawRecord::EndOfBuffer => "EndOfBuffer",
            RawRecord::NewCpuId { .. } => "NewCPUId",
            RawRecord::TscWrap { .. } => "TSCWrap",
            RawRecord::WallClock { .. } => "WallClockTime",
            RawRecord::CustomEvent { .. } => "CustomEventMarker",
            RawRecord::CallArgument { .. } => "CallArgument",
            RawRecord::BufferExtents { .. } => "BufferExtents",
            RawRecord::TypedEvent { .. } => "TypedEventMarker",
            RawRecord::Pid { .. } => "Pid",
            RawRecord::Padding { .. } => "Padding",
        }
    }
}

/// Cuts the data into records. `data` is the whole file; offsets are file offsets.
pub(crate) struct Framer<'a> {
    data: &'a [u8],
    pos: usize,
    version: u16,
    /// Version 3+: bytes left in the current segment (0: between segments).
    extent_left: u64,
}

impl<'a> Framer<'a> {
    /// Starts right after the 32-byte header.
    pub fn new(data: &'a [u8], version: u16, start: usize) -> Self {
        Framer {
            data,
            pos: start,
            version,
            extent_left: 0,
        }
    }

    /// The next record and its file offset; `None` at a clean end of the data.
    pub fn next(&mut self) -> Result<Option<(u64, RawRecord<'a>)>, ReadError> {
        if self.pos >= self.data.len() {
            return Ok(None);
        }
        let offset = self.pos as u64;
        if self.version >= 3 && self.extent_left == 0 {
            return self.between_segments().map(Some);
        }
        let (record, len) = decode(self.data, self.pos, self.version)?;
        if self.version >= 3 {
            if len as u64 > self.extent_left {
                return Err(ReadError::new(
                    offset,
                    record.name(),
                    format!(
                        "the record's {len} bytes cross the end of its BufferExtents segment \
                         ({} bytes left in it)",
                        self.extent_left
                    ),
                ));
            }
            self.extent_left -= len as u64;
        }
        if let RawRecord::BufferExtents { size } = record {
            // As in llvm-xray: a BufferExtents inside a segment starts a new one.
            self.extent_left = size;
        }
        self.pos += len;
        Ok(Some((offset, record)))
    }

    /// Version 3+, outside a segment: zero padding, then a BufferExtents record.
    fn between_segments(&mut self) -> Result<(u64, RawRecord<'a>), ReadError> {
        let offset = self.pos as u64;
        let rest = &self.data[self.pos..];
        let zeros = rest.iter().take_while(|&&b| b == 0).count();
        if zeros > 0 {
            if zeros == rest.len() {
                return Err(ReadError::new(
                    offset,
                    "Padding",
                    format!(
                        "the file ends in {zeros} bytes of padding instead of a record \
                         (llvm-xray rejects this)"
                    ),
                ));
            }
            self.pos += zeros;
            return Ok((offset, RawRecord::Padding { len: zeros as u64 }));
        }
        if rest[0] != MetadataKind::BufferExtents.introducer() {
            return Err(ReadError::new(
                offset,
                "BufferExtents",
                format!(
                    "byte {:#04x} where a BufferExtents record (or zero padding) must start \
                     the next segment",
                    rest[0]
                ),
            ));
        }
        let (record, len) = decode(self.data, self.pos, self.version)?;
        if let RawRecord::BufferExtents { size } = record {
            self.extent_left = size;
        }
        self.pos += len;
        Ok((offset, record))
    }
}

fn short(offset: u64, name: &'static str, need: usize, left: usize) -> ReadError {
    ReadError::new(
        offset,
        name,
        format!("the record needs {need} bytes but the file has {left} left"),
    )
}

fn i32_at(b: &[u8]) -> i32 {
    le_u32(b) as i32
}

/// Decodes the record at `pos`: the record and its length, payload included.
pub(crate) fn decode(
    data: &[u8],
    pos: usize,
    version: u16,
) -> Result<(RawRecord<'_>, usize), ReadError> {
    let offset = pos as u64;
    let rest = &data[pos..];
    let first = rest[0];
    if first & 1 == 0 {
        if rest.len() < FUNCTION_RECORD_SIZE {
            return Err(short(offset, "Function", FUNCTION_RECORD_SIZE, rest.len()));
        }
        let word = le_u32(rest);
        let code = ((word >> 1) & 7) as u8;
        let action = FunctionAction::from_code(code).ok_or_else(|| {
            ReadError::new(
                offset,
                "Function",
                format!("unknown function record type {code}"),
            )
        })?;
        let record = RawRecord::Function {
            action,
            function_id: word >> 4,
            delta: le_u32(&rest[4..]),
        };
        return Ok((record, FUNCTION_RECORD_SIZE));
    }
    let code = first >> 1;
    let kind = MetadataKind::from_code(code).ok_or_else(|| {
        ReadError::new(
            offset,
            "metadata record",
            format!("unknown metadata record kind {code}"),
        )
    })?;
    let name = kind.name();
    if rest.len() < METADATA_RECORD_SIZE {
        return Err(short(offset, name, METADATA_RECORD_SIZE, rest.len()));
    }
    let p = &rest[1..METADATA_RECORD_SIZE];
    let since = |min: u16| -> Result<(), ReadError> {
        if version < min {
            return Err(ReadError::new(
                offset,
                name,
                format!(
                    "{name} records exist from version {min} on; this file is version {version}"
                ),
            ));
        }
        Ok(())
    };
    let record = match kind {
        MetadataKind::NewBuffer => RawRecord::NewBuffer { tid: le_u32(p) },
        MetadataKind::EndOfBuffer => {
            if version >= 2 {
                return Err(ReadError::new(
                    offset,
                    name,
                    format!("EndOfBuffer exists only in version 1; this file is version {version}"),
                ));
            }
            RawRecord::EndOfBuffer
        }
        MetadataKind::NewCPUId => RawRecord::NewCpuId {
            cpu: le_u16(p),
            tsc: le_u64(&p[2..]),
        },
        MetadataKind::TSCWrap => RawRecord::TscWrap { tsc: le_u64(p) },
        MetadataKind::WallClockTime => RawRecord::WallClock {
            secs: le_u64(p),
            micros: le_u32(&p[8..]),
        },
        MetadataKind::CallArgument => RawRecord::CallArgument { value: le_u64(p) },
        MetadataKind::BufferExtents => {
            since(2)?;
            RawRecord::BufferExtents { size: le_u64(p) }
        }
        MetadataKind::Pid => {
            since(3)?;
            RawRecord::Pid { pid: le_u32(p) }
        }
        MetadataKind::CustomEventMarker | MetadataKind::TypedEventMarker => {
            if kind == MetadataKind::TypedEventMarker {
                since(5)?;
            }
            let size = i32_at(p);
            if size <= 0 {
                return Err(ReadError::new(
                    offset,
                    name,
                    format!("event payload size {size} is not positive"),
                ));
            }
            let size = size as usize;
            let left = rest.len() - METADATA_RECORD_SIZE;
            if size > left {
                return Err(ReadError::new(
                    offset,
                    name,
                    format!(
                        "the {size}-byte payload runs past the end of the file ({left} bytes left)"
                    ),
                ));
            }
            let data = &rest[METADATA_RECORD_SIZE..METADATA_RECORD_SIZE + size];
            let record = if kind == MetadataKind::TypedEventMarker {
                RawRecord::TypedEvent {
                    delta: i32_at(&p[4..]),
                    event_type: le_u16(&p[8..]),
                    data,
                }
            } else if version >= 5 {
                RawRecord::CustomEvent {
                    time: EventTime::Delta(i32_at(&p[4..])),
                    cpu: None,
                    data,
                }
            } else {
                RawRecord::CustomEvent {
                    time: EventTime::Absolute(le_u64(&p[4..])),
                    cpu: (version == 4).then(|| le_u16(&p[12..])),
                    data,
                }
            };
            return Ok((record, METADATA_RECORD_SIZE + size));
        }
    };
    Ok((record, METADATA_RECORD_SIZE))
}
