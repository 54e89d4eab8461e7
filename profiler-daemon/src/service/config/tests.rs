use super::*;

fn parse(text: &str) -> Result<ServiceConfig, ConfigError> {
    ServiceConfig::parse(Path::new("/etc/fdr.toml"), text)
}

/// `(line, column, message)` of the error `text` gives.
fn error(text: &str) -> (usize, usize, String) {
    let e = parse(text).map(|_| ()).unwrap_err();
    assert_eq!(e.file, Path::new("/etc/fdr.toml"));
    (e.line, e.column, e.message)
}

const GOOD: &str = r#"
output = "/tmp/fdr-service-test"
max_disk = "2GiB"
min_free = "5%"

[[target]]
binary = "/usr/bin/myserver"
mode = "flight-recorder"
window = "30s"
functions = ["ns::*"]
exits = "auto"

[[target]]
name = "workers"
binary = "/opt/app/bin/worker-*"
mode = "record"
segment_size = "64MiB"
segment_age = "10m"
trigger_slower_than = "50ms"
trigger_functions = ["re:^handle_"]
fdr_version = 5
args = 2
"#;

#[test]
fn the_issue_example_is_read_with_its_values() {
    let c = parse(GOOD).unwrap();
    assert_eq!(c.output, Path::new("/tmp/fdr-service-test"));
    assert_eq!(c.max_disk, 2 << 30);
    assert_eq!(c.min_free, MinFree::Percent(5.0));
    assert_eq!(c.targets.len(), 2);
    let t = &c.targets[0];
    assert_eq!(
        (t.name.as_str(), t.mode, t.window, t.exits),
        (
            "myserver",
            Mode::FlightRecorder,
            Duration::from_secs(30),
            ExitMode::Auto
        )
    );
    assert_eq!(t.functions, ["ns::*"]);
    let w = &c.targets[1];
    assert_eq!((w.name.as_str(), w.mode), ("workers", Mode::Record));
    assert_eq!(w.segment_bytes, 64 << 20);
    assert_eq!(w.segment_age, Duration::from_secs(600));
    assert_eq!(w.trigger_slower_than, Some(Duration::from_millis(50)));
    assert_eq!((w.fdr_version, w.args), (FdrVersion::V5, 2));
}

#[test]
fn an_unknown_key_is_refused_where_it_is() {
    let text = "output = \"/tmp\"\n[[target]]\nbinary = \"/bin/x\"\nwindw = \"3s\"\n";
    let (line, column, message) = error(text);
    assert_eq!((line, column), (4, 1), "{message}");
    assert!(message.contains("windw"), "{message}");
}

#[test]
fn a_bad_glob_or_pattern_points_at_itself() {
    let (line, column, message) = error("output = \"/tmp\"\n[[target]]\nbinary = \"/bin/[x\"\n");
    assert_eq!((line, column), (3, 10), "{message}");
    assert!(message.contains("bad glob"), "{message}");
    let (line, column, message) = error(
        "output = \"/tmp\"\n[[target]]\nbinary = \"/bin/x\"\nfunctions = [\"ok\", \"re:(\"]\n",
    );
    assert_eq!((line, column), (4, 20), "{message}");
    assert!(message.contains("regex"), "{message}");
}

#[test]
fn values_out_of_range_are_refused() {
    for (bad, what) in [
        ("window = \"soon\"", "not a duration"),
        ("window = \"0s\"", "longer than 0"),
        ("max_memory = \"lots\"", "not a size"),
        ("exits = \"maybe\"", "exits must be"),
        ("args = 7", "args must be between 0 and 6"),
        ("fdr_version = 3", "fdr_version must be 1 or 5"),
        ("mode = \"everything\"", "unknown variant"),
        ("trigger_functions = [\"f\"]", "needs trigger_slower_than"),
        ("name = \"../etc\"", "use 1 to 64 letters"),
        ("binary2 = \"/x\"", "unknown field"),
    ] {
        let text = format!("output = \"/tmp\"\n[[target]]\nbinary = \"/bin/x\"\n{bad}\n");
        let (line, _, message) = error(&text);
        assert_eq!(line, 4, "{bad}: {message}");
        assert!(message.contains(what), "{bad}: {message}");
    }
}

