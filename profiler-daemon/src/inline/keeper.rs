//! The inline engine's keeper: a process of its own, forked from fdr-profiled before any of
//! its threads exists, that patches the traced process and puts it back as it was.
//!
//! It stops every thread of the process (ptrace), maps the shared memory and, near each
//! object, a page for the handler (system calls made by a stopped thread, `super::remote`),
//! copies the handler there, patches the sleds, and lets the threads go: the process then runs
//! untraced by ptrace, each hit a call into the handler. It waits for fdr-profiled's word (its
//! end: the pipe closed, whatever way fdr-profiled ended, SIGKILL included), stops every thread
//! again, writes each sled's original bytes back and checks them, moves any thread that is
//! inside the handler out of it, unmaps the handler's pages (kept when a thread's stack still
//! points into them: a signal handler that interrupted the handler returns there), puts
//! private anonymous memory where the shared memory was (a hit interrupted by that signal
//! handler writes there, harmlessly), and lets the threads go.
//!
//! So fdr-profiled may die at any moment: while the keeper patches, it finishes and then finds
//! the pipe closed; afterwards, it restores at once. Only the keeper's own death (SIGKILL)
//! leaves the sleds patched; the handler then goes on writing into memory nobody reads,
//! counting what it cannot write, which costs the process a few nanoseconds a call.
use super::buffers::Layout;
use super::handler::handler;
use super::patch::{
    is_unpatched, object_sleds, patched, ObjectSleds, Sled, Trampoline, SLED_BYTES,
};
use super::remote::{mapped_ranges, place_near, Stopped};
use crate::plan::AttachPlan;
use crate::repair::keeper::{become_keeper, pipe};
use anyhow::{bail, Context as _, Result};
use std::fs::File;
use std::io::{BufRead as _, Write as _};
use std::os::fd::{AsRawFd as _, RawFd};

/// What the keeper did at the start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patched {
    /// Where the shared memory is mapped in the process.
    pub shared_at: u64,
    /// Sleds patched.
    pub sleds: usize,
    /// Sleds left as they were: not as the compiler leaves them (patched by the program's own
    /// XRay runtime?), or with no free place for the handler within reach.
    pub skipped: usize,
    /// A held process taken only once past its entry point: its first calls are not recorded.
    pub past_entry: bool,
}

/// What the keeper did at the end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored {
    /// Sleds whose original bytes were written back, and read back equal.
    pub sleds: usize,
    /// Sleds found neither patched by us nor original (something else wrote there): left.
    pub changed: usize,
    /// Whether the handler's pages were unmapped (else a thread's stack pointed into them).
    pub unmapped: bool,
    /// The process was gone: nothing to restore.
    pub gone: bool,
    /// Processes it forked while traced (running the patched code), and how many of them
    /// were put back.
    pub forked: usize,
    pub forked_restored: usize,
    /// Sleds of objects the process unmapped since they were patched: nothing to put back.
    pub unmapped_sleds: usize,
}

/// The keeper process.
pub struct InlineKeeper {
    pid: libc::pid_t,
    /// Closed to say the session ends.
    commands: Option<File>,
    reports: std::io::BufReader<File>,
}

/// The process the keeper patches.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    /// A running process (`--pid`): every thread stopped where it is.
    Running(u32),
    /// A command fdr-profiled launched, still parked before its `exec` on a pipe whose
    /// writing end is this descriptor: let go by the keeper, and patched at its entry point.
    Launched(u32, RawFd),
    /// A process that exec'd the traced executable, held in its dynamic loader by
    /// fdr-profiled's exec holder (`repair::hold`), whose handover pipe is this descriptor:
    /// taken from it, and patched at its entry point.
    Held(u32, RawFd),
}

impl Target {
    /// The process's pid.
    pub fn pid(self) -> u32 {
        match self {
            Target::Running(pid) | Target::Launched(pid, _) | Target::Held(pid, _) => pid,
        }
    }
}

