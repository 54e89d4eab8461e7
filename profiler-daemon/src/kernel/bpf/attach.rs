//! Placing the probes of an [`AttachPlan`] and removing them again: the sleds' uprobes
//! (`uprobe_multi` links where the kernel has them, perf events otherwise), return probes,
//! the catch probes and the process-start probe, each set kept as an [`Attachment`].
use super::{one_line, uprobe, Attachment, Scope, Tracer};
use crate::kernel::uprobe_multi::{self, MultiLink};
use crate::plan::{AttachPlan, Probe};
use anyhow::{anyhow, bail, Result};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use profiler_common::{
    cookie_flags, event_kind, Cookie, SledKind, FLOOR_PROGRAM, FLOOR_RETURN_PROGRAM,
    PROCESS_START_PROGRAM, RETURN_PROGRAM, SLED_PROGRAM, STARTED_MAP,
};
use std::path::Path;

/// The probes to place for `probes`: at the sleds (exits first, see [`Tracer::attach`]),
/// and the return probes of the functions marked `RETURN_PROBED`, at their entries.
fn split_probes(probes: &[Probe]) -> (Vec<Probe>, Vec<Probe>) {
    let mut sleds = Vec::new();
    let mut returns = Vec::new();
    for probe in probes {
        let kind = SledKind::from_u8(probe.cookie.kind);
        match (kind, probe.cookie.return_probed()) {
            (Some(SledKind::Exit), true) => {}
            (Some(k), true) if k.is_entry() => {
                sleds.push(*probe);
                returns.push(Probe {
                    file_offset: probe.file_offset,
                    cookie: Cookie::new(probe.cookie.function_id, SledKind::Exit)
                        .with_flags(cookie_flags::RETURN_PROBED),
                });
            }
            (Some(_), _) => sleds.push(*probe),
            (None, _) => {}
        }
    }
    sleds.sort_by_key(|p| SledKind::from_u8(p.cookie.kind).is_some_and(SledKind::is_entry));
    (sleds, returns)
}

impl Tracer {
    /// Places the plan's probes: for a function marked `RETURN_PROBED` (see `plan::exits`), a
    /// return probe at its entry instead of probes on its exit sleds. Exit-side probes go first:
    /// a process keeps running while probes are placed one at a time, and this order can only
    /// produce exits without entries (dropped and counted), never entries without exits.
    /// Returns how many probes were placed.
    pub fn attach(&mut self, plan: &AttachPlan, scope: Scope) -> Result<usize> {
        let (placed, returns) = self.attach_keeping_returns(plan, scope)?;
        self.attachment.extend(returns);
        Ok(placed)
    }

    /// [`Tracer::attach`], keeping the return probes apart: returns how many probes were placed
    /// and the return probes' links (not in [`Tracer::take_attachment`]'s set), which
    /// [`Tracer::exit_sleds_instead`] can remove.
    pub fn attach_keeping_returns(
        &mut self,
        plan: &AttachPlan,
        scope: Scope,
    ) -> Result<(usize, Attachment)> {
        let scope = UProbeScope::from(scope);
        let (sled_prog, return_prog) = self.sled_programs();
        let (sleds, returns) = split_probes(&plan.probes);
        let before = self.take_attachment();
        let placed_returns = self.place(return_prog, &returns, &plan.binary, scope);
        let return_links = std::mem::replace(&mut self.attachment, before);
        let placed =
            placed_returns.and_then(|()| self.place(sled_prog, &sleds, &plan.binary, scope));
        if let Err(err) = placed {
            // What was placed stays in the set a failed attach is removed with.
            self.attachment.extend(return_links);
            return Err(err);
        }
        Ok((sleds.len() + returns.len(), return_links))
    }

