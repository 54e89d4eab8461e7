//! What the eBPF programs need to know about the running kernel's own structures, read from
//! its BTF (`/sys/kernel/btf/vmlinux`) with the `btf-rs` crate: aya does not relocate field
//! accesses in Rust programs, so offsets are passed in as settings at load time.
use btf_rs::{Btf, Type};

/// Where the kernel describes its types.
const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The kernel's BTF, read whole and parsed from memory: `Btf::from_file` parses through a
/// `BufReader` that asks the file for its position (an `lseek` on sysfs) for every type, which
/// made reading it most of the daemon's start-up.
/// Parsed once until [`forget`]: loading the programs asks it for several offsets, and each
/// parse took tens of milliseconds (0.3 s of a recording's start).
fn vmlinux() -> Result<std::sync::Arc<Btf>, String> {
    let mut cached = PARSED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(btf) = &*cached {
        return Ok(btf.clone());
    }
    let bytes = std::fs::read(VMLINUX_BTF).map_err(|e| format!("reading {VMLINUX_BTF}: {e}"))?;
    let btf = std::sync::Arc::new(
        Btf::from_bytes(&bytes).map_err(|e| format!("reading {VMLINUX_BTF}: {e}"))?,
    );
    *cached = Some(btf.clone());
    Ok(btf)
}

static PARSED: std::sync::Mutex<Option<std::sync::Arc<Btf>>> = std::sync::Mutex::new(None);

/// Drops the parsed BTF (about 30 MiB here): call it once the programs are loaded, so that
/// a session does not keep it for its whole life. A later question parses it again.
pub fn forget() {
    PARSED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
}

/// Byte offset of `exit_code` in `struct task_struct`: how a thread's end tells that its
/// process died of a signal. `None` when the kernel has no BTF or the field is not where it is
/// expected (a top-level, byte-aligned member).
pub fn task_exit_code_offset() -> Option<u32> {
    let btf = vmlinux().ok()?;
    member_offset(&btf, "task_struct", "exit_code")
}

/// Byte offset of `pid` (the thread id) in `struct task_struct`: how `--follow-forks` names a
/// new process. `None` when the kernel has no BTF or no such field.
pub fn task_pid_offset() -> Option<u32> {
    let btf = vmlinux().ok()?;
    member_offset(&btf, "task_struct", "pid")
}

/// Where `--exits repair` finds a thread's pending return-probe instances (see
/// `profiler_common::RepairState`), its blocked signals and its signal handlers. All zero:
/// repair off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RepairOffsets {
    /// `task_struct.utask`.
    pub utask: u32,
    /// `uprobe_task.return_instances`.
    pub return_instances: u32,
    /// `return_instance.stack`, `.orig_ret_vaddr`, `.next`, `.func`.
    pub ri_stack: u32,
    pub ri_orig: u32,
    pub ri_next: u32,
    pub ri_func: u32,
    /// `task_struct.blocked`.
    pub blocked: u32,
    /// `task_struct.sighand`, `sighand_struct.action`, `sizeof(struct k_sigaction)`: the
    /// thread's signal handlers.
    pub sighand: u32,
    pub sighand_action: u32,
    pub k_sigaction_size: u32,
    /// `task_struct.pid`: the thread whose instances the `repair_release` iterator copies
    /// when a running process is let go.
    pub task_pid: u32,
}

/// The offsets `--exits repair` needs, or which one this kernel's BTF lacks.
pub fn repair_offsets() -> Result<RepairOffsets, String> {
    let btf = vmlinux()?;
    let find = |ty: &str, member: &str| {
        member_offset(&btf, ty, member)
            .ok_or_else(|| format!("the kernel's BTF has no {ty}.{member}"))
    };
    Ok(RepairOffsets {
        utask: find("task_struct", "utask")?,
        return_instances: find("uprobe_task", "return_instances")?,
        ri_stack: find("return_instance", "stack")?,
        ri_orig: find("return_instance", "orig_ret_vaddr")?,
        ri_next: find("return_instance", "next")?,
        ri_func: find("return_instance", "func")?,
        blocked: find("task_struct", "blocked")?,
        sighand: find("task_struct", "sighand")?,
        sighand_action: find("sighand_struct", "action")?,
        k_sigaction_size: struct_size(&btf, "k_sigaction")
            .ok_or("the kernel's BTF has no struct k_sigaction")?,
        task_pid: find("task_struct", "pid")?,
    })
}

/// Where the kernel counts a thread's pending return probes: `task_struct.utask`, then
/// `uprobe_task.depth` and `uprobe_task.return_instances`, and `return_instance.stack` (the
/// newest one's slot). The eBPF programs read them at each entry of a return-probed function.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DepthOffsets {
    pub utask: u32,
    pub depth: u32,
    pub return_instances: u32,
    pub ri_stack: u32,
}

