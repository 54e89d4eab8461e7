//! Byte-exact encoding of XRay FDR records (see `shared/docs/fdr-format.md`).
//!
//! Everything here is pure: each function turns field values into the fixed-size byte array the
//! format prescribes, little-endian, with unused payload bytes zero. Nothing here knows about
//! ordering rules or delta bases; that is [`super::writer`]'s job. Keeping encoding separate lets
//! the unit tests pin every byte, while the writer's tests check meaning against `llvm-xray`.
#![warn(missing_docs)]

/// Size of the file header that starts every trace file.
pub const HEADER_SIZE: usize = 32;
/// Size of a function record (entry, exit, tail exit, entry with arguments).
pub const FUNCTION_RECORD_SIZE: usize = 8;
/// Size of a metadata record: one kind byte and 15 payload bytes.
pub const METADATA_RECORD_SIZE: usize = 16;
/// Largest function id a function record can carry: the id has 28 bits in the record.
pub const MAX_FUNCTION_ID: u32 = (1 << 28) - 1;
/// `type` value of the file header for flight-data-recorder logs (0 would be basic mode).
pub const FDR_LOG_TYPE: u16 = 1;
/// Header bitfield bit: the TSC runs at a constant rate (`constant_tsc` in /proc/cpuinfo).
pub const BITFIELD_CONSTANT_TSC: u32 = 1 << 0;
/// Header bitfield bit: the TSC keeps running in deep C-states (`nonstop_tsc`).
pub const BITFIELD_NONSTOP_TSC: u32 = 1 << 1;

/// Why a record could not be encoded. Encoding never truncates silently: a truncated function id
/// or size would produce a file that loads but says something false.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The function id does not fit the 28 bits a function record has for it.
    #[error("function id {0} does not fit in 28 bits (max {MAX_FUNCTION_ID})")]
    FunctionIdTooLarge(u32),
    /// Event payload sizes are read as a positive `i32`; llvm-xray rejects 0 and negatives.
    #[error("event payload size {0} must be between 1 and {max}", max = i32::MAX)]
    InvalidEventSize(u32),
}

/// The 32-byte file header.
///
/// The header is the only part of the file that is rewritten after the fact: `buffer_size` is
/// patched by the writer at every flush, so its offset is exported as [`FileHeader::BUFFER_SIZE_OFFSET`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    /// Format version: 1 for the layout this project writes by default.
    pub version: u16,
    /// Log type; [`FDR_LOG_TYPE`] for FDR files.
    pub log_type: u16,
    /// Bit 0 constant_tsc, bit 1 nonstop_tsc; other bits must stay 0.
    pub bitfield: u32,
    /// Ticks per second of the timestamps, so readers can turn deltas into seconds.
    pub cycle_frequency: u64,
    /// Bytes of data following the header.
    pub buffer_size: u64,
}

impl FileHeader {
    /// Byte offset of `buffer_size` inside the header, for in-place patching.
    pub const BUFFER_SIZE_OFFSET: u64 = 16;

    /// A version-1 FDR header with constant and nonstop TSC flags, which is what the writer emits:
    /// our timestamps are monotonic kernel clock ticks, so both guarantees hold.
    pub fn v1(cycle_frequency: u64, buffer_size: u64) -> Self {
        FileHeader {
            version: 1,
            log_type: FDR_LOG_TYPE,
            bitfield: BITFIELD_CONSTANT_TSC | BITFIELD_NONSTOP_TSC,
            cycle_frequency,
            buffer_size,
        }
    }

    /// A header of `version` with the same flags as [`FileHeader::v1`].
    pub fn new(version: u16, cycle_frequency: u64, buffer_size: u64) -> Self {
        FileHeader {
            version,
            ..FileHeader::v1(cycle_frequency, buffer_size)
        }
    }

