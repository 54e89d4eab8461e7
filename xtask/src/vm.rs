//! `cargo xtask vm aarch64 -- COMMAND`: an emulated arm64 machine the project makes itself, to
//! run the daemon and its tests on XRay's other big target (issue 33).
//!
//! The machine is `qemu-system-aarch64 -M virt` (software emulation: no KVM for arm64 on an
//! x86-64 host), booting Debian's arm64 kernel from bookworm-backports (6.12: uprobe_multi,
//! BTF, BPF task storage, as the x86-64 host's) with a small initramfs: busybox (Debian's
//! static arm64 build) and the 9p modules. The workspace is shared read-write at `/work` over
//! virtio-9p; the init script runs COMMAND there with `sh -c`, prints its exit status on a
//! marker line, and powers off; this process echoes the machine's console and exits with that
//! status. The kernel and initramfs are made once, cached under `target/vm/aarch64/` (the
//! packages come from the Debian archive through an apt state of its own there: the host's
//! apt sources and architectures are left as they are).
use crate::run;
use anyhow::{bail, Context as _, Result};
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The kernel: Debian's arm64 image from bookworm-backports.
const KERNEL_PACKAGE: &str = "linux-image-6.12.95+deb12-arm64";
const KERNEL_RELEASE: &str = "6.12.95+deb12-arm64";
/// The modules the share needs, in load order (the kernel has virtio-pci built in).
const MODULES: &[&str] = &[
    "kernel/fs/netfs/netfs.ko.xz",
    "kernel/net/9p/9pnet.ko.xz",
    "kernel/net/9p/9pnet_virtio.ko.xz",
    "kernel/fs/9p/9p.ko.xz",
];
/// The line the init script prints after COMMAND, with its exit status.
const EXIT_MARKER: &str = "fdr-vm-exit=";
/// Host packages: the emulator, and what unpacks the image's parts.
const HOST_PACKAGES: &[&str] = &["qemu-system-arm", "cpio", "xz-utils"];

/// `cargo xtask vm ARCH -- COMMAND`.
pub fn vm(arch: &str, command: &[String], timeout: Duration) -> Result<()> {
    if arch != "aarch64" {
        bail!("no machine for {arch}: aarch64 is the one there is");
    }
    let image = image()?;
    let status = boot(&image, &command.join(" "), timeout)?;
    if status != 0 {
        bail!("the command exited with status {status} in the aarch64 machine");
    }
    Ok(())
}

/// The kernel and initramfs of the machine.
pub struct Image {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

fn dir() -> PathBuf {
    run::target_dir().join("vm").join("aarch64")
}

/// Makes the image once (idempotent: kept under `target/vm/aarch64/`).
pub fn image() -> Result<Image> {
    crate::setup::debian_packages(HOST_PACKAGES)?;
    let dir = dir();
    let image = Image {
        kernel: dir.join("vmlinuz"),
        initrd: dir.join("initrd.cpio.gz"),
    };
    if image.kernel.is_file() && image.initrd.is_file() {
        return Ok(image);
    }
    eprintln!(
        "xtask vm: making the aarch64 machine's image in {}",
        dir.display()
    );
    let debs = download(&dir, &[KERNEL_PACKAGE, "busybox-static"])?;
    let unpacked = dir.join("unpacked");
    let _ = std::fs::remove_dir_all(&unpacked);
    for deb in &debs {
        run::status(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&unpacked))?;
    }
    let root = dir.join("initramfs");
    let _ = std::fs::remove_dir_all(&root);
    for sub in ["bin", "dev", "proc", "sys", "tmp", "work", "modules"] {
        std::fs::create_dir_all(root.join(sub))?;
    }
    std::fs::copy(unpacked.join("bin/busybox"), root.join("bin/busybox"))
        .context("busybox from busybox-static")?;
    let modules = unpacked.join("lib/modules").join(KERNEL_RELEASE);
    for (n, module) in MODULES.iter().enumerate() {
        let xz = modules.join(module);
        let out = root.join(format!("modules/{n}.ko"));
        let file = std::fs::File::create(&out)?;
        let status = Command::new("xz")
            .args(["-dc"])
            .arg(&xz)
            .stdout(file)
            .status()
            .with_context(|| format!("xz -dc {}", xz.display()))?;
        if !status.success() {
            bail!("could not unpack {}", xz.display());
        }
    }
    let init = root.join("init");
    std::fs::write(&init, INIT)?;
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    run::status(
        Command::new("sh")
            .arg("-c")
            .arg("find . | cpio -o -H newc --quiet | gzip -1 > \"$0\"")
            .arg(&image.initrd)
            .current_dir(&root),
    )?;
    std::fs::copy(
        unpacked.join(format!("boot/vmlinuz-{KERNEL_RELEASE}")),
        &image.kernel,
    )
    .context("the kernel image")?;
    Ok(image)
}

