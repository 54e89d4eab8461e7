//! `cargo xtask vm aarch64 -- COMMAND`: an emulated arm64 machine the project makes itself, to
//! run the daemon and its tests on XRay's other big target (issue 33).
//!
//! The machine is `qemu-system-aarch64 -M virt` (software emulation: no KVM for arm64 on an
//! x86-64 host), booting Debian's arm64 kernel from bookworm-backports (6.12: uprobe_multi,
//! BTF, BPF task storage, as the x86-64 host's) with a small initramfs: busybox (Debian's
//! static arm64 build), the 9p modules, and Debian's arm64 C and C++ runtime libraries (so that
//! dynamically linked programs run). The workspace is shared read-write over virtio-9p,
//! mounted at the path it has on the host; the init script runs COMMAND there with `sh -c`, prints its exit status on a
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
/// The C and C++ runtime libraries (arm64, as the cross toolchain's), in the initramfs so that
/// dynamically linked programs run there too.
const LIBRARIES: &[&str] = &["libc6", "libgcc-s1", "libstdc++6"];
/// The dynamic loader they bring.
const LOADER: &str = "lib/ld-linux-aarch64.so.1";
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
    let (status, _) = boot(&image, &command.join(" "), timeout)?;
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

/// Where the machine's image and what the arm64 tests use are kept.
pub fn dir() -> PathBuf {
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
    let root = dir.join("initramfs");
    let init = root.join("init");
    let current = std::fs::read_to_string(&init).is_ok_and(|s| s == INIT);
    let unpacked =
        image.kernel.is_file() && root.join("bin/busybox").is_file() && root.join(LOADER).exists();
    if unpacked && image.initrd.is_file() && current {
        return Ok(image);
    }
    if !image.kernel.is_file() || !root.join("bin/busybox").is_file() || !root.join(LOADER).exists()
    {
        eprintln!(
            "xtask vm: making the aarch64 machine's image in {}",
            dir.display()
        );
        unpack_kernel_and_busybox(&dir, &image, &root)?;
    }
    // The init script is this file's: a changed one is packed again (seconds).
    std::fs::write(&init, INIT)?;
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    run::status(
        Command::new("sh")
            .arg("-c")
            .arg("find . | cpio -o -H newc --quiet | gzip -1 > \"$0\"")
            .arg(&image.initrd)
            .current_dir(&root),
    )?;
    Ok(image)
}

/// Downloads the kernel, busybox and the C and C++ runtime libraries, and lays out the
/// initramfs (all but its init).
fn unpack_kernel_and_busybox(dir: &Path, image: &Image, root: &Path) -> Result<()> {
    let debs = download(dir, &[KERNEL_PACKAGE, "busybox-static"])?;
    let libraries = download(dir, LIBRARIES)?;
    let unpacked = dir.join("unpacked");
    let _ = std::fs::remove_dir_all(&unpacked);
    for deb in &debs {
        run::status(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&unpacked))?;
    }
    let _ = std::fs::remove_dir_all(root);
    for sub in ["bin", "dev", "proc", "sys", "tmp", "modules"] {
        std::fs::create_dir_all(root.join(sub))?;
    }
    std::fs::copy(unpacked.join("bin/busybox"), root.join("bin/busybox"))
        .context("busybox from busybox-static")?;
    for deb in &libraries {
        run::status(Command::new("dpkg-deb").arg("-x").arg(deb).arg(root))?;
    }
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
    std::fs::copy(
        unpacked.join(format!("boot/vmlinuz-{KERNEL_RELEASE}")),
        &image.kernel,
    )
    .context("the kernel image")?;
    Ok(())
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
root=$(sed -n 's/.*fdr.vm.root=\([^ ]*\).*/\1/p' /proc/cmdline)
cmd=$(sed -n 's/.*fdr.vm.command=\([^ ]*\).*/\1/p' /proc/cmdline)
mkdir -p "$root"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576 work "$root" || echo "fdr-vm: no share"
[ "$root" = /work ] || ln -s "$root" /work
cd "$root"
sh -c "$(cat "$root/$cmd")"
echo "fdr-vm-exit=$?"
sync
poweroff -f
"#;

/// Downloads arm64 `packages` (their files) through an apt state of its own in `dir`.
pub fn download(dir: &Path, packages: &[&str]) -> Result<Vec<PathBuf>> {
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

/// Boots the machine, runs `command` in it and returns its console; fails if the command fails.
pub fn boot_capture(image: &Image, command: &str, timeout: Duration) -> Result<String> {
    let (status, console) = boot(image, command, timeout)?;
    if status != 0 {
        bail!("the command exited with status {status} in the aarch64 machine:\n{console}");
    }
    Ok(console)
}

/// Boots the machine, runs `command` in it, and returns its exit status and the console (also
/// echoed as it comes).
pub fn boot(image: &Image, command: &str, timeout: Duration) -> Result<(i32, String)> {
    let root = run::workspace_root();
    // The command travels as a file in the share: the kernel's command line is short and
    // splits on spaces.
    // The workspace is mounted at its path here, so that paths name the same files inside
    // and out (a session's manifest, a test's fixtures); `/work` leads there too.
    let root_arg = root.to_str().filter(|r| !r.contains(char::is_whitespace));
    let Some(root_arg) = root_arg else {
        bail!(
            "the workspace path {} has a space or is not UTF-8: the machine mounts it at the same path",
            root.display()
        );
    };
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
        &format!("console=ttyAMA0 rdinit=/init quiet panic=-1 fdr.vm.root={root_arg} fdr.vm.command={name}"),
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
    let mut console = String::new();
    loop {
        match received.recv_timeout(Duration::from_millis(500)) {
            Ok(line) => {
                let line = line.trim_end_matches('\r');
                println!("{line}");
                console.push_str(line);
                console.push('\n');
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
    let status =
        status.context("the aarch64 machine stopped without saying the command's exit status")?;
    Ok((status, console))
}

/// Removes a file when dropped.
struct Remove(PathBuf);

impl Drop for Remove {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
