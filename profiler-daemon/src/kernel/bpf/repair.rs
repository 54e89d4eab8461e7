//! What `--exits repair` and `--follow-forks` ask of the loaded programs: the unwind stops,
//! the per-thread repair state, the program that lets a process go, the processes followed.
use super::{one_line, ExecReports, PodRepairState, PodStopKey, PodStopTime, Scope, Tracer};
use crate::plan::Probe;
use anyhow::{anyhow, bail, Context as _, Result};
use aya::maps::{HashMap as BpfHashMap, MapData};
use aya::programs::uprobe::UProbeScope;
use profiler_common::{
    Cookie, ENTERED_MAP, EXECS_MAP, EXEC_WATCHED_MAP, FOLLOWED_MAP, PROCESS_EXEC_PROGRAM,
    REPAIRS_MAP, REPAIR_RELEASE_PROGRAM, STOP_TIMES_MAP, UNHOOK_MAP, UNWIND_STOP_PROGRAM,
};
use std::path::Path;

impl Tracer {
    /// `--exits repair --attach`, the service's repaired targets: has `process_exec` report
    /// every exec of `executable` (by its inode number) with `tag`. The first call attaches
    /// the program (raw tracepoint `sched_process_exec`) and returns the ring it reports into,
    /// with the map of the processes that ran the entry point since their exec, for
    /// `repair::hold`; later calls return `None`. An error when this kernel's BTF lacks
    /// what the program reads, or the tracer was loaded without repair.
    pub fn watch_execs(&mut self, executable: &Path, tag: u32) -> Result<Option<ExecReports>> {
        use std::os::unix::fs::MetadataExt as _;
        if self.options.repair.is_none() || crate::kernel::btf::exec_offsets().is_none() {
            bail!("this kernel's BTF does not say where an exec's file is");
        }
        let ino = std::fs::metadata(executable)
            .with_context(|| format!("{}", executable.display()))?
            .ino();
        let mut watched: BpfHashMap<_, u64, u32> = BpfHashMap::try_from(
            self.ebpf
                .map_mut(EXEC_WATCHED_MAP)
                .context("the eBPF object has no exec-watch map")?,
        )?;
        watched
            .insert(ino, tag, 0)
            .context("watching the executable's execs")?;
        let Some(map) = self.ebpf.take_map(EXECS_MAP) else {
            return Ok(None);
        };
        let program: &mut aya::programs::RawTracePoint = self
            .ebpf
            .program_mut(PROCESS_EXEC_PROGRAM)
            .with_context(|| format!("the eBPF object has no {PROCESS_EXEC_PROGRAM} program"))?
            .try_into()?;
        program.load().map_err(|e| {
            anyhow!(
                "the kernel refused the {PROCESS_EXEC_PROGRAM} program: {}",
                one_line(&e)
            )
        })?;
        program.attach("sched_process_exec").map_err(|e| {
            anyhow!(
                "cannot attach to the sched_process_exec tracepoint: {}",
                one_line(&e)
            )
        })?;
        let entered = self
            .ebpf
            .take_map(ENTERED_MAP)
            .context("the eBPF object has no map of entered processes")?;
        Ok(Some(ExecReports {
            execs: aya::maps::RingBuf::try_from(map)?,
            entered: BpfHashMap::try_from(entered)?,
        }))
    }

    /// `--exits repair`: places the `unwind_stop` probe at `file_offset` of `object`, as a throw
    /// point (`event_kind::THROW`) or a catch point (`event_kind::CATCH`); returns its cookie.
    pub fn attach_unwind_stop(
        &mut self,
        object: &Path,
        file_offset: u64,
        kind: u8,
        scope: Scope,
    ) -> Result<u64> {
        let probe = Probe {
            file_offset,
            cookie: Cookie {
                function_id: 0,
                kind,
                regs: [0; 3],
                flags: 0,
            },
        };
        self.place(
            UNWIND_STOP_PROGRAM,
            &[probe],
            object,
            UProbeScope::from(scope),
        )?;
        Ok(probe.cookie.encode())
    }

    /// `--exits repair`: the maps a repair keeper writes (each keeper gets handles of its own
    /// on the one table of each).
    pub fn take_repairs(&mut self) -> Result<RepairMaps> {
        let (repairs, repairs_fd) = self.own_handle(REPAIRS_MAP)?;
        let (stop_times, stop_times_fd) = self.own_handle(STOP_TIMES_MAP)?;
        let (unhook, unhook_fd) = self.own_handle(UNHOOK_MAP)?;
        Ok(RepairMaps {
            repairs: BpfHashMap::try_from(repairs)?,
            stop_times: BpfHashMap::try_from(stop_times)?,
            unhook: BpfHashMap::try_from(unhook)?,
            fds: [repairs_fd, stop_times_fd, unhook_fd],
        })
    }

