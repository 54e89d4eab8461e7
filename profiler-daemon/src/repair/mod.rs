//! Stage 5, `--exits repair`: return probes on every function, made safe for exceptions by
//! repairing the traced process's stack at each throw, from outside it.
//!
//! - [`keeper`]: the process's ptrace tracer (a process of its own, `fdr-repair`): started,
//!   asked to let a running process go, its report read. Inside it, `repairer` serves every
//!   stop (the repairs at throws and catches, the forks it follows, the release with no frame
//!   left hooked), through the system calls of `ptrace`; `stops` places the throw and catch
//!   stops it serves, and `release` is how fdr-profiled and the keeper talk.
//! - [`processes`]: every process that runs one executable (`--attach`, the service's
//!   targets), each traced by a keeper of its own before any probe of it is placed; [`hold`]
//!   holds each new one from its exec until its keeper has it.
pub mod hold;
pub mod keeper;
pub mod processes;
pub(crate) mod ptrace;
mod release;
mod repairer;
pub mod resumption;
mod stops;

/// What the programs of the stack repair need of this kernel, for a repair asked for by name
/// (`what`: `--exits repair`, a target's `exits = "repair"`); refused in one line, prefixed
/// with `what`, where the repair is not for this architecture or the kernel's BTF does not
/// say where the repair reads.
pub fn offsets_for(what: &str) -> anyhow::Result<crate::kernel::btf::RepairOffsets> {
    crate::arch::repair_applies(what)?;
    crate::kernel::btf::repair_offsets().map_err(|why| anyhow::anyhow!("{what}: {why}"))
}

/// Whether `--exits auto` (a target's `exits = "auto"`) repairs the stack of the processes
/// running `image`, and why: the image can unwind (the object with a personality routine, and
/// the routine) and throws through a raise function the keeper can stop at, this kernel has
/// what repair needs (its BTF, `uprobe_multi` links), and fdr-profiled may trace any process
/// (`CAP_SYS_PTRACE`). `every_process`: `--attach` and the
/// service, where each new process must also be held from its exec (see [`hold`]), or its
/// first calls, and a short process whole, would not be recorded: per-function records every
/// process from its first instruction.
pub fn auto_repairs(
    image: &[std::path::PathBuf],
    every_process: bool,
) -> Option<(std::path::PathBuf, &'static str)> {
    // Not for this architecture (arm64: exit sleds are as cheap as return probes there).
    crate::arch::repair_applies("--exits auto").ok()?;
    let (path, symbol) = crate::plan::exits::unwinder(image)?;
    let throws = image
        .iter()
        .any(|o| !crate::plan::catches::throw_points(o).is_empty());
    let kernel = crate::kernel::btf::repair_offsets().is_ok()
        && crate::kernel::uprobe_multi::supported()
        && (!every_process || crate::kernel::btf::exec_offsets().is_some());
    // The keepers trace processes of any user (the service's unit keeps CAP_SYS_PTRACE for it;
    // without it, per-function needs no tracer).
    let ptrace = crate::kernel::caps::effective().is_ok_and(|eff| {
        crate::kernel::caps::missing(eff, &[crate::kernel::caps::Cap::SysPtrace]).is_empty()
    });
    (throws && kernel && ptrace).then(|| (path.clone(), symbol))
}

/// The reason `auto` gives when it chose repair (see [`auto_repairs`]).
pub fn auto_reason(unwinder: &std::path::Path, symbol: &str) -> String {
    format!(
        "auto: {} has {symbol}: return probes everywhere, the stack repaired at each \
         throw (--exits per-function decides each function instead, without a tracer)",
        unwinder.display()
    )
}
