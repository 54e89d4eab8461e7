//! A traced process held still from outside: every thread seized and stopped (ptrace), its
//! memory read and written through `/proc/PID/mem`, and system calls made in one of its
//! threads (`mmap`, `munmap`), as a debugger's inferior calls are.
//!
//! A system call is made by the stopped thread itself: its registers are saved, it is pointed
//! at a `syscall; int3` written over a sled (no thread runs while all are stopped; the bytes
//! are put back at once), run to the breakpoint, and its registers put back. A thread stopped
//! inside an interrupted system call gets it restarted as the kernel would have: its saved
//! registers still say so (`orig_rax`, `-ERESTART*`), and the injected call runs with
//! `orig_rax` = -1 so that the kernel does not restart that one instead.
use crate::arch::Registers;
use crate::repair::ptrace;
use anyhow::{bail, Context as _, Result};
use std::fs::File;
use std::os::unix::fs::FileExt as _;

/// What the inline engine asks of ptrace: threads created while it works are traced (and
/// stopped) from their first instruction; forks and execs are not followed.
const OPTIONS: libc::c_int = libc::PTRACE_O_TRACECLONE;

/// How long a keeper waits for the exec holder to let a held process go: as long as the
/// holder holds one (`repair::hold::HOLD_LIMIT`); on a loaded host 200 ms was seen to pass.
const HANDOVER_WAIT: std::time::Duration = crate::repair::hold::HOLD_LIMIT;

/// How long a process may take from its exec to its entry point (its dynamic loader mapping
/// and relocating its libraries, on a busy host) before it is given up on.
const ENTRY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// `syscall; int3`.
const SYSCALL_SITE: [u8; 3] = [0x0f, 0x05, 0xcc];

/// A process whose threads are all stopped, until [`Stopped::release`] (or drop).
pub struct Stopped {
    pid: u32,
    /// Each stopped thread and the signal to deliver when it goes on.
    threads: Vec<(u32, i32)>,
    mem: File,
    released: bool,
    /// A held process taken only once past its entry point (the holder let it go and it ran
    /// on before the keeper could seize it): its first calls are not recorded.
    past_entry: bool,
}

impl Stopped {
    /// Seizes and stops every thread of `pid`, threads created meanwhile included. Fails
    /// when a thread cannot be traced (another tracer, a debugger, has it: said in one line).
    pub fn stop(pid: u32) -> Result<Stopped> {
        let mem = open_mem(pid)?;
        let mut stopped = Stopped {
            pid,
            threads: Vec::new(),
            mem,
            released: false,
            past_entry: false,
        };
        // Threads being created while the others stop show up in the next listing (traced
        // from their creation by the clone option): until a listing finds none new.
        loop {
            let seized = ptrace::seize_all_with(pid, OPTIONS)?;
            let new: Vec<u32> = seized
                .into_iter()
                .filter(|t| !stopped.threads.iter().any(|(s, _)| s == t))
                .collect();
            if new.is_empty() {
                break;
            }
            stopped.threads.extend(ptrace::stop_all(&new));
        }
        if stopped.threads.is_empty() {
            bail!("process {pid} has no thread left");
        }
        Ok(stopped)
    }