    /// Decodes the first 32 bytes of a file. The 8 reserved bytes are not kept: no version gives
    /// them a meaning and llvm-xray ignores them.
    pub fn decode(b: &[u8; HEADER_SIZE]) -> Self {
        FileHeader {
            version: le_u16(&b[0..]),
            log_type: le_u16(&b[2..]),
            bitfield: le_u32(&b[4..]),
            cycle_frequency: le_u64(&b[8..]),
            buffer_size: le_u64(&b[16..]),
        }
    }

    /// Encodes the header; the 8 reserved trailing bytes are zero.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        b[0..2].copy_from_slice(&self.version.to_le_bytes());
        b[2..4].copy_from_slice(&self.log_type.to_le_bytes());
        b[4..8].copy_from_slice(&self.bitfield.to_le_bytes());
        b[8..16].copy_from_slice(&self.cycle_frequency.to_le_bytes());
        b[16..24].copy_from_slice(&self.buffer_size.to_le_bytes());
        b
    }
}

/// What a function record says happened. The discriminants are the 3-bit codes in the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FunctionAction {
    /// The function was entered.
    Entry = 0,
    /// The function returned normally.
    Exit = 1,
    /// The function is about to tail-call another one; its frame ends here.
    TailExit = 2,
    /// The function was entered and its arguments follow as CallArgument records.
    EntryArgs = 3,
}

impl FunctionAction {
    /// True for the actions that open a frame (Entry, EntryArgs).
    #[inline]
    pub fn is_entry(self) -> bool {
        matches!(self, FunctionAction::Entry | FunctionAction::EntryArgs)
    }

    /// The action of a 3-bit code; `None` for 4..=7, which no version defines.
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => FunctionAction::Entry,
            1 => FunctionAction::Exit,
            2 => FunctionAction::TailExit,
            3 => FunctionAction::EntryArgs,
            _ => return None,
        })
    }
}

/// Metadata record kinds; the discriminant is stored as `(kind << 1) | 1` in byte 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MetadataKind {
    /// Starts a thread buffer; carries the thread id.
    NewBuffer = 0,
    /// Ends a thread buffer (version 1 only).
    EndOfBuffer = 1,
    /// The thread now runs on another CPU; resets the delta base.
    NewCPUId = 2,
    /// Resets the delta base when a delta would not fit in 32 bits.
    TSCWrap = 3,
    /// Wall-clock time at the start of the buffer.
    WallClockTime = 4,
    /// A custom event; its payload bytes follow the record.
    CustomEventMarker = 5,
    /// One argument of the preceding EntryArgs record.
    CallArgument = 6,
    /// Byte count of the buffer that follows (version 2+).
    BufferExtents = 7,
    /// A typed event; its payload bytes follow the record (version 5).
    TypedEventMarker = 8,
    /// Process id (version 3+).
    Pid = 9,
}

impl MetadataKind {
    /// The kind of a 7-bit code; `None` for codes no version defines (10 and above).
    pub fn from_code(code: u8) -> Option<Self> {
        use MetadataKind::*;
        Some(match code {
            0 => NewBuffer,
            1 => EndOfBuffer,
            2 => NewCPUId,
            3 => TSCWrap,
            4 => WallClockTime,
            5 => CustomEventMarker,
            6 => CallArgument,
            7 => BufferExtents,
            8 => TypedEventMarker,
            9 => Pid,
            _ => return None,
        })
    }

    /// The first byte of a record of this kind: the kind above the metadata bit.
    pub fn introducer(self) -> u8 {
        ((self as u8) << 1) | 1
    }

    /// The record's name as the format documentation spells it (used in error messages).
    pub fn name(self) -> &'static str {
        use MetadataKind::*;
        match self {
            NewBuffer => "NewBuffer",
            EndOfBuffer => "EndOfBuffer",
            NewCPUId => "NewCPUId",
            TSCWrap => "TSCWrap",
            WallClockTime => "WallClockTime",
            CustomEventMarker => "CustomEventMarker",
            CallArgument => "CallArgument",
            BufferExtents => "BufferExtents",
            TypedEventMarker => "TypedEventMarker",
            Pid => "Pid",
        }
    }
}