/// [`DepthOffsets`] from this kernel's BTF; `None` when one is missing.
pub fn depth_offsets() -> Option<DepthOffsets> {
    let btf = vmlinux().ok()?;
    Some(DepthOffsets {
        utask: member_offset(&btf, "task_struct", "utask")?,
        depth: member_offset(&btf, "uprobe_task", "depth")?,
        return_instances: member_offset(&btf, "uprobe_task", "return_instances")?,
        ri_stack: member_offset(&btf, "return_instance", "stack")?,
    })
}

/// Where a thread's return-probe trampoline is: `task_struct.mm`, then
/// `mm_struct.uprobes_state.xol_area`, then `xol_area.vaddr`. The eBPF programs compare a
/// frame's return-address slot with it to tell a tail call from a new call at the same slot,
/// as the kernel does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrampolineOffsets {
    pub task_mm: u32,
    pub mm_xol_area: u32,
    pub xol_vaddr: u32,
}

/// [`TrampolineOffsets`] from this kernel's BTF; `None` when one is missing.
pub fn trampoline_offsets() -> Option<TrampolineOffsets> {
    let btf = vmlinux().ok()?;
    Some(TrampolineOffsets {
        task_mm: member_offset(&btf, "task_struct", "mm")?,
        mm_xol_area: member_offset(&btf, "mm_struct", "uprobes_state")?
            + member_offset(&btf, "uprobes_state", "xol_area")?,
        xol_vaddr: member_offset(&btf, "xol_area", "vaddr")?,
    })
}

/// The size of `struct ty` in bytes.
fn struct_size(btf: &Btf, ty: &str) -> Option<u32> {
    btf.resolve_types_by_name(ty)
        .ok()?
        .iter()
        .find_map(|t| match t {
            Type::Struct(s) => u32::try_from(s.size()).ok(),
            _ => None,
        })
}

/// Byte offset of the byte-aligned member `member` of `struct ty`, looking into its anonymous
/// structs and unions (where `mm_struct` keeps most of its fields).
/// Where `process_exec` finds the inode number of the file an exec runs:
/// `linux_binprm.file`, `file.f_inode`, `inode.i_ino`. `None` when one is missing.
pub fn exec_offsets() -> Option<[u32; 3]> {
    let btf = vmlinux().ok()?;
    Some([
        member_offset(&btf, "linux_binprm", "file")?,
        member_offset(&btf, "file", "f_inode")?,
        member_offset(&btf, "inode", "i_ino")?,
    ])
}

fn member_offset(btf: &Btf, ty: &str, member: &str) -> Option<u32> {
    let types = btf.resolve_types_by_name(ty).ok()?;
    types.iter().find_map(|t| find_member(btf, t, member, 0, 4))
}

fn find_member(btf: &Btf, t: &Type, member: &str, base: u32, depth: u32) -> Option<u32> {
    let members = match t {
        Type::Struct(s) | Type::Union(s) => &s.members,
        _ => return None,
    };
    for m in members {
        let bits = m.bit_offset();
        let name = btf.resolve_name(m).unwrap_or_default();
        if name == member {
            return (bits % 8 == 0).then_some(base + bits / 8);
        }
        if name.is_empty() && depth > 0 && bits % 8 == 0 {
            if let Ok(inner) = btf.resolve_chained_type(m) {
                if let Some(at) = find_member(btf, &inner, member, base + bits / 8, depth - 1) {
                    return Some(at);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn finds_exit_code_in_this_kernel() {
        // Every kernel this project supports has BTF (README: requirements).
        let offset = super::task_exit_code_offset().expect("task_struct.exit_code in the BTF");
        assert!(offset > 0 && offset < 16384, "{offset}");
    }

    #[test]
    fn finds_the_trampoline_in_this_kernel() {
        let o = super::trampoline_offsets()
            .expect("task_struct.mm, mm_struct.uprobes_state, xol_area.vaddr");
        assert!(
            o.task_mm > 0 && o.mm_xol_area > 0 && o.xol_vaddr > 0,
            "{o:?}"
        );
    }

    #[test]
    fn finds_what_repair_reads_in_this_kernel() {
        let o = super::repair_offsets().expect("the repair offsets in the BTF");
        assert!(o.utask > 0 && o.blocked > 0, "{o:?}");
        // Three distinct fields of one small struct.
        let mut ri = [o.ri_stack, o.ri_orig, o.ri_next, o.ri_func];
        ri.sort_unstable();
        assert!(ri.windows(2).all(|w| w[0] < w[1]) && ri[3] < 256, "{o:?}");
        // x86-64: struct k_sigaction is a struct sigaction (handler, flags, restorer, mask),
        // 32 bytes; sighand_struct keeps its 64 actions after its count and lock.
        assert_eq!(o.k_sigaction_size, 32, "{o:?}");
        assert!(o.sighand > 0 && o.sighand_action > 0, "{o:?}");
        assert!(o.task_pid > 0, "{o:?}");
    }
}
