//! Loading a program for `uprobe_multi` links. The kernel only accepts programs loaded with
//! `expected_attach_type = BPF_TRACE_UPROBE_MULTI` there (and refuses those on perf events),
//! while aya 0.14 loads uprobe programs without an attach type. So the program is loaded a
//! second time from the same object, with aya-obj (the parser aya itself uses), its map
//! references pointing at the maps aya already created: both loads share every map.
//!
//! Limits of this second load, which handles only what this crate's programs need: map
//! references (including the `.rodata`/`.bss` globals aya created), BPF-to-BPF calls and CO-RE
//! relocations are applied; no BTF function or line information is passed to the kernel (a
//! verifier log shows no source lines; the load through aya, which the fallback uses, does),
//! and no kfunc or extension program is supported. Once aya can load uprobe programs with the
//! `uprobe_multi` attach type itself, this module is to be dropped.
use crate::kernel::sys::{invalid, sys_bpf_fd};
use anyhow::{anyhow, bail, Context as _, Result};
use aya::maps::{Map, MapData};
use aya::Ebpf;
use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd, bpf_insn, bpf_prog_type};
use aya_obj::ProgramSection;
use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd, RawFd};

/// Bytes of verifier log kept when a load fails (the kernel keeps the log's tail).
const LOG_BYTES: usize = 1 << 20;
/// `BPF_F_SLEEPABLE` (include/uapi/linux/bpf.h), for `uprobe.s` programs.
const BPF_F_SLEEPABLE: u32 = 1 << 4;

/// A program loaded with the attach type `uprobe_multi` links require. Dropping it unloads it
/// once no link uses it any more.
#[derive(Debug)]
pub struct MultiProgram {
    fd: OwnedFd,
    is_return: bool,
}

impl MultiProgram {
    /// Loads program `name` of the eBPF `object` that `ebpf` was loaded from, sharing `ebpf`'s
    /// maps. Call it before taking any map the program uses out of `ebpf`.
    pub fn load(ebpf: &Ebpf, object: &[u8], name: &str) -> Result<MultiProgram> {
        let mut obj =
            aya_obj::Object::parse(object).map_err(|e| anyhow!("parsing the eBPF object: {e}"))?;
        if obj.has_btf_relocations() {
            let btf = aya::Btf::from_sys_fs().context("reading the kernel BTF")?;
            obj.relocate_btf(&btf)
                .map_err(|e| anyhow!("BTF relocations of the eBPF object: {e}"))?;
        }
        let fds: HashMap<&str, RawFd> = ebpf
            .maps()
            .map(|(name, map)| (name, map_data(map).fd().as_fd().as_raw_fd()))
            .collect();
        // Maps aya did not create (none unless the kernel lacks global data) stay unresolved:
        // relocate_maps then fails if the program uses them.
        let maps: Vec<(String, RawFd, aya_obj::Map)> = obj
            .maps
            .drain()
            .filter_map(|(name, map)| Some((fds.get(name.as_str()).copied()?, name, map)))
            .map(|(fd, name, map)| (name, fd, map))
            .collect();
        // Same steps, same order as aya's EbpfLoader::load.
        let text_sections: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
        obj.relocate_maps(
            maps.iter().map(|(name, fd, map)| (name.as_str(), *fd, map)),
            &text_sections,
        )
        .map_err(|e| anyhow!("relocating map references of the eBPF object: {e}"))?;
        obj.relocate_calls(&text_sections)
            .map_err(|e| anyhow!("linking calls of the eBPF object: {e}"))?;
        obj.sanitize_functions(aya::features());

        let program = obj
            .programs
            .get(name)
            .with_context(|| format!("the eBPF object has no program {name}"))?;
        let (sleepable, is_return) = match program.section {
            ProgramSection::UProbe { sleepable } => (sleepable, false),
            ProgramSection::URetProbe { sleepable } => (sleepable, true),
            _ => bail!("eBPF program {name} is not a uprobe program"),
        };
        let flags = if sleepable { BPF_F_SLEEPABLE } else { 0 };
        let function = obj
            .functions
            .get(&program.function_key())
            .with_context(|| format!("the eBPF object has no code for program {name}"))?;
        let insns: Vec<u64> = function.instructions.iter().map(insn_bits).collect();
        let fd = prog_load(
            name,
            &insns,
            &program.license,
            program.kernel_version,
            flags,
        )
        .map_err(|e| anyhow!("the kernel refused {name} as a uprobe_multi program: {e}"))?;
        Ok(MultiProgram { fd, is_return })
    }

    /// Loads raw instructions (8 bytes each, in the kernel's `struct bpf_insn` layout, as a
    /// little-endian u64) as a uprobe_multi program named `name`. Map references must already
    /// hold map fds (`BPF_PSEUDO_MAP_FD`).
    pub fn from_instructions(name: &str, insns: &[u64], license: &CStr) -> io::Result<Self> {
        let fd = prog_load(name, insns, license, None, 0)?;
        Ok(MultiProgram {
            fd,
            is_return: false,
        })
    }