/// Little-endian u16 at the start of `b` (callers guarantee the length).
pub(crate) fn le_u16(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}

/// Little-endian u32 at the start of `b` (callers guarantee the length).
pub(crate) fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Little-endian u64 at the start of `b` (callers guarantee the length).
pub(crate) fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Builds a metadata record from its kind and up to 15 payload bytes; the rest stays zero.
fn metadata(kind: MetadataKind, payload: &[u8]) -> [u8; METADATA_RECORD_SIZE] {
    debug_assert!(payload.len() < METADATA_RECORD_SIZE);
    let mut b = [0u8; METADATA_RECORD_SIZE];
    // Bit 0 set marks a metadata record; the kind sits in the 7 bits above it.
    b[0] = ((kind as u8) << 1) | 1;
    b[1..1 + payload.len()].copy_from_slice(payload);
    b
}

/// Accumulates little-endian field bytes of a metadata payload in order, so each record's encoder
/// reads as its field list and offsets cannot drift from the documented layout.
struct Payload {
    buf: [u8; METADATA_RECORD_SIZE - 1],
    len: usize,
}

impl Payload {
    fn new() -> Self {
        Payload {
            buf: [0; METADATA_RECORD_SIZE - 1],
            len: 0,
        }
    }
    fn put(mut self, bytes: &[u8]) -> Self {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
        self
    }
    fn record(&self, kind: MetadataKind) -> [u8; METADATA_RECORD_SIZE] {
        metadata(kind, &self.buf[..self.len])
    }
}

/// Event sizes are `i32` on disk and must be positive for llvm-xray to accept the record.
fn event_size(size: u32) -> Result<i32, RecordError> {
    match i32::try_from(size) {
        Ok(s) if s > 0 => Ok(s),
        _ => Err(RecordError::InvalidEventSize(size)),
    }
}

/// Encodes a function record: word 0 holds the kind bit (0), the action and the 28-bit function
/// id; word 1 the tick delta from the current delta base.
#[inline]
pub fn function_record(
    action: FunctionAction,
    function_id: u32,
    tsc_delta: u32,
) -> Result<[u8; FUNCTION_RECORD_SIZE], RecordError> {
    if function_id > MAX_FUNCTION_ID {
        return Err(RecordError::FunctionIdTooLarge(function_id));
    }
    let word0 = (function_id << 4) | ((action as u32) << 1);
    let mut b = [0u8; FUNCTION_RECORD_SIZE];
    b[0..4].copy_from_slice(&word0.to_le_bytes());
    b[4..8].copy_from_slice(&tsc_delta.to_le_bytes());
    Ok(b)
}

/// NewBuffer with the full 32-bit thread id: the v1 spec gives the field 2 bytes, but llvm-xray
/// reads 4, and Linux thread ids exceed 65535, so the low 16 bits remain the spec's field.
pub fn new_buffer(tid: u32) -> [u8; METADATA_RECORD_SIZE] {
    Payload::new()
        .put(&tid.to_le_bytes())
        .record(MetadataKind::NewBuffer)
}

/// EndOfBuffer: no payload. Only valid in version 1 files.
pub fn end_of_buffer() -> [u8; METADATA_RECORD_SIZE] {
    metadata(MetadataKind::EndOfBuffer, &[])
}

/// NewCPUId: the cpu the following records ran on and the absolute tick that becomes the new
/// delta base.
pub fn new_cpu_id(cpu: u16, tsc: u64) -> [u8; METADATA_RECORD_SIZE] {
    Payload::new()
        .put(&cpu.to_le_bytes())
        .put(&tsc.to_le_bytes())
        .record(MetadataKind::NewCPUId)
}

/// TSCWrap: the absolute tick that becomes the new delta base when a delta would overflow u32.
pub fn tsc_wrap(tsc: u64) -> [u8; METADATA_RECORD_SIZE] {
    Payload::new()
        .put(&tsc.to_le_bytes())
        .record(MetadataKind::TSCWrap)
}