    /// Places `probes` (some of a plan's, with the cookies the plan gave them) of `binary`
    /// as a set of their own, which [`Tracer::detach`] or [`Tracer::detach_later`] removes
    /// again: the overhead budget's unit, one function's probes. Returns how many probes were
    /// placed, and the set. Not in [`Tracer::take_attachment`]'s set; nothing stays placed
    /// when it fails.
    pub fn attach_probes(
        &mut self,
        binary: &Path,
        probes: &[Probe],
        scope: Scope,
    ) -> Result<(usize, Attachment)> {
        let scope = UProbeScope::from(scope);
        let (sled_prog, return_prog) = self.sled_programs();
        let (sleds, returns) = split_probes(probes);
        let before = self.take_attachment();
        let placed = self
            .place(return_prog, &returns, binary, scope)
            .and_then(|()| self.place(sled_prog, &sleds, binary, scope));
        let set = std::mem::replace(&mut self.attachment, before);
        match placed {
            Ok(()) => Ok((sleds.len() + returns.len(), set)),
            Err(err) => {
                self.detach(set);
                Err(err)
            }
        }
    }

    /// The programs at sleds and at return probes.
    fn sled_programs(&self) -> (&'static str, &'static str) {
        if self.options.floor {
            (FLOOR_PROGRAM, FLOOR_RETURN_PROGRAM)
        } else {
            (SLED_PROGRAM, RETURN_PROGRAM)
        }
    }

    /// Observes the exits of `plan`'s return-probed functions by their exit sleds from now on:
    /// places those sleds' probes, then removes `returns` (the plan's return probes, from
    /// [`Tracer::attach_keeping_returns`]). Frames hooked before go on returning through the
    /// kernel's trampoline, unseen; their exit sleds report them.
    pub fn exit_sleds_instead(
        &mut self,
        plan: &AttachPlan,
        returns: Attachment,
        scope: Scope,
    ) -> Result<usize> {
        let exits: Vec<Probe> = plan
            .probes
            .iter()
            .filter(|p| p.cookie.kind == SledKind::Exit as u8 && p.cookie.return_probed())
            .map(|p| Probe {
                file_offset: p.file_offset,
                cookie: Cookie {
                    flags: p.cookie.flags & !cookie_flags::RETURN_PROBED,
                    ..p.cookie
                },
            })
            .collect();
        let program = if self.options.floor {
            FLOOR_PROGRAM
        } else {
            SLED_PROGRAM
        };
        self.place(program, &exits, &plan.binary, UProbeScope::from(scope))?;
        self.detach(returns);
        Ok(exits.len())
    }

    /// Places the catch probe (see `plan::catches`) at `file_offset` of `object`, for the
    /// threads that have traced state.
    pub fn attach_catch(&mut self, object: &Path, file_offset: u64, scope: Scope) -> Result<()> {
        if self.options.floor {
            return Ok(());
        }
        let scope = UProbeScope::from(scope);
        let probe = Probe {
            file_offset,
            cookie: Cookie {
                function_id: 0,
                kind: event_kind::CATCH,
                regs: [0; 3],
                flags: 0,
            },
        };
        self.place(SLED_PROGRAM, &[probe], object, scope)
    }

    /// `--exits repair --attach`: places the `process_start` probe at `file_offset` of the
    /// traced executable (its entry point), for every process; [`Tracer::started_processes`]
    /// names them with `tag`.
    pub fn attach_process_start(
        &mut self,
        binary: &Path,
        file_offset: u64,
        tag: u32,
    ) -> Result<()> {
        let probe = Probe {
            file_offset,
            cookie: Cookie {
                function_id: tag,
                kind: 0,
                regs: [0; 3],
                flags: 0,
            },
        };
        self.place(
            PROCESS_START_PROGRAM,
            &[probe],
            binary,
            UProbeScope::AllProcesses,
        )
    }

