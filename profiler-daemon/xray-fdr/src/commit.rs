//! Crash-safe commits: how new records reach the file so that a SIGKILL at any instant leaves a
//! file that llvm-xray (14 and 19) and [`super::reader`] load, holding at least everything
//! committed before.
//!
//! Two facts shape this module:
//! - A `pwrite` is not atomic. Linux copies a buffered write one page (or folio) at a time and
//!   stops between pages once a fatal signal is pending, so SIGKILL can cut a write at any
//!   4096-byte file offset inside it ([`GRANULE`]); writes are never cut elsewhere. Everything
//!   else (`ftruncate`, a write within one page) is all-or-nothing.
//! - What each reader tolerates (llvm-xray checked by source and experiment): in version 1 every
//!   record after EndOfBuffer is parsed but ignored until the next NewBuffer; in version 5 bytes
//!   between BufferExtents segments are skipped up to the next BufferExtents record, a file may
//!   end before its last segment's extent (at a record boundary), but a file must not end in
//!   skipped bytes. Both lose record order across several NewBuffer blocks of one thread
//!   (llvm-xray sorts them with a comparator that is not a strict weak order), so a file keeps
//!   exactly one NewBuffer.
//!
//! **Version 1: stage behind EndOfBuffer, then flip.** At rest the file ends with EndOfBuffer
//! whose unused payload holds the bytes of `TSCWrap(base)` (base = current delta base). A commit:
//! 1. `ftruncate` grows the file by a multiple of 8 bytes: zeros after EndOfBuffer parse as ignored
//!    function records.
//! 2. One write puts, after EndOfBuffer: a cover (a CustomEventMarker whose payload spans the rest
//!    of the new space), the new records, a new EndOfBuffer, and if needed a small ignored
//!    CustomEventMarker so the growth stays a multiple of 8. The cover never crosses a page
//!    boundary, so a cut write still has the cover, and the cover swallows whatever got written.
//! 3. The cover is overwritten with `TSCWrap(base)` (16 bytes within one page): a no-op record.
//! 4. The old EndOfBuffer's first byte becomes TSCWrap's (one byte): the new records are live.
//! 5. The header's `buffer_size` is set to the live length, then `ftruncate` drops the padding.
//!
//! **Version 5: page-aligned segments.** Each commit appends BufferExtents segments laid out so
//! that every page boundary inside the write falls where a cut file is valid: at the end of a
//! record, or right after a BufferExtents record. Where a record would cross a boundary, the
//! segment ends early, zero padding follows and a new BufferExtents ends exactly at the
//! boundary. One exception: an event payload over [`V5_CRASH_SAFE_PAYLOAD`] bytes cannot fit
//! between two boundaries, and a SIGKILL during its write can cut it.
#![warn(missing_docs)]

use std::io;

use super::records::{
    self, FileHeader, MetadataKind, WallClock, HEADER_SIZE, METADATA_RECORD_SIZE,
};
use super::sink::TraceSink;
use super::version::FdrVersion;

/// The unit at which the kernel may cut a write short: the smallest page size (larger pages are
/// multiples of it, so their boundaries are among these).
pub const GRANULE: u64 = 4096;

/// Records larger than this are never moved to the next page in version 5 (moving one could not
/// help: it would not fit either); see [`V5_CRASH_SAFE_PAYLOAD`].
const V5_MOVABLE_RECORD: u64 = GRANULE - 64;

/// Largest custom or typed event payload that version 5 output keeps crash-safe (a marker plus
/// payload must fit in one page next to a BufferExtents record).
pub const V5_CRASH_SAFE_PAYLOAD: usize = (V5_MOVABLE_RECORD as usize) - METADATA_RECORD_SIZE;

const MD: u64 = METADATA_RECORD_SIZE as u64;

/// Whether `[pos, pos + len)` contains a granule boundary strictly inside, i.e. a cut there
/// would split it.
pub(crate) fn crosses_granule(pos: u64, len: u64) -> bool {
    len > 1 && pos / GRANULE != (pos + len - 1) / GRANULE
}

/// Whether fewer than 16 bytes (but more than 0) remain before the next granule boundary: no
/// metadata record can start at `pos` without crossing it.
fn in_tail_zone(pos: u64) -> bool {
    pos % GRANULE > GRANULE - MD
}

