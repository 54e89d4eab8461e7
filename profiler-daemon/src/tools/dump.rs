//! `fdr-profiled dump FILE`: every record of an FDR file, one per line, in the style of
//! `llvm-xray fdr-dump`, plus the file offset, the absolute tick of function records and events,
//! and function names when a binary (`--binary`) or a session (`--session`) names them.
//!
//! It stops at the first violation the reader finds, after printing every record before it,
//! and fails with that violation (offset, record kind, problem) as its one-line error.
use anyhow::{bail, Context as _, Result};
use std::collections::HashMap;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use xray_fdr::reader::{EventTime, RawRecord, Reader, Step};
use xray_fdr::records::FunctionAction;
use xray_fdr::writer::TYPED_EVENT_PREFIX;
use xray_object::elf::ElfImage;
use xray_object::instrmap::InstrMap;
use xray_object::symbols::SymbolTable;

/// Options of `dump`.
#[derive(Debug, clap::Args)]
pub struct DumpArgs {
    /// The FDR file.
    pub file: PathBuf,
    /// The instrumented binary the trace is of: function records get its function names.
    #[arg(long, value_name = "BIN", conflicts_with = "session")]
    pub binary: Option<PathBuf>,
    /// The session directory the file belongs to (holds session.json): the binary is taken from
    /// the manifest.
    #[arg(long, value_name = "DIR")]
    pub session: Option<PathBuf>,
    /// With --session: leave out the `Exit` records fdr-profiled wrote to close frames proven
    /// gone (unwound by an exception, skipped by a `longjmp`, ...), which XRay's own runtime
    /// does not write: the records are then exactly the stream XRay's FDR runtime would have
    /// written (deltas are printed as in the file). Without it, those records are marked.
    #[arg(long, requires = "session")]
    pub xray_stream: bool,
}

/// Runs `dump`; returns the exit code.
pub fn run(args: &DumpArgs) -> Result<u8> {
    let names = match (&args.binary, &args.session) {
        (Some(bin), _) => Some(FunctionNames::from_binary(bin)?),
        (None, Some(dir)) => Some(FunctionNames::from_binary(&binary_from_session(
            dir, &args.file,
        )?)?),
        (None, None) => None,
    };
    let closing = match &args.session {
        Some(dir) => closing_exits_from_session(dir, &args.file)?,
        None => ClosingExits::default(),
    };
    let bytes = super::read_regular_file(&args.file)?;
    let mut out = BufWriter::new(io::stdout().lock());
    let view = View {
        names: names.as_ref(),
        closing: &closing,
        xray_stream: args.xray_stream,
    };
    match dump(&bytes, &view, &mut out) {
        Ok(Ok(())) => {}
        // `dump | head` closes the pipe early: not an error.
        Ok(Err(e)) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(0),
        Ok(Err(e)) => return Err(e).context("writing to stdout"),
        Err(e) => {
            let _ = out.flush();
            bail!("{}: {e}", args.file.display());
        }
    }
    match out.flush() {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(0),
    }
}

/// What a dump shows besides the records.
pub struct View<'a> {
    /// Function names.
    pub names: Option<&'a FunctionNames>,
    /// The exits fdr-profiled wrote to close frames proven gone.
    pub closing: &'a ClosingExits,
    /// Leave those out (else mark them).
    pub xray_stream: bool,
}

/// Writes the dump of `bytes` to `out`. The outer error is the file's first violation, the
/// inner one an output failure.
pub fn dump(
    bytes: &[u8],
    view: &View<'_>,
    out: &mut impl Write,
) -> Result<io::Result<()>, xray_fdr::ReadError> {
    let mut reader = Reader::new(bytes)?;
    let h = *reader.header();
    let header = format!(
        "<Header: version = {}, type = {}, constant_tsc = {}, nonstop_tsc = {}, \
         cycle_frequency = {}, buffer_size = {}>",
        h.version,
        h.log_type,
        h.bitfield & 1 != 0,
        h.bitfield & 2 != 0,
        h.cycle_frequency,
        h.buffer_size
    );
    if let Err(e) = writeln!(out, "{header}") {
        return Ok(Err(e));
    }
    let mut base = 0;
    // Index of the next function record among the file's function records.
    let mut function_records = 0u64;
    while let Some(step) = reader.next_step()? {
        let mut text = line(&step, base, view.names);
        base = step.context.base;
        if matches!(step.record, RawRecord::Function { .. }) && !step.ignored {
            let closing = view.closing.contains(function_records);
            function_records += 1;
            if closing {
                if view.xray_stream {
                    continue;
                }
                text.push_str(" (closed by fdr-profiled: the frame was proven gone here; XRay's runtime writes no such record)");
            }
        }
        if let Err(e) = writeln!(out, "{text}") {
            return Ok(Err(e));
        }
    }
    Ok(Ok(()))
}

