//! `convert`: a session as files other tools open.
//!
//! - [`chrome`]: Chrome trace-event JSON (Perfetto UI, `chrome://tracing`): one track per
//!   thread, named processes, nested calls with their logged arguments, events as instants.
//! - [`perfetto`]: Perfetto's own protobuf trace, the same timeline for traces of any size.
//! - [`speedscope`]: speedscope's own JSON, one evented profile per thread.
//! - [`folded`]: folded stacks (`a;b;c N`, N the self time in ns), and from them a flame
//!   graph SVG drawn by inferno.
//! - [`pprof`]: a gzipped pprof profile (`go tool pprof`, Pyroscope, Parca), one sample per
//!   distinct call stack with its calls, inclusive and self time.
//!
//! The timelines stream: each record is written as it is read. Folded stacks, pprof and the
//! flame graph need memory for each distinct stack, not for each call.
//!
//! Every format shows calls down to [`MAX_SHOWN_DEPTH`] levels; a call at that depth stands for
//! itself and everything it called, as one frame named [`FOLDED_FRAME`] (in folded stacks, followed
//! by the function whose self time it is). A trace of XRay's own runtime has no exit for a frame
//! an exception or `longjmp` left, and no stack pointer to tell such a frame from a live one: it
//! stays open until a caller's exit, so under a long-lived catcher every throw would add its frames
//! to the depth of every later call, and folded stacks would grow as throws x depth. With the cap,
//! sizes and memory grow with the distinct stacks and the events; the calls folded are counted in a
//! warning. The report ([`crate::report`]) is not affected: its statistics stay exact.
pub mod chrome;
mod depth;
pub mod folded;
mod json;
pub mod perfetto;
pub mod pprof;
pub mod speedscope;

pub use depth::{FOLDED_FRAME, MAX_SHOWN_DEPTH};

use crate::replay::Session;
use anyhow::Result;
use fdr_session::output_dir::OutputDir;
use std::io::{BufWriter, Write};
use std::path::Path;

/// Output formats of `convert`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Chrome trace-event JSON (Perfetto UI, chrome://tracing).
    Chrome,
    /// Perfetto's protobuf trace (Perfetto UI, trace processor): the timeline of any size.
    Perfetto,
    /// speedscope JSON (evented profiles, one per thread).
    Speedscope,
    /// Folded stacks, one `a;b;c N` line per stack, N its self time in ns.
    Folded,
    /// A flame graph SVG (from the folded stacks).
    Svg,
    /// A gzipped pprof profile (go tool pprof, Pyroscope, Parca): calls, wall and self time
    /// per call stack.
    Pprof,
}

impl Format {
    /// The usual file name extension.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Chrome | Format::Speedscope => "json",
            Format::Perfetto => "perfetto-trace",
            Format::Folded => "folded",
            Format::Svg => "svg",
            Format::Pprof => "pb.gz",
        }
    }
}

/// Writes `session` in `format` to `out`; returns problems found while reading.
pub fn write(
    session: &Session,
    format: Format,
    out: &mut impl Write,
) -> std::io::Result<Vec<String>> {
    match format {
        Format::Chrome => chrome::write(session, out),
        Format::Perfetto => perfetto::write(session, out),
        Format::Speedscope => speedscope::write(session, out),
        Format::Folded => folded::write_folded(session, out),
        Format::Svg => folded::write_svg(session, out),
        Format::Pprof => pprof::write(session, out),
    }
}

/// Writes `session` in `format` to the file `path`, which must not exist: created `0600` in a
/// directory other users cannot write to (unless sticky), through a hidden file given its name
/// only when complete, so a failed conversion leaves nothing (see [`crate::output_dir`]).
pub fn write_file(session: &Session, format: Format, path: &Path) -> Result<Vec<String>> {
    let (dir, name) = OutputDir::for_new_file(path)?;
    write_in(session, format, &dir, &name)
}

/// Writes `session` in `format` as the new file `name` of the directory `dir`.
pub fn write_in(
    session: &Session,
    format: Format,
    dir: &OutputDir,
    name: &str,
) -> Result<Vec<String>> {
    dir.write_new(name, |file| {
        let mut out = BufWriter::new(file);
        let warnings = write(session, format, &mut out)?;
        out.flush()?;
        Ok(warnings)
    })
}
