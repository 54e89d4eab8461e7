//! Placing one BPF program on many offsets of one file with a single `uprobe_multi` link
//! (`BPF_LINK_CREATE` with `BPF_TRACE_UPROBE_MULTI`, Linux 6.6+): one syscall and one file
//! descriptor per link, where the alternative costs one perf event, one descriptor and one
//! kernel probe registration per offset. aya 0.14 has no API for it, so this module issues the
//! two syscalls it needs itself; [`MultiProgram`] loads the program the way such links require.
//!
//! Closing the link (dropping [`MultiLink`]) removes every probe it placed.
use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd, BPF_F_UPROBE_MULTI_RETURN};
use std::ffi::CString;
use std::io;
use std::num::NonZeroU32;
use std::os::fd::{AsRawFd as _, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::sync::OnceLock;

mod program;

use super::sys::{invalid, sys_bpf_fd};
pub use program::MultiProgram;

/// Most offsets the kernel accepts in one link (`MAX_UPROBE_MULTI_CNT` in
/// kernel/trace/bpf_trace.c); [`attach`] splits longer lists over several links.
pub const MAX_OFFSETS_PER_LINK: usize = 1 << 20;

/// Whether this kernel has `uprobe_multi` links. Probed once (a trivial program and a link
/// request that fails differently with and without support), then cached.
pub fn supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(probe_support)
}

fn probe_support() -> bool {
    // r0 = 0; exit
    const RETURN_ZERO: [u64; 2] = [0xb7, 0x95];
    let Ok(program) = MultiProgram::from_instructions("probe_umulti", &RETURN_ZERO, c"GPL") else {
        return false;
    };
    // Like libbpf's probe: "/" is a directory, which a kernel with uprobe_multi rejects with
    // EBADF after parsing the request; older kernels reject the attach type with EINVAL.
    match link_create(program.fd(), c"/", &[0], &[], 0, 0) {
        Ok(_) => true,
        Err(err) => err.raw_os_error() == Some(libc::EBADF),
    }
}

/// The links of one [`attach`] call. Dropping it detaches every probe they placed.
#[derive(Debug)]
pub struct MultiLink {
    links: Vec<OwnedFd>,
    probes: usize,
}

impl MultiLink {
    /// Number of probes placed.
    pub fn probes(&self) -> usize {
        self.probes
    }

    /// Number of file descriptors held (one per [`MAX_OFFSETS_PER_LINK`] probes).
    pub fn fds(&self) -> usize {
        self.links.len()
    }

    /// The file descriptors held: the probes stay while any process holds them open.
    pub fn raw_fds(&self) -> impl Iterator<Item = std::os::fd::RawFd> + '_ {
        use std::os::fd::AsRawFd as _;
        self.links.iter().map(|fd| fd.as_raw_fd())
    }
}

/// Places `prog` (loaded by [`MultiProgram`]) at each of `offsets` (file offsets of
/// instructions in `path`). The program's `bpf_get_attach_cookie()` returns `cookies[i]` at
/// `offsets[i]`; `cookies` is either empty (all zero) or as long as `offsets`. With `pid` the
/// probes fire only in that process (all its threads, also after it calls `exec`); without, in
/// every process that maps the file, now or later. With `retprobe` they are return probes: the
/// program runs when the function whose first instruction is at the offset returns.
///
/// `path` may be a `/proc/PID/exe` link: the kernel follows it to the file the process runs,
/// even when that file has been deleted or replaced on disk.
pub fn attach(
    prog: BorrowedFd<'_>,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    pid: Option<NonZeroU32>,
    retprobe: bool,
) -> io::Result<MultiLink> {
    if offsets.is_empty() {
        return Err(invalid("no offsets to attach to"));
    }
    if !cookies.is_empty() && cookies.len() != offsets.len() {
        return Err(invalid(&format!(
            "{} cookies for {} offsets",
            cookies.len(),
            offsets.len()
        )));
    }
    let pid = match pid {
        Some(pid) => i32::try_from(pid.get()).map_err(|_| invalid("pid out of range"))? as u32,
        None => 0,
    };
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| invalid("the path contains a NUL byte"))?;
    let flags = if retprobe {
        BPF_F_UPROBE_MULTI_RETURN
    } else {
        0
    };
    let mut links = Vec::with_capacity(offsets.len().div_ceil(MAX_OFFSETS_PER_LINK));
    for (i, chunk) in offsets.chunks(MAX_OFFSETS_PER_LINK).enumerate() {
        let cookies = match cookies.is_empty() {
            true => &[][..],
            false => &cookies[i * MAX_OFFSETS_PER_LINK..][..chunk.len()],
        };
        links.push(link_create(prog, &path, chunk, cookies, pid, flags)?);
    }
    Ok(MultiLink {
        links,
        probes: offsets.len(),
    })
}

/// `BPF_LINK_CREATE` of a `uprobe_multi` link; `cookies` is empty or as long as `offsets`.
fn link_create(
    prog: BorrowedFd<'_>,
    path: &std::ffi::CStr,
    offsets: &[u64],
    cookies: &[u64],
    pid: u32,
    flags: u32,
) -> io::Result<OwnedFd> {
    // SAFETY: bpf_attr is a plain C union; all-zero is its documented "unset" value.
    let mut attr = unsafe { std::mem::zeroed::<bpf_attr>() };
    // SAFETY: writing plain integer fields of the union variant BPF_LINK_CREATE reads.
    unsafe {
        let create = &mut attr.link_create;
        create.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
        create.attach_type = bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32;
        let multi = &mut create.__bindgen_anon_3.uprobe_multi;
        multi.path = path.as_ptr() as u64;
        multi.offsets = offsets.as_ptr() as u64;
        multi.cookies = if cookies.is_empty() {
            0
        } else {
            cookies.as_ptr() as u64
        };
        multi.cnt = u32::try_from(offsets.len()).map_err(|_| invalid("too many offsets"))?;
        multi.flags = flags;
        multi.pid = pid;
    }
    // The kernel reads `path`, `offsets` and `cookies` during the call; they outlive it.
    sys_bpf_fd(bpf_cmd::BPF_LINK_CREATE, &mut attr)
}