    /// Seizes process `pid`, a command forked and parked before its `exec` (see
    /// `traced::launch`), lets it go by writing a byte to `go` (its parking pipe), and runs it
    /// to its entry point: there every object it links is mapped, its libraries' constructors
    /// have run, and nothing of its own code has. Returns it stopped there (threads its
    /// libraries' constructors started, if any, stopped too). Kills it if it cannot get there
    /// held: a command that would run untraced never starts.
    pub fn launched(pid: u32, go: std::os::fd::RawFd) -> Result<Stopped> {
        ptrace::seize_with(pid, OPTIONS | libc::PTRACE_O_TRACEEXEC)
            .with_context(|| format!("tracing the command (process {pid})"))?;
        let byte = 1u8;
        // SAFETY: writes one byte from a valid buffer to the parking pipe.
        if unsafe { libc::write(go, (&raw const byte).cast(), 1) } != 1 {
            let err = std::io::Error::last_os_error();
            return Err(err).context("letting the command go");
        }
        let held = run_to_entry(pid, None, Vec::new());
        let stopped = held.and_then(|threads| {
            let mem = open_mem(pid)?;
            Ok(Stopped {
                pid,
                threads,
                mem,
                released: false,
                past_entry: false,
            })
        });
        if stopped.is_err() {
            // SAFETY: plain system call; the command is ours and has not run its own code.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        stopped
    }

    /// Takes process `pid` from fdr-profiled's exec holder (`repair::hold`, process `parent`,
    /// its handover pipe `handover`): seizes it as the holder lets it go, still in its dynamic
    /// loader, and runs it to its entry point as [`Stopped::launched`] does (one that got
    /// past it first is stopped where it is: its first calls are not recorded). On failure it
    /// is let go, untouched.
    pub fn held(pid: u32, parent: u32, handover: std::os::fd::RawFd) -> Result<Stopped> {
        let seized = ptrace::seize_all_from(pid, parent, handover, HANDOVER_WAIT)?;
        let mut threads = ptrace::stop_all(&seized);
        let mem = open_mem(pid)?;
        let rip = Registers::of(pid)
            .map(|r| r.pc())
            .context("reading the process's registers")?;
        let past_entry = !in_loader(pid, rip);
        if !past_entry {
            let main = threads
                .iter()
                .position(|(t, _)| *t == pid)
                .context("its main thread is gone")?;
            let (_, signal) = threads.remove(main);
            let breakpoint = Breakpoint::at_entry(pid)?;
            let (entry, original) = (breakpoint.entry, breakpoint.original);
            ptrace::request(libc::PTRACE_CONT, pid, signal);
            threads = run_to_entry(pid, Some(breakpoint), threads).inspect_err(|_| {
                // Nothing of ours left in it.
                let _ = mem.write_all_at(&[original], entry);
            })?;
        }
        Ok(Stopped {
            pid,
            threads,
            mem,
            released: false,
            past_entry,
        })
    }

    /// Whether it was taken only once past its entry point (see [`Stopped::held`]).
    pub fn past_entry(&self) -> bool {
        self.past_entry
    }

    /// The process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The stopped threads.
    pub fn threads(&self) -> impl Iterator<Item = u32> + '_ {
        self.threads.iter().map(|(t, _)| *t)
    }

    /// Reads `buf.len()` bytes at `at`.
    pub fn read(&self, at: u64, buf: &mut [u8]) -> Result<()> {
        self.mem.read_exact_at(buf, at).with_context(|| {
            format!(
                "reading {} bytes at {at:#x} in process {}",
                buf.len(),
                self.pid
            )
        })
    }

    /// Writes `bytes` at `at` (read-only code included: the kernel writes through the
    /// process's own page tables, copying a shared page first).
    pub fn write(&self, at: u64, bytes: &[u8]) -> Result<()> {
        self.mem.write_all_at(bytes, at).with_context(|| {
            format!(
                "writing {} bytes at {at:#x} in process {}",
                bytes.len(),
                self.pid
            )
        })
    }

    /// Makes system call `nr` with `args` in the first stopped thread, using the code at
    /// `site` (11 writable bytes no thread is about to run: a sled) for its instruction;
    /// returns what it returned (negative: `-errno`).
    pub fn syscall(&mut self, site: u64, nr: libc::c_long, args: [u64; 6]) -> Result<i64> {
        let tid = self.threads[0].0;
        let mut original = [0u8; SYSCALL_SITE.len()];
        self.read(site, &mut original)?;
        self.write(site, &SYSCALL_SITE)?;
        let result = self.run_syscall(tid, site, nr, args);
        // Put back whatever happened.
        let restored = self.write(site, &original);
        let result = result?;
        restored?;
        Ok(result)
    }