/// WallClockTime: seconds and microseconds since the Unix epoch. (llvm's reader calls the second
/// field "nanos" but prints it as microseconds, which is what compiler-rt writes.)
pub fn wall_clock_time(secs: u64, micros: u32) -> [u8; METADATA_RECORD_SIZE] {
    Payload::new()
        .put(&secs.to_le_bytes())
        .put(&micros.to_le_bytes())
        .record(MetadataKind::WallClockTime)
}

/// CustomEventMarker in the version 1-3 layout: payload size and absolute tick. The caller writes
/// `size` payload bytes right after this record. Version 4 adds a u16 cpu at payload offset 12
/// ([`custom_event_marker_v4`]); version 5 replaces the tick by a delta
/// ([`custom_event_marker_v5`]).
pub fn custom_event_marker_v1(
    size: u32,
    tsc: u64,
) -> Result<[u8; METADATA_RECORD_SIZE], RecordError> {
    let size = event_size(size)?;
    Ok(Payload::new()
        .put(&size.to_le_bytes())
        .put(&tsc.to_le_bytes())
        .record(MetadataKind::CustomEventMarker))
}

/// CustomEventMarker in the version 4 layout: the v1 fields plus the cpu at payload offset 12.
/// Only the reader's tests need it: this project writes versions 1 and 5.
pub fn custom_event_marker_v4(
    size: u32,
    tsc: u64,
    cpu: u16,
) -> Result<[u8; METADATA_RECORD_SIZE], RecordError> {
    let size = event_size(size)?;
    Ok(Payload::new()
        .put(&size.to_le_bytes())
        .put(&tsc.to_le_bytes())
        .put(&cpu.to_le_bytes())
        .record(MetadataKind::CustomEventMarker))
}

/// CustomEventMarker in the version 5 layout: payload size and a signed tick delta from the
/// current delta base (which then moves to the event's tick, as for function records).
pub fn custom_event_marker_v5(
    size: u32,
    tsc_delta: i32,
) -> Result<[u8; METADATA_RECORD_SIZE], RecordError> {
    let size = event_size(size)?;
    Ok(Payload::new()
        .put(&size.to_le_bytes())
        .put(&tsc_delta.to_le_bytes())
        .record(MetadataKind::CustomEventMarker))
}

/// CallArgument: one argument value of the EntryArgs record it follows.
pub fn call_argument(arg: u64) -> [u8; METADATA_RECORD_SIZE] {
    Payload::new()
        .put(&arg.to_le_bytes())
        .record(MetadataKind::CallArgument)
}

/// BufferExtents: number of bytes in the buffer that follows (version 2+ files).
pub fn buffer_extents(size: u64) -> [u8; METADATA_RECORD_SIZE] {
    Payload::new()
        .put(&size.to_le_bytes())
        .record(MetadataKind::BufferExtents)
}

/// TypedEventMarker (version 5): payload size, signed tick delta and event type; the payload
/// follows the record.
pub fn typed_event_marker(
    size: u32,
    tsc_delta: i32,
    event_type: u16,
) -> Result<[u8; METADATA_RECORD_SIZE], RecordError> {
    let size = event_size(size)?;
    Ok(Payload::new()
        .put(&size.to_le_bytes())
        .put(&tsc_delta.to_le_bytes())
        .put(&event_type.to_le_bytes())
        .record(MetadataKind::TypedEventMarker))
}

/// Pid (version 3+): the process id, stored as the i32 readers expect. Linux pids never exceed
/// `i32::MAX`, so the u32 bit pattern is the same value.
pub fn pid(pid: u32) -> [u8; METADATA_RECORD_SIZE] {
    Payload::new()
        .put(&pid.to_le_bytes())
        .record(MetadataKind::Pid)
}

