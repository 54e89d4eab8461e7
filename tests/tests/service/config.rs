//! `fdr-profiled service --check-config FILE`: a configuration the service would accept exits
//! 0 and lists its targets; a bad one exits non-zero with one line naming file, line and column,
//! and the service refuses to start on it the same way.
use tests::service::ServiceStart;
use tests::tools::run_output;

fn check(text: &str) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fdr-profiled.toml");
    std::fs::write(
        &path,
        text.replace("@OUT@", &dir.path().join("out").display().to_string()),
    )
    .unwrap();
    let out = run_output(&mut ServiceStart::config(&path).check_command());
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).replace(&path.display().to_string(), "FILE"),
        String::from_utf8_lossy(&out.stderr).replace(&path.display().to_string(), "FILE"),
    )
}

#[test]
fn a_good_configuration_is_accepted_and_listed() {
    let (ok, stdout, stderr) = check(
        "output = \"@OUT@\"\n[[target]]\nbinary = \"/usr/bin/myserver\"\nwindow = \"10s\"\n\
         [[target]]\nname = \"batch\"\nbinary = \"/opt/*/batch\"\nmode = \"record\"\n",
    );
    assert!(ok, "{stderr}");
    assert!(stdout.starts_with("FILE: ok: "), "{stdout}");
    assert!(stdout.contains("2 targets"), "{stdout}");
    assert!(stdout.contains("myserver: /usr/bin/myserver (flight recorder, window 10s)"));
    assert!(stdout.contains("batch: /opt/*/batch (record)"), "{stdout}");
}

#[test]
fn a_bad_configuration_is_refused_in_one_line_naming_where() {
    for (text, want) in [
        (
            "output = \"@OUT@\"\n[[target]]\nbinary = \"/x\"\nwindw = \"3s\"\n",
            "fdr-profiled: error: FILE:4:1: unknown field `windw`",
        ),
        (
            "output = \"@OUT@\"\n[[target]]\nbinary = \"/bin/[x\"\n",
            "fdr-profiled: error: FILE:3:10: bad glob",
        ),
        (
            "output = \"/proc/version/out\"\n[[target]]\nbinary = \"/x\"\n",
            "fdr-profiled: error: FILE:1:10: output /proc/version/out is not writable",
        ),
        (
            "output = \"@OUT@\"\nstop_timeout = \"soon\"\n[[target]]\nbinary = \"/x\"\n",
            "fdr-profiled: error: FILE:2:16: \"soon\" is not a duration",
        ),
        (
            "output = \"@OUT@\"\nstop_timeout = \"2h\"\n[[target]]\nbinary = \"/x\"\n",
            "fdr-profiled: error: FILE:2:16: stop_timeout \"2h\" is longer than an hour",
        ),
    ] {
        let (ok, _, stderr) = check(text);
        assert!(!ok, "accepted: {text}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with(want), "{stderr:?}, want {want:?}");
    }
}

#[test]
fn a_bad_configuration_refuses_to_start() {
    let scratch = tests::scratch_dir("service-bad-config");
    let config = scratch.path().join("fdr-profiled.toml");
    std::fs::write(
        &config,
        "output = \"/tmp\"\n[[target]]\nbinary = \"/bin/x\"\nwindow = \"soon\"\n",
    )
    .unwrap();
    let out = run_output(&mut ServiceStart::config(&config).command());
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "fdr-profiled: error: {}:4:10: \"soon\" is not a duration",
            config.display()
        )),
        "{stderr}"
    );
}