impl InlineKeeper {
    /// Forks the keeper of `target`, which patches the sleds of `plans` (each found where the
    /// process maps its object) to call the handler, with shared memory laid out as `layout`;
    /// returns once it has (or why it could not). For a [`Target::Held`] process, `let_go` is
    /// called once the keeper has reported: it must make the holder let it go (if the
    /// keeper's handover did not). The
    /// child of a fork runs only the forking thread: call it where no other thread of
    /// fdr-profiled holds a lock the keeper takes (none does: the keeper prints nothing, and
    /// glibc's `fork` makes `malloc` safe in the child).
    pub fn start(
        target: Target,
        plans: &[AttachPlan],
        layout: Layout,
        let_go: impl FnOnce(),
    ) -> Result<(InlineKeeper, Patched)> {
        let (report_read, report_write) = pipe()?;
        let (command_read, command_write) = pipe()?;
        let mut keep = vec![report_write.as_raw_fd(), command_read.as_raw_fd()];
        if let Target::Launched(_, fd) | Target::Held(_, fd) = target {
            keep.push(fd);
        }
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() } as u32;
        // SAFETY: see above: the child runs only code that takes no lock another thread may
        // hold.
        match unsafe { libc::fork() } {
            -1 => Err(std::io::Error::last_os_error()).context("--engine inline: fork"),
            0 => {
                drop((report_read, command_write));
                let code = keeper_main(
                    target,
                    parent,
                    plans,
                    layout,
                    report_write,
                    command_read,
                    &keep,
                );
                // SAFETY: the keeper ends here, without running the parent's destructors.
                unsafe { libc::_exit(code) }
            }
            pid => {
                drop((report_write, command_read));
                let mut keeper = InlineKeeper {
                    pid,
                    commands: Some(command_write),
                    reports: std::io::BufReader::new(report_read),
                };
                let mut line = keeper.report();
                if line == "ready\n" {
                    line = keeper.report();
                }
                // The holder lets a held process go when the keeper, trying to seize it
                // already, writes to its handover pipe; asked here only once the keeper has
                // reported (in case that write failed, or the keeper did): asked at `ready`,
                // it let the process run free while the keeper got ready, on a busy host
                // past its entry point or to its end (see `repair::Keeper::start`).
                let_go();
                match parse_patched(&line) {
                    Some(patched) => Ok((keeper, patched)),
                    None => {
                        keeper.reap();
                        bail!(
                            "--engine inline: {}",
                            if line.is_empty() {
                                "the keeper died"
                            } else {
                                line.trim_end()
                            }
                        )
                    }
                }
            }
        }
    }

    fn report(&mut self) -> String {
        let mut line = String::new();
        let _ = self.reports.read_line(&mut line);
        line
    }

    /// Lets a launched command go from its entry point, its sleds patched: fdr-profiled reads
    /// the memory from now on (the keeper keeps it stopped until then, so that no hit is lost
    /// before the first read).
    pub fn go(&mut self) -> Result<()> {
        let commands = self.commands.as_mut().context("the keeper has ended")?;
        commands
            .write_all(b"go\n")
            .context("--engine inline: letting the command go")
    }

    /// Patches the sleds of `objects` (mapped by the process since the start): returns the
    /// sleds patched and those left as they were.
    pub fn patch_more(&mut self, objects: &[ObjectSleds]) -> Result<(usize, usize)> {
        let commands = self.commands.as_mut().context("the keeper has ended")?;
        let mut batch = format!("patch {}\n", objects.len()).into_bytes();
        write_objects(&mut batch, objects)?;
        commands
            .write_all(&batch)
            .context("--engine inline: asking the keeper to patch")?;
        let line = self.report();
        let mut words = line.strip_prefix("more ").unwrap_or("").split_whitespace();
        match (
            words.next().and_then(|w| w.parse().ok()),
            words.next().and_then(|w| w.parse().ok()),
        ) {
            (Some(patched), Some(skipped)) => Ok((patched, skipped)),
            _ => bail!(
                "--engine inline: {}",
                if line.is_empty() {
                    "the keeper died"
                } else {
                    line.trim_end()
                }
            ),
        }
    }

    /// Ends the session: the keeper puts the process back as it was; what it did.
    pub fn finish(mut self) -> Result<Restored> {
        drop(self.commands.take());
        let line = self.report();
        self.reap();
        parse_restored(&line).with_context(|| {
            format!(
                "--engine inline: the keeper could not put the process back: {}",
                if line.is_empty() {
                    "it died"
                } else {
                    line.trim_end()
                }
            )
        })
    }

    fn reap(&mut self) {
        drop(self.commands.take());
        let mut status = 0;
        // SAFETY: valid pointer; the keeper is our child.
        unsafe { libc::waitpid(self.pid, &mut status, 0) };
    }
}

