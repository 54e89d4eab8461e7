//! speedscope's file format (<https://www.speedscope.app/file-format-schema.json>): one
//! evented profile per thread, open (`O`) and close (`C`) events in nanoseconds from the
//! session's first record, frames shared by all profiles with their source file and line.
//!
//! Written as the trace is read: the profiles come first, the frame table (known only at the
//! end) last, which JSON allows.
//!
//! A call at depth [`MAX_SHOWN_DEPTH`] is opened and closed as the frame [`FOLDED_FRAME`]; the
//! calls it made are not written (they are counted in a warning).
use super::depth::{Folding, FOLDED_FRAME, MAX_SHOWN_DEPTH};
use super::json::JsonNames;
use crate::replay::{self, Call, FunctionKey, ObjectTable, Session, Visitor};
use std::collections::HashMap;
use std::io::{self, Write};

/// Writes `session` as a speedscope file to `out`; returns problems found (one line each).
pub fn write(session: &Session, out: &mut impl Write) -> io::Result<Vec<String>> {
    let start = session.start_ns();
    let mut names = JsonNames::new(session.namer());
    let mut frames: HashMap<Option<FunctionKey>, u32> = HashMap::new();
    let mut order: Vec<Option<FunctionKey>> = Vec::new();
    let mut folding = Folding::default();
    let mut warnings = Vec::new();
    let title = serde_json::to_string(&format!("fdr-profiled {}", session.layout.dir.display()))?;
    write!(
        out,
        "{{\"$schema\":\"https://www.speedscope.app/file-format-schema.json\",\"exporter\":\"fdr-profiled\",\"name\":{title},\"activeProfileIndex\":0,\"profiles\":["
    )?;
    for (i, t) in session.threads().iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        let name = serde_json::to_string(&format!(
            "{} pid {} tid {}",
            t.process.name, t.process.pid, t.thread.tid
        ))?;
        write!(
            out,
            "\n{{\"type\":\"evented\",\"name\":{name},\"unit\":\"nanoseconds\",\"events\":["
        )?;
        let mut v = ProfileWriter {
            out: &mut *out,
            frames: &mut frames,
            order: &mut order,
            objects: t.objects,
            start,
            first: true,
            span: None,
            folding: &mut folding,
            error: None,
        };
        replay::replay_thread(t, &mut v, &mut warnings);
        if let Some(e) = v.error {
            return Err(e);
        }
        let (from, to) = v.span.unwrap_or((0, 0));
        write!(out, "],\"startValue\":{from},\"endValue\":{to}}}")?;
    }
    warnings.extend(folding.warning());
    out.write_all(b"\n],\"shared\":{\"frames\":[")?;
    for (i, key) in order.iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        let Some(key) = key else {
            write!(out, "\n{{\"name\":\"{FOLDED_FRAME}\"}}")?;
            continue;
        };
        let name = names.get(*key).to_owned();
        let info = names.namer().function(*key);
        write!(out, "\n{{\"name\":{name}")?;
        if let Some(loc) = &info.location {
            write!(
                out,
                ",\"file\":{},\"line\":{}",
                serde_json::to_string(&loc.file)?,
                loc.line
            )?;
            if loc.column > 0 {
                write!(out, ",\"col\":{}", loc.column)?;
            }
        }
        out.write_all(b"}")?;
    }
    out.write_all(b"\n]}}\n")?;
    out.flush()?;
    Ok(warnings)
}

struct ProfileWriter<'a, W: Write> {
    out: &'a mut W,
    /// Frame index by function; `None` is the folded frame.
    frames: &'a mut HashMap<Option<FunctionKey>, u32>,
    order: &'a mut Vec<Option<FunctionKey>>,
    objects: ObjectTable,
    start: u64,
    first: bool,
    span: Option<(u64, u64)>,
    folding: &'a mut Folding,
    error: Option<io::Error>,
}

impl<W: Write> ProfileWriter<'_, W> {
    fn event(&mut self, open: bool, id: u32, ts: u64, depth: usize) {
        if self.error.is_some() || depth > MAX_SHOWN_DEPTH {
            return;
        }
        let key = (depth < MAX_SHOWN_DEPTH).then(|| self.objects.function(id));
        let order = &mut *self.order;
        let frame = *self.frames.entry(key).or_insert_with(|| {
            order.push(key);
            (order.len() - 1) as u32
        });
        let at = ts.saturating_sub(self.start);
        self.span = Some(match self.span {
            None => (at, at),
            Some((from, _)) => (from, at),
        });
        let kind = if open { 'O' } else { 'C' };
        let sep = if std::mem::take(&mut self.first) {
            ""
        } else {
            ","
        };
        if let Err(e) = write!(
            self.out,
            "{sep}{{\"type\":\"{kind}\",\"frame\":{frame},\"at\":{at}}}"
        ) {
            self.error = Some(e);
        }
    }
}

impl<W: Write> Visitor for ProfileWriter<'_, W> {
    fn enter(&mut self, id: u32, ts: u64, _: &[u64], depth: usize) {
        self.folding.fold(depth);
        self.event(true, id, ts, depth);
    }

    fn exit(&mut self, call: &Call) {
        self.event(false, call.id, call.end, call.depth);
    }
}
