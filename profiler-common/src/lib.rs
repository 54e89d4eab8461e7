//! Types shared by the eBPF programs (`profiler-ebpf`) and the daemon (`profiler-daemon`).
//!
//! Everything here is `no_std` and `#[repr(C)]`: the kernel side writes these bytes into a BPF
//! ring buffer and the user side reads them back, so both must agree on the exact layout.
#![no_std]

/// What kind of XRay sled a probe sits on, as recorded in `xray_instr_map`.
///
/// The numeric values are LLVM's `SledEntry::FunctionKinds`.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SledKind {
    /// Function entry (`jmp +9` + nops at the function start).
    Entry = 0,
    /// Function exit (`ret` + nops).
    Exit = 1,
    /// Just before a tail call leaves the function.
    Tail = 2,
    /// Function entry of a function whose first argument XRay logs.
    LogArgsEntry = 3,
    /// `__xray_customevent` call site.
    CustomEvent = 4,
    /// `__xray_typedevent` call site.
    TypedEvent = 5,
}

impl SledKind {
    /// Whether the sled is at a function's entry (plain or logging its arguments).
    pub const fn is_entry(self) -> bool {
        matches!(self, SledKind::Entry | SledKind::LogArgsEntry)
    }

    /// Decodes the kind byte of an instrumentation-map entry; `None` for values LLVM does not define.
    pub const fn from_u8(v: u8) -> Option<SledKind> {
        Some(match v {
            0 => SledKind::Entry,
            1 => SledKind::Exit,
            2 => SledKind::Tail,
            3 => SledKind::LogArgsEntry,
            4 => SledKind::CustomEvent,
            5 => SledKind::TypedEvent,
            _ => return None,
        })
    }
}

/// The attach cookie of a sled probe: which function (XRay function id, possibly packed with an
/// object id) and which kind of sled. The eBPF program reads it with `bpf_get_attach_cookie` so
/// that one program serves every sled and the daemon never has to map addresses back to ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cookie {
    /// XRay function id (`(object_id << 24) | function_id` for shared objects).
    pub function_id: u32,
    /// Kind of the sled the probe is on.
    pub kind: u8,
}

impl Cookie {
    /// Packs the cookie into the 64 bits the kernel stores per attachment:
    /// bits 0..32 function id, bits 32..40 sled kind.
    pub const fn encode(self) -> u64 {
        (self.function_id as u64) | ((self.kind as u64) << 32)
    }

    /// Inverse of [`Cookie::encode`].
    pub const fn decode(raw: u64) -> Cookie {
        Cookie {
            function_id: raw as u32,
            kind: (raw >> 32) as u8,
        }
    }
}

/// One probe hit, as written by the eBPF program into the events ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SledEvent {
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC nanoseconds at the hit.
    pub ts_ns: u64,
    /// Process id (the kernel's tgid).
    pub pid: u32,
    /// Thread id (the kernel's pid).
    pub tid: u32,
    /// The attach cookie, see [`Cookie`].
    pub cookie: u64,
    /// CPU the thread ran on at the hit.
    pub cpu: u32,
    /// Zero; keeps the layout free of implicit padding.
    pub reserved: u32,
    /// First integer argument (`rdi`) at a LOG_ARGS_ENTRY sled, as XRay logs it; 0 otherwise.
    pub arg: u64,
}

impl SledEvent {
    /// Size of the record in the ring buffer.
    pub const SIZE: usize = core::mem::size_of::<SledEvent>();

    /// Reads an event from the bytes of a ring-buffer record; `None` if the record is too short.
    pub fn from_bytes(bytes: &[u8]) -> Option<SledEvent> {
        if bytes.len() < Self::SIZE {
            return None;
        }
        // SAFETY: length checked above; SledEvent is plain old data with no invalid bit patterns;
        // read_unaligned because ring-buffer records are only 8-byte aligned by convention.
        Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr() as *const SledEvent) })
    }
}

/// Name of the ring-buffer map the eBPF program writes [`SledEvent`]s into.
pub const EVENTS_MAP: &str = "EVENTS";
/// Name of the per-CPU array map (one `u64` slot) counting events that did not fit the ring buffer.
pub const LOST_MAP: &str = "LOST";
/// Name of the eBPF program attached to every sled.
pub const SLED_PROGRAM: &str = "sled";
/// Default size of the events ring buffer in bytes (a power of two, as the kernel requires).
pub const DEFAULT_RING_BYTES: u32 = 8 << 20;

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn cookie_round_trips() {
        let c = Cookie {
            function_id: (3 << 24) | 0x12345,
            kind: SledKind::Tail as u8,
        };
        assert_eq!(Cookie::decode(c.encode()), c);
        assert_eq!(c.encode() >> 32, 2);
    }

    #[test]
    fn event_layout_has_no_padding() {
        assert_eq!(SledEvent::SIZE, 40);
    }

    #[test]
    fn sled_kind_matches_llvm_values() {
        for v in 0..=5u8 {
            assert_eq!(SledKind::from_u8(v).map(|k| k as u8), Some(v));
        }
        assert_eq!(SledKind::from_u8(6), None);
    }
}