fn parse_patched(line: &str) -> Option<Patched> {
    let mut words = line.strip_prefix("patched ")?.split_whitespace();
    Some(Patched {
        shared_at: words.next()?.parse().ok()?,
        sleds: words.next()?.parse().ok()?,
        skipped: words.next()?.parse().ok()?,
        past_entry: words.next() == Some("past-entry"),
    })
}

fn parse_restored(line: &str) -> Option<Restored> {
    if let Some(rest) = line.strip_prefix("gone") {
        let mut words = rest.split_whitespace();
        return Some(Restored {
            sleds: 0,
            changed: 0,
            unmapped: false,
            gone: true,
            forked_restored: words.next().and_then(|w| w.parse().ok()).unwrap_or(0),
            forked: words.next().and_then(|w| w.parse().ok()).unwrap_or(0),
            unmapped_sleds: 0,
        });
    }
    let mut words = line.strip_prefix("restored ")?.split_whitespace();
    Some(Restored {
        sleds: words.next()?.parse().ok()?,
        changed: words.next()?.parse().ok()?,
        unmapped: words.next()? == "unmapped",
        gone: false,
        forked_restored: words.next()?.parse().ok()?,
        forked: words.next()?.parse().ok()?,
        unmapped_sleds: words.next()?.parse().ok()?,
    })
}

/// What the keeper changed in the process.
struct Applied {
    shared_at: u64,
    /// The shared memory's inode (as `/proc/PID/maps` shows it): every process that maps it
    /// at `shared_at` is the traced one or was forked from it.
    shared_inode: u64,
    /// The handler's pages (address, length).
    pages: Vec<(u64, u64)>,
    /// Each patched sled: address, original and patched bytes.
    sleds: Vec<(u64, [u8; SLED_BYTES], [u8; SLED_BYTES])>,
    skipped: usize,
    /// Where system calls are made (a sled).
    site: u64,
    /// Where the process's threads keep their id (for the handler's data block).
    tid_offset: u64,
}

