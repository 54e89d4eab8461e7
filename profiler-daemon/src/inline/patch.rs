//! What the inline engine writes over each sled, and what it must find there first.
//!
//! An x86-64 XRay sled is 11 bytes. Unpatched, an entry or tail-call sled is `jmp +9` over
//! nine bytes of `nop`s, and an exit sled is `ret` and ten. XRay's own runtime patches them
//! to `mov r10d, <function id>` followed by `call` (entry, tail) or `jmp` (exit) to its
//! trampolines, writing the last nine bytes first and the first two last, in one store; the
//! inline engine writes the same instructions, calling the handler copied near the object
//! (`super::handler`), in the same order, while every thread of the process is stopped.
//! Restoring writes the original bytes back the same way: the first two bytes first (the sled
//! is then unpatched whatever follows), then the rest.
use crate::plan::AttachPlan;
use anyhow::{Context as _, Result};
use profiler_common::SledKind;

/// Bytes of a sled.
pub const SLED_BYTES: usize = 11;

/// One sled to patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sled {
    /// Where it is in the process.
    pub address: u64,
    /// The id the trace gives its function (an object's id packed in, as the probes' cookies).
    pub function_id: u32,
    /// Which trampoline it calls.
    pub kind: Trampoline,
}

/// The handler's three ways in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trampoline {
    /// Called from an entry sled (a function that logs arguments included: they are not
    /// recorded).
    Entry,
    /// Jumped to from an exit sled.
    Exit,
    /// Called from a tail-call sled.
    Tail,
}

impl Trampoline {
    /// The trampoline a sled of `kind` gets; `None` for the event sleds, left as they are.
    pub fn for_kind(kind: SledKind) -> Option<Trampoline> {
        match kind {
            SledKind::Entry | SledKind::LogArgsEntry => Some(Trampoline::Entry),
            SledKind::Exit => Some(Trampoline::Exit),
            SledKind::Tail => Some(Trampoline::Tail),
            SledKind::CustomEvent | SledKind::TypedEvent => None,
        }
    }

    /// The bytes an unpatched sled of this kind starts with.
    pub fn unpatched_prefix(self) -> &'static [u8] {
        match self {
            Trampoline::Entry | Trampoline::Tail => &[0xeb, 0x09],
            Trampoline::Exit => &[0xc3],
        }
    }
}

/// Whether `bytes` are an unpatched sled of `kind`: its first bytes as the compiler leaves
/// them, and nothing but `nop`s after (what XRay emits: multi-byte `nop`s, whose bytes are
/// not checked one by one; the first bytes are what tells a patched sled).
pub fn is_unpatched(kind: Trampoline, bytes: &[u8; SLED_BYTES]) -> bool {
    bytes.starts_with(kind.unpatched_prefix())
}

/// The patched bytes of `sled`, whose trampoline is at `trampoline`; `None` if it is beyond
/// the reach of a `rel32` from the sled.
pub fn patched(sled: &Sled, trampoline: u64) -> Option<[u8; SLED_BYTES]> {
    let next = sled.address.checked_add(SLED_BYTES as u64)?;
    let rel = i32::try_from(trampoline as i64 - next as i64).ok()?;
    let mut bytes = [0u8; SLED_BYTES];
    bytes[0] = 0x41; // mov r10d, imm32
    bytes[1] = 0xba;
    bytes[2..6].copy_from_slice(&sled.function_id.to_le_bytes());
    bytes[6] = match sled.kind {
        Trampoline::Entry | Trampoline::Tail => 0xe8, // call rel32
        Trampoline::Exit => 0xe9,                     // jmp rel32
    };
    bytes[7..11].copy_from_slice(&rel.to_le_bytes());
    Some(bytes)
}

/// How far a `call rel32` reaches (less a page, for the handler's own length).
pub const REACH: u64 = (1 << 31) - (1 << 16);

/// One object's sleds.
pub struct ObjectSleds {
    /// How the object is named in messages.
    pub name: String,
    pub sleds: Vec<Sled>,
}

/// The sleds of `plan` where process `pid` has them: each probe's file offset in the mapping
/// of the object that holds it (the object's file, by device and inode).
pub fn object_sleds(pid: u32, plan: &AttachPlan) -> Result<ObjectSleds> {
    let file = crate::traced::mappings::file_id(&plan.binary)
        .with_context(|| format!("{}: cannot stat it", plan.binary.display()))?;
    // (start, end, file offset) of each executable mapping of the file.
    let mappings: Vec<(u64, u64, u64)> = crate::traced::mappings::mappings(pid)?
        .iter()
        .filter(|m| m.executable() && m.of_file(file))
        .map(|m| (m.start, m.end, m.offset))
        .collect();
    let sleds = plan
        .probes
        .iter()
        .filter_map(|probe| {
            let kind = Trampoline::for_kind(SledKind::from_u8(probe.cookie.kind)?)?;
            let &(start, _, offset) = mappings.iter().find(|&&(start, end, offset)| {
                probe.file_offset >= offset
                    && probe.file_offset + SLED_BYTES as u64 <= offset + (end - start)
            })?;
            Some(Sled {
                address: start + (probe.file_offset - offset),
                function_id: probe.cookie.function_id,
                kind,
            })
        })
        .collect();
    Ok(ObjectSleds {
        name: plan.display_path.clone(),
        sleds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_sled_becomes_xrays_own_patch() {
        let sled = Sled {
            address: 0x1000,
            function_id: 7,
            kind: Trampoline::Entry,
        };
        // mov r10d, 7; call 0x2000 (from 0x100b: +0xff5)
        assert_eq!(
            patched(&sled, 0x2000).unwrap(),
            [0x41, 0xba, 7, 0, 0, 0, 0xe8, 0xf5, 0x0f, 0, 0]
        );
        let exit = Sled {
            kind: Trampoline::Exit,
            ..sled
        };
        // jmp backwards: 0x800 - 0x100b
        let bytes = patched(&exit, 0x800).unwrap();
        assert_eq!(bytes[6], 0xe9);
        assert_eq!(
            i32::from_le_bytes(bytes[7..11].try_into().unwrap()),
            0x800 - 0x100b
        );
        assert_eq!(patched(&sled, 0x1000 + (1 << 32)), None, "out of reach");
    }

    #[test]
    fn unpatched_sleds_are_told_from_patched_ones() {
        let mut entry = [0x90u8; SLED_BYTES];
        entry[0] = 0xeb;
        entry[1] = 0x09;
        assert!(is_unpatched(Trampoline::Entry, &entry));
        let mut exit = [0x90u8; SLED_BYTES];
        exit[0] = 0xc3;
        assert!(is_unpatched(Trampoline::Exit, &exit));
        let sled = Sled {
            address: 0x1000,
            function_id: 1,
            kind: Trampoline::Entry,
        };
        assert!(!is_unpatched(
            Trampoline::Entry,
            &patched(&sled, 0x2000).unwrap()
        ));
        assert_eq!(Trampoline::for_kind(SledKind::CustomEvent), None);
    }
}
