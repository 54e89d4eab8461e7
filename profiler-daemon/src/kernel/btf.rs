//! What the eBPF programs need to know about the running kernel's own structures, read from
//! its BTF (`/sys/kernel/btf/vmlinux`) with the `btf-rs` crate: aya does not relocate field
//! accesses in Rust programs, so offsets are passed in as settings at load time.
use btf_rs::{Btf, Type};

/// Where the kernel describes its types.
const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Byte offset of `exit_code` in `struct task_struct`: how a thread's end tells that its
/// process died of a signal. `None` when the kernel has no BTF or the field is not where it is
/// expected (a top-level, byte-aligned member).
pub fn task_exit_code_offset() -> Option<u32> {
    let btf = Btf::from_file(VMLINUX_BTF).ok()?;
    member_offset(&btf, "task_struct", "exit_code")
}

/// Where `--exits repair` finds a thread's pending return-probe instances (see
/// `profiler_common::RepairState`) and its blocked signals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RepairOffsets {
    /// `task_struct.utask`.
    pub utask: u32,
    /// `uprobe_task.return_instances`.
    pub return_instances: u32,
    /// `return_instance.stack`, `.orig_ret_vaddr`, `.next`.
    pub ri_stack: u32,
    pub ri_orig: u32,
    pub ri_next: u32,
    /// `task_struct.blocked`.
    pub blocked: u32,
}

/// The offsets `--exits repair` needs, or which one this kernel's BTF lacks.
pub fn repair_offsets() -> Result<RepairOffsets, String> {
    let btf = Btf::from_file(VMLINUX_BTF).map_err(|e| format!("reading {VMLINUX_BTF}: {e}"))?;
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
        blocked: find("task_struct", "blocked")?,
    })
}

/// Byte offset of the top-level, byte-aligned member `member` of `struct ty`.
fn member_offset(btf: &Btf, ty: &str, member: &str) -> Option<u32> {
    let types = btf.resolve_types_by_name(ty).ok()?;
    types.iter().find_map(|t| {
        let Type::Struct(s) = t else { return None };
        s.members.iter().find_map(|m| {
            let name = btf.resolve_name(m).ok()?;
            let bits = m.bit_offset();
            (name == member && bits % 8 == 0).then_some(bits / 8)
        })
    })
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
    fn finds_what_repair_reads_in_this_kernel() {
        let o = super::repair_offsets().expect("the repair offsets in the BTF");
        assert!(o.utask > 0 && o.blocked > 0, "{o:?}");
        // Three distinct fields of one small struct.
        let mut ri = [o.ri_stack, o.ri_orig, o.ri_next];
        ri.sort_unstable();
        assert!(ri[0] < ri[1] && ri[1] < ri[2] && ri[2] < 256, "{o:?}");
    }
}