    fn run_syscall(
        &mut self,
        tid: u32,
        site: u64,
        nr: libc::c_long,
        args: [u64; 6],
    ) -> Result<i64> {
        let Some(saved) = Registers::of(tid) else {
            bail!("reading the registers of thread {tid}");
        };
        let mut regs = saved;
        regs.prepare_syscall(nr as u64, args);
        regs.set_pc(site);
        if !regs.set(tid) {
            bail!("setting the registers of thread {tid}");
        }
        let outcome = self.run_to_breakpoint(tid);
        let after = Registers::of(tid);
        // The thread's own registers back, whatever happened (it is still stopped unless it
        // died).
        let put_back = saved.set(tid);
        outcome?;
        let Some(after) = after else {
            bail!("reading the registers of thread {tid} after its system call");
        };
        if !put_back {
            bail!("putting back the registers of thread {tid}");
        }
        if after.pc() != site + 3 {
            bail!(
                "thread {tid} stopped at {:#x}, not after its system call",
                after.pc()
            );
        }
        Ok(after.syscall_result())
    }

    /// Resumes stopped thread `tid` until its `int3`; signals that come meanwhile are kept
    /// for it (delivered when it goes on).
    fn run_to_breakpoint(&mut self, tid: u32) -> Result<()> {
        for _ in 0..64 {
            ptrace::request(libc::PTRACE_CONT, tid, 0);
            let mut status = 0;
            loop {
                // SAFETY: valid pointer to an int; `tid` is a tracee of this thread.
                let r = unsafe { libc::waitpid(tid as libc::pid_t, &mut status, libc::__WALL) };
                if r >= 0 {
                    break;
                }
                if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                    bail!(
                        "waiting for thread {tid}: {}",
                        std::io::Error::last_os_error()
                    );
                }
            }
            if !libc::WIFSTOPPED(status) {
                bail!("thread {tid} ended during a system call made for it");
            }
            let signal = ptrace::signal_of_stop(status);
            if signal == libc::SIGTRAP {
                return Ok(());
            }
            if signal != 0 {
                if let Some(entry) = self.threads.iter_mut().find(|(t, _)| *t == tid) {
                    entry.1 = signal;
                }
            }
        }
        bail!("thread {tid} did not reach its breakpoint")
    }

    /// `mmap` in the process; the address, or an error with the call's errno.
    pub fn mmap(&mut self, site: u64, addr: u64, len: u64, prot: i32, flags: i32) -> Result<u64> {
        let r = self.syscall(
            site,
            libc::SYS_mmap,
            [addr, len, prot as u64, flags as u64, u64::MAX, 0],
        )?;
        if (-4095..0).contains(&r) {
            return Err(std::io::Error::from_raw_os_error(-r as i32))
                .with_context(|| format!("mmap of {len} bytes in process {}", self.pid));
        }
        Ok(r as u64)
    }

    /// `munmap` in the process.
    pub fn munmap(&mut self, site: u64, addr: u64, len: u64) -> Result<()> {
        let r = self.syscall(site, libc::SYS_munmap, [addr, len, 0, 0, 0, 0])?;
        if r < 0 {
            return Err(std::io::Error::from_raw_os_error(-r as i32))
                .with_context(|| format!("munmap in process {}", self.pid));
        }
        Ok(())
    }

    /// Where each stopped thread is: its id, instruction and stack pointers.
    pub fn positions(&self) -> Vec<(u32, u64, u64)> {
        self.threads
            .iter()
            .filter_map(|&(tid, _)| Registers::of(tid).map(|r| (tid, r.pc(), r.sp())))
            .collect()
    }

    /// Runs stopped thread `tid` one instruction.
    pub fn step(&mut self, tid: u32) -> Result<()> {
        ptrace::request(libc::PTRACE_SINGLESTEP, tid, 0);
        let mut status = 0;
        // SAFETY: valid pointer to an int; `tid` is a tracee of this thread.
        let r = unsafe { libc::waitpid(tid as libc::pid_t, &mut status, libc::__WALL) };
        if r < 0 || !libc::WIFSTOPPED(status) {
            bail!("thread {tid} ended while stepped");
        }
        let signal = ptrace::signal_of_stop(status);
        if signal != 0 && signal != libc::SIGTRAP {
            if let Some(entry) = self.threads.iter_mut().find(|(t, _)| *t == tid) {
                entry.1 = signal;
            }
        }
        Ok(())
    }

    /// Lets every thread go on (each with the signal it had), no longer traced.
    pub fn release(mut self) {
        self.detach();
    }

    fn detach(&mut self) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        for &(tid, signal) in &self.threads {
            ptrace::request(libc::PTRACE_DETACH, tid, signal);
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.detach();
    }
}