#[test]
fn the_whole_file_is_checked() {
    let (_, _, message) = error("output = \"relative/dir\"\n[[target]]\nbinary = \"/bin/x\"\n");
    assert!(message.contains("absolute"), "{message}");
    let (line, _, message) = error("output = \"/tmp\"\n");
    assert!(message.contains("no [[target]]"), "{line} {message}");
    let (line, _, message) = error("output = \"/tmp\"\n[[target]]\nbinary = \"relative\"\n");
    assert_eq!(line, 3, "{message}");
    let (line, _, message) =
        error("output = \"/tmp\"\n[[target]]\nbinary = \"/a/x\"\n[[target]]\nbinary = \"/b/x\"\n");
    assert!(
        message.contains("two targets are named \"x\""),
        "{line} {message}"
    );
    let (_, _, message) =
        error("output = \"/tmp\"\nmin_free = \"120%\"\n[[target]]\nbinary = \"/x\"\n");
    assert!(message.contains("percentage"), "{message}");
    let (line, column, message) = error("output = [\n");
    assert!(line >= 1 && column >= 1, "{message}");
}

#[test]
fn an_output_that_cannot_be_written_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let text = format!(
        "output = \"{}/sub\"\n[[target]]\nbinary = \"/bin/x\"\n",
        file.display()
    );
    let (line, column, message) = error(&text);
    assert_eq!((line, column), (1, 10), "{message}");
    assert!(message.contains("not a directory"), "{message}");
    // A directory that does not exist yet under a writable one is fine: it is created.
    let text = format!(
        "output = \"{}/new/sessions\"\n[[target]]\nbinary = \"/bin/x\"\n",
        dir.path().display()
    );
    parse(&text).unwrap();
}

#[test]
fn errors_print_as_file_line_column() {
    let e = ConfigError {
        file: PathBuf::from("/etc/f.toml"),
        line: 3,
        column: 7,
        message: "bad".into(),
    };
    assert_eq!(e.to_string(), "/etc/f.toml:3:7: bad");
}

#[test]
fn line_and_column_count_characters() {
    assert_eq!(line_column("a\nbé c", 6), (2, 4));
    assert_eq!(line_column("abc", 99), (1, 4));
    assert_eq!(line_column("é", 1), (1, 1));
}

#[test]
fn an_export_section_is_read_with_its_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let auth = dir.path().join("push.auth");
    std::fs::write(&auth, "fleet:s3cr:et\n").unwrap();
    let c = parse(&format!(
        "output = \"/tmp\"\n[[target]]\nbinary = \"/bin/x\"\n[export]\npyroscope = \"https://pyro.example:4040/\"\ninterval = \"10s\"\ntenant = \"team-a\"\nbasic_auth_file = \"{}\"\nqueue = 8\n",
        auth.display()
    ))
    .unwrap();
    let e = c.export.unwrap();
    assert_eq!(e.pyroscope.unwrap().base, "https://pyro.example:4040");
    assert_eq!(e.otlp, None);
    assert_eq!(e.interval, Duration::from_secs(10));
    assert_eq!(e.tenant.as_deref(), Some("team-a"));
    assert_eq!(e.basic_auth, Some(("fleet".into(), "s3cr:et".into())));
    assert_eq!(e.queue, 8);
    // The defaults.
    let e = parse("output = \"/tmp\"\n[[target]]\nbinary = \"/bin/x\"\n[export]\npyroscope = \"http://p:4040\"\n")
        .unwrap()
        .export
        .unwrap();
    assert_eq!((e.interval, e.queue), (Duration::from_secs(15), 64));
}