/// The keeper's life, in the forked child.
fn keeper_main(
    target: Target,
    parent: u32,
    plans: &[AttachPlan],
    layout: Layout,
    mut reports: File,
    commands: File,
    keep: &[i32],
) -> i32 {
    become_keeper(c"fdr-inline", keep);
    if matches!(target, Target::Held(..)) {
        // fdr-profiled has the holder let the process go when it reads this.
        let _ = reports.write_all(b"ready\n");
    }
    let (mut applied, held) = match apply(target, parent, plans, layout) {
        Ok(applied) => applied,
        Err(err) => {
            let _ = writeln!(reports, "{err:#}");
            return 1;
        }
    };
    let launched = matches!(target, Target::Launched(..));
    let target = target.pid();
    let past_entry = held.as_ref().is_some_and(Stopped::past_entry);
    let _ = writeln!(
        reports,
        "patched {} {} {}{}",
        applied.shared_at,
        applied.sleds.len(),
        applied.skipped,
        if past_entry { " past-entry" } else { "" }
    );
    // Until fdr-profiled says the session ends, or dies (either way the pipe closes). A
    // launched command waits at its entry point for its word that it reads the memory
    // (`go`); objects the process maps later come as `patch` (see `InlineKeeper::patch_more`).
    let mut held = held;
    let mut commands = std::io::BufReader::new(commands);
    loop {
        let mut line = String::new();
        match commands.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) if line == "go\n" => {
                if let Some(stopped) = held.take() {
                    stopped.release();
                }
            }
            Ok(_) => {
                let reply = match line.strip_prefix("patch ").map(str::trim_end) {
                    Some(count) => patch_more(target, count, &mut commands, &mut applied, layout),
                    None => Err(anyhow::anyhow!("unknown command {line:?}")),
                };
                let _ = match reply {
                    Ok((patched, skipped)) => writeln!(reports, "more {patched} {skipped}"),
                    Err(err) => writeln!(reports, "{err:#}"),
                };
            }
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    if let Some(stopped) = held {
        if launched {
            // fdr-profiled ended before it could read anything: the command never starts
            // (as one whose probes could not be placed).
            // SAFETY: plain system call on the command fdr-profiled launched.
            unsafe { libc::kill(stopped.pid() as libc::pid_t, libc::SIGKILL) };
            drop(stopped);
            let _ = writeln!(reports, "gone 0 0");
            return 0;
        }
        // A process of --attach goes on, put back below.
        stopped.release();
    }
    // Processes it forked meanwhile run the patched code too, their hits in the same memory:
    // each is put back as well (found by the shared memory they map).
    let forked: Vec<u32> = holders(&applied)
        .into_iter()
        .filter(|&pid| pid != target)
        .collect();
    let mut forked_back = 0;
    for &pid in &forked {
        if matches!(restore(pid, &applied, layout), Ok(Some(r)) if r.changed == 0) {
            forked_back += 1;
        }
    }
    let line = match restore(target, &applied, layout) {
        Ok(Some(r)) => format!(
            "restored {} {} {} {forked_back} {} {}",
            r.sleds,
            r.changed,
            if r.unmapped { "unmapped" } else { "kept" },
            forked.len(),
            r.unmapped_sleds
        ),
        Ok(None) => format!("gone {forked_back} {}", forked.len()),
        Err(err) => format!("{err:#}"),
    };
    let _ = writeln!(reports, "{line}");
    0
}

/// Stops the process (a launched command at its entry point) and patches it; a launched
/// command is returned still stopped there.
fn apply(
    target: Target,
    parent: u32,
    plans: &[AttachPlan],
    layout: Layout,
) -> Result<(Applied, Option<Stopped>)> {
    let (mut stopped, launched) = match target {
        Target::Running(pid) => (Stopped::stop(pid)?, false),
        Target::Launched(pid, go) => (Stopped::launched(pid, go)?, true),
        Target::Held(pid, handover) => (Stopped::held(pid, parent, handover)?, false),
    };
    // A process patched at its entry point waits there for fdr-profiled to read its memory
    // (a short one would otherwise be gone before).
    let waits = !matches!(target, Target::Running(_));
    match patch(&mut stopped, plans, layout) {
        Ok(applied) if waits => Ok((applied, Some(stopped))),
        Ok(applied) => {
            stopped.release();
            Ok((applied, None))
        }
        Err(err) => {
            if launched {
                // Never started (see `Stopped::launched`).
                // SAFETY: plain system call on the command we launched.
                unsafe { libc::kill(stopped.pid() as libc::pid_t, libc::SIGKILL) };
            }
            Err(err)
        }
    }
}

