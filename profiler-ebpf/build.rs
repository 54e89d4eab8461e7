//! Rebuild the eBPF object when bpf-linker changes (a new LLVM can change the output).
fn main() {
    // aya-build passes `--cfg bpf_target_arch="..."` (regs.rs); tell rustc's cfg checker.
    println!(
        "cargo::rustc-check-cfg=cfg(bpf_target_arch, values(\"x86_64\", \"aarch64\", \"arm\", \"riscv64\", \"powerpc64\", \"s390x\", \"mips\", \"loongarch64\"))"
    );
    if let Ok(path) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
