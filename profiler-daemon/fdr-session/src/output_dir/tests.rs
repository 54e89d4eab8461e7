use super::*;
use std::os::unix::fs::PermissionsExt as _;

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

/// The umask is process-wide: every test here takes this lock, so none creates its scratch
/// directory while another has the umask at 000 (tempfile's directories would be 0777).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` with the process umask set to `mask` (restored after); the caller holds
/// [`serial`].
fn with_umask<T>(mask: u32, f: impl FnOnce() -> T) -> T {
    let old = rustix::process::umask(Mode::from_raw_mode(mask));
    let t = f();
    rustix::process::umask(old);
    t
}

#[test]
fn refuses_non_empty_and_symlinked_roots() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let full = tmp.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("x"), b"x").unwrap();
    let err = OutputDir::create_root(&full).unwrap_err().to_string();
    assert_eq!(
        err,
        format!("output directory {} is not empty", full.display())
    );

    let link = tmp.path().join("link");
    std::fs::create_dir(tmp.path().join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("elsewhere"), &link).unwrap();
    let err = OutputDir::create_root(&link).unwrap_err().to_string();
    assert!(err.contains("is a symlink"), "{err}");
}

/// Under umask 000 (and under 077, which would leave nothing to chmod back), every file is
/// 0600 and every directory 0700, the missing parents of the output directory included.
#[test]
fn modes_are_private_whatever_the_umask() {
    let _serial = serial();
    for mask in [0o000, 0o077, 0o277] {
        let tmp = tempfile::tempdir().unwrap();
        let root_path = tmp.path().join("a/b/out");
        with_umask(mask, || {
            let root = OutputDir::create_root(&root_path).unwrap();
            let sub = root.create_subdir("p-1").unwrap();
            drop(sub.create_file("t.fdr").unwrap());
            root.write_atomically("session.json", b"{}").unwrap();
            root.write_new("report.txt", |f| {
                use std::io::Write as _;
                f.write_all(b"r")
            })
            .unwrap();
        });
        for dir in ["a", "a/b", "a/b/out", "a/b/out/p-1"] {
            assert_eq!(
                mode(&tmp.path().join(dir)),
                0o700,
                "umask {mask:03o}: {dir}"
            );
        }
        for file in [
            "a/b/out/p-1/t.fdr",
            "a/b/out/session.json",
            "a/b/out/report.txt",
        ] {
            assert_eq!(
                mode(&tmp.path().join(file)),
                0o600,
                "umask {mask:03o}: {file}"
            );
        }
    }
}

#[test]
fn never_follows_a_planted_symlink() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let root = OutputDir::create_root(&tmp.path().join("out")).unwrap();
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let out = tmp.path().join("out");
    std::os::unix::fs::symlink(&victim, out.join("trace")).unwrap();
    let err = root.create_file("trace").unwrap_err().to_string();
    assert!(err.contains("exists; not overwriting it"), "{err}");
    // A dangling symlink: O_CREAT alone would create its target.
    let target = tmp.path().join("created-through-link");
    std::os::unix::fs::symlink(&target, out.join("dangling")).unwrap();
    assert!(root.create_file("dangling").is_err());
    assert!(!target.exists());
    assert!(root
        .write_new("dangling", |f| {
            use std::io::Write as _;
            f.write_all(b"x")
        })
        .is_err());
    assert!(!target.exists());
    // A symlink where a subdirectory goes: mkdirat fails on it, the next name is used.
    std::os::unix::fs::symlink(tmp.path(), out.join("p-1")).unwrap();
    let sub = root.create_subdir("p-1").unwrap();
    assert_eq!(sub.path(), out.join("p-1.1"));
    // session.json is rewritten by renaming over it: the link is replaced, not followed.
    std::os::unix::fs::symlink(&victim, out.join("m.json")).unwrap();
    root.write_atomically("m.json", b"{}").unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert_eq!(std::fs::read(out.join("m.json")).unwrap(), b"{}");
    assert!(!std::fs::symlink_metadata(out.join("m.json"))
        .unwrap()
        .file_type()
        .is_symlink());
}

/// The directory is held by descriptor: once it is swapped for a symlink, files still go
/// into the directory we created, not where the link points.
#[test]
fn a_swapped_directory_changes_nothing() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let root = OutputDir::create_root(&out).unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::rename(&out, tmp.path().join("moved")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &out).unwrap();
    drop(root.create_file("t").unwrap());
    assert!(tmp.path().join("moved/t").is_file());
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
}

#[test]
fn publish_and_write_new_never_replace() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let root = OutputDir::create_root(&tmp.path().join("out")).unwrap();
    root.create_file(".a.tmp").unwrap();
    root.publish(".a.tmp", "a").unwrap();
    assert!(tmp.path().join("out/a").exists());
    root.create_file(".b.tmp").unwrap();
    assert!(root.publish(".b.tmp", "a").is_err());
    let err = root.write_new("a", |_| Ok(())).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{} exists; not overwriting it",
            tmp.path().join("out/a").display()
        )
    );
    // A failed write leaves nothing, not even its hidden file.
    let before = std::fs::read_dir(tmp.path().join("out")).unwrap().count();
    assert!(root
        .write_new("c", |_| Err::<(), _>(std::io::Error::other("no")))
        .is_err());
    assert_eq!(
        std::fs::read_dir(tmp.path().join("out")).unwrap().count(),
        before
    );
}