/// Records accepted but not yet on disk: their bytes back to back, and where each starts (version
/// 5 may only move whole records to the next page; version 1 never splits records, so its
/// writer does not keep the starts: a push per record saved).
#[derive(Debug)]
pub(crate) struct Pending {
    pub bytes: Vec<u8>,
    pub starts: Vec<u32>,
    /// Whether `starts` is kept.
    keep_starts: bool,
}

impl Default for Pending {
    fn default() -> Self {
        Pending::new(true)
    }
}

impl Pending {
    /// An empty buffer that keeps where records start if `keep_starts` (version 5 needs them).
    pub fn new(keep_starts: bool) -> Self {
        Pending {
            bytes: Vec::new(),
            starts: Vec::new(),
            keep_starts,
        }
    }
    /// Appends one record (an event's marker and payload count as one).
    pub fn push(&mut self, parts: &[&[u8]]) {
        if self.keep_starts {
            self.starts.push(self.bytes.len() as u32);
        }
        for p in parts {
            self.bytes.extend_from_slice(p);
        }
    }
    /// Appends one record of fixed size (a function or metadata record): no loop over parts,
    /// and a copy of known length.
    #[inline]
    pub fn push_record<const N: usize>(&mut self, record: &[u8; N]) {
        if self.keep_starts {
            self.starts.push(self.bytes.len() as u32);
        }
        self.bytes.extend_from_slice(record);
    }
    /// Appends bytes to the last record, making them one unit that version 5 never splits
    /// across pages (an Entry_Args record and its arguments).
    pub fn extend_last(&mut self, bytes: &[u8]) {
        debug_assert!(!self.keep_starts || !self.starts.is_empty());
        self.bytes.extend_from_slice(bytes);
    }
    pub fn len(&self) -> usize {
        self.bytes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
    /// Empties the buffer; gives memory back after an unusually large event.
    pub fn clear(&mut self, keep_capacity: usize) {
        self.bytes.clear();
        self.starts.clear();
        if self.bytes.capacity() > 2 * keep_capacity {
            self.bytes = Vec::with_capacity(keep_capacity);
        }
    }
    fn record(&self, i: usize) -> &[u8] {
        let start = self.starts[i] as usize;
        let end = self
            .starts
            .get(i + 1)
            .map_or(self.bytes.len(), |&e| e as usize);
        &self.bytes[start..end]
    }
}

/// The on-disk state of one file between commits.
#[derive(Debug)]
pub(crate) enum Disk {
    /// Version 1: data ends with an EndOfBuffer record ending at `live_end`, which encodes
    /// `TSCWrap(base)` in its payload.
    V1 {
        start: u64,
        live_end: u64,
        base: u64,
    },
    /// Version 5: data ends at `end`, right after the last record of an exact segment.
    V5 { start: u64, end: u64 },
}

/// EndOfBuffer carrying `TSCWrap(base)`'s payload, so one byte turns it into that no-op record.
/// Readers ignore an EndOfBuffer's payload.
fn end_of_buffer_for(base: u64) -> [u8; METADATA_RECORD_SIZE] {
    let mut r = records::tsc_wrap(base);
    r[0] = MetadataKind::EndOfBuffer.introducer();
    r
}

fn buffer_extents(n: usize) -> [u8; METADATA_RECORD_SIZE] {
    records::buffer_extents(n as u64)
}

impl Disk {
    /// Writes the header and the buffer preamble (NewBuffer, WallClockTime, [Pid,] a placeholder
    /// NewCPUId(0, 0) that keeps a record-less file valid) in one write inside the first page,
    /// so the file is complete from its first byte.
    pub fn create<W: TraceSink>(
        out: &mut W,
        version: FdrVersion,
        ids: (u32, u32),
        cycle_frequency: u64,
        wall: WallClock,
    ) -> io::Result<Disk> {
        let (tid, pid) = ids;
        let start = out.start_offset()?;
        let mut body = Vec::with_capacity(128);
        body.extend_from_slice(&records::new_buffer(tid));
        body.extend_from_slice(&records::wall_clock_time(wall.secs, wall.micros));
        if version == FdrVersion::V5 {
            body.extend_from_slice(&records::pid(pid));
        }
        body.extend_from_slice(&records::new_cpu_id(0, 0));
        let mut data = Vec::with_capacity(160);
        let disk = match version {
            FdrVersion::V1 => {
                // The next commit's cover goes right after the EndOfBuffer and must not cross
                // a page boundary.
                let mut end = start + (HEADER_SIZE + body.len()) as u64 + MD;
                if crosses_granule(end, MD) {
                    body.extend_from_slice(&records::tsc_wrap(0));
                    end += MD;
                }
                body.extend_from_slice(&end_of_buffer_for(0));
                Disk::V1 {
                    start,
                    live_end: end,
                    base: 0,
                }
            }
            FdrVersion::V5 => {
                let mut end = start + (HEADER_SIZE as u64) + MD + body.len() as u64;
                if in_tail_zone(end) {
                    body.extend_from_slice(&records::tsc_wrap(0));
                    end += MD;
                }
                data.extend_from_slice(&buffer_extents(body.len()));
                Disk::V5 { start, end }
            }
        };
        data.extend_from_slice(&body);
        let header = FileHeader::new(version.number(), cycle_frequency, data.len() as u64);
        data.splice(0..0, header.encode());
        out.write_at(start, &data)?;
        Ok(disk)
    }

