//! `cargo xtask install` and `cargo xtask package`: fdr-profiled put in place as a system
//! service, by hand on one host or as the Debian package a fleet is rolled out with.
use crate::run;
use anyhow::{Context as _, Result};
use std::path::{Path, PathBuf};

/// The unit and the example configuration, as the repository holds them.
fn dist(file: &str) -> PathBuf {
    run::workspace_root().join("dist").join(file)
}

/// Where the package's and the unit's paths put the binary and the configuration.
const PACKAGED_BINARY: &str = "/usr/bin/fdr-profiled";
const CONFIG: &str = "/etc/fdr-profiled/fdr-profiled.toml";

/// Installs the release binary as `PREFIX/bin/fdr-profiled`, the unit as
/// `/etc/systemd/system/fdr-profiled.service` (its commands pointing at that binary) and the
/// example configuration as `/etc/fdr-profiled/fdr-profiled.toml` unless one is there already;
/// all under `root` (`/` by default; a scratch directory to stage). Starts nothing.
pub fn install(prefix: &Path, root: &Path) -> Result<()> {
    crate::setup::setup()?;
    run::cargo(&["build", "--package", "profiler-daemon", "--release"])?;
    let under = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    let binary = prefix.join("bin").join("fdr-profiled");
    let built = run::target_dir().join("release").join("fdr-profiled");
    copy(&built, &under(&binary), 0o755)?;
    let unit = std::fs::read_to_string(dist("fdr-profiled.service"))?
        .replace(PACKAGED_BINARY, &binary.display().to_string());
    let unit_path = under(Path::new("/etc/systemd/system/fdr-profiled.service"));
    write(&unit_path, unit.as_bytes(), 0o644)?;
    let config = under(Path::new(CONFIG));
    if config.exists() {
        eprintln!("xtask install: {} exists: kept", config.display());
    } else {
        copy(&dist("fdr-profiled.toml"), &config, 0o644)?;
    }
    eprintln!(
        "xtask install: {}, {}, {}; edit the configuration, then `systemctl daemon-reload && systemctl enable --now fdr-profiled`",
        under(&binary).display(),
        unit_path.display(),
        config.display()
    );
    Ok(())
}

/// Builds `target/debian/fdr-profiled_<version>_<arch>.deb` with cargo-deb: the binary as
/// `/usr/bin/fdr-profiled`, the unit in `/lib/systemd/system/`, the example configuration as a
/// conffile in `/etc/fdr-profiled/`; no maintainer scripts, so installing it starts nothing.
pub fn package() -> Result<()> {
    crate::setup::setup()?;
    run::cargo(&["build", "--package", "profiler-daemon", "--release"])?;
    let out = run::target_dir().join("debian");
    run::cargo(&[
        "deb",
        "--package",
        "profiler-daemon",
        "--no-build",
        "--output",
        &out.display().to_string(),
    ])
}

fn copy(from: &Path, to: &Path, mode: u32) -> Result<()> {
    let bytes = std::fs::read(from).with_context(|| format!("reading {}", from.display()))?;
    write(to, &bytes, mode)
}

fn write(to: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // Written beside and renamed: a running binary is replaced, not overwritten in place.
    let staging = to.with_extension("xtask-new");
    std::fs::write(&staging, bytes).with_context(|| format!("writing {}", staging.display()))?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(mode))?;
    std::fs::rename(&staging, to).with_context(|| format!("installing {}", to.display()))?;
    Ok(())
}