    /// A handle of its own on the hash map `name`, and its descriptor.
    fn own_handle(&self, name: &str) -> Result<(aya::maps::Map, std::os::fd::RawFd)> {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        let map = self
            .ebpf
            .map(name)
            .with_context(|| format!("the eBPF object has no {name} map"))?;
        let aya::maps::Map::HashMap(data) = map else {
            bail!("the {name} map is not a hash map");
        };
        let fd = data
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .with_context(|| format!("duplicating the {name} map's descriptor"))?;
        let data = MapData::from_fd(fd)?;
        let raw = data.fd().as_fd().as_raw_fd();
        Ok((aya::maps::Map::HashMap(data), raw))
    }

    /// `--exits repair`: the time the traced threads spent stopped for their repair so far,
    /// by process and hooked function (what the keepers wrote; see
    /// [`profiler_common::STOP_TIMES_MAP`]). Empty when the programs have no such map.
    pub fn stop_times(&self) -> Vec<(profiler_common::StopKey, profiler_common::StopTime)> {
        let Some(map) = self.ebpf.map(STOP_TIMES_MAP) else {
            return Vec::new();
        };
        let Ok(map) = BpfHashMap::<_, PodStopKey, PodStopTime>::try_from(map) else {
            return Vec::new();
        };
        map.iter()
            .filter_map(|entry| entry.ok())
            .map(|(k, v)| (k.0, v.0))
            .collect()
    }

    /// Forgets these stop times and unhook marks (of processes gone).
    pub fn forget_stop_times(&mut self, keys: &[profiler_common::StopKey]) {
        if let Some(Ok(mut map)) = self
            .ebpf
            .map_mut(STOP_TIMES_MAP)
            .map(BpfHashMap::<_, PodStopKey, PodStopTime>::try_from)
        {
            for key in keys {
                let _ = map.remove(&PodStopKey(*key));
            }
        }
        for key in keys {
            self.unhook(*key, false);
        }
    }

    /// Has the repair keepers leave the frames of `key`'s function unhooked at catches
    /// (`unhook`), or hook them again as before (see [`profiler_common::UNHOOK_MAP`]).
    pub fn unhook(&mut self, key: profiler_common::StopKey, unhook: bool) {
        let Some(Ok(mut map)) = self
            .ebpf
            .map_mut(UNHOOK_MAP)
            .map(BpfHashMap::<_, PodStopKey, u8>::try_from)
        else {
            return;
        };
        let _ = if unhook {
            map.insert(PodStopKey(key), 1, 0)
        } else {
            map.remove(&PodStopKey(key))
        };
    }
}

/// The maps a repair keeper uses: the stopped threads' [`RepairState`], the time their stops
/// took ([`profiler_common::STOP_TIMES_MAP`]), the functions whose frames it leaves unhooked
/// ([`profiler_common::UNHOOK_MAP`]); their descriptors, for the keeper to keep.
pub struct RepairMaps {
    pub repairs: BpfHashMap<MapData, u32, PodRepairState>,
    pub stop_times: BpfHashMap<MapData, PodStopKey, PodStopTime>,
    pub unhook: BpfHashMap<MapData, PodStopKey, u8>,
    pub fds: [std::os::fd::RawFd; 3],
}

impl Tracer {
    /// `--exits repair`: the `repair_release` task iterator program (loaded at the first
    /// call), for the repair keeper to run over the threads of each process it lets go (see
    /// `kernel::task_iter` and `profiler_common::repair_state::RELEASE`).
    pub fn release_program_fd(&mut self) -> Result<std::os::fd::RawFd> {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        let program: &mut aya::programs::Iter = self
            .ebpf
            .program_mut(REPAIR_RELEASE_PROGRAM)
            .with_context(|| format!("the eBPF object has no {REPAIR_RELEASE_PROGRAM} program"))?
            .try_into()?;
        if program.fd().is_err() {
            let btf = aya::Btf::from_sys_fs().context("reading the kernel's BTF")?;
            program.load("task", &btf).map_err(|e| {
                anyhow!(
                    "the kernel refused the {REPAIR_RELEASE_PROGRAM} program: {}",
                    one_line(&e)
                )
            })?;
        }
        Ok(program.fd()?.as_fd().as_raw_fd())
    }

    /// `--exits repair`: the `unwind_stop` program as loaded for `uprobe_multi` links, for the
    /// repair keeper to place the throw and catch stops of the processes the traced one forks.
    pub fn unwind_stop_program_fd(&self) -> Result<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd as _;
        self.multi
            .iter()
            .find(|(name, _)| *name == UNWIND_STOP_PROGRAM)
            .map(|(_, program)| program.fd().as_raw_fd())
            .context("the unwind_stop program is not loaded for uprobe_multi links")
    }

    /// `--follow-forks`: records process `pid` (and, from now on, the processes it forks).
    pub fn follow(&mut self, pid: u32) -> Result<()> {
        let mut followed: BpfHashMap<_, u32, u32> = self
            .ebpf
            .map_mut(FOLLOWED_MAP)
            .with_context(|| format!("the eBPF object has no {FOLLOWED_MAP} map"))?
            .try_into()?;
        followed
            .insert(pid, 1, 0)
            .with_context(|| format!("following process {pid}"))
    }
}