    /// Bytes of the file as it stands at rest, header included.
    pub fn len(&self) -> u64 {
        match *self {
            Disk::V1 {
                start, live_end, ..
            } => live_end - start,
            Disk::V5 { start, end } => end - start,
        }
    }

    /// Puts `pending` on disk (see the module docs for the protocol) and sets `buffer_size`.
    /// `base` is the delta base after the pending records. `scratch` is reused memory.
    pub fn commit<W: TraceSink>(
        &mut self,
        out: &mut W,
        pending: &Pending,
        base: u64,
        scratch: &mut Vec<u8>,
    ) -> io::Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        match self {
            Disk::V1 {
                start,
                live_end,
                base: old_base,
            } => {
                let l = *live_end;
                let new_end = stage_v1(l, &pending.bytes, base, scratch)?;
                let total_end = l + scratch.len() as u64;
                // Until the flip below, the file's live end is still `l`: a failed step (the
                // disk full) leaves the file as it was once cut back there. Without the cut,
                // the grown file would keep a hole, which a full tmpfs cannot even read
                // through mmap (llvm-xray dies of SIGBUS).
                let staged = out
                    .set_len(total_end)
                    .and_then(|()| out.write_at(l, scratch))
                    .and_then(|()| out.write_at(l, &records::tsc_wrap(*old_base)));
                if let Err(err) = staged {
                    let _ = out.set_len(l);
                    return Err(err);
                }
                out.write_at(l - MD, &[MetadataKind::TSCWrap.introducer()])?;
                patch_size(out, *start, new_end)?;
                if total_end != new_end {
                    out.set_len(new_end)?;
                }
                *live_end = new_end;
                *old_base = base;
            }
            Disk::V5 { start, end } => {
                layout_v5(*end, pending, scratch);
                if let Err(err) = out.write_at(*end, scratch) {
                    // A short write (the disk full) ends at a page boundary, where a cut file is
                    // valid; cutting it back to the last commit leaves exactly what was there.
                    let _ = out.set_len(*end);
                    return Err(err);
                }
                *end += scratch.len() as u64;
                patch_size(out, *start, *end)?;
            }
        }
        Ok(())
    }
}

fn patch_size<W: TraceSink>(out: &mut W, start: u64, end: u64) -> io::Result<()> {
    let size = end - start - HEADER_SIZE as u64;
    out.write_at(start + FileHeader::BUFFER_SIZE_OFFSET, &size.to_le_bytes())
}

