//! The raw `bpf(2)` calls the kernel stage makes itself (`uprobe_multi` links and program
//! loads, per-process task iterators), where aya has no API for them.
use aya_obj::generated::{bpf_attr, bpf_cmd};
use std::io;
use std::os::fd::{FromRawFd as _, OwnedFd};

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
