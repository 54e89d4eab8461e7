//! Needs root (directories are given to `nobody`, uid 65534, to play the other user).
use super::*;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

const NOBODY: u32 = 65534;

fn root_only() {
    assert_eq!(
        rustix::process::geteuid().as_raw(),
        0,
        "these tests give directories to another user: run them as root (cargo xtask test does)"
    );
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid)).unwrap();
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn missing_directories_are_created_private_and_the_root_is_held() {
    root_only();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("a/b/out");
    let root = OutputRoot::open(&path).unwrap();
    for p in [tmp.path().join("a"), tmp.path().join("a/b"), path.clone()] {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.mode() & 0o7777, 0o700, "{}", p.display());
    }
    assert!(root.verify().is_ok());
    let session = root
        .create_session("t", "20260101T000000.000Z-sigusr1")
        .unwrap();
    assert_eq!(
        session.path(),
        path.join("t").join("20260101T000000.000Z-sigusr1")
    );
    assert!(path.join("t/20260101T000000.000Z-sigusr1").is_dir());
}

#[test]
fn a_directory_another_user_owns_or_can_write_is_refused_on_the_way() {
    root_only();
    let tmp = tempfile::tempdir().unwrap();
    let theirs = tmp.path().join("home-user");
    std::fs::create_dir(&theirs).unwrap();
    chown(&theirs, NOBODY);
    let err = OutputRoot::open(&theirs.join("out")).unwrap_err();
    assert!(format!("{err:#}").contains("owned by uid 65534"), "{err:#}");
    assert!(OutputRoot::check(&theirs.join("out")).is_err());
    assert!(!theirs.join("out").exists(), "nothing created under it");
    // Writable by everyone, not sticky: refused; sticky (like /tmp): accepted.
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    let err = OutputRoot::check(&open.join("out")).unwrap_err();
    assert!(
        format!("{err:#}").contains("mode 0777, not sticky"),
        "{err:#}"
    );
    chmod(&open, 0o1777);
    OutputRoot::open(&open.join("out")).unwrap();
    // The output root itself, another user's: refused.
    let out = tmp.path().join("theirs-out");
    std::fs::create_dir(&out).unwrap();
    chown(&out, NOBODY);
    assert!(OutputRoot::open(&out).is_err());
}

#[test]
fn a_symlink_on_the_way_is_followed_only_when_root_made_it() {
    root_only();
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let sticky = tmp.path().join("sticky");
    std::fs::create_dir(&sticky).unwrap();
    chmod(&sticky, 0o1777);
    std::os::unix::fs::symlink(&real, sticky.join("link")).unwrap();
    let root = OutputRoot::open(&sticky.join("link/out")).unwrap();
    assert!(real.join("out").is_dir());
    assert!(root.verify().is_ok());
    // The same link made by another user in the sticky directory: not followed.
    chown(&sticky.join("link"), NOBODY);
    let err = OutputRoot::open(&sticky.join("link/out2")).unwrap_err();
    assert!(format!("{err:#}").contains("symbolic link"), "{err:#}");
    assert!(!real.join("out2").exists());
    // And the root opened through it no longer verifies.
    assert!(root.verify().is_err());
}

#[test]
fn a_swapped_output_is_refused_and_counted_never_followed() {
    root_only();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("out");
    let root = OutputRoot::open(&path).unwrap();
    root.create_session("t", "20260101T000000.000Z-segment")
        .unwrap();
    // The output moved away and replaced by another directory whose `t` leads elsewhere.
    let victim = tmp.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::rename(&path, tmp.path().join("moved")).unwrap();
    std::fs::create_dir(&path).unwrap();
    std::os::unix::fs::symlink(&victim, path.join("t")).unwrap();
    let err = root
        .create_session("t", "20260101T000001.000Z-segment")
        .unwrap_err();
    assert!(format!("{err:#}").contains("moved or replaced"), "{err:#}");
    assert_eq!(root.refusals(), 1);
    assert!(root.refused().is_some());
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0);
    // What is held is still measured: the first session.
    let stored = root.sessions(|_| true);
    assert_eq!(stored.len(), 1, "{stored:?}");
    // Back in place: accepted again.
    std::fs::remove_file(path.join("t")).unwrap();
    std::fs::remove_dir(&path).unwrap();
    std::fs::rename(tmp.path().join("moved"), &path).unwrap();
    root.create_session("t", "20260101T000002.000Z-segment")
        .unwrap();
    assert!(root.refused().is_none());
}

#[test]
fn sizes_and_deletions_follow_no_link() {
    root_only();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("out");
    let root = OutputRoot::open(&path).unwrap();
    let session = root
        .create_session("t", "20260101T000000.000Z-sigusr1")
        .unwrap();
    session
        .write_new("a", |f| std::io::Write::write_all(f, &[0u8; 1000]))
        .unwrap();
    let victim = tmp.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("big"), vec![0u8; 5000]).unwrap();
    let planted = path.join("t/20260101T000000.000Z-sigusr1/link");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    std::os::unix::fs::symlink(&victim, path.join("t/20260101T000001.000Z-sigusr1")).unwrap();
    let stored = root.sessions(|_| true);
    assert_eq!(
        stored.len(),
        1,
        "the planted link is no session: {stored:?}"
    );
    assert_eq!(stored[0].bytes, 1000);
    root.remove(&stored[0]).unwrap();
    assert!(!path.join("t/20260101T000000.000Z-sigusr1").exists());
    assert!(
        victim.join("big").exists(),
        "the link's target is untouched"
    );
}