    /// The processes that started running a traced executable since the last call, as
    /// `(tag, pid)` (see [`Tracer::attach_process_start`]), oldest first.
    pub fn started_processes(&mut self) -> Vec<(u32, u32)> {
        let Some(map) = self.ebpf.map_mut(STARTED_MAP) else {
            return Vec::new();
        };
        let Ok(mut queue) = aya::maps::Queue::<_, u64>::try_from(map) else {
            return Vec::new();
        };
        std::iter::from_fn(|| queue.pop(0).ok())
            .take(4096)
            .map(|v| ((v >> 32) as u32, v as u32))
            .collect()
    }

    pub(super) fn place(
        &mut self,
        program: &'static str,
        probes: &[Probe],
        binary: &Path,
        scope: UProbeScope,
    ) -> Result<()> {
        if probes.is_empty() {
            return Ok(());
        }
        if let Some((_, multi)) = self.multi.iter().find(|(name, _)| *name == program) {
            let offsets: Vec<u64> = probes.iter().map(|p| p.file_offset).collect();
            let cookies: Vec<u64> = probes.iter().map(|p| p.cookie.encode()).collect();
            let pid = match scope {
                UProbeScope::OneProcess(pid) => Some(pid),
                _ => None,
            };
            let link = uprobe_multi::attach(
                multi.fd(),
                binary,
                &offsets,
                &cookies,
                pid,
                multi.is_return(),
            )
            .map_err(|e| {
                anyhow!(
                    "cannot place {} uprobes in {}: {e}",
                    probes.len(),
                    binary.display()
                )
            })?;
            self.attachment.multi.push(self.links.len());
            self.links.push(Some(link));
            return Ok(());
        }
        crate::kernel::rlimit::reserve_open_files(probes.len())?;
        let program_name = program;
        let program = uprobe(&mut self.ebpf, program)?;
        for probe in probes {
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(probe.file_offset),
                cookie: Some(probe.cookie.encode()),
            };
            let id = program.attach(point, binary, scope).map_err(|e| {
                anyhow!(
                    "cannot place a uprobe at offset {:#x} of {}: {}",
                    probe.file_offset,
                    binary.display(),
                    one_line(&e)
                )
            })?;
            self.attachment.perf.push((program_name, id));
        }
        Ok(())
    }

    /// Everything placed since the last call (by [`Tracer::attach`] and
    /// [`Tracer::attach_catch`]): what [`Tracer::detach`] removes.
    pub fn take_attachment(&mut self) -> Attachment {
        std::mem::take(&mut self.attachment)
    }

    /// The file descriptors of `attachment`'s links, for a process that must keep its probes
    /// in place after ours ends (`repair::keeper::Keeper`). None for perf-event links: aya
    /// keeps those to itself.
    pub fn link_fds(&self, attachment: &Attachment) -> Result<Vec<std::os::fd::RawFd>> {
        if !attachment.perf.is_empty() {
            bail!("the probes are perf-event links");
        }
        Ok(attachment
            .multi
            .iter()
            .filter_map(|&slot| self.links.get(slot)?.as_ref())
            .flat_map(|link| link.raw_fds())
            .collect())
    }

    /// Removes the probes of `attachment`, leaving every other probe in place.
    pub fn detach(&mut self, attachment: Attachment) {
        drop(self.detach_later(attachment));
    }

    /// [`Tracer::detach`], handing back the `uprobe_multi` links instead of closing them: the
    /// probes go when the links are dropped. The kernel takes its time removing uprobes (a
    /// grace period per link: about 50 ms each measured here), which an event loop must not
    /// wait for; drop them on another thread. Perf-event links are removed here.
    #[must_use = "the probes stay in place until the links are dropped"]
    pub fn detach_later(&mut self, attachment: Attachment) -> Vec<MultiLink> {
        let links = attachment
            .multi
            .into_iter()
            .filter_map(|slot| self.links.get_mut(slot)?.take())
            .collect();
        for (program, id) in attachment.perf {
            if let Ok(p) = uprobe(&mut self.ebpf, program) {
                let _ = p.detach(id);
            }
        }
        links
    }
}