/// Patches the stopped process: the sleds of `plans`, found where it maps their objects.
fn patch(stopped: &mut Stopped, plans: &[AttachPlan], layout: Layout) -> Result<Applied> {
    let target = stopped.pid();
    // Read with every thread stopped: the mappings cannot change meanwhile.
    let tid_offset = super::glibc::tid_offset(target)?;
    let objects = plans
        .iter()
        .map(|plan| object_sleds(target, plan))
        .collect::<Result<Vec<_>>>()?;
    let objects = &objects[..];
    let site = objects
        .iter()
        .flat_map(|o| o.sleds.first())
        .map(|s| s.address)
        .next()
        .context("no sled to patch")?;
    let shared_at = stopped.mmap(
        site,
        0,
        layout.bytes(),
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
    )?;
    let shared_inode = mapping_inode(target, shared_at).unwrap_or(0);
    let mut applied = Applied {
        shared_at,
        shared_inode,
        pages: Vec::new(),
        sleds: Vec::new(),
        skipped: 0,
        site,
        tid_offset,
    };
    match patch_objects(stopped, objects, layout, tid_offset, &mut applied) {
        Ok(()) => Ok(applied),
        Err(err) => {
            // Nothing half done is left: the sleds patched so far go back.
            for (address, original, _) in &applied.sleds {
                let _ = write_sled(stopped, *address, original);
            }
            Err(err)
        }
    }
}

fn patch_objects(
    stopped: &mut Stopped,
    objects: &[ObjectSleds],
    layout: Layout,
    tid_offset: u64,
    applied: &mut Applied,
) -> Result<()> {
    let handler = handler();
    let block = layout.data_block(applied.shared_at, tid_offset);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let len = (handler.bytes.len() as u64).div_ceil(page) * page;
    for object in objects {
        let (Some(lo), Some(hi)) = (
            object.sleds.iter().map(|s| s.address).min(),
            object.sleds.iter().map(|s| s.address).max(),
        ) else {
            continue;
        };
        let mapped = mapped_ranges(stopped.pid())?;
        let Some(at) = place_near(&mapped, lo, hi + SLED_BYTES as u64, len, page) else {
            applied.skipped += object.sleds.len();
            continue;
        };
        let code = stopped.mmap(
            applied.site,
            at,
            len,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
        )?;
        if code != at {
            bail!(
                "the handler's page for {} went to {code:#x}, not {at:#x}",
                object.name
            );
        }
        applied.pages.push((code, len));
        stopped.write(code, handler.bytes)?;
        stopped.write(code + handler.data as u64, &block)?;
        for sled in &object.sleds {
            let mut original = [0u8; SLED_BYTES];
            stopped.read(sled.address, &mut original)?;
            let trampoline = code
                + match sled.kind {
                    Trampoline::Entry => handler.entry,
                    Trampoline::Exit => handler.exit,
                    Trampoline::Tail => handler.tail,
                } as u64;
            let new = match patched(sled, trampoline) {
                Some(new) if is_unpatched(sled.kind, &original) => new,
                _ => {
                    applied.skipped += 1;
                    continue;
                }
            };
            write_sled(stopped, sled.address, &new)?;
            applied.sleds.push((sled.address, original, new));
        }
    }
    Ok(())
}

/// `patch COUNT`: reads COUNT objects' sleds (see [`write_objects`]) and patches them in
/// the process, stopped for the while; returns the sleds patched and left.
fn patch_more(
    target: u32,
    count: &str,
    commands: &mut impl std::io::BufRead,
    applied: &mut Applied,
    layout: Layout,
) -> Result<(usize, usize)> {
    let count: usize = count.parse().context("patch: not a count")?;
    let objects = read_objects(commands, count)?;
    let (before, skipped_before) = (applied.sleds.len(), applied.skipped);
    let mut stopped = Stopped::stop(target)?;
    let tid_offset = applied.tid_offset;
    if let Err(err) = patch_objects(&mut stopped, &objects, layout, tid_offset, applied) {
        // This batch goes back whole; what was patched before stays.
        for (address, original, _) in &applied.sleds[before..] {
            let _ = write_sled(&stopped, *address, original);
        }
        applied.sleds.truncate(before);
        return Err(err);
    }
    stopped.release();
    Ok((
        applied.sleds.len() - before,
        applied.skipped - skipped_before,
    ))
}

