//! The trace viewers and readers the tests load our output into: speedscope, from the npm
//! registry, into `~/.cache/fdr-profiled/speedscope` (run in headless Chromium, a Debian
//! package installed with the others by `setup`); Perfetto's Python package, whose generated
//! `perfetto_trace_pb2` decodes `convert --format perfetto`'s packets, from PyPI into
//! `~/.cache/fdr-profiled/perfetto-py`. Idempotent: a present install of the pinned version is
//! kept.
use crate::run;
use anyhow::{bail, Context as _, Result};
use std::path::PathBuf;
use std::process::Command;

/// The speedscope release the viewer tests are written against.
pub const SPEEDSCOPE_VERSION: &str = "1.25.0";

/// The `perfetto` PyPI release whose protos the Perfetto test decodes with.
pub const PERFETTO_PY_VERSION: &str = "0.59.1";

fn cache_dir(name: &str) -> PathBuf {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/root".into());
    home.join(".cache").join("fdr-profiled").join(name)
}

/// Where speedscope is installed (an npm prefix); the tests look for it here too.
pub fn speedscope_dir() -> PathBuf {
    cache_dir("speedscope")
}

/// Installs the viewers and readers the tests need.
pub fn install() -> Result<()> {
    speedscope()?;
    perfetto_py()
}

/// Installs Perfetto's Python package (with the protobuf runtime it needs) into
/// `~/.cache/fdr-profiled/perfetto-py` unless the pinned version is there; the tests put that
/// directory on `PYTHONPATH`.
fn perfetto_py() -> Result<()> {
    let dir = cache_dir("perfetto-py");
    let stamp = dir.join(format!("perfetto-{PERFETTO_PY_VERSION}.dist-info"));
    if stamp.is_dir()
        && dir
            .join("perfetto/protos/perfetto/trace/perfetto_trace_pb2.py")
            .is_file()
    {
        eprintln!(
            "xtask setup: perfetto (Python) {PERFETTO_PY_VERSION}: present in {}",
            dir.display()
        );
        return Ok(());
    }
    if run::output(Command::new("python3").args(["-m", "pip", "--version"])).is_none() {
        bail!("python3 with pip is needed to install Perfetto's Python package (apt-get install python3-pip)");
    }
    eprintln!(
        "xtask setup: perfetto (Python) {PERFETTO_PY_VERSION}: installing into {}",
        dir.display()
    );
    run::status(
        Command::new("python3")
            .args(["-m", "pip", "install", "-q", "--upgrade", "--target"])
            .arg(&dir)
            .arg(format!("perfetto=={PERFETTO_PY_VERSION}"))
            .env("PIP_ROOT_USER_ACTION", "ignore")
            .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    )
    .context("could not install Perfetto's Python package from PyPI")
}

/// Installs speedscope (and npm, when missing, from Debian) unless the pinned version is there.
fn speedscope() -> Result<()> {
    let dir = speedscope_dir();
    let manifest = dir.join("node_modules/speedscope/package.json");
    let installed = std::fs::read_to_string(&manifest)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["version"].as_str().map(str::to_owned));
    if installed.as_deref() == Some(SPEEDSCOPE_VERSION) {
        eprintln!(
            "xtask setup: speedscope {SPEEDSCOPE_VERSION}: present in {}",
            dir.display()
        );
        return Ok(());
    }
    if run::output(Command::new("npm").arg("--version")).is_none() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!("npm is missing: install it as root (apt-get install npm)");
        }
        eprintln!("xtask setup: npm: missing, installing the Debian package");
        run::status(
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends", "npm"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
        .context("could not install npm")?;
    }
    eprintln!(
        "xtask setup: speedscope {SPEEDSCOPE_VERSION}: installing into {}",
        dir.display()
    );
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    run::status(
        Command::new("npm")
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--no-save",
                "--prefix",
            ])
            .arg(&dir)
            .arg(format!("speedscope@{SPEEDSCOPE_VERSION}")),
    )
    .context("could not install speedscope from the npm registry")?;
    if !dir
        .join("node_modules/speedscope/dist/release/index.html")
        .is_file()
    {
        bail!(
            "speedscope installed, but {} has no dist/release/index.html",
            dir.display()
        );
    }
    Ok(())
}
