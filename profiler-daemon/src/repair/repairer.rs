//! The keeper's ptrace loop: every stop of every thread of the traced process (and of the
//! processes it forks) served, the repairs at throws and catches made, the process let go
//! with no frame left hooked.
use super::ptrace::{
    event_message, is_process_leader, pass_through_trampoline, probe_stack_pointer, read_word,
    request, stack_pointer, syscall_trampoline, wait_any, write_word, Wait,
};
use super::release::{release_due, Reports, RELEASE_WAIT};
use super::stops::UnwindStops;
use crate::arch::Registers;
use crate::kernel::bpf::repair::RepairMaps;
use crate::kernel::bpf::{PodRepairState, PodStopKey, PodStopTime};
use crate::session::summary::RepairsByThread;
use anyhow::{Context as _, Result};
use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::repair_state;
use std::collections::HashMap;
use std::io::Read as _;
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;
use std::time::Instant;

/// The tracer's state.
pub(super) struct Repairer<'a> {
    pid: u32,
    /// Every thread it traces (seized, or traced from its creation), until its exit.
    threads: std::collections::BTreeSet<u32>,
    /// The processes the traced one forked (and theirs, and so on), with the throw and catch
    /// stops placed for each: a child has the frames it inherited hooked, and the kernel
    /// hooks its own calls too (a return probe hooks a frame wherever its breakpoint fires,
    /// whatever process it is filtered to), so it is repaired as its parent is.
    children: HashMap<u32, Vec<crate::kernel::uprobe_multi::MultiLink>>,
    /// Whether the traced process has exited (its forked processes may live on).
    exited: bool,
    stops: &'a UnwindStops,
    repairs: BpfHashMap<MapData, u32, PodRepairState>,
    /// Where each stop's time goes, shared among the functions whose frames caused it.
    stop_times: BpfHashMap<MapData, PodStopKey, PodStopTime>,
    /// The functions whose frames stay unhooked at a catch (dropped by the overhead budget).
    unhook: BpfHashMap<MapData, PodStopKey, u8>,
    /// The kernel's return-probe trampoline in the command (its `[uprobes]` mapping, at the
    /// same address in a forked child), once known.
    trampoline: Option<u64>,
    /// By thread: the slots restored at its last throws, with the address written and the
    /// frame's function (its process and address, see [`profiler_common::StopKey`]).
    restored: HashMap<u32, Vec<(u64, u64, PodStopKey)>>,
    /// What the repairs did, by thread.
    stats: RepairsByThread,
    /// What a stop costs its thread after its `PTRACE_CONT` (measured before the fork).
    resumption_ns: u64,
}

/// `PTRACE_EVENT_*` (uapi values).
pub(super) const EVENT_FORK: i32 = 1;

pub(super) const EVENT_EXEC: i32 = 4;

pub(super) const EVENT_STOP: i32 = 128;