/// Builds the bytes written after the EndOfBuffer that ends at `l`: cover, `records`, an
/// optional no-op filler, the new EndOfBuffer, optional ignored padding. Returns the new live end.
fn stage_v1(l: u64, records: &[u8], base: u64, out: &mut Vec<u8>) -> io::Result<u64> {
    out.clear();
    out.extend_from_slice(&[0; METADATA_RECORD_SIZE]);
    out.extend_from_slice(records);
    let mut eob = l + out.len() as u64;
    if crosses_granule(eob + MD, MD) {
        // Keep the next commit's cover (right after the new EndOfBuffer) inside one page.
        out.extend_from_slice(&records::tsc_wrap(base));
        eob += MD;
    }
    out.extend_from_slice(&end_of_buffer_for(base));
    let new_end = eob + MD;
    let rem = (new_end - l) % 8;
    if rem != 0 {
        // Zeros from the ftruncate parse as 8-byte records only if the growth is a multiple of 8.
        let pad = (8 - rem) as u32;
        out.extend_from_slice(&records::custom_event_marker_v1(pad, 0).map_err(io::Error::other)?);
        out.resize(out.len() + pad as usize, 0);
    }
    let cover = u32::try_from(out.len() - METADATA_RECORD_SIZE)
        .ok()
        .filter(|&n| n <= i32::MAX as u32)
        .ok_or_else(|| io::Error::other("FDR commit too large for one CustomEventMarker cover"))?;
    let marker = records::custom_event_marker_v1(cover, 0).map_err(io::Error::other)?;
    out[..METADATA_RECORD_SIZE].copy_from_slice(&marker);
    Ok(new_end)
}

/// Lays out `pending` as version-5 segments to be written at absolute offset `at` (see the module
/// docs). `at` must not be in the last 15 bytes before a page boundary, and neither is the end.
pub(crate) fn layout_v5(at: u64, pending: &Pending, out: &mut Vec<u8>) {
    out.clear();
    let n = pending.starts.len();
    let abs = |k: usize| at + k as u64;
    let mut seg = 0; // index in `out` of the open segment's BufferExtents
    out.extend_from_slice(&[0; METADATA_RECORD_SIZE]);
    let mut seg_recs: Vec<(usize, usize)> = Vec::new(); // (index in out, record index)
    let mut i = 0;
    loop {
        let end = abs(out.len());
        let next = (i < n).then(|| pending.record(i));
        let need_break = match next {
            Some(r) => {
                let len = r.len() as u64;
                len <= V5_MOVABLE_RECORD && crosses_granule(end, len)
            }
            None => in_tail_zone(end),
        };
        if !need_break {
            let Some(r) = next else { break };
            seg_recs.push((out.len(), i));
            out.extend_from_slice(r);
            i += 1;
            continue;
        }
        let boundary = (end / GRANULE + 1) * GRANULE;
        // Cut the segment at its latest record boundary that leaves room for a BufferExtents
        // before `boundary`; records after the cut move to the next page.
        let mut keep = seg_recs.len();
        let mut cut = out.len();
        while boundary - abs(cut) < MD && keep > 0 {
            keep -= 1;
            cut = seg_recs[keep].0;
        }
        let movable = seg_recs[keep..]
            .iter()
            .all(|&(_, r)| pending.record(r).len() as u64 <= V5_MOVABLE_RECORD);
        if !movable {
            // Only oversized events get here; they are documented as not crash-safe.
            match next {
                Some(r) => {
                    seg_recs.push((out.len(), i));
                    out.extend_from_slice(r);
                    i += 1;
                    continue;
                }
                None => break,
            }
        }
        if keep == 0 {
            cut = seg; // nothing stays: the segment's BufferExtents goes too
        } else {
            let size = cut - seg - METADATA_RECORD_SIZE;
            out[seg..seg + METADATA_RECORD_SIZE].copy_from_slice(&buffer_extents(size));
        }
        if let Some(&(_, first_moved)) = seg_recs.get(keep) {
            i = first_moved;
        }
        out.truncate(cut);
        out.resize((boundary - MD - at) as usize, 0);
        seg = out.len();
        out.extend_from_slice(&[0; METADATA_RECORD_SIZE]);
        seg_recs.clear();
    }
    if seg_recs.is_empty() {
        out.truncate(seg);
    } else {
        let size = out.len() - seg - METADATA_RECORD_SIZE;
        out[seg..seg + METADATA_RECORD_SIZE].copy_from_slice(&buffer_extents(size));
    }
}

#[cfg(test)]
mod tests;