/// Runs the seized command `pid` from its parking place through its `exec` to the first
/// instruction of the program's entry point (`AT_ENTRY`), where it is stopped by a breakpoint
/// put there for the while; every thread stopped, each with the signal to deliver when it
/// goes on.
fn run_to_entry(
    pid: u32,
    mut breakpoint: Option<Breakpoint>,
    mut threads: Vec<(u32, i32)>,
) -> Result<Vec<(u32, i32)>> {
    let deadline = std::time::Instant::now() + ENTRY_WAIT;
    for _ in 0..10_000 {
        let mut status = 0;
        // SAFETY: valid pointer to an int; the command and its threads are our tracees.
        let tid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL | libc::WNOHANG) };
        if tid == 0 {
            if std::time::Instant::now() > deadline {
                bail!("it did not reach its entry point within {ENTRY_WAIT:?}");
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
            continue;
        }
        if tid < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            bail!(
                "waiting for the command: {}",
                std::io::Error::last_os_error()
            );
        }
        let tid = tid as u32;
        if !libc::WIFSTOPPED(status) {
            if tid == pid {
                bail!(
                    "the command ended before its entry point ({})",
                    match libc::WIFEXITED(status) {
                        true => format!("exit status {}", libc::WEXITSTATUS(status)),
                        false => format!("signal {}", libc::WTERMSIG(status)),
                    }
                );
            }
            threads.retain(|(t, _)| *t != tid);
            continue;
        }
        if tid != pid {
            // A thread a library's constructor started: held where it is until the end.
            if !threads.iter().any(|(t, _)| *t == tid) {
                threads.push((tid, ptrace::signal_of_stop(status)));
            }
            continue;
        }
        let event = status >> 16;
        let signal = libc::WSTOPSIG(status);
        if event == libc::PTRACE_EVENT_EXEC {
            breakpoint = Some(Breakpoint::at_entry(pid)?);
        } else if let (libc::SIGTRAP, 0, Some(bp)) = (signal, event, &breakpoint) {
            let regs = Registers::of(pid).context("reading the command's registers")?;
            if regs.pc() == bp.entry + 1 {
                bp.take_away()?;
                let mut at_entry = regs;
                at_entry.set_pc(bp.entry);
                if !at_entry.set(pid) {
                    bail!("setting the command's registers");
                }
                threads.insert(0, (pid, 0));
                return Ok(threads);
            }
            // A SIGTRAP of the program's own.
            ptrace::request(libc::PTRACE_CONT, pid, signal);
            continue;
        }
        ptrace::request(libc::PTRACE_CONT, pid, ptrace::signal_of_stop(status));
    }
    bail!("the command did not reach its entry point")
}

/// An `int3` over the first byte of a process's entry point, until taken away.
struct Breakpoint {
    entry: u64,
    original: u8,
    mem: File,
}

impl Breakpoint {
    /// Puts one at process `pid`'s entry point (its program mapped: after its exec).
    fn at_entry(pid: u32) -> Result<Breakpoint> {
        let entry = entry_point(pid)?;
        let mem = open_mem(pid)?;
        let mut original = [0u8];
        mem.read_exact_at(&mut original, entry)
            .with_context(|| format!("reading the entry point {entry:#x}"))?;
        if original[0] == 0xcc {
            // A uprobe's or a debugger's: it would take the trap, and this one never come.
            bail!("its entry point holds a breakpoint already (a uprobe, or another tracer's)");
        }
        mem.write_all_at(&[0xcc], entry)
            .with_context(|| format!("putting a breakpoint at the entry point {entry:#x}"))?;
        Ok(Breakpoint {
            entry,
            original: original[0],
            mem,
        })
    }

    /// Writes the original byte back.
    fn take_away(&self) -> Result<()> {
        self.mem
            .write_all_at(&[self.original], self.entry)
            .context("taking the breakpoint away")
    }
}

/// Process `pid`'s memory, to read and write.
fn open_mem(pid: u32) -> Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .with_context(|| format!("opening the memory of process {pid}"))
}

