//! Rebuild the eBPF object when bpf-linker changes (a new LLVM can change the output).
fn main() {
    if let Ok(path) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
