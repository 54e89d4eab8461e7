//! `fdr-profiled`: see the README and `fdr-profiled --help`.
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
