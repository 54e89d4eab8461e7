//! Our outputs in a real viewer: speedscope (from the npm registry, installed by `cargo xtask
//! setup` into `~/.cache/fdr-profiled/speedscope`) in headless Chromium imports the speedscope
//! and the Chrome trace-event files of a recorded C++ fixture trace without error and lists
//! the fixture's function names; Chromium parses and draws the flame graph SVG. Screenshots
//! are kept in `<target dir>/test-artifacts/viewer/`.

use std::path::{Path, PathBuf};
use std::process::Command;
use tests::scenario::{trace_launched, CPP};
use tests::synthetic_session::run_tool;
use tests::tools::run_output;

/// The functions the main thread of the C++ fixture runs.
const MAIN_THREAD_FUNCTIONS: &[&str] = &[
    "main",
    "fx::work(int, int)",
    "fx::outer(int)",
    "fx::middle(int)",
    "fx::leaf(int)",
];

fn chromium() -> PathBuf {
    let path = PathBuf::from("/usr/bin/chromium");
    assert!(
        path.is_file(),
        "{} missing: install the Debian package chromium (cargo xtask setup does)",
        path.display()
    );
    path
}

fn speedscope_index() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    let index =
        home.join(".cache/fdr-profiled/speedscope/node_modules/speedscope/dist/release/index.html");
    assert!(
        index.is_file(),
        "{} missing: cargo xtask setup installs speedscope",
        index.display()
    );
    index
}

fn artifacts() -> PathBuf {
    let dir = tests::target_dir().join("test-artifacts").join("viewer");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn base64(data: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Runs headless Chromium on `url`: `--dump-dom` (returned, with the console log) or
/// `--screenshot=PNG`.
fn chromium_run(url: &str, mode: &str, scratch: &Path) -> (String, String) {
    let out = run_output(
        Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--enable-unsafe-swiftshader",
                "--allow-file-access-from-files",
                "--enable-logging=stderr",
                "--v=0",
                "--window-size=1600,1000",
                "--virtual-time-budget=15000",
            ])
            .arg(format!(
                "--user-data-dir={}",
                scratch.join("profile").display()
            ))
            .arg(mode)
            .arg(url),
    );
    assert!(
        out.status.success(),
        "chromium {mode} {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Loads `file` into speedscope (as its command-line launcher does: a script calling
/// `speedscope.loadFileFromBase64`), checks the sandwich view lists `names`, keeps a
/// screenshot of the flame chart as `<label>.png`.
fn load_in_speedscope(file: &Path, label: &str, names: &[&str], scratch: &Path) {
    let loader = scratch.join(format!("{label}.js"));
    let data = std::fs::read(file).unwrap();
    std::fs::write(
        &loader,
        format!(
            "speedscope.loadFileFromBase64({:?}, {:?})",
            file.file_name().unwrap().to_string_lossy(),
            base64(&data)
        ),
    )
    .unwrap();
    let index = speedscope_index();
    let url = |view: &str| {
        format!(
            "file://{}#localProfilePath={}{view}",
            index.display(),
            loader.display()
        )
    };
    let (dom, log) = chromium_run(&url("&view=sandwich"), "--dump-dom", scratch);
    assert!(
        !dom.contains("Something went wrong") && !log.contains("Failed to load format"),
        "speedscope could not import {label}:\n{log}"
    );
    assert!(!log.contains("Unrecognized format"), "{log}");
    // speedscope's importer warns when it cannot pair an end with its begin.
    for complaint in [
        "Tried to end",
        "still open at end of profile",
        "Empty profile",
    ] {
        assert!(
            !log.contains(complaint),
            "{label}: speedscope: {complaint}:\n{log}"
        );
    }
    assert!(
        log.contains("CONSOLE"),
        "the console log is captured: {log}"
    );
    for name in names {
        let escaped = name
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;");
        assert!(
            dom.contains(&escaped),
            "speedscope does not show {name} for {label}:\n{dom}"
        );
    }
    let png = artifacts().join(format!("{label}.png"));
    let _ = std::fs::remove_file(&png);
    chromium_run(
        &url(""),
        &format!("--screenshot={}", png.display()),
        scratch,
    );
    let size = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
    assert!(
        size > 10_000,
        "{}: {size} bytes: nothing drawn?",
        png.display()
    );
}

#[test]
fn speedscope_imports_our_speedscope_and_chrome_files_and_chromium_draws_the_svg() {
    let run = trace_launched(&CPP, 10);
    let scratch = tests::scratch_dir("viewer");
    let convert = |format: &str, name: &str| -> PathBuf {
        let out = scratch.path().join(name);
        let (ok, _, err) = run_tool(&[
            "convert".as_ref(),
            run.trace.dir.as_os_str(),
            "--format".as_ref(),
            format.as_ref(),
            "--output".as_ref(),
            out.as_os_str(),
        ]);
        assert!(ok, "convert {format}: {err}");
        out
    };
    let ss = convert("speedscope", "fixture.speedscope.json");
    load_in_speedscope(&ss, "speedscope", MAIN_THREAD_FUNCTIONS, scratch.path());
    let chrome = convert("chrome", "fixture.trace.json");
    load_in_speedscope(
        &chrome,
        "chrome-trace",
        MAIN_THREAD_FUNCTIONS,
        scratch.path(),
    );

    // The flame graph: Chromium parses the SVG (an XML error page otherwise) and draws it.
    let svg = convert("svg", "fixture.svg");
    let url = format!("file://{}", svg.display());
    let (dom, _) = chromium_run(&url, "--dump-dom", scratch.path());
    assert!(
        !dom.contains("This page contains the following errors"),
        "{dom}"
    );
    for name in MAIN_THREAD_FUNCTIONS {
        assert!(dom.contains(name), "{name} not in the rendered SVG");
    }
    let png = artifacts().join("flamegraph.png");
    let _ = std::fs::remove_file(&png);
    chromium_run(
        &url,
        &format!("--screenshot={}", png.display()),
        scratch.path(),
    );
    assert!(std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0) > 10_000);
}

#[test]
fn base64_matches_rfc_4648_examples() {
    for (plain, coded) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(base64(plain.as_bytes()), coded);
    }
}
