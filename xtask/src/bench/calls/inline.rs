//! The call benchmark's in-process rows (issue 31): XRay's own FDR runtime on the workload, and
//! fdr-profiled's inline engine attached by pid to the same workload already running (waiting
//! before its loop), each call recorded by both (XRay's duration threshold off; rings large
//! enough that neither drops a call of the loop).
use super::super::support::{last_lines, Output};
use anyhow::{bail, Context as _, Result};
use std::io::Read as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The row of XRay's FDR runtime.
pub const XRAY_FDR: &str = "XRay FDR runtime, in process (every call)";
/// The row of the inline engine.
pub const INLINE: &str = "fdr-profiled --pid --engine inline";
/// Issue 31's target: the inline engine at most this times XRay's FDR runtime per call.
pub const TARGET_VS_XRAY: f64 = 2.0;
/// Each thread's ring under the inline engine: every event of the loop fits (the daemon
/// drains meanwhile).
const INLINE_RING: &str = "536870912";

/// Where XRay's runtime writes its log (the workload turns FDR mode on itself, `--xray-fdr`:
/// every call, no duration threshold, 512 MiB of buffers).
fn xray_env(work: &Path) -> (String, String) {
    (
        "XRAY_OPTIONS".to_owned(),
        format!("verbosity=0 xray_logfile_base={}/xray-log.", work.display()),
    )
}

/// XRay's FDR row as a command line (`env` and the workload).
pub fn xray_fdr_command(bin: &str, args: &[String], work: &Path) -> (String, Vec<String>) {
    let (k, v) = xray_env(work);
    let mut a = vec![format!("{k}={v}"), bin.to_owned()];
    a.extend(args.iter().cloned());
    a.push("--xray-fdr".to_owned());
    ("env".to_owned(), a)
}

/// The inline row as a command line (the workload started first, waiting for `WORK/go`).
pub fn inline_command(
    bin: &str,
    args: &[String],
    daemon: &Path,
    work: &Path,
) -> (String, Vec<String>) {
    let mut a = vec![
        "--pid".to_owned(),
        format!(
            "$({bin} {} --wait-file {}/go & echo $!)",
            args.join(" "),
            work.display()
        ),
    ];
    a.extend(inline_args(work));
    (daemon.display().to_string(), a)
}

fn inline_args(work: &Path) -> Vec<String> {
    [
        "--engine",
        "inline",
        "--no-report",
        "--buffer-size",
        INLINE_RING,
        "--out",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([work.join("trace").display().to_string()])
    .collect()
}

/// Checks that XRay's runtime wrote its trace.
pub fn check_xray_fdr(work: &Path) -> Result<()> {
    let written: u64 = std::fs::read_dir(work)?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("xray-log."))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    if written < 1 << 20 {
        bail!("XRay's FDR runtime wrote {written} bytes: was it on?");
    }
    Ok(())
}

/// Starts the workload waiting before its loop, attaches the inline engine, lets the loop go;
/// the workload's output (and fdr-profiled's standard error).
pub fn run_inline(bin: &Path, args: &[String], daemon: &Path, work: &Path) -> Result<Output> {
    let go = work.join("go");
    let mut workload = Command::new(bin)
        .args(args)
        .arg("--wait-file")
        .arg(&go)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let stderr_path = work.join("fdr-profiled.stderr");
    let mut tracer = Command::new(daemon)
        .arg("--pid")
        .arg(workload.id().to_string())
        .args(inline_args(work))
        .stderr(std::fs::File::create(&stderr_path)?)
        .spawn()
        .context("starting fdr-profiled")?;
    let stderr = || std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !stderr().contains("fdr-profiled: recording") {
        if Instant::now() > deadline || tracer.try_wait()?.is_some() {
            let _ = workload.kill();
            let _ = tracer.kill();
            bail!(
                "fdr-profiled did not start recording: {}",
                last_lines(&stderr(), 3)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::write(&go, b"go\n")?;
    let mut stdout = String::new();
    if let Some(out) = workload.stdout.as_mut() {
        out.read_to_string(&mut stdout)?;
    }
    let status = workload.wait()?;
    // fdr-profiled ends with the process.
    let deadline = Instant::now() + Duration::from_secs(120);
    let traced = loop {
        if let Some(status) = tracer.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = tracer.kill();
            bail!("fdr-profiled did not end with the process");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if !status.success() || !traced.success() {
        bail!(
            "workload {status}, fdr-profiled {traced}: {}",
            last_lines(&stderr(), 3)
        );
    }
    Ok(Output {
        stdout,
        stderr: stderr(),
    })
}

/// Checks that the inline session recorded the loop's calls.
pub fn check_inline(session: &serde_json::Value, function: &str, calls: u64) -> Result<()> {
    let recorded = session["functions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["name"] == function)
        .and_then(|f| f["calls"].as_u64())
        .unwrap_or(0);
    if recorded + session["events_lost"].as_u64().unwrap_or(0) < calls {
        bail!("the inline engine recorded {recorded} calls of {function} for {calls}");
    }
    Ok(())
}