/// The initramfs's init: the share mounted, COMMAND run in it, its status said, off.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
for m in /modules/*.ko; do insmod "$m" || echo "fdr-vm: insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576 work /work || echo "fdr-vm: no share"
cmd=$(sed -n 's/.*fdr.vm.command=\([^ ]*\).*/\1/p' /proc/cmdline)
cd /work
sh -c "$(cat /work/$cmd)"
echo "fdr-vm-exit=$?"
sync
poweroff -f
"#;

/// Downloads arm64 `packages` (their files) through an apt state of its own in `dir`.
fn download(dir: &Path, packages: &[&str]) -> Result<Vec<PathBuf>> {
    let apt = dir.join("apt");
    for sub in ["lists/partial", "cache/archives/partial", "debs"] {
        std::fs::create_dir_all(apt.join(sub))?;
    }
    let sources = apt.join("sources.list");
    std::fs::write(
        &sources,
        "deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main\n\
         deb [arch=arm64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main\n",
    )?;
    let options = [
        format!("Dir::Etc::SourceList={}", sources.display()),
        "Dir::Etc::SourceParts=/dev/null".into(),
        format!("Dir::State::Lists={}", apt.join("lists").display()),
        format!("Dir::Cache={}", apt.join("cache").display()),
        "Dir::State::status=/dev/null".into(),
        "APT::Architecture=arm64".into(),
        "APT::Architectures=arm64".into(),
        // The files are written by root into our own directory.
        "APT::Sandbox::User=root".into(),
    ];
    let apt_get = |args: &[&str]| {
        let mut cmd = Command::new("apt-get");
        for o in &options {
            cmd.arg("-o").arg(o);
        }
        cmd.args(args).current_dir(apt.join("debs"));
        run::status(&mut cmd)
    };
    apt_get(&["update", "-q"])?;
    apt_get(&[&["download", "-q"][..], packages].concat())?;
    let mut debs = Vec::new();
    for package in packages {
        let found = std::fs::read_dir(apt.join("debs"))?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.ends_with(".deb"))
            })
            .with_context(|| format!("{package} was not downloaded"))?;
        debs.push(found);
    }
    Ok(debs)
}

/// Boots the machine, runs `command` in it, and returns its exit status.
pub fn boot(image: &Image, command: &str, timeout: Duration) -> Result<i32> {
    let root = run::workspace_root();
    // The command travels as a file in the share: the kernel's command line is short and
    // splits on spaces.
    let name = format!(".fdr-vm-command-{}", std::process::id());
    let file = root.join(&name);
    std::fs::write(&file, command)?;
    let _remove = Remove(file);
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    let mut qemu = Command::new("qemu-system-aarch64");
    qemu.args([
        "-M",
        "virt",
        "-cpu",
        "max",
        "-m",
        "2048",
        "-nographic",
        "-no-reboot",
        "-nic",
        "none",
    ])
    .args(["-smp", &cpus.to_string()])
    .arg("-kernel")
    .arg(&image.kernel)
    .arg("-initrd")
    .arg(&image.initrd)
    .args([
        "-append",
        &format!("console=ttyAMA0 rdinit=/init quiet panic=-1 fdr.vm.command={name}"),
    ])
    .arg("-virtfs")
    .arg(format!(
        "local,path={},mount_tag=work,security_model=none,id=work",
        root.display()
    ))
    .stdin(Stdio::null())
    .stdout(Stdio::piped());
    eprintln!("xtask vm: booting the aarch64 machine (emulated: expect minutes)");
    let mut child = qemu.spawn().context("starting qemu-system-aarch64")?;
    let stdout = child.stdout.take().expect("piped");
    let started = Instant::now();
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut status = None;
    loop {
        match received.recv_timeout(Duration::from_millis(500)) {
            Ok(line) => {
                let line = line.trim_end_matches('\r');
                println!("{line}");
                if let Some(code) = line.strip_prefix(EXIT_MARKER) {
                    status = code.trim().parse().ok();
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the aarch64 machine did not finish within {timeout:?}");
        }
    }
    let _ = child.wait();
    status.context("the aarch64 machine stopped without saying the command's exit status")
}

/// Removes a file when dropped.
struct Remove(PathBuf);

impl Drop for Remove {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
