//! Idempotent installation of everything the build and the tests need, one line of output per
//! action. A fresh CI machine has only stable Rust, rustup's nightly and Debian: this is the only
//! place that knows how to get from there to a machine that builds eBPF and runs the tests.
use crate::run;
use anyhow::{bail, Context as _, Result};
use std::path::PathBuf;
use std::process::Command;

/// Debian packages the build, the fixtures and the reference checks need: clang-19 compiles the
/// XRay fixtures (the runtime archive is in libclang-rt-19-dev), llvm-19 and llvm give
/// `llvm-xray` 19 and 14, the two reference readers every trace is checked with; bpftrace and
/// uftrace are the peer tools `cargo xtask bench` compares with.
const DEBIAN_PACKAGES: &[&str] = &[
    "clang-19",
    "libclang-rt-19-dev",
    "llvm-19",
    "llvm",
    "bpftrace",
    "uftrace",
    // Headless browser the viewer tests load speedscope (and our SVGs) in.
    "chromium",
    // `systemd-analyze verify` checks the service's unit; `setpriv` (util-linux) runs the
    // service with the unit's capability bounding set.
    "systemd",
    "util-linux",
    // `cargo xtask bench cxx_suite` builds yaml-cpp's own test suite: gtest and gmock, and its
    // source tarball fetched with curl and unpacked with xz.
    "libgtest-dev",
    "libgmock-dev",
    "curl",
    "xz-utils",
    // The terminal the `top` tests run the live view in, send keys to and read.
    "tmux",
    // AArch64 builds of the fixtures (issue 33): a cross linker and Debian's arm64 libc.
    "gcc-aarch64-linux-gnu",
    "g++-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    // `go tool pprof`, the reference reader of `convert --format pprof`.
    "golang-go",
    // nlohmann/json, a real C++ library's parser the exceptions tests trace
    // (tests/fixtures/json_parse.cpp).
    "nlohmann-json3-dev",
];

/// bpf-linker release line that works with aya-ebpf 0.2 (platform.md).
const BPF_LINKER_VERSION: &str = "^0.13";

/// Installs what is missing; prints what it found or did.
pub fn setup() -> Result<()> {
    nightly_rust_src()?;
    debian_packages(DEBIAN_PACKAGES)?;
    bpf_linker()?;
    cargo_deb()?;
    crate::viewers::install()?;
    Ok(())
}

/// cargo-deb release line `cargo xtask package` builds the Debian package with.
const CARGO_DEB_VERSION: &str = "^3";

/// cargo-deb, which builds the Debian package (`cargo xtask package`, and its test).
fn cargo_deb() -> Result<()> {
    if run::output(Command::new("cargo").args(["deb", "--version"])).is_some() {
        say("cargo-deb: present");
        return Ok(());
    }
    say("cargo-deb: missing, installing from crates.io (about half a minute)");
    run::status(Command::new("cargo").args([
        "install",
        "cargo-deb",
        "--locked",
        "--version",
        CARGO_DEB_VERSION,
    ]))
    .context("could not install cargo-deb (cargo install cargo-deb)")
}

fn say(msg: &str) {
    eprintln!("xtask setup: {msg}");
}

fn nightly_rust_src() -> Result<()> {
    let toolchains = run::output(Command::new("rustup").args(["toolchain", "list"]))
        .context("rustup is needed (the eBPF crate builds with rustup's nightly toolchain)")?;
    if toolchains.lines().any(|l| l.starts_with("nightly")) {
        say("nightly toolchain: present");
    } else {
        say("nightly toolchain: missing, installing");
        run::status(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))
        .context("could not install the nightly toolchain (rustup toolchain install nightly)")?;
    }
    let components = run::output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))
    .unwrap_or_default();
    if components
        .lines()
        .any(|l| l.trim() == "rust-src" || l.starts_with("rust-src"))
    {
        say("nightly rust-src: present");
    } else {
        say("nightly rust-src: missing, installing");
        run::status(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))
        .context("could not add rust-src to nightly (needed for -Z build-std=core)")?;
    }
    Ok(())
}

/// Installs those of `packages` that are missing (as root), or fails saying which.
pub fn debian_packages(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    if missing.is_empty() {
        say(&format!(
            "Debian packages: present ({})",
            packages.join(", ")
        ));
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "missing Debian packages {}: install them as root (apt-get install {})",
            missing.join(", "),
            missing.join(" ")
        );
    }
    say(&format!(
        "Debian packages: installing {}",
        missing.join(", ")
    ));
    run::status(Command::new("apt-get").args(["update", "-q"]))?;
    run::status(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(|| format!("could not install {}", missing.join(" ")))?;
    Ok(())
}

fn dpkg_installed(package: &str) -> bool {
    run::output(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_some_and(|s| s.trim() == "install ok installed")
}

/// bpf-linker must link against the same LLVM major as the nightly rustc that emits the bitcode.
/// It is built from crates.io against rustc's own libLLVM (platform.md): a directory holding
/// `libLLVM.so` and the soname, both pointing into the nightly sysroot, serves as LLVM_PREFIX.
/// A stamp file records which nightly it was built for, so a new nightly triggers a rebuild.
fn bpf_linker() -> Result<()> {
    let nightly = run::output(Command::new("rustc").args(["+nightly", "-vV"]))
        .context("`rustc +nightly -vV` failed")?;
    let llvm_major = nightly
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("`rustc +nightly -vV` does not say its LLVM version")?
        .to_owned();
    let cache = cache_dir();
    let stamp = cache.join("bpf-linker.stamp");
    let runs = run::output(Command::new("bpf-linker").arg("--version")).is_some();
    if runs && std::fs::read_to_string(&stamp).ok().as_deref() == Some(nightly.as_str()) {
        say(&format!(
            "bpf-linker: present, built for nightly's LLVM {llvm_major}"
        ));
        return Ok(());
    }
    say(&format!(
        "bpf-linker: building for LLVM {llvm_major} against the nightly's libLLVM (about a minute)"
    ));
    let sysroot = run::output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))
        .context("`rustc +nightly --print sysroot` failed")?;
    let libdir = PathBuf::from(sysroot.trim()).join("lib");
    let libllvm = std::fs::read_dir(&libdir)
        .with_context(|| format!("reading {}", libdir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libLLVM.so."))
        .with_context(|| format!("no libLLVM.so.* in {}", libdir.display()))?;
    let prefix = cache.join(format!("llvm-{llvm_major}-for-bpf-linker"));
    let prefix_lib = prefix.join("lib");
    std::fs::create_dir_all(&prefix_lib)
        .with_context(|| format!("creating {}", prefix_lib.display()))?;
    for name in ["libLLVM.so", libllvm.as_str()] {
        let link = prefix_lib.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(libdir.join(&libllvm), &link)
            .with_context(|| format!("creating symlink {}", link.display()))?;
    }
    run::status(
        Command::new("cargo")
            .args([
                "+stable",
                "install",
                "--force",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
            ])
            .args([
                "--no-default-features",
                "--features",
                &format!("llvm-{llvm_major}"),
            ])
            .env("LLVM_PREFIX", &prefix),
    )
    .context("building bpf-linker failed")?;
    std::fs::write(&stamp, &nightly).with_context(|| format!("writing {}", stamp.display()))?;
    say("bpf-linker: installed");
    Ok(())
}

/// Where set-up keeps what must outlive a build: bpf-linker's rpath points into it (and the
/// benchmarks keep what they build once).
pub(crate) fn cache_dir() -> PathBuf {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/root".into());
    home.join(".cache").join("fdr-profiled")
}