/// Writes `objects` for [`read_objects`]: per object a line `object N NAME`, then N lines
/// `ADDRESS FUNCTION-ID KIND` (kind `e`ntry, e`x`it or `t`ail).
fn write_objects(out: &mut impl std::io::Write, objects: &[ObjectSleds]) -> std::io::Result<()> {
    for object in objects {
        let name: String = object.name.chars().filter(|c| *c != '\n').collect();
        writeln!(out, "object {} {name}", object.sleds.len())?;
        for sled in &object.sleds {
            let kind = match sled.kind {
                Trampoline::Entry => 'e',
                Trampoline::Exit => 'x',
                Trampoline::Tail => 't',
            };
            writeln!(out, "{} {} {kind}", sled.address, sled.function_id)?;
        }
    }
    Ok(())
}

/// Reads `count` objects [`write_objects`] wrote.
fn read_objects(input: &mut impl std::io::BufRead, count: usize) -> Result<Vec<ObjectSleds>> {
    let mut line = String::new();
    let mut next = |line: &mut String| -> Result<()> {
        line.clear();
        match input.read_line(line)? {
            0 => bail!("patch: cut short"),
            _ => Ok(()),
        }
    };
    let mut objects = Vec::new();
    for _ in 0..count {
        next(&mut line)?;
        let (n, name) = line
            .trim_end()
            .strip_prefix("object ")
            .and_then(|rest| rest.split_once(' '))
            .context("patch: not an object line")?;
        let n: usize = n.parse().context("patch: not a sled count")?;
        let name = name.to_owned();
        let mut sleds = Vec::new();
        for _ in 0..n {
            next(&mut line)?;
            let mut words = line.split_whitespace();
            let (Some(address), Some(function_id), Some(kind)) =
                (words.next(), words.next(), words.next())
            else {
                bail!("patch: not a sled line");
            };
            sleds.push(Sled {
                address: address.parse().context("patch: address")?,
                function_id: function_id.parse().context("patch: function id")?,
                kind: match kind {
                    "e" => Trampoline::Entry,
                    "x" => Trampoline::Exit,
                    "t" => Trampoline::Tail,
                    _ => bail!("patch: kind {kind:?}"),
                },
            });
        }
        objects.push(ObjectSleds { name, sleds });
    }
    Ok(objects)
}

/// Writes a sled's bytes: the last nine, then the first two (XRay's order: a thread that ran
/// it meanwhile would see the old sled or the new one, never a mix).
fn write_sled(stopped: &Stopped, address: u64, bytes: &[u8; SLED_BYTES]) -> Result<()> {
    stopped.write(address + 2, &bytes[2..])?;
    stopped.write(address, &bytes[..2])
}

