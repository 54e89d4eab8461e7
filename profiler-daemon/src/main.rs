//! `fdr-profiled`: see the README and `fdr-profiled --help`.
use anyhow::{bail, Context as _, Result};
use clap::Parser as _;
use profiler_daemon::cli::{Cli, Tool};
use profiler_daemon::record;
use profiler_daemon::{errln, out};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.tool {
        None => record::run(&cli.record),
        Some(Tool::List { target }) => profiler_daemon::tools::list::render(target).map(|table| {
            out!("{table}");
            0
        }),
        Some(Tool::Dump(args)) => profiler_daemon::tools::dump::run(args),
        Some(Tool::Verify(args)) => profiler_daemon::tools::verify::run(args),
        Some(Tool::Report(args)) => profiler_daemon::tools::report::run(args),
        Some(Tool::Diff(args)) => profiler_daemon::tools::diff::run(args),
        Some(Tool::Convert(args)) => profiler_daemon::tools::convert::run(args),
        Some(Tool::Service(args)) => profiler_daemon::service::run(args),
        Some(Tool::Snapshot(args)) => profiler_daemon::service::control::snapshot(args),
        Some(Tool::Status { socket, json }) => {
            profiler_daemon::service::control::status(socket, *json)
        }
        Some(Tool::Top(args)) => top(args),
        Some(Tool::BenchAttach(args)) => profiler_daemon::tools::bench_attach::run(args),
        Some(Tool::BenchRescan(args)) => profiler_daemon::tools::bench_rescan::run(args),
        Some(Tool::BenchUnwinding(args)) => profiler_daemon::tools::bench_unwinding::run(args),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err)
            if err.chain().any(|e| {
                e.downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            // The reader of our output went away (`| head`): nothing more to say.
            ExitCode::from(profiler_daemon::console::BROKEN_PIPE_STATUS)
        }
        Err(err) => {
            // One line: the whole cause chain, with any embedded newlines folded.
            let text = format!("{err:#}").replace('\n', " ");
            errln!("fdr-profiled: error: {text}");
            ExitCode::from(1)
        }
    }
}

/// `top`: the service's live view, or a recording's (its options re-read as a recording's,
/// with `--live`), its files in a directory of its own removed at the end unless `--out`.
fn top(args: &profiler_daemon::tools::top::TopArgs) -> Result<u8> {
    if args.recording.is_empty() {
        return profiler_daemon::tools::top::service(args.socket.as_deref());
    }
    if args.socket.is_some() {
        bail!("--socket watches the service, which takes no recording options");
    }
    // Clap took the `--` of `top -- COMMAND`: a recording's options begin with `-`, so a
    // first word that does not is the command.
    let command = !args.recording[0].to_string_lossy().starts_with('-');
    let argv = ["fdr-profiled", "--live"]
        .into_iter()
        .chain(command.then_some("--"))
        .map(std::ffi::OsString::from)
        .chain(args.recording.iter().cloned());
    // A mistake in the recording options is clap's usual message and status.
    let cli = Cli::parse_from(argv);
    let Some(mut recording) = cli.tool.is_none().then_some(cli.record) else {
        bail!("top takes recording options (--pid, --attach, -- COMMAND), not another command");
    };
    profiler_daemon::tools::top::check_terminal()?;
    let kept = recording.out.is_some();
    if !kept {
        // Made here, mode 0700, failing if anything is at that name (a prepared symlink).
        let dir = std::env::temp_dir().join(format!(
            "fdr-profiled-top.{}.{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        ));
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        recording.out = Some(dir);
        recording.no_report = true;
    }
    let result = record::run(&recording);
    if let (false, Some(dir)) = (kept, &recording.out) {
        let _ = std::fs::remove_dir_all(dir);
        if result.is_ok() {
            errln!("fdr-profiled: top: the recording was not kept (--out DIR keeps it)");
        }
    }
    result
}
