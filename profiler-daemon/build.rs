//! Builds the eBPF programs (crate `profiler-ebpf`) for `bpfel-unknown-none` with the nightly
//! toolchain and bpf-linker, and leaves the object in `OUT_DIR/profiler` for `include_bytes!`.
//! `cargo xtask setup` installs what this needs.
use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
    let meta = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or_else(|| anyhow!("profiler-daemon has no parent directory"))?
        .join("profiler-ebpf");
    let root_dir = meta.to_str().context("non-UTF-8 path to profiler-ebpf")?;
    let package = aya_build::Package {
        name: "profiler-ebpf",
        root_dir,
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::default()).context(
        "building the eBPF programs failed; run `cargo xtask setup` to install the nightly \
         rust-src component and bpf-linker",
    )
}
