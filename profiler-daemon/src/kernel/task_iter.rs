//! Task iterators: `BPF_LINK_CREATE` (`BPF_TRACE_ITER`, with `bpf_iter_link_info.task.pid`
//! for the threads of one process, Linux 6.1+), then `BPF_ITER_CREATE`. aya 0.14 attaches a
//! task iterator only over every task of the system, and keeps the link: `--exits repair` runs
//! one per traced process (the keepers of several processes may run theirs at the same time),
//! and the daemon's books run one over every task each time it reads them.
use super::sys::sys_bpf_fd;
use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd};
use std::io;
use std::num::NonZeroU32;
use std::os::fd::{AsRawFd as _, BorrowedFd};

/// `union bpf_iter_link_info`'s task member (`include/uapi/linux/bpf.h`): a tid, a pid or a
/// pidfd; the union is 16 bytes (its cgroup member).
#[repr(C)]
#[derive(Default)]
struct TaskIterInfo {
    tid: u32,
    pid: u32,
    pid_fd: u32,
    _union_tail: u32,
}

/// Attaches the loaded task iterator `program` to the threads of process `pid` and returns
/// the file whose read runs it once over them (every thread of the process, none other).
pub fn for_process(program: BorrowedFd<'_>, pid: NonZeroU32) -> io::Result<std::fs::File> {
    iterator(
        program,
        TaskIterInfo {
            pid: pid.get(),
            ..TaskIterInfo::default()
        },
    )
}

/// Attaches the loaded task iterator `program` to every task of the system and returns the
/// file whose read runs it once over them.
pub fn for_every_task(program: BorrowedFd<'_>) -> io::Result<std::fs::File> {
    iterator(program, TaskIterInfo::default())
}

fn iterator(program: BorrowedFd<'_>, mut info: TaskIterInfo) -> io::Result<std::fs::File> {
    // SAFETY: bpf_attr is a plain C union; all-zero is its documented "unset" value.
    let mut attr = unsafe { std::mem::zeroed::<bpf_attr>() };
    // SAFETY: writing the link_create member of a zeroed union; `info` outlives the call.
    unsafe {
        let create = &mut attr.link_create;
        create.__bindgen_anon_1.prog_fd = program.as_raw_fd() as u32;
        create.attach_type = bpf_attach_type::BPF_TRACE_ITER as u32;
        create.__bindgen_anon_3.__bindgen_anon_1.iter_info = (&raw mut info) as u64;
        create.__bindgen_anon_3.__bindgen_anon_1.iter_info_len =
            std::mem::size_of::<TaskIterInfo>() as u32;
    }
    let link = sys_bpf_fd(bpf_cmd::BPF_LINK_CREATE, &mut attr)?;
    // SAFETY: as above.
    let mut attr = unsafe { std::mem::zeroed::<bpf_attr>() };
    attr.iter_create.link_fd = link.as_raw_fd() as u32;
    // The iterator's file keeps the link alive; ours can go.
    let iter = sys_bpf_fd(bpf_cmd::BPF_ITER_CREATE, &mut attr)?;
    Ok(std::fs::File::from(iter))
}
