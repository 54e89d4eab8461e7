//! The raw `bpf(2)` calls the kernel stage makes itself (`uprobe_multi` links and program
//! loads, per-process task iterators), where aya has no API for them.
use aya_obj::generated::{bpf_attr, bpf_cmd};
use std::io;
use std::os::fd::{BorrowedFd, FromRawFd as _, OwnedFd};

/// The `bpf(2)` system call for commands that return a new file descriptor.
pub(crate) fn sys_bpf_fd(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: `attr` is a valid bpf_attr of the size passed; pointers in it are valid for
        // the duration of the call (the callers' borrows).
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd as libc::c_long,
                attr as *mut bpf_attr,
                std::mem::size_of::<bpf_attr>(),
            )
        };
        if ret >= 0 {
            let fd = i32::try_from(ret).map_err(|_| io::Error::other("bpf returned a bad fd"))?;
            // SAFETY: these commands return a new descriptor that nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// An error for arguments the kernel could not be given.
pub(crate) fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message.to_owned())
}

/// `BPF_OBJ_GET_INFO_BY_FD`: the kernel's `T` (`bpf_prog_info`, `bpf_map_info`) of the object
/// behind `fd`.
fn object_info<T>(fd: BorrowedFd<'_>) -> io::Result<T> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: T is one of the kernel's plain C info structs; all-zero is their "unset" value.
    let mut info = unsafe { std::mem::zeroed::<T>() };
    // SAFETY: as above.
    let mut attr = unsafe { std::mem::zeroed::<bpf_attr>() };
    attr.info.bpf_fd = fd.as_raw_fd() as u32;
    attr.info.info_len = std::mem::size_of::<T>() as u32;
    attr.info.info = (&raw mut info) as u64;
    // SAFETY: `attr` is a valid bpf_attr of the size passed; `info` outlives the call and the
    // kernel writes at most `info_len` bytes into it.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_long,
            &raw mut attr,
            std::mem::size_of::<bpf_attr>(),
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info)
}

/// What the kernel counted for a program while run-time statistics were on
/// (`BPF_ENABLE_STATS`): its runs and the nanoseconds they took in all.
pub(crate) fn program_run_stats(program: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let info: aya_obj::generated::bpf_prog_info = object_info(program)?;
    Ok((info.run_cnt, info.run_time_ns))
}

/// A map's `max_entries` (a ring buffer's data size).
pub(crate) fn map_max_entries(map: BorrowedFd<'_>) -> io::Result<u32> {
    let info: aya_obj::generated::bpf_map_info = object_info(map)?;
    Ok(info.max_entries)
}
