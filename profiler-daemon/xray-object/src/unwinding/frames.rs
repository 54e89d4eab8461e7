//! The functions an object's unwinder knows: one per frame description entry (FDE) in
//! `.eh_frame`, with its address range, its language-specific data area (LSDA, the exception
//! table `.gcc_except_table` holds) and the personality routine that interprets it.
//!
//! Parsed with gimli. A broken `.eh_frame` ends the list where it breaks: what is missing is
//! analysed without an exception table, the conservative reading.
use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, Pointer, UnwindSection as _};
use object::{Object as _, ObjectSection as _};

/// Upper bound on the FDEs read from one file (a hostile `.eh_frame` can claim anything;
/// libxul.so, among the largest real objects, has about 400,000).
const MAX_FDES: usize = 4_000_000;

/// One function as the unwinder sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// First address (the FDE's `pc_begin`); call-site offsets in the LSDA are relative to it.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Address of the function's LSDA, when it has one.
    pub lsda: Option<u64>,
    /// The personality routine of the frame's CIE, as an address: `Direct` is the routine,
    /// `Indirect` a pointer-sized slot holding it (`DW.ref.__gxx_personality_v0`).
    pub personality: Option<Pointer>,
}

/// Every FDE of `file`'s `.eh_frame`, sorted by start address. Empty when there is none.
pub fn frames(file: &object::read::elf::ElfFile64<'_, object::LittleEndian>) -> Vec<Frame> {
    let Some(section) = file.section_by_name(".eh_frame") else {
        return Vec::new();
    };
    let Ok(data) = section.data() else {
        return Vec::new();
    };
    let mut bases = BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = file
        .section_by_name(".got.plt")
        .or_else(|| file.section_by_name(".got"))
    {
        bases = bases.set_got(got.address());
    }
    let eh_frame = EhFrame::new(data, LittleEndian);
    let mut out = Vec::new();
    let mut entries = eh_frame.entries(&bases);
    while out.len() < MAX_FDES {
        let Ok(Some(entry)) = entries.next() else {
            break;
        };
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) =
            partial.parse(|section, bases, offset| section.cie_from_offset(bases, offset))
        else {
            continue;
        };
        let start = fde.initial_address();
        let Some(end) = start.checked_add(fde.len()) else {
            continue;
        };
        if end == start {
            continue;
        }
        let lsda = fde.lsda().map(|p| match p {
            Pointer::Direct(a) | Pointer::Indirect(a) => a,
        });
        out.push(Frame {
            start,
            end,
            lsda,
            personality: fde.personality(),
        });
    }
    out.sort_by_key(|f| (f.start, std::cmp::Reverse(f.end)));
    out.dedup_by_key(|f| f.start);
    out
}
