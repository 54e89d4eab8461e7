//! What the arm64 end-to-end tests (`tests/tests/aarch64/`, issue 33) need besides the
//! machine (`vm`): the daemon cross-built for arm64, compiler-rt's arm64 XRay runtime for the
//! reference traces, and the source of a real C program to trace there (Lua).
//!
//! Everything is made once and kept: under `target/` (the daemon, the runtime) and the cache
//! directory (the Lua tarball, checked by its SHA-256).
use crate::{run, setup, vm};
use anyhow::{bail, Context as _, Result};
use std::path::PathBuf;
use std::process::Command;

/// The Rust target of the arm64 daemon.
pub const TARGET: &str = "aarch64-unknown-linux-gnu";

/// Lua 5.4.4's source, as Debian's archive keeps it (the upstream tarball, renamed).
const LUA_URL: &str = "http://deb.debian.org/debian/pool/main/l/lua5.4/lua5.4_5.4.4.orig.tar.gz";
const LUA_SHA256: &str = "164c7849653b80ae67bec4b7473b884bf5cc8d2dca05653475ec2ed27b9ebf61";
const LUA_DIR: &str = "lua-5.4.4";

/// Makes everything the arm64 tests use: the machine's image, the cross-built daemon, the
/// runtime and Lua's source.
pub fn prepare() -> Result<()> {
    vm::image()?;
    daemon()?;
    compiler_rt()?;
    lua_source()?;
    Ok(())
}

/// Builds the daemon for arm64 (release, static: the machine has no libc of its own) into
/// `target/aarch64-unknown-linux-gnu/release/fdr-profiled`.
pub fn daemon() -> Result<PathBuf> {
    run::status(Command::new("rustup").args(["target", "add", TARGET]))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run::status(
        Command::new(cargo)
            .args(["build", "--release", "--package", "profiler-daemon"])
            .args(["--target", TARGET])
            .env("CC_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-gcc")
            .env(
                "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
                "aarch64-linux-gnu-gcc",
            )
            .env(
                "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
                "-C target-feature=+crt-static",
            )
            .current_dir(run::workspace_root()),
    )?;
    Ok(run::target_dir()
        .join(TARGET)
        .join("release")
        .join("fdr-profiled"))
}

/// A clang resource directory for arm64 XRay builds: clang-19's own headers and Debian's
/// arm64 compiler-rt (`libclang-rt-19-dev`, the same version as the host's clang), so that
/// `clang --target=aarch64-linux-gnu -resource-dir=DIR -fxray-instrument` links XRay's
/// runtime as it does on x86-64. `target/vm/aarch64/clang-resource`.
pub fn compiler_rt() -> Result<PathBuf> {
    let dir = vm::dir();
    let resource = dir.join("clang-resource");
    let lib = resource.join("lib/linux");
    if lib.join("libclang_rt.xray-fdr-aarch64.a").is_file() {
        return Ok(resource);
    }
    let debs = vm::download(&dir, &["libclang-rt-19-dev"])?;
    let unpacked = dir.join("compiler-rt");
    let _ = std::fs::remove_dir_all(&unpacked);
    run::status(
        Command::new("dpkg-deb")
            .arg("-x")
            .arg(&debs[0])
            .arg(&unpacked),
    )?;
    let _ = std::fs::remove_dir_all(&resource);
    std::fs::create_dir_all(resource.join("lib"))?;
    let headers = run::output(Command::new("clang-19").arg("-print-resource-dir"))
        .context("clang-19 -print-resource-dir")?;
    std::os::unix::fs::symlink(
        PathBuf::from(headers.trim()).join("include"),
        resource.join("include"),
    )?;
    let runtime = unpacked.join("usr/lib/llvm-19/lib/clang/19/lib/linux");
    if !runtime.join("libclang_rt.xray-fdr-aarch64.a").is_file() {
        bail!(
            "libclang-rt-19-dev (arm64) has no XRay runtime at {}",
            runtime.display()
        );
    }
    std::os::unix::fs::symlink(&runtime, &lib)?;
    Ok(resource)
}

/// Lua's source, unpacked in the cache directory (`~/.cache/fdr-profiled/lua-5.4.4`).
pub fn lua_source() -> Result<PathBuf> {
    let dir = setup::cache_dir().join(LUA_DIR);
    if dir.join("src/lua.c").is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(setup::cache_dir())?;
    let tarball = setup::cache_dir().join(format!("{LUA_DIR}.tar.gz"));
    run::fetch_source(LUA_URL, LUA_SHA256, &tarball, &dir).context("Lua's source")?;
    Ok(dir)
}