/// Stops the process again and puts it back as it was; `None` if it is gone.
fn restore(target: u32, applied: &Applied, layout: Layout) -> Result<Option<Restored>> {
    let mut stopped = match Stopped::stop(target) {
        Ok(stopped) => stopped,
        Err(_) if gone(target) => return Ok(None),
        Err(err) => return Err(err),
    };
    let mut restored = Restored {
        sleds: 0,
        changed: 0,
        unmapped: false,
        gone: false,
        forked: 0,
        forked_restored: 0,
        unmapped_sleds: 0,
    };
    for (address, original, new) in &applied.sleds {
        let mut now = [0u8; SLED_BYTES];
        if stopped.read(*address, &mut now).is_err() {
            // Its object was unmapped (`dlclose`): nothing left to put back.
            restored.unmapped_sleds += 1;
            continue;
        }
        if now == *new {
            // The first two bytes first: the sled is whole again from then on.
            stopped.write(*address, &original[..2])?;
            stopped.write(address + 2, &original[2..])?;
        } else if now != *original {
            restored.changed += 1;
            continue;
        }
        stopped.read(*address, &mut now)?;
        if now == *original {
            restored.sleds += 1;
        } else {
            restored.changed += 1;
        }
    }
    let inside = |at: u64| {
        applied
            .pages
            .iter()
            .any(|&(p, len)| (p..p + len).contains(&at))
    };
    // A thread stopped inside the handler finishes its hit first (a few instructions).
    for (tid, rip, _) in stopped.positions() {
        let mut rip = rip;
        for _ in 0..256 {
            if !inside(rip) {
                break;
            }
            stopped.step(tid)?;
            rip = stopped
                .positions()
                .into_iter()
                .find(|p| p.0 == tid)
                .map_or(0, |p| p.1);
        }
    }
    // A sled that could not be read might still call the handler: its pages stay then.
    let referenced = restored.unmapped_sleds > 0
        || stopped
            .positions()
            .into_iter()
            .any(|(_, rip, rsp)| inside(rip) || stack_words(&stopped, rsp).into_iter().any(inside));
    if referenced {
        // A hit interrupted in the handler writes its record here when it goes on.
        stopped.mmap(
            applied.site,
            applied.shared_at,
            layout.bytes(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
        )?;
    } else {
        for &(page, len) in &applied.pages {
            stopped.munmap(applied.site, page, len)?;
        }
        stopped.munmap(applied.site, applied.shared_at, layout.bytes())?;
        restored.unmapped = true;
    }
    stopped.release();
    Ok(Some(restored))
}

/// The inode of the mapping of process `pid` that starts at `at`.
fn mapping_inode(pid: u32, at: u64) -> Option<u64> {
    crate::traced::mappings::mappings(pid)
        .ok()?
        .iter()
        .find(|m| m.start == at)
        .map(|m| m.inode)
}

/// The processes that map the shared memory where the traced one does.
fn holders(applied: &Applied) -> Vec<u32> {
    if applied.shared_inode == 0 {
        return Vec::new();
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| mapping_inode(pid, applied.shared_at) == Some(applied.shared_inode))
        .collect()
}

/// Whether process `pid` has ended (a zombie has no memory left to restore).
pub(crate) fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_none_or(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
        Err(_) => true,
    }
}

/// The words of the top 64 KiB of a stack (as far as it is readable).
fn stack_words(stopped: &Stopped, rsp: u64) -> Vec<u64> {
    let mut words = Vec::new();
    let mut chunk = [0u8; 4096];
    let mut at = rsp & !7;
    for _ in 0..17 {
        // Page by page (the first from `rsp` to its page's end): the stack ends at a page.
        let len = (4096 - (at % 4096)) as usize;
        if stopped.read(at, &mut chunk[..len]).is_err() {
            break;
        }
        words.extend(
            chunk[..len]
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))),
        );
        at += len as u64;
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keepers_reports_parse() {
        assert_eq!(
            parse_patched("patched 140000 12 1\n"),
            Some(Patched {
                shared_at: 140000,
                sleds: 12,
                skipped: 1,
                past_entry: false,
            })
        );
        assert!(
            parse_patched("patched 1 2 3 past-entry\n")
                .unwrap()
                .past_entry
        );
        assert_eq!(
            parse_patched("PTRACE_SEIZE: Operation not permitted\n"),
            None
        );
        let restored = parse_restored("restored 12 0 unmapped 1 2 3\n").unwrap();
        assert_eq!((restored.sleds, restored.unmapped), (12, true));
        assert_eq!((restored.forked_restored, restored.forked), (1, 2));
        assert_eq!(restored.unmapped_sleds, 3);
        assert!(parse_restored("gone 0 0\n").unwrap().gone);
    }
}
