//! Where glibc keeps a thread's id in its thread control block: the handler reads the id of
//! the thread it runs on from there (`%fs:0` points at the block), with no system call.
//!
//! glibc says where, for debuggers: `libthread_db` reads the layout of `struct pthread` from
//! symbols glibc exports for it, `_thread_db_pthread_tid` among them (three u32: the field's
//! size in bits, its count, its offset). The process's own libc is read (through
//! `/proc/PID/map_files`, so a container's libc is the one read), as any object it maps:
//! hostile input, parsed with bounds checks by `object`.
use anyhow::{bail, Context as _, Result};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

/// The offset of the thread id in process `pid`'s thread control blocks.
pub fn tid_offset(pid: u32) -> Result<u64> {
    let objects = crate::traced::mappings::mapped_objects(pid)?;
    let libc = objects
        .iter()
        .find(|o| {
            let name = crate::traced::file_name(&o.path);
            name.starts_with("libc.so") || name.starts_with("libc-")
        })
        .with_context(|| {
            format!("process {pid} maps no glibc (libc.so.6): --engine inline needs one (to find each thread's id)")
        })?;
    let bytes = std::fs::read(&libc.open_path).with_context(|| format!("reading {}", libc.path))?;
    tid_offset_in(&bytes).with_context(|| libc.path.clone())
}

/// [`tid_offset`] in the bytes of a libc.
pub fn tid_offset_in(bytes: &[u8]) -> Result<u64> {
    let file = object::File::parse(bytes).context("not an ELF file")?;
    let Some(symbol) = file
        .dynamic_symbols()
        .chain(file.symbols())
        .find(|s| s.name() == Ok("_thread_db_pthread_tid"))
    else {
        bail!("no _thread_db_pthread_tid symbol: not a glibc of 2.34 or later?");
    };
    let section = symbol
        .section_index()
        .and_then(|i| file.section_by_index(i).ok())
        .context("_thread_db_pthread_tid is in no section")?;
    let data = section
        .data()
        .context("reading _thread_db_pthread_tid's section")?;
    let at = symbol
        .address()
        .checked_sub(section.address())
        .and_then(|o| usize::try_from(o).ok())
        .context("_thread_db_pthread_tid outside its section")?;
    let word = |i: usize| {
        data.get(at + 4 * i..at + 4 * i + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    let (Some(bits), Some(offset)) = (word(0), word(2)) else {
        bail!("_thread_db_pthread_tid cut short");
    };
    if bits != 32 || offset == 0 || offset > 1 << 16 {
        bail!("_thread_db_pthread_tid says a {bits}-bit id at {offset}: not a layout this version knows");
    }
    Ok(u64::from(offset))
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_hosts_glibc_says_where_the_thread_id_is() {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        let offset = super::tid_offset(pid).unwrap();
        // The id there is this thread's.
        // SAFETY: reads the word at that offset of this thread's control block, which
        // glibc says holds its id.
        let tid = unsafe {
            let tcb: u64;
            std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tcb);
            *((tcb + offset) as *const i32)
        };
        // SAFETY: gettid has no preconditions.
        assert_eq!(tid, unsafe { libc::gettid() });
    }
}