#[test]
fn subdir_names_do_not_collide() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let root = OutputDir::create_root(&tmp.path().join("out")).unwrap();
    let a = root.create_subdir("p-1").unwrap();
    let b = root.create_subdir("p-1").unwrap();
    assert_ne!(a.path(), b.path());
    assert!(root.create_subdir("../x").is_err());
    assert!(root.create_file("a/b").is_err());
}

/// A place other users can write to is refused unless sticky (then, an existing directory
/// must also be ours); an existing empty directory of our own is accepted.
#[test]
fn refuses_directories_others_can_write() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    // As the output directory itself.
    let err = OutputDir::create_root(&open).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "output directory {} is writable by other users (mode 0777, not sticky): give a directory only its owner can write",
            open.display()
        )
    );
    // As the place a new output directory is made in, or a -o file.
    let err = OutputDir::create_root(&open.join("out"))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        format!(
            "{} is writable by other users (mode 0777, not sticky): choose an output directory elsewhere",
            open.display()
        )
    );
    assert!(!open.join("out").exists());
    assert!(OutputDir::for_new_file(&open.join("r.txt")).is_err());
    // Group-writable counts too.
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o770)).unwrap();
    assert!(OutputDir::create_root(&open.join("out")).is_err());
    // Sticky, like /tmp: a new directory in it is fine, and so is an existing one of ours.
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    OutputDir::create_root(&open.join("out")).unwrap();
    OutputDir::for_new_file(&open.join("r.txt")).unwrap();
    OutputDir::create_root(&open).unwrap_err(); // not empty now
    let sticky_empty = tmp.path().join("sticky");
    std::fs::create_dir(&sticky_empty).unwrap();
    std::fs::set_permissions(&sticky_empty, std::fs::Permissions::from_mode(0o1777)).unwrap();
    OutputDir::create_root(&sticky_empty).unwrap();
    // An existing empty directory only we can write: accepted, its mode left as it was.
    let mine = tmp.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o755)).unwrap();
    OutputDir::create_root(&mine).unwrap();
    assert_eq!(mode(&mine), 0o755);
}

/// A sticky other-writable directory that is not ours (someone else made it in /tmp): refused.
/// Needs another owner: runs as root, where chown works.
#[test]
fn refuses_a_sticky_directory_of_someone_else() {
    let _serial = serial();
    if !rustix::process::geteuid().is_root() {
        panic!("this test chowns a directory to nobody: run it as root");
    }
    let tmp = tempfile::tempdir().unwrap();
    let theirs = tmp.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let err = OutputDir::create_root(&theirs).unwrap_err().to_string();
    assert!(err.contains("(mode 1777, not ours)"), "{err}");
    assert!(OutputDir::open_existing(&theirs).is_err());
}

#[test]
fn a_new_file_is_refused_when_its_name_is_taken() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("r.txt");
    std::fs::write(&path, b"old").unwrap();
    let err = OutputDir::for_new_file(&path).unwrap_err().to_string();
    assert_eq!(
        err,
        format!("{} exists; not overwriting it", path.display())
    );
    let link = tmp.path().join("l.txt");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    assert!(OutputDir::for_new_file(&link).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), b"old");
    let (dir, name) = OutputDir::for_new_file(&tmp.path().join("new.txt")).unwrap();
    dir.write_new(&name, |f| {
        use std::io::Write as _;
        f.write_all(b"new")
    })
    .unwrap();
    assert_eq!(std::fs::read(tmp.path().join("new.txt")).unwrap(), b"new");
    assert_eq!(mode(&tmp.path().join("new.txt")), 0o600);
}

/// The control socket: 0600 under umask 000, a stale socket replaced, anything else refused.
#[test]
fn sockets_are_private_and_replace_only_sockets() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = OutputDir::open_or_create(&tmp.path().join("run/fdr")).unwrap();
    assert_eq!(mode(&tmp.path().join("run")), 0o700);
    let sock = tmp.path().join("run/fdr/control.sock");
    let listener = with_umask(0, || dir.bind_socket("control.sock").unwrap());
    assert_eq!(mode(&sock), 0o600);
    drop(listener);
    // Stale (nobody listens): replaced.
    dir.bind_socket("control.sock").unwrap();
    let file = tmp.path().join("run/fdr/file");
    std::fs::write(&file, b"keep").unwrap();
    let err = dir.bind_socket("file").unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "{} exists and is not a socket: not replacing it",
            file.display()
        )
    );
    std::os::unix::fs::symlink(&file, tmp.path().join("run/fdr/link")).unwrap();
    assert!(dir.bind_socket("link").is_err());
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
}
