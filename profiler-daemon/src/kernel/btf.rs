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
    let types = btf.resolve_types_by_name("task_struct").ok()?;
    types.iter().find_map(|t| {
        let Type::Struct(s) = t else { return None };
        s.members.iter().find_map(|m| {
            let name = btf.resolve_name(m).ok()?;
            let bits = m.bit_offset();
            (name == "exit_code" && bits % 8 == 0).then_some(bits / 8)
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
}