    /// Whether the object declares it a return probe (`uretprobe` section): attach it with
    /// `retprobe` set.
    pub fn is_return(&self) -> bool {
        self.is_return
    }

    /// The program's file descriptor, for [`super::attach`].
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The descriptor of any map aya created (every variant holds one `MapData`).
fn map_data(map: &Map) -> &MapData {
    match map {
        Map::Array(m)
        | Map::ArrayOfMaps(m)
        | Map::BloomFilter(m)
        | Map::CgroupArray(m)
        | Map::CgroupStorage(m)
        | Map::CgrpStorage(m)
        | Map::CpuMap(m)
        | Map::DevMap(m)
        | Map::DevMapHash(m)
        | Map::HashMap(m)
        | Map::HashOfMaps(m)
        | Map::InodeStorage(m)
        | Map::LpmTrie(m)
        | Map::LruHashMap(m)
        | Map::PerCpuArray(m)
        | Map::PerCpuCgroupStorage(m)
        | Map::PerCpuHashMap(m)
        | Map::PerCpuLruHashMap(m)
        | Map::PerfEventArray(m)
        | Map::ProgramArray(m)
        | Map::Queue(m)
        | Map::ReusePortSockArray(m)
        | Map::RingBuf(m)
        | Map::SockHash(m)
        | Map::SockMap(m)
        | Map::SkStorage(m)
        | Map::Stack(m)
        | Map::StackTraceMap(m)
        | Map::Unsupported(m)
        | Map::XskMap(m) => m,
    }
}

/// An instruction's 8 bytes as the u64 with the same memory layout.
fn insn_bits(insn: &bpf_insn) -> u64 {
    const _: () = assert!(size_of::<bpf_insn>() == size_of::<u64>());
    // SAFETY: bpf_insn is a repr(C) struct of 8 bytes of plain integers, no padding.
    unsafe { std::mem::transmute::<bpf_insn, u64>(*insn) }
}

/// `BPF_PROG_LOAD` of a kprobe-type program with `expected_attach_type = UPROBE_MULTI`. Loaded
/// without BTF: func/line info only improve verifier messages, and the maps (which carry the
/// object's BTF) already exist. On failure, loads again with the verifier log for the message.
fn prog_load(
    name: &str,
    insns: &[u64],
    license: &CStr,
    kernel_version: Option<u32>,
    flags: u32,
) -> io::Result<OwnedFd> {
    if insns.is_empty() {
        return Err(invalid("no instructions"));
    }
    // Only kernels before 5.0 check it, against their own version.
    let kernel_version = kernel_version.unwrap_or_else(|| {
        aya::util::KernelVersion::current().map_or(0, aya::util::KernelVersion::code)
    });
    let attempt = |log: &mut [u8]| {
        // SAFETY: bpf_attr is a plain C union; all-zero is its documented "unset" value.
        let mut attr = unsafe { std::mem::zeroed::<bpf_attr>() };
        // SAFETY: writing plain integer fields of the union variant BPF_PROG_LOAD reads.
        let load = unsafe { &mut attr.__bindgen_anon_3 };
        load.prog_type = bpf_prog_type::BPF_PROG_TYPE_KPROBE as u32;
        load.expected_attach_type = bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32;
        load.insns = insns.as_ptr() as u64;
        load.insn_cnt = u32::try_from(insns.len()).map_err(|_| invalid("program too long"))?;
        load.license = license.as_ptr() as u64;
        load.kern_version = kernel_version;
        load.prog_flags = flags;
        // The kernel keeps 15 bytes and a NUL; longer names are cut, as libbpf does.
        for (dst, src) in load.prog_name.iter_mut().zip(name.bytes().take(15)) {
            *dst = src as libc::c_char;
        }
        if !log.is_empty() {
            load.log_level = 1;
            load.log_buf = log.as_mut_ptr() as u64;
            load.log_size = log.len() as u32;
        }
        sys_bpf_fd(bpf_cmd::BPF_PROG_LOAD, &mut attr)
    };
    match attempt(&mut []) {
        Ok(fd) => Ok(fd),
        Err(first) => {
            let mut log = vec![0u8; LOG_BYTES];
            if let Ok(fd) = attempt(&mut log) {
                return Ok(fd);
            }
            let text =
                String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)])
                    .into_owned();
            // The verifier's verdict is in its last lines.
            let tail: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            let tail = tail[tail.len().saturating_sub(3)..].join(" / ");
            Err(match tail.is_empty() {
                true => first,
                false => io::Error::new(first.kind(), format!("{first}; verifier: {tail}")),
            })
        }
    }
}
