//! `convert`: a session as files other tools open.
//!
//! - [`chrome`]: Chrome trace-event JSON (Perfetto UI, `chrome://tracing`): one track per
//!   thread, named processes, nested calls with their logged arguments, events as instants.
//! - [`speedscope`]: speedscope's own JSON, one evented profile per thread.
//! - [`folded`]: folded stacks (`a;b;c N`, N the self time in ns), and from them a flame
//!   graph SVG drawn by inferno.
//!
//! The timelines stream: each record is written as it is read. Folded stacks and the flame
//! graph need memory for each distinct stack, not for each call.
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
pub mod speedscope;

pub use depth::{FOLDED_FRAME, MAX_SHOWN_DEPTH};

use crate::replay::Session;
use anyhow::{Context as _, Result};
use std::io::{BufWriter, Write};
use std::path::Path;

/// Output formats of `convert`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Chrome trace-event JSON (Perfetto UI, chrome://tracing).
    Chrome,
    /// speedscope JSON (evented profiles, one per thread).
    Speedscope,
    /// Folded stacks, one `a;b;c N` line per stack, N its self time in ns.
    Folded,
    /// A flame graph SVG (from the folded stacks).
    Svg,
}

impl Format {
    /// The usual file name extension.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Chrome | Format::Speedscope => "json",
            Format::Folded => "folded",
            Format::Svg => "svg",
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
        Format::Speedscope => speedscope::write(session, out),
        Format::Folded => folded::write_folded(session, out),
        Format::Svg => folded::write_svg(session, out),
    }
}

/// Writes `session` in `format` to the file `path`, created anew (through a temporary file
/// renamed into place, so a failed conversion leaves no half-written file).
pub fn write_file(session: &Session, format: Format, path: &Path) -> Result<Vec<String>> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let file =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut out = BufWriter::new(file);
    let result = write(session, format, &mut out).and_then(|w| {
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(w)
    });
    match result {
        Ok(w) => {
            std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
            Ok(w)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e).with_context(|| format!("writing {}", path.display()))
        }
    }
}
