//! Where a [`super::writer::ThreadWriter`] puts its bytes.
//!
//! The writer never streams through a buffered writer: a buffer that fills up is written out at
//! whatever moment it fills, possibly mid-record, and a SIGKILL right then leaves a file no reader
//! accepts. Instead it writes complete, pre-planned byte ranges at known offsets and changes the
//! file length explicitly (see [`super::commit`] for the order of operations), so the sink only
//! needs positional writes and `set_len`.
#![warn(missing_docs)]

use std::fs::File;
use std::io::{self, Cursor, Seek};
use std::os::unix::fs::FileExt;

/// A random-access byte sink: a file, or memory for tests.
pub trait TraceSink {
    /// The offset where the trace starts: the sink's current position when the writer is made.
    fn start_offset(&mut self) -> io::Result<u64>;
    /// Writes all of `bytes` at `offset`, growing the sink if needed (a `pwrite` for files).
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()>;
    /// Sets the total length, zero-filling when it grows (an `ftruncate` for files: atomic).
    fn set_len(&mut self, len: u64) -> io::Result<()>;
}

impl TraceSink for File {
    fn start_offset(&mut self) -> io::Result<u64> {
        self.stream_position()
    }
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.write_all_at(bytes, offset)
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
}

impl TraceSink for Cursor<Vec<u8>> {
    fn start_offset(&mut self) -> io::Result<u64> {
        Ok(self.position())
    }
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let end = start
            .checked_add(bytes.len())
            .ok_or_else(|| io::Error::other("write past the address space"))?;
        let v = self.get_mut();
        if v.len() < end {
            v.resize(end, 0);
        }
        v[start..end].copy_from_slice(bytes);
        Ok(())
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(io::Error::other)?;
        self.get_mut().resize(len, 0);
        Ok(())
    }
}

/// Every operation a writer performed, in order, so tests can replay any prefix of them, and tear
/// any write at any page boundary, to see every state a crash could leave on disk.
#[cfg(test)]
#[derive(Debug, Clone, Default)]
pub(crate) struct OpLog {
    /// The operations so far.
    pub ops: Vec<Op>,
    /// The bytes after all of them.
    pub data: Vec<u8>,
}

/// One recorded sink operation.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// A positional write.
    Write { offset: u64, bytes: Vec<u8> },
    /// A length change.
    SetLen(u64),
}

#[cfg(test)]
impl OpLog {
    /// Applies `op`, or only the part of a write before `torn_at` (an absolute offset).
    pub(crate) fn apply(data: &mut Vec<u8>, op: &Op, torn_at: Option<u64>) {
        match op {
            Op::Write { offset, bytes } => {
                let keep = torn_at.map_or(bytes.len(), |t| (t - offset) as usize);
                let mut c = Cursor::new(std::mem::take(data));
                c.write_at(*offset, &bytes[..keep]).unwrap();
                *data = c.into_inner();
            }
            Op::SetLen(len) => data.resize(*len as usize, 0),
        }
    }
}

#[cfg(test)]
impl TraceSink for OpLog {
    fn start_offset(&mut self) -> io::Result<u64> {
        Ok(self.data.len() as u64)
    }
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let op = Op::Write {
            offset,
            bytes: bytes.to_vec(),
        };
        OpLog::apply(&mut self.data, &op, None);
        self.ops.push(op);
        Ok(())
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let op = Op::SetLen(len);
        OpLog::apply(&mut self.data, &op, None);
        self.ops.push(op);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_sink_grows_and_shrinks() {
        let mut c = Cursor::new(b"ab".to_vec());
        c.set_position(2);
        assert_eq!(c.start_offset().unwrap(), 2);
        c.write_at(4, b"xy").unwrap();
        assert_eq!(c.get_ref(), b"ab\0\0xy");
        c.write_at(1, b"Q").unwrap();
        c.set_len(3).unwrap();
        assert_eq!(c.get_ref(), b"aQ\0");
        c.set_len(5).unwrap();
        assert_eq!(c.get_ref(), b"aQ\0\0\0");
    }

    #[test]
    fn file_sink_writes_at_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.path().join("f"))
            .unwrap();
        TraceSink::write_at(&mut f, 3, b"abc").unwrap();
        TraceSink::set_len(&mut f, 8).unwrap();
        TraceSink::write_at(&mut f, 0, b"z").unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("f")).unwrap(),
            b"z\0\0abc\0\0"
        );
    }

    #[test]
    fn oplog_replays_and_tears() {
        let mut log = OpLog::default();
        log.write_at(0, b"hello").unwrap();
        log.set_len(8).unwrap();
        log.write_at(2, b"XYZW").unwrap();
        assert_eq!(log.data, b"heXYZW\0\0");
        let mut d = Vec::new();
        OpLog::apply(&mut d, &log.ops[0], None);
        OpLog::apply(&mut d, &log.ops[1], None);
        OpLog::apply(&mut d, &log.ops[2], Some(4));
        assert_eq!(d, b"heXYo\0\0\0");
    }
}