/// Whether `at` is in process `pid`'s dynamic loader (`ld-linux*.so*`, `ld-*.so*`).
fn in_loader(pid: u32, at: u64) -> bool {
    crate::traced::mappings::mappings(pid)
        .unwrap_or_default()
        .iter()
        .any(|m| {
            (m.start..m.end).contains(&at) && crate::traced::file_name(&m.path).starts_with("ld-")
        })
}

/// Process `pid`'s entry point, from its auxiliary vector.
fn entry_point(pid: u32) -> Result<u64> {
    let auxv = std::fs::read(format!("/proc/{pid}/auxv"))
        .with_context(|| format!("reading /proc/{pid}/auxv"))?;
    auxv.chunks_exact(16)
        .map(|pair| {
            let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().expect("8 bytes"));
            (word(&pair[..8]), word(&pair[8..]))
        })
        .find(|&(key, _)| key == libc::AT_ENTRY)
        .map(|(_, entry)| entry)
        .context("the command's auxiliary vector has no entry point")
}

/// The mapped ranges of process `pid`, in order.
pub fn mapped_ranges(pid: u32) -> Result<Vec<(u64, u64)>> {
    let mut ranges: Vec<(u64, u64)> = crate::traced::mappings::mappings(pid)?
        .iter()
        .map(|m| (m.start, m.end))
        .collect();
    ranges.sort_unstable();
    Ok(ranges)
}

/// A free, page-aligned place for `len` bytes whose every byte a `rel32` from each address in
/// `lo..=hi` reaches (see [`super::patch::REACH`]), the nearest to `lo`; `None` if there is
/// none among `mapped` (sorted ranges). Leaves a page free on each side.
pub fn place_near(mapped: &[(u64, u64)], lo: u64, hi: u64, len: u64, page: u64) -> Option<u64> {
    let reach = super::patch::REACH;
    let len = len.div_ceil(page) * page;
    let low_limit = hi.saturating_sub(reach).max(1 << 16);
    let high_limit = lo.saturating_add(reach);
    let mut best: Option<u64> = None;
    let mut gap_start = 1u64 << 16;
    let mut consider = |from: u64, to: u64| {
        // Inside [from + page, to - page), within the limits, as near `lo` as it can be.
        let from = from.saturating_add(page).max(low_limit);
        let to = to.saturating_sub(page).min(high_limit);
        if to <= from || to - from < len {
            return;
        }
        let candidate = if to <= lo {
            (to - len) / page * page
        } else {
            from.div_ceil(page) * page
        };
        if candidate < from || candidate + len > to {
            return;
        }
        let distance = |a: u64| a.abs_diff(lo);
        if best.is_none_or(|b| distance(candidate) < distance(b)) {
            best = Some(candidate);
        }
    };
    for &(start, end) in mapped {
        if start > gap_start {
            consider(gap_start, start);
        }
        gap_start = gap_start.max(end);
    }
    // Below the top of the user address space (47 bits).
    consider(gap_start, 1 << 47);
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_placed_in_the_nearest_gap_within_reach() {
        let page = 4096;
        let mapped = [
            (0x5555_0000_0000, 0x5555_0010_0000),
            (0x5555_0010_0000, 0x5555_0020_0000),
            (0x7fff_0000_0000, 0x7fff_1000_0000),
        ];
        // Just below the object, a page apart.
        let at = place_near(&mapped, 0x5555_0000_1000, 0x5555_0000_9000, 100, page).unwrap();
        assert_eq!(at, 0x5555_0000_0000 - 2 * page);
        // A lower gap too small: the one above is taken.
        let tight = [
            (0x10000, 0x5555_0000_0000 - page),
            (0x5555_0000_0000, 0x5555_0020_0000),
        ];
        let at = place_near(&tight, 0x5555_0000_1000, 0x5555_0000_9000, 100, page).unwrap();
        assert_eq!(at, 0x5555_0020_0000 + page);
        // Nothing within reach.
        let full = [(0x10000, 1 << 47)];
        assert_eq!(
            place_near(&full, 0x5555_0000_1000, 0x5555_0000_9000, 100, page),
            None
        );
    }
}