impl<'a> Repairer<'a> {
    pub(super) fn new(
        pid: u32,
        threads: Vec<u32>,
        maps: RepairMaps,
        stops: &'a UnwindStops,
    ) -> Repairer<'a> {
        Repairer {
            pid,
            threads: threads.into_iter().collect(),
            children: HashMap::new(),
            exited: false,
            stops,
            repairs: maps.repairs,
            stop_times: maps.stop_times,
            unhook: maps.unhook,
            trampoline: None,
            restored: HashMap::new(),
            stats: RepairsByThread::new(),
            resumption_ns: super::resumption::resumption_ns(),
        }
    }

    /// Serves every stop of every thread of the command (and of the processes it forks) until
    /// they have all exited, or, for a running process (`running`), until it is asked to let
    /// it go (`release`: see [`Tracee::Running`]). `report` gets what the repairs did once:
    /// when the command exits (a launched command: fdr-profiled waits for it, not for the
    /// processes it left), or when the process is let go or gone.
    pub(super) fn serve(mut self, running: bool, reports: &mut Reports) -> Result<()> {
        let mut reported = false;
        loop {
            if running && release_due() {
                self.release()?;
                if !reported {
                    reports.repairs(&self.stats);
                }
                return Ok(());
            }
            if self.exited && self.threads.is_empty() {
                if !reported {
                    reports.repairs(&self.stats);
                }
                return Ok(());
            }
            let (tid, status) = match wait_any()? {
                Wait::Stop(tid, status) => (tid, status),
                Wait::Interrupted => continue,
                Wait::NoTracee => {
                    self.exited = true;
                    self.threads.clear();
                    continue;
                }
            };
            if self.exited(tid, status) {
                if tid == self.pid {
                    self.exited = true;
                    // How it ended is fdr-profiled's to read (the command's parent, or the
                    // pidfd of --pid).
                    if !running && !reported {
                        reports.repairs(&self.stats);
                        reported = true;
                    }
                }
                continue;
            }
            if !libc::WIFSTOPPED(status) {
                continue;
            }
            if self.threads.insert(tid) && is_process_leader(tid) && tid != self.pid {
                // A forked child's first stop, before its parent's fork event was seen.
                self.follow(tid, None);
            }
            let signal = libc::WSTOPSIG(status);
            match status >> 16 {
                0 => {
                    self.signal_stop(tid, signal, true);
                }
                EVENT_STOP => {
                    if matches!(
                        signal,
                        libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
                    ) {
                        // A group stop: stay stopped until SIGCONT, as without a tracer.
                        request(libc::PTRACE_LISTEN, tid, 0);
                    } else {
                        // A new thread's or process's first stop (SIGTRAP), or an interrupt.
                        request(libc::PTRACE_CONT, tid, 0);
                    }
                }
                EVENT_FORK => {
                    if let Some(child) = event_message(tid) {
                        self.follow(child, Some(tid));
                    }
                    request(libc::PTRACE_CONT, tid, 0);
                }
                EVENT_EXEC if tid == self.pid => {
                    // A program that raised the process's privileges must not run under a
                    // root tracer: let go before its first instruction.
                    if let Some(why) = crate::traced::process::exec_raised_privileges(tid) {
                        return self.let_go_at_exec(&why, running, reports);
                    }
                    request(libc::PTRACE_CONT, tid, 0);
                }
                EVENT_EXEC => {
                    // A forked child now runs another program: its frames went with its old
                    // image. Its stops go first, so that none stops it once untraced.
                    self.children.remove(&tid);
                    self.threads.remove(&tid);
                    self.restored.remove(&tid);
                    request(libc::PTRACE_DETACH, tid, 0);
                }
                _ => request(libc::PTRACE_CONT, tid, 0),
            }
        }
    }

    /// The traced process, stopped at its exec event, now runs a program that raised its
    /// privileges (`why`: which, and how): under a root tracer the kernel keeps them, so the
    /// keeper lets it go before its first instruction. fdr-profiled is told first: for a
    /// running process it removes its probes of the process and asks for the release, which
    /// is waited for (at most [`RELEASE_WAIT`]); then the keeper's own throw and catch stops go
    /// (none can stop the new program), its repair states are dropped, and it is detached from
    /// its exec stop. Nothing is written into the new program: no frame of it was hooked yet.
    /// The processes it forked are let go as at a release; then the keeper reports and ends.
    fn let_go_at_exec(&mut self, why: &str, running: bool, reports: &mut Reports) -> Result<()> {
        let pid = self.pid;
        reports.let_go(&format!(
            "process {pid} exec'd {why}: its tracer let it go before its first instruction"
        ));
        if running {
            let deadline = Instant::now() + RELEASE_WAIT;
            while !release_due() && Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        // The children's trampoline is the one they inherited (the new image has none yet).
        let _ = self.trampoline_of(self.children.keys().next().copied());
        for &fd in &self.stops.links {
            // SAFETY: the keeper's own copies of the links; nothing uses them after this.
            unsafe { libc::close(fd) };
        }
        let _ = self.repairs.remove(&pid);
        self.threads.remove(&pid);
        self.restored.remove(&pid);
        self.exited = true;
        request(libc::PTRACE_DETACH, pid, 0);
        // Its forked processes, and its old threads' ends still to be collected.
        if !self.threads.is_empty() {
            self.release()?;
        }
        reports.repairs(&self.stats);
        Ok(())
    }

    /// Follows the process `child` that a traced thread (`parent`, when known) forked: places
    /// its throw and catch stops (once), before it runs.
    fn follow(&mut self, child: u32, parent: Option<u32>) {
        if let Some(parent) = parent {
            self.stats.entry(parent).or_default().forks_followed += 1;
        }
        if child == self.pid || self.children.contains_key(&child) {
            return;
        }
        let Some(pid) = std::num::NonZeroU32::new(child) else {
            return;
        };
        let mut links = Vec::new();
        for object in &self.stops.objects {
            let path = PathBuf::from(format!("/proc/self/fd/{}", object.file.as_raw_fd()));
            // SAFETY: the program's descriptor stays open for the keeper's life (kept).
            let program = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.stops.program) };
            match crate::kernel::uprobe_multi::attach(
                program,
                &path,
                &object.offsets,
                &object.cookies,
                Some(pid),
                false,
            ) {
                Ok(link) => links.push(link),
                Err(err) => errln!(
                    "fdr-profiled: repair keeper: warning: process {child} (forked): its throws cannot be repaired ({err}); one through a hooked frame ends it"
                ),
            }
        }
        self.children.insert(child, links);
    }

    /// Whether `status` says `tid` is gone; forgets it then.
    fn exited(&mut self, tid: u32, status: i32) -> bool {
        let gone = libc::WIFEXITED(status) || libc::WIFSIGNALED(status);
        if gone {
            self.restored.remove(&tid);
            self.threads.remove(&tid);
            self.children.remove(&tid);
        }
        gone
    }

    /// Lets a running process, and the processes it forked, go: stops every thread
    /// (`PTRACE_INTERRUPT`; a repair due meanwhile is made, a signal meant for the program is
    /// kept for the detach), has the `repair_release` iterator copy each thread's pending
    /// return-probe instances from the kernel, puts the original return address back into
    /// every live slot that still holds the trampoline, and detaches every thread. The frames
    /// so released return straight to their callers; the kernel drops their instances as it
    /// drops those a `longjmp` left.
    fn release(&mut self) -> Result<()> {
        // Signal to deliver at the detach, by stopped thread.
        let mut stopped: HashMap<u32, i32> = HashMap::new();
        for &tid in &self.threads {
            request(libc::PTRACE_INTERRUPT, tid, 0);
        }
        while self.threads.iter().any(|t| !stopped.contains_key(t)) {
            let (tid, status) = match wait_any()? {
                Wait::Stop(tid, status) => (tid, status),
                Wait::Interrupted => continue,
                Wait::NoTracee => {
                    self.threads.clear();
                    break;
                }
            };
            if self.exited(tid, status) {
                stopped.remove(&tid);
                continue;
            }
            if !libc::WIFSTOPPED(status) {
                continue;
            }
            if self.threads.insert(tid) {
                // Created meanwhile: its first stop is this one.
                stopped.insert(tid, 0);
                continue;
            }
            let signal = libc::WSTOPSIG(status);
            let deliver = match status >> 16 {
                0 => {
                    if self.signal_stop(tid, signal, false) {
                        // Ours: repaired, and resumed; stop it again.
                        request(libc::PTRACE_INTERRUPT, tid, 0);
                        continue;
                    }
                    signal
                }
                // An interrupt, a group stop, a clone, a fork: stopped all the same (a
                // child forked meanwhile is stopped at its first stop and traced).
                _ => 0,
            };
            // A second stop of one already stopped cannot come: it is not resumed.
            stopped.insert(tid, deliver);
        }
        // Every thread is stopped: their instances cannot change until the detach.
        let processes: Vec<u32> = std::iter::once(self.pid)
            .filter(|_| !self.exited)
            .chain(self.children.keys().copied())
            .collect();
        for pid in processes {
            let Some(nz) = std::num::NonZeroU32::new(pid) else {
                continue;
            };
            // SAFETY: the program's descriptor stays open for the keeper's life (kept).
            let program =
                unsafe { std::os::fd::BorrowedFd::borrow_raw(self.stops.release_program) };
            let mut sink = Vec::new();
            crate::kernel::task_iter::for_process(program, nz)
                .and_then(|mut iterator| iterator.read_to_end(&mut sink))
                .with_context(|| {
                    format!("running the repair_release task iterator over process {pid}")
                })?;
        }
        let trampoline = self.trampoline();
        for &tid in stopped.keys() {
            let state = self.repairs.get(&tid, 0).ok().map(|s| s.0);
            let _ = self.repairs.remove(&tid);
            if let (Some(state), Some(trampoline), Some(sp)) =
                (state, trampoline, stack_pointer(tid))
            {
                if state.state == repair_state::RELEASE {
                    let stats = self.stats.entry(tid).or_default();
                    let frames = (state.frames as usize).min(state.slots.len());
                    let mut done: Vec<u64> = Vec::new();
                    for i in 0..frames {
                        let (slot, orig) = (state.slots[i], state.origs[i]);
                        // Dead (at or below the stack pointer), or a tail call's shared slot.
                        if slot <= sp || done.contains(&slot) {
                            continue;
                        }
                        done.push(slot);
                        match read_word(tid, slot) {
                            Some(word) if word == trampoline => {
                                if write_word(tid, slot, orig) {
                                    stats.frames_released += 1;
                                } else {
                                    stats.slots_left_alone += 1;
                                }
                            }
                            // Restored at a throw not caught yet, or overwritten.
                            _ => {}
                        }
                    }
                }
            }
        }
        // The children's stops go before they are untraced: none may stop them afterwards.
        self.children.clear();
        for (&tid, &deliver) in &stopped {
            request(libc::PTRACE_DETACH, tid, deliver);
        }
        Ok(())
    }

    /// A signal about to be delivered to `tid`: ours (a repair is due: made, and the thread
    /// resumed; returns true) or the program's (returns false; passed on when `pass_on`, else
    /// left for the caller to deliver).
    fn signal_stop(&mut self, tid: u32, signal: i32, pass_on: bool) -> bool {
        let state = self.repairs.get(&tid, 0).ok().map(|s| s.0);
        // The stop the program sent (`profiler_common::STOP_SIGNALS`) names its signal: any
        // other, even the same number arriving meanwhile, is the program's.
        let ours = state.is_some_and(|s| {
            (s.state == repair_state::THROWN || s.state == repair_state::CATCHING)
                && s.signal == signal as u32
        });
        let stats = self.stats.entry(tid).or_default();
        if !ours {
            stats.signals_passed_on += 1;
            if pass_on {
                request(libc::PTRACE_CONT, tid, signal);
            }
            return false;
        }
        let started = Instant::now();
        // A signal for the program that came while the thread passed through the trampoline.
        let mut deliver = 0;
        // The functions whose hooked frames made this stop needed.
        let mut culprits = Vec::new();
        if let Some(state) = state {
            if state.state == repair_state::THROWN {
                self.throw(tid, &state);
                culprits = self.culprits(tid);
                let mut done = state;
                done.state = repair_state::RESTORED;
                let _ = self.repairs.insert(tid, PodRepairState(done), 0);
            } else {
                culprits = self.culprits(tid);
                self.catch(tid, &state);
                deliver = self.drop_dead_instances(tid, &state);
                let _ = self.repairs.remove(&tid);
            }
        }
        let handled = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        request(libc::PTRACE_CONT, tid, deliver);
        // The whole stop: from the kernel's stamp (else from the keeper's sight of it) to the
        // thread running again.
        let stopped = state
            .and_then(|state| self.account_stop(&state, culprits))
            .unwrap_or(handled + self.resumption_ns);
        let stats = self.stats.entry(tid).or_default();
        stats.repair_ns_total += stopped;
        stats.repair_ns_max = stats.repair_ns_max.max(stopped);
        stats.resumption_ns = self.resumption_ns;
        true
    }

    /// The functions of the frames restored at the thread's last throw (those still hooked
    /// then, alive): a throw stops only for them, and its catch only because they were.
    fn culprits(&self, tid: u32) -> Vec<u64> {
        let mut funcs: Vec<u64> = self
            .restored
            .get(&tid)
            .into_iter()
            .flatten()
            .map(|(.., function)| function.0.func)
            .filter(|&func| func != 0)
            .collect();
        funcs.sort_unstable();
        funcs.dedup();
        funcs
    }

    /// The time the stop of `state` cost its thread (from the program's stop to its
    /// `PTRACE_CONT`, and the measured time it takes to run again after that), shared in
    /// [`profiler_common::STOP_TIMES_MAP`] among `culprits`: without every one of them hooked
    /// there would have been no stop (see `unwind_stop`), so the overhead budget charges it
    /// to them. Returns the stop's time (`None` where the kernel's stamp is missing).
    fn account_stop(
        &mut self,
        state: &profiler_common::RepairState,
        mut culprits: Vec<u64>,
    ) -> Option<u64> {
        let now = crate::session::monotonic_ns();
        if state.at_ns == 0 || state.at_ns > now {
            return None;
        }
        if culprits.is_empty() {
            // Unknown functions: the time is still the program's, charged to none (key 0).
            culprits.push(0);
        }
        let stopped = now - state.at_ns + self.resumption_ns;
        let share = stopped / culprits.len() as u64;
        for func in culprits {
            let key = PodStopKey(profiler_common::StopKey {
                pid: state.process,
                reserved: 0,
                func,
            });
            let mut time = self
                .stop_times
                .get(&key, 0)
                .map_or_else(|_| Default::default(), |t| t.0);
            time.stops += 1;
            time.ns += share;
            // A full table: this stop goes unaccounted (the budget under-estimates; no more).
            let _ = self.stop_times.insert(key, PodStopTime(time), 0);
        }
        Some(stopped)
    }

    /// At a catch: when the kernel holds as many return-probe instances for the thread as it
    /// allows (64) and some are of frames the exception left (their slot at or below the
    /// catch's stack pointer), it hooks no new frame until a traced caller of those returns,
    /// and in a thread whose outer frames were entered before tracing none ever does (it
    /// cleans up only when a hooked frame returns, or at an entry below its limit). So the
    /// thread, stopped at its catch, is made to pass once through the return trampoline with
    /// its stack pointer just above the outermost dead frame's slot: the kernel drops every
    /// instance below that point, as when a frame returns past frames a `longjmp` left (it runs
    /// the return handler of that outermost one, which the return program is told to keep
    /// silent: `repair_state::CLEANUP`). The thread is stopped at the trampoline's system call
    /// (`PTRACE_SYSCALL`), then its registers and the three stack words the trampoline pushed
    /// are put back, and it resumes at its catch: the program sees nothing of it. Returns a
    /// signal for the program that came meanwhile (to deliver when it resumes), else 0.
    fn drop_dead_instances(&mut self, tid: u32, state: &profiler_common::RepairState) -> i32 {
        let frames = (state.frames as usize).min(state.slots.len());
        if frames < profiler_common::MAX_RETURN_PROBE_DEPTH as usize {
            // Below its limit the kernel drops them itself at the thread's next entry.
            return 0;
        }
        let catch_sp = state.sp;
        let Some(&outermost) = state.slots[..frames]
            .iter()
            .filter(|&&slot| slot != 0 && slot <= catch_sp)
            .max()
        else {
            return 0;
        };
        let dead = state.slots[..frames]
            .iter()
            .filter(|&&slot| slot != 0 && slot <= catch_sp)
            .count() as u64;
        let (Some(trampoline), true) = (self.trampoline(), syscall_trampoline(self.pid)) else {
            return 0;
        };
        let Some(saved) = Registers::of(tid) else {
            return 0;
        };
        // The trampoline pushes three words below the stack pointer it starts with.
        let sp = outermost + 8;
        let words: Vec<Option<u64>> = (1..=3).map(|i| read_word(tid, sp - 8 * i)).collect();
        if words.iter().any(Option::is_none) {
            return 0;
        }
        let mut cleanup = *state;
        cleanup.state = repair_state::CLEANUP;
        cleanup.sp = outermost;
        if self
            .repairs
            .insert(tid, PodRepairState(cleanup), 0)
            .is_err()
        {
            return 0;
        }
        let mut regs = saved;
        regs.set_pc(trampoline);
        regs.set_sp(sp);
        // Not in a system call: nothing is restarted when the registers are put back.
        regs.cancel_syscall();
        let mut deliver = 0;
        let passed = regs.set(tid) && {
            let (passed, signal) = pass_through_trampoline(tid, trampoline);
            deliver = signal;
            passed
        };
        // Whatever happened, the thread goes on from its catch as it was.
        let restored = saved.set(tid);
        for (i, word) in words.into_iter().enumerate() {
            if let Some(word) = word {
                write_word(tid, sp - 8 * (i as u64 + 1), word);
            }
        }
        if passed && restored {
            let stats = self.stats.entry(tid).or_default();
            stats.trampoline_passes += 1;
            stats.instances_dropped += dead;
        }
        deliver
    }

    /// At a throw: the original return address back into every live slot that holds the
    /// trampoline, newest frame first (a slot shared by a tail call is written once).
    fn throw(&mut self, tid: u32, state: &profiler_common::RepairState) {
        let (sp, trampoline) = (probe_stack_pointer(tid, state), self.trampoline());
        let stats = self.stats.entry(tid).or_default();
        stats.throws += 1;
        let (Some(sp), Some(trampoline)) = (sp, trampoline) else {
            return;
        };
        let restored = self.restored.entry(tid).or_default();
        // Frames restored at an earlier throw that were never caught, and are gone now.
        restored.retain(|&(slot, ..)| slot > sp);
        let frames = (state.frames as usize).min(state.slots.len());
        for i in 0..frames {
            let (slot, orig) = (state.slots[i], state.origs[i]);
            if slot <= sp || restored.iter().any(|&(s, ..)| s == slot) {
                continue;
            }
            match read_word(tid, slot) {
                Some(word) if word == trampoline => {
                    if write_word(tid, slot, orig) {
                        let function = PodStopKey(profiler_common::StopKey {
                            pid: state.process,
                            reserved: 0,
                            func: state.funcs[i],
                        });
                        restored.push((slot, orig, function));
                        stats.frames_restored += 1;
                    } else {
                        stats.slots_left_alone += 1;
                    }
                }
                _ => stats.slots_left_alone += 1,
            }
        }
    }

    /// At a catch: the trampoline back into the restored slots of the frames still alive.
    fn catch(&mut self, tid: u32, state: &profiler_common::RepairState) {
        let restored = self.restored.remove(&tid).unwrap_or_default();
        let (sp, trampoline) = (probe_stack_pointer(tid, state), self.trampoline());
        let stats = self.stats.entry(tid).or_default();
        stats.catches += 1;
        let (Some(sp), Some(trampoline)) = (sp, trampoline) else {
            return;
        };
        for (slot, orig, function) in restored {
            if slot <= sp {
                // Unwound: the kernel drops its instance as dead.
                continue;
            }
            if self.unhook.get(&function, 0).is_ok() {
                // Its function is no longer traced: the frame returns straight to its caller,
                // and the kernel drops the instance as dead after (as for a frame unwound).
                stats.frames_left_unhooked += 1;
                continue;
            }
            match read_word(tid, slot) {
                Some(word) if word == orig => {
                    if write_word(tid, slot, trampoline) {
                        stats.frames_hooked_again += 1;
                    }
                }
                _ => stats.slots_left_alone += 1,
            }
        }
    }

    /// The start of the command's `[uprobes]` mapping: the return-probe trampoline.
    fn trampoline(&mut self) -> Option<u64> {
        self.trampoline_of(Some(self.pid))
    }

    /// [`Repairer::trampoline`], read from process `pid`'s mappings if not known yet (a
    /// forked child has it where its parent had it).
    fn trampoline_of(&mut self, pid: Option<u32>) -> Option<u64> {
        if self.trampoline.is_none() {
            let maps = std::fs::read_to_string(format!("/proc/{}/maps", pid?)).ok()?;
            self.trampoline = maps
                .lines()
                .find(|l| l.trim_end().ends_with("[uprobes]"))
                .and_then(|l| u64::from_str_radix(l.split('-').next()?, 16).ok());
        }
        self.trampoline
    }
}
