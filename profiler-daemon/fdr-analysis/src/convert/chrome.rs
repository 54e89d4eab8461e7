//! Chrome trace-event JSON, as the Perfetto UI and `chrome://tracing` load it.
//!
//! Each call is a `B`/`E` pair on its thread's track (pid and tid as recorded), so the file is
//! written as the trace is read; process and thread names are `M` metadata events; logged
//! function arguments are the args of the call's events; custom and
//! typed events are thread-scoped instant events (`i`) whose args hold the payload and where
//! in the source the event was emitted. Times are microseconds from the session's first
//! record, with nanosecond digits.
//!
//! An `E` event repeats its `B` event's name and args: speedscope's importer pairs them by
//! both (Perfetto by order alone). Nothing else goes into a call's args, since speedscope
//! shows them as part of the frame's name.
//!
//! A call at depth [`MAX_SHOWN_DEPTH`] is one slice named [`FOLDED_FRAME`] over its whole
//! duration; the calls it made are not drawn (they are counted in a warning).
use super::depth::{Folding, FOLDED_FRAME, MAX_SHOWN_DEPTH};
use super::json::{micros, payload_text, JsonNames};
use crate::replay::{self, Call, FunctionKey, ObjectTable, Session, TraceEvent, Visitor};
use crate::report::render::site_text;
use profiler_common::SledKind;
use std::collections::HashMap;
use std::io::{self, Write};

/// Writes `session` as a Chrome trace to `out`; returns problems found (one line each).
pub fn write(session: &Session, out: &mut impl Write) -> io::Result<Vec<String>> {
    let start = session.start_ns();
    let mut names = JsonNames::new(session.namer());
    let mut sites: HashMap<(FunctionKey, bool), String> = HashMap::new();
    let mut warnings = Vec::new();
    let dir = serde_json::to_string(&session.layout.dir.display().to_string())?;
    writeln!(
        out,
        "{{\"displayTimeUnit\":\"ns\",\"otherData\":{{\"generator\":\"fdr-profiled\",\"session\":{dir}}},\"traceEvents\":["
    )?;
    let mut first = true;
    let mut folding = Folding::default();
    let mut named_processes = std::collections::HashSet::new();
    for t in session.threads() {
        let pid = t.process.pid;
        let tid = t.thread.tid;
        if named_processes.insert(pid) {
            let name = serde_json::to_string(&t.process.name)?;
            sep(out, &mut first)?;
            write!(
                out,
                "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":{name}}}}}"
            )?;
        }
        // Viewers add the ids themselves.
        let thread = if tid == pid { "main thread" } else { "thread" };
        sep(out, &mut first)?;
        write!(
            out,
            "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":\"{thread}\"}}}}"
        )?;
        let mut v = ThreadWriter {
            out: &mut *out,
            names: &mut names,
            sites: &mut sites,
            objects: t.objects,
            head: format!("\"pid\":{pid},\"tid\":{tid}"),
            start,
            first: &mut first,
            open: Vec::new(),
            folding: &mut folding,
            error: None,
        };
        replay::replay_thread(&t, &mut v, &mut warnings);
        if let Some(e) = v.error {
            return Err(e);
        }
    }
    warnings.extend(folding.warning());
    out.write_all(b"\n]}\n")?;
    out.flush()?;
    Ok(warnings)
}

fn sep(out: &mut impl Write, first: &mut bool) -> io::Result<()> {
    if !std::mem::take(first) {
        out.write_all(b",\n")?;
    }
    Ok(())
}

struct ThreadWriter<'a, W: Write> {
    out: &'a mut W,
    names: &'a mut JsonNames,
    sites: &'a mut HashMap<(FunctionKey, bool), String>,
    objects: ObjectTable,
    /// `"pid":P,"tid":T`
    head: String,
    start: u64,
    first: &'a mut bool,
    /// `"name":..,"args":{..}` of each open call shown, for its `E` event.
    open: Vec<String>,
    folding: &'a mut Folding,
    error: Option<io::Error>,
}

impl<W: Write> ThreadWriter<'_, W> {
    fn emit(&mut self, f: impl FnOnce(&mut Self) -> io::Result<()>) {
        if self.error.is_some() {
            return;
        }
        let r = sep(self.out, self.first).and_then(|()| f(self));
        if let Err(e) = r {
            self.error = Some(e);
        }
    }

    fn key(&self, id: u32) -> FunctionKey {
        self.objects.function(id)
    }

    /// The event site text of a function's event sleds, as a JSON string.
    fn site(&mut self, id: u32, typed: bool) -> String {
        let key = self.key(id);
        let namer = self.names.namer();
        self.sites
            .entry((key, typed))
            .or_insert_with(|| {
                let kind = if typed {
                    SledKind::TypedEvent
                } else {
                    SledKind::CustomEvent
                };
                let sites = namer
                    .object(key.object)
                    .map(|o| o.event_sites(key.function_id(), kind))
                    .unwrap_or_default();
                let text: Vec<String> = sites.iter().map(site_text).collect();
                serde_json::to_string(&text.join(" | ")).unwrap_or_default()
            })
            .clone()
    }
}

impl<W: Write> Visitor for ThreadWriter<'_, W> {
    fn enter(&mut self, id: u32, ts: u64, args: &[u64], depth: usize) {
        if self.folding.fold(depth) && depth > MAX_SHOWN_DEPTH {
            return;
        }
        let key = self.key(id);
        let mut fragment = if depth == MAX_SHOWN_DEPTH {
            format!("\"name\":\"{FOLDED_FRAME}\"")
        } else {
            format!("\"name\":{}", self.names.get(key))
        };
        if !args.is_empty() && depth < MAX_SHOWN_DEPTH {
            let list: Vec<String> = args
                .iter()
                .enumerate()
                .map(|(i, a)| format!("\"arg{i}\":{a}"))
                .collect();
            fragment.push_str(&format!(",\"args\":{{{}}}", list.join(",")));
        }
        let ts = micros(ts.saturating_sub(self.start));
        self.emit(|w| {
            write!(
                w.out,
                "{{\"ph\":\"B\",\"cat\":\"function\",{fragment},{},\"ts\":{ts}}}",
                w.head
            )
        });
        self.open.push(fragment);
    }

    fn exit(&mut self, call: &Call) {
        if call.depth > MAX_SHOWN_DEPTH {
            return;
        }
        let ts = micros(call.end.saturating_sub(self.start));
        let fragment = self.open.pop().unwrap_or_default();
        self.emit(|w| {
            write!(
                w.out,
                "{{\"ph\":\"E\",\"cat\":\"function\",{fragment},{},\"ts\":{ts}}}",
                w.head
            )
        });
    }

    fn event(&mut self, e: &TraceEvent<'_>) {
        let ts = micros(e.ts.saturating_sub(self.start));
        let name = match e.event_type {
            None => "custom event".to_owned(),
            Some(t) => format!("typed event {t}"),
        };
        let payload = serde_json::to_string(&payload_text(e.data)).unwrap_or_default();
        let (function, site) = match e.function {
            Some(id) => (
                self.names.get(self.key(id)).to_owned(),
                self.site(id, e.event_type.is_some()),
            ),
            None => ("null".to_owned(), "null".to_owned()),
        };
        self.emit(|w| {
            write!(
                w.out,
                "{{\"ph\":\"i\",\"s\":\"t\",\"cat\":\"event\",\"name\":\"{name}\",{},\"ts\":{ts},\"args\":{{\"payload\":{payload},\"function\":{function},\"emitted\":{site}}}}}",
                w.head
            )
        });
    }
}