/// Wall-clock time written into the buffer's WallClockTime record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WallClock {
    /// Seconds since the Unix epoch.
    pub secs: u64,
    /// Microseconds within the second (the unit llvm-xray prints and compiler-rt writes).
    pub micros: u32,
}

impl WallClock {
    /// The current system time; before-epoch clocks read as the epoch rather than failing,
    /// because the field is informational only.
    pub fn now() -> Self {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        WallClock {
            secs: d.as_secs(),
            micros: d.subsec_micros(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_v1_bytes() {
        let h = FileHeader::v1(1_000_000_000, 0x0102_0304_0506_0708).encode();
        let mut want = vec![1, 0, 1, 0, 3, 0, 0, 0];
        want.extend_from_slice(&1_000_000_000u64.to_le_bytes());
        want.extend_from_slice(&[8, 7, 6, 5, 4, 3, 2, 1]);
        want.extend_from_slice(&[0; 8]);
        assert_eq!(h.to_vec(), want);
        assert_eq!(&h[16..24], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(FileHeader::BUFFER_SIZE_OFFSET, 16);
    }

    #[test]
    fn header_fields_roundtrip_positions() {
        let h = FileHeader {
            version: 5,
            log_type: 1,
            bitfield: 1,
            cycle_frequency: 7,
            buffer_size: 9,
        };
        let b = h.encode();
        assert_eq!(b[..8], [5, 0, 1, 0, 1, 0, 0, 0]);
        assert_eq!(b[8], 7);
        assert_eq!(b[16], 9);
        assert!(b[24..].iter().all(|&x| x == 0));
    }

    #[test]
    fn function_records_all_actions() {
        assert_eq!(
            function_record(FunctionAction::Entry, 1, 0).unwrap(),
            [0x10, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            function_record(FunctionAction::Exit, 1, 5).unwrap(),
            [0x12, 0, 0, 0, 5, 0, 0, 0]
        );
        assert_eq!(
            function_record(FunctionAction::TailExit, 0x123, 0xdead_beef).unwrap(),
            [0x34, 0x12, 0, 0, 0xef, 0xbe, 0xad, 0xde]
        );
        assert_eq!(
            function_record(FunctionAction::EntryArgs, 2, 1).unwrap(),
            [0x26, 0, 0, 0, 1, 0, 0, 0]
        );
    }

    #[test]
    fn function_id_limits() {
        let max = function_record(FunctionAction::Exit, MAX_FUNCTION_ID, u32::MAX).unwrap();
        assert_eq!(max, [0xf2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        // Bit 0 must stay clear whatever the id, or the record would read as metadata.
        assert_eq!(max[0] & 1, 0);
        assert_eq!(
            function_record(FunctionAction::Entry, MAX_FUNCTION_ID + 1, 0),
            Err(RecordError::FunctionIdTooLarge(1 << 28))
        );
        assert!(function_record(FunctionAction::Entry, u32::MAX, 0).is_err());
    }

    fn md(kind: u8, payload: &[u8]) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0] = (kind << 1) | 1;
        b[1..1 + payload.len()].copy_from_slice(payload);
        b
    }

    #[test]
    fn new_buffer_full_tid() {
        assert_eq!(new_buffer(70000), md(0, &[0x70, 0x11, 0x01, 0x00]));
        assert_eq!(new_buffer(u32::MAX), md(0, &[0xff; 4]));
        assert_eq!(new_buffer(70000)[0], 0x01);
    }

    #[test]
    fn end_of_buffer_bytes() {
        assert_eq!(end_of_buffer(), md(1, &[]));
        assert_eq!(end_of_buffer()[0], 0x03);
    }

    #[test]
    fn new_cpu_id_bytes() {
        let r = new_cpu_id(0x0102, 0x1112_1314_1516_1718);
        assert_eq!(
            r,
            md(
                2,
                &[0x02, 0x01, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11]
            )
        );
        assert_eq!(r[0], 0x05);
    }

    #[test]
    fn tsc_wrap_bytes() {
        let r = tsc_wrap(0x1112_1314_1516_1718);
        assert_eq!(r, md(3, &[0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11]));
        assert_eq!(r[0], 0x07);
    }

    #[test]
    fn wall_clock_bytes() {
        let r = wall_clock_time(0x0102_0304_0506_0708, 999_999);
        let mut p = 0x0102_0304_0506_0708u64.to_le_bytes().to_vec();
        p.extend_from_slice(&999_999u32.to_le_bytes());
        assert_eq!(r, md(4, &p));
        assert_eq!(r[0], 0x09);
    }

    #[test]
    fn custom_event_v1_bytes() {
        let r = custom_event_marker_v1(3, 0x1112_1314_1516_1718).unwrap();
        assert_eq!(
            r,
            md(
                5,
                &[3, 0, 0, 0, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11]
            )
        );
        assert_eq!(r[0], 0x0b);
        assert_eq!(
            custom_event_marker_v1(0, 1),
            Err(RecordError::InvalidEventSize(0))
        );
        assert!(custom_event_marker_v1(u32::MAX, 1).is_err());
    }

    #[test]
    fn call_argument_bytes() {
        let r = call_argument(u64::MAX - 1);
        assert_eq!(r, md(6, &[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]));
        assert_eq!(r[0], 0x0d);
    }

    #[test]
    fn buffer_extents_bytes() {
        let r = buffer_extents(4096);
        assert_eq!(r, md(7, &[0, 0x10, 0, 0, 0, 0, 0, 0]));
        assert_eq!(r[0], 0x0f);
    }

    #[test]
    fn typed_event_bytes() {
        let r = typed_event_marker(16, -2, 0x0304).unwrap();
        assert_eq!(r, md(8, &[16, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 0x04, 0x03]));
        assert_eq!(r[0], 0x11);
        assert!(typed_event_marker(0, 0, 0).is_err());
    }

    #[test]
    fn pid_bytes() {
        let r = pid(4_194_304);
        assert_eq!(r, md(9, &[0, 0, 0x40, 0]));
        assert_eq!(r[0], 0x13);
    }

    #[test]
    fn header_decode_roundtrips() {
        let h = FileHeader::new(5, 2_400_000_000, 12345);
        assert_eq!(FileHeader::decode(&h.encode()), h);
        assert_eq!(h.bitfield, BITFIELD_CONSTANT_TSC | BITFIELD_NONSTOP_TSC);
    }

    #[test]
    fn codes_roundtrip() {
        for code in 0..10 {
            let k = MetadataKind::from_code(code).unwrap();
            assert_eq!(k as u8, code);
            assert_eq!(k.introducer(), (code << 1) | 1);
        }
        assert_eq!(MetadataKind::from_code(10), None);
        assert_eq!(MetadataKind::TypedEventMarker.name(), "TypedEventMarker");
        for code in 0..4 {
            assert_eq!(FunctionAction::from_code(code).unwrap() as u8, code);
        }
        assert_eq!(FunctionAction::from_code(4), None);
    }

    #[test]
    fn custom_event_v4_v5_bytes() {
        let r = custom_event_marker_v4(3, 0x1112_1314_1516_1718, 0x0102).unwrap();
        assert_eq!(
            r,
            md(
                5,
                &[3, 0, 0, 0, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, 0x02, 0x01]
            )
        );
        let r = custom_event_marker_v5(7, -1).unwrap();
        assert_eq!(r, md(5, &[7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]));
        assert!(custom_event_marker_v5(0, 0).is_err());
    }

    #[test]
    fn action_helpers() {
        assert!(FunctionAction::Entry.is_entry());
        assert!(FunctionAction::EntryArgs.is_entry());
        assert!(!FunctionAction::Exit.is_entry());
        assert!(!FunctionAction::TailExit.is_entry());
        assert_eq!(FunctionAction::TailExit as u8, 2);
    }
}