/// The `Exit` records the recorder wrote to close frames proven gone, as `session.json` lists
/// them for one file (`closing_exits`: runs of `[first function record, count]`).
#[derive(Debug, Default)]
pub struct ClosingExits(Vec<[u64; 2]>);

impl ClosingExits {
    /// Whether function record `index` of the file is one.
    pub fn contains(&self, index: u64) -> bool {
        // Runs are in file order: the last run starting at or before `index`.
        let at = self.0.partition_point(|r| r[0] <= index);
        at > 0 && index - self.0[at - 1][0] < self.0[at - 1][1]
    }
}

/// The closing exits `dir/session.json` lists for `file` (the thread whose `file` is `file`'s
/// path under `dir`); none when the manifest does not list the file.
pub fn closing_exits_from_session(dir: &Path, file: &Path) -> Result<ClosingExits> {
    let json = read_manifest(dir)?;
    let name = |p: &Path| -> Option<String> {
        let parent = p.parent()?.file_name()?.to_str()?;
        Some(format!("{parent}/{}", p.file_name()?.to_str()?))
    };
    let Some(want) = name(file) else {
        return Ok(ClosingExits::default());
    };
    let thread = json["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["threads"].as_array().into_iter().flatten())
        .find(|t| t["file"].as_str() == Some(want.as_str()));
    let mut runs: Vec<[u64; 2]> = thread
        .and_then(|t| t["closing_exits"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|r| Some([r.get(0)?.as_u64()?, r.get(1)?.as_u64()?]))
        .collect();
    runs.sort_unstable();
    Ok(ClosingExits(runs))
}

/// `dir/session.json`, parsed.
fn read_manifest(dir: &Path) -> Result<serde_json::Value> {
    let manifest = dir.join(fdr_session::manifest::MANIFEST);
    // Read as every reader of a session reads it: no symbolic link, no FIFO, bounded.
    let Some(bytes) = fdr_session::manifest::read(&manifest)? else {
        bail!(
            "cannot read {} (a session killed before its end has none; use --binary)",
            manifest.display()
        );
    };
    serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not valid JSON", manifest.display()))
}

/// One record's line; `base` is the delta base before the record (to mark no-op TSCWraps).
pub fn line(step: &Step<'_>, base: u64, names: Option<&FunctionNames>) -> String {
    let mut s = format!("@{:#x} ", step.offset);
    let when = |s: &mut String| {
        if let Some(tsc) = step.tsc {
            s.push_str(&format!(" tsc = {tsc}, cpu = {}", step.cpu));
        }
    };
    match step.record {
        RawRecord::Function {
            action,
            function_id,
            delta,
        } => {
            let what = match action {
                FunctionAction::Entry => "Function Enter",
                FunctionAction::EntryArgs => "Function Enter With Arg",
                FunctionAction::Exit => "Function Exit",
                FunctionAction::TailExit => "Function Tail Exit",
            };
            s.push_str(&format!("<{what}: #{function_id} delta = +{delta}>"));
            when(&mut s);
            if let Some(name) = names.and_then(|n| n.name(function_id)) {
                s.push_str(&format!(" {name}"));
            }
            if step.unwound > 0 {
                s.push_str(&format!(
                    " (also closes {} unwound frame{})",
                    step.unwound,
                    if step.unwound == 1 { "" } else { "s" }
                ));
            }
        }
        RawRecord::NewBuffer { tid } => s.push_str(&format!("<Thread ID: {}>", tid as i32)),
        RawRecord::EndOfBuffer => s.push_str("<End of Buffer>"),
        RawRecord::NewCpuId { cpu, tsc } => s.push_str(&format!("<CPU: id = {cpu}, tsc = {tsc}>")),
        RawRecord::TscWrap { tsc } => {
            s.push_str(&format!("<TSC Wrap: base = {tsc}>"));
            if !step.ignored && base == tsc {
                s.push_str(" (no-op)");
            }
        }
        RawRecord::WallClock { secs, micros } => {
            s.push_str(&format!("<Wall Time: seconds = {secs}.{micros:06}>"))
        }
        RawRecord::CustomEvent { time, cpu, data } => {
            // As llvm-xray prints them: versions 1 to 4 with the marker's tsc and cpu (0 when
            // the version has no cpu field), version 5 with its delta.
            let head = match time {
                EventTime::Absolute(tsc) => format!("tsc = {tsc}, cpu = {}", cpu.unwrap_or(0)),
                EventTime::Delta(d) => format!("delta = {d:+}"),
            };
            s.push_str(&format!(
                "<Custom Event: {head}, size = {}, data = '{}'>",
                data.len(),
                data.escape_ascii()
            ));
            when(&mut s);
            if data.len() >= 6 && data[..4] == TYPED_EVENT_PREFIX {
                let t = u16::from_le_bytes([data[4], data[5]]);
                s.push_str(&format!(
                    " (typed event, type = {t}, written as a custom event)"
                ));
            }
        }
        RawRecord::CallArgument { value } => s.push_str(&format!(
            "<Call Argument: data = {value} (hex = {value:#x})>"
        )),
        RawRecord::BufferExtents { size } => s.push_str(&format!("<Buffer: size = {size} bytes>")),
        RawRecord::TypedEvent {
            delta,
            event_type,
            data,
        } => {
            s.push_str(&format!(
                "<Typed Event: delta = {delta:+}, type = {event_type}, size = {}, data = '{}'>",
                data.len(),
                data.escape_ascii()
            ));
            when(&mut s);
        }
        RawRecord::Pid { pid } => s.push_str(&format!("<PID: {}>", pid as i32)),
        RawRecord::Padding { len } => s.push_str(&format!("<Padding: {len} bytes>")),
    }
    if step.ignored {
        s.push_str(" (ignored: after End of Buffer)");
    }
    s
}

/// Function names by XRay id, from an instrumented binary.
#[derive(Debug, Default)]
pub struct FunctionNames(HashMap<u32, String>);

impl FunctionNames {
    /// Reads `bin`'s instrumentation map and symbols: id → function address → symbol name.
    pub fn from_binary(bin: &Path) -> Result<FunctionNames> {
        let image = ElfImage::open(bin)?;
        let map = InstrMap::from_elf(&image)?;
        // Refused as report and the recorder refuse it: a map that does not match the code.
        map.check_sleds(&image)?;
        let symbols = SymbolTable::from_elf(&image);
        Ok(FunctionNames(
            map.functions
                .iter()
                .filter_map(|f| Some((f.id, symbols.name_at(f.address)?.to_owned())))
                .collect(),
        ))
    }

    /// The name of function `id`, if the binary has one.
    pub fn name(&self, id: u32) -> Option<&str> {
        self.0.get(&id).map(String::as_str)
    }
}

/// A binary path the manifest at `manifest` records, if absolute: a recorder writes no other,
/// and a relative one would be read from wherever `dump` runs.
fn recorded_path(bin: PathBuf, manifest: &Path) -> Result<PathBuf> {
    if !bin.is_absolute() {
        bail!(
            "{}: binary {:?} is not an absolute path; refused",
            manifest.display(),
            bin.display().to_string()
        );
    }
    Ok(bin)
}

/// The binary `file` was recorded from, per `dir/session.json`: the process whose output
/// directory holds `file`, or the only binary of the session.
pub fn binary_from_session(dir: &Path, file: &Path) -> Result<PathBuf> {
    let manifest = dir.join(fdr_session::manifest::MANIFEST);
    let json = read_manifest(dir)?;
    let processes = json["processes"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let parent = file
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str());
    let binary_of = |p: &serde_json::Value| p["binary"].as_str().map(PathBuf::from);
    if let Some(p) = processes
        .iter()
        .find(|p| parent.is_some() && p["dir"].as_str() == parent)
    {
        if let Some(bin) = binary_of(p) {
            return recorded_path(bin, &manifest);
        }
    }
    let mut binaries: Vec<PathBuf> = processes.iter().filter_map(binary_of).collect();
    binaries.dedup();
    match binaries.as_slice() {
        [one] => recorded_path(one.clone(), &manifest),
        [] => bail!("{} names no binary; use --binary", manifest.display()),
        _ => bail!(
            "{} names several binaries and none for {}; use --binary",
            manifest.display(),
            file.display()
        ),
    }
}
