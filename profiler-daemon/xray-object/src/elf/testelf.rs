//! Builders of small, valid ELF files for the unit tests of this crate.
use object::elf;

/// A section to put in a synthetic ELF file.
pub struct Section {
    pub name: &'static str,
    pub sh_type: u32,
    pub flags: u64,
    pub addr: u64,
    pub data: Vec<u8>,
    pub link: u32,
    pub entsize: u64,
}

/// A `PT_LOAD` segment covering `[vaddr, vaddr + size)` at file offset `offset`.
pub struct Segment {
    pub vaddr: u64,
    pub offset: u64,
    pub size: u64,
    pub flags: u32,
}

fn push_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn push_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn push_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Lays out: ELF header, program headers, section data (in order, 16-aligned), zero
/// padding up to the end of the last segment, section name table, section headers. Section data is placed at file offset == its `addr` when
/// `addr` is non-zero and large enough, so that an identity-mapped segment covers it.
pub fn build(e_type: u16, machine: u16, segments: &[Segment], sections: &[Section]) -> Vec<u8> {
    let phoff = 64u64;
    let mut body_start = phoff + 56 * segments.len() as u64;
    body_start = body_start.next_multiple_of(16);
    let mut out = vec![0u8; body_start as usize];
    let mut offsets = Vec::new();
    for s in sections {
        let mut off = (out.len() as u64).next_multiple_of(16);
        if s.addr >= off && s.addr < (1 << 24) {
            off = s.addr;
        }
        out.resize(off as usize, 0);
        offsets.push(off);
        out.extend_from_slice(&s.data);
    }
    // Every segment's file range must lie inside the file.
    let seg_end = segments
        .iter()
        .map(|s| s.offset + s.size)
        .max()
        .unwrap_or(0);
    if (out.len() as u64) < seg_end {
        out.resize(seg_end as usize, 0);
    }
    // Section name string table.
    let mut shstr = vec![0u8];
    let mut name_offs = Vec::new();
    for s in sections {
        name_offs.push(shstr.len() as u32);
        shstr.extend_from_slice(s.name.as_bytes());
        shstr.push(0);
    }
    let shstr_name = shstr.len() as u32;
    shstr.extend_from_slice(b".shstrtab\0");
    let shstr_off = out.len() as u64;
    out.extend_from_slice(&shstr);
    let shoff = (out.len() as u64).next_multiple_of(8);
    out.resize(shoff as usize, 0);
    // Null section header.
    out.extend_from_slice(&[0u8; 64]);
    for (i, s) in sections.iter().enumerate() {
        push_u32(&mut out, name_offs[i]);
        push_u32(&mut out, s.sh_type);
        push_u64(&mut out, s.flags);
        push_u64(&mut out, s.addr);
        push_u64(&mut out, offsets[i]);
        push_u64(&mut out, s.data.len() as u64);
        push_u32(&mut out, s.link);
        push_u32(&mut out, 0);
        push_u64(&mut out, 1);
        push_u64(&mut out, s.entsize);
    }
    push_u32(&mut out, shstr_name);
    push_u32(&mut out, elf::SHT_STRTAB);
    push_u64(&mut out, 0);
    push_u64(&mut out, 0);
    push_u64(&mut out, shstr_off);
    push_u64(&mut out, shstr.len() as u64);
    push_u32(&mut out, 0);
    push_u32(&mut out, 0);
    push_u64(&mut out, 1);
    push_u64(&mut out, 0);
    let shnum = sections.len() as u16 + 2;

    // ELF header.
    let mut h = Vec::new();
    h.extend_from_slice(&elf::ELFMAG);
    h.extend_from_slice(&[elf::ELFCLASS64, elf::ELFDATA2LSB, elf::EV_CURRENT, 0]);
    h.extend_from_slice(&[0u8; 8]);
    push_u16(&mut h, e_type);
    push_u16(&mut h, machine);
    push_u32(&mut h, 1);
    push_u64(&mut h, 0); // e_entry
    push_u64(&mut h, if segments.is_empty() { 0 } else { phoff });
    push_u64(&mut h, shoff);
    push_u32(&mut h, 0);
    push_u16(&mut h, 64);
    push_u16(&mut h, 56);
    push_u16(&mut h, segments.len() as u16);
    push_u16(&mut h, 64);
    push_u16(&mut h, shnum);
    push_u16(&mut h, shnum - 1);
    for seg in segments {
        push_u32(&mut h, elf::PT_LOAD);
        push_u32(&mut h, seg.flags);
        push_u64(&mut h, seg.offset);
        push_u64(&mut h, seg.vaddr);
        push_u64(&mut h, seg.vaddr);
        push_u64(&mut h, seg.size);
        push_u64(&mut h, seg.size);
        push_u64(&mut h, 0x1000);
    }
    out[..h.len()].copy_from_slice(&h);
    out
}

/// A GNU build-id note section with the given id bytes.
pub fn build_id_note(id: &[u8]) -> Section {
    let mut data = Vec::new();
    data.extend_from_slice(&4u32.to_le_bytes());
    data.extend_from_slice(&(id.len() as u32).to_le_bytes());
    data.extend_from_slice(&elf::NT_GNU_BUILD_ID.to_le_bytes());
    data.extend_from_slice(b"GNU\0");
    data.extend_from_slice(id);
    while data.len() % 4 != 0 {
        data.push(0);
    }
    Section {
        name: ".note.gnu.build-id",
        sh_type: elf::SHT_NOTE,
        flags: u64::from(elf::SHF_ALLOC),
        addr: 0,
        data,
        link: 0,
        entsize: 0,
    }
}