#[test]
fn a_bad_export_is_refused_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.auth");
    std::fs::write(&empty, "no colon here\n").unwrap();
    for (bad, what) in [
        ("pyroscope = \"pyro:4040 x\"", "endpoint"),
        ("pyroscope = \"ftp://pyro:4040\"", "http:// or https://"),
        (
            "pyroscope = \"http://user:pw@pyro:4040\"",
            "basic_auth_file",
        ),
        ("pyroscope = \"http://pyro:4040/?x=1\"", "no query string"),
        ("otlp = \"not a url\"", "endpoint"),
        ("interval = \"500ms\"", "whole seconds"),
        ("interval = \"2h\"", "whole seconds"),
        ("queue = 0", "queue must be between"),
        ("tenant = \"a b\"", "tenant"),
        (
            "basic_auth_file = \"/nonexistent/push.auth\"",
            "cannot read",
        ),
        ("basic_auth_file = \"relative.auth\"", "absolute path"),
        ("basic_auth_file = \"/tmp\"", "not a regular file"),
        ("unknown = 1", "unknown field"),
    ] {
        let text = format!(
            "output = \"/tmp\"\n[[target]]\nbinary = \"/bin/x\"\n[export]\npyroscope = \"http://p:4040\"\n{bad}\n"
        );
        let text = if bad.starts_with("pyroscope") {
            text.replacen("pyroscope = \"http://p:4040\"\n", "", 1)
        } else {
            text
        };
        let (line, _, message) = error(&text);
        let want = if bad.starts_with("pyroscope") { 5 } else { 6 };
        assert_eq!(line, want, "{bad}: {message}");
        assert!(message.contains(what), "{bad}: {message}");
    }
    let (line, _, message) = error(&format!(
        "output = \"/tmp\"\n[[target]]\nbinary = \"/bin/x\"\n[export]\npyroscope = \"http://p:4040\"\nbasic_auth_file = \"{}\"\n",
        empty.display()
    ));
    assert_eq!(line, 6);
    assert!(message.contains("user:password"), "{message}");
    let (line, _, message) =
        error("output = \"/tmp\"\n[[target]]\nbinary = \"/bin/x\"\n[export]\ninterval = \"10s\"\n");
    assert_eq!(line, 4, "the section itself: {message}");
    assert!(message.contains("names no endpoint"), "{message}");
}

#[test]
fn an_inline_target_has_no_budget_and_observes_exits_at_sleds() {
    let target = |extra: &str| {
        format!("output = \"/tmp/o\"\n[[target]]\nbinary = \"/usr/bin/s\"\nengine = \"inline\"\n{extra}")
    };
    let c = parse(&target("")).unwrap();
    let t = &c.targets[0];
    assert_eq!((t.engine, t.max_overhead), (TargetEngine::Inline, None));
    assert_eq!(
        parse(&target("max_overhead = \"none\"\nexits = \"sleds\"\n"))
            .unwrap()
            .targets[0]
            .engine,
        TargetEngine::Inline
    );
    let (line, _, message) = error(&target("exits = \"repair\"\n"));
    assert_eq!(line, 5, "{message}");
    assert!(
        message.contains("exits must be \"auto\" or \"sleds\""),
        "{message}"
    );
    let (line, _, message) = error(&target("max_overhead = \"3%\"\n"));
    assert_eq!(line, 5, "{message}");
    assert!(
        message.contains("not with engine = \"inline\""),
        "{message}"
    );
    let (_, _, message) = error(&target("").replace("\"inline\"", "\"fast\""));
    assert!(message.contains("inline"), "{message}");
    // The default: uprobes, with the default budget.
    let c = parse("output = \"/tmp/o\"\n[[target]]\nbinary = \"/usr/bin/s\"\n").unwrap();
    assert_eq!(c.targets[0].engine, TargetEngine::Uprobes);
    assert_eq!(c.targets[0].max_overhead, Some(DEFAULT_MAX_OVERHEAD));
}

#[test]
fn an_inline_target_s_ring_size_is_a_power_of_two_and_only_its() {
    let target =
        |extra: &str| format!("output = \"/tmp/o\"\n[[target]]\nbinary = \"/usr/bin/s\"\n{extra}");
    let c = parse(&target("engine = \"inline\"\n")).unwrap();
    assert_eq!(c.targets[0].ring_size, DEFAULT_RING_SIZE);
    let c = parse(&target("engine = \"inline\"\nring_size = \"64MiB\"\n")).unwrap();
    assert_eq!(c.targets[0].ring_size, 64 << 20);
    let (line, _, message) = error(&target("engine = \"inline\"\nring_size = \"3MB\"\n"));
    assert_eq!(line, 5, "{message}");
    assert!(message.contains("power of two"), "{message}");
    let (_, _, message) = error(&target("ring_size = \"4MiB\"\n"));
    assert!(message.contains("engine = \"inline\""), "{message}");
}
