//! Folded stacks (`outer;inner;leaf N`, the format of Brendan Gregg's `flamegraph.pl` and of
//! inferno) and flame graph SVGs drawn from them.
//!
//! N is the stack's self time in nanoseconds, summed over every thread and process. Stacks are
//! kept in a trie, one node per distinct stack, so memory grows with the number of distinct
//! stacks, not with the number of calls. A `;` inside a function name (Rust array types such
//! as `[u8; 4]`) would split the frame, so it is written as a full-width `；`.
//!
//! Stacks are cut at [`MAX_SHOWN_DEPTH`] frames: the self time of a
//! deeper call goes to `first frames;[deeper calls folded];its function`, so a stack is never
//! longer than the cap plus two frames, and the distinct stacks stay as many as the distinct
//! (shown stack, function) pairs.
use super::depth::{Folding, FOLDED_FRAME, MAX_SHOWN_DEPTH};
use crate::replay::{self, Call, CallEnd, FunctionKey, ObjectTable, Session, Visitor};
use std::collections::HashMap;
use std::io::{self, Write};

/// The parent of outermost frames.
pub(super) const ROOT: u32 = u32::MAX;

/// A frame of a stack: a function, or the mark where deeper frames were folded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Frame {
    Function(FunctionKey),
    Folded,
}

/// What the calls that returned at one stack add up to (the report's columns): calls that an
/// exception unwound or that were still open are in [`StackTrie`]'s self time only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Returned {
    /// Calls.
    pub calls: u64,
    /// Their inclusive time, ns.
    pub total_ns: u64,
    /// Their self time, ns.
    pub self_ns: u64,
}

/// Distinct call stacks and their self time.
#[derive(Default)]
pub struct StackTrie {
    /// (parent, frame) per node.
    pub(super) nodes: Vec<(u32, Frame)>,
    /// Self time of every call that ended at the node's stack, however it ended.
    self_ns: Vec<u64>,
    /// The calls that returned at the node's stack.
    pub(super) returned: Vec<Returned>,
    index: HashMap<(u32, Frame), u32>,
    folding: Folding,
    /// The earliest entry and the latest exit seen, ns (0 and 0 when no call ended).
    pub(super) span: (u64, u64),
    /// Calls that ended without returning: unwound, or open at the end.
    pub(super) not_returned: u64,
}

impl StackTrie {
    fn child(&mut self, parent: u32, frame: Frame) -> u32 {
        let nodes = &mut self.nodes;
        let self_ns = &mut self.self_ns;
        let returned = &mut self.returned;
        *self.index.entry((parent, frame)).or_insert_with(|| {
            nodes.push((parent, frame));
            self_ns.push(0);
            returned.push(Returned::default());
            (nodes.len() - 1) as u32
        })
    }

    /// Number of distinct stacks.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether no call was seen.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Reads every thread of `session`; returns problems found (one line each), the calls
    /// folded below [`MAX_SHOWN_DEPTH`] among them.
    pub fn from_session(session: &Session) -> (StackTrie, Vec<String>) {
        let mut trie = StackTrie::default();
        let mut warnings = Vec::new();
        for t in session.threads() {
            let mut v = ThreadStacks {
                trie: &mut trie,
                stack: Vec::new(),
                objects: t.objects,
            };
            replay::replay_thread(&t, &mut v, &mut warnings);
        }
        warnings.extend(trie.folding.warning());
        (trie, warnings)
    }

    /// One `a;b;c N` line per stack with self time, sorted (inferno wants them sorted).
    pub fn lines(&self, session: &Session) -> Vec<String> {
        let mut namer = session.namer();
        let mut names: HashMap<FunctionKey, String> = HashMap::new();
        let mut out = Vec::new();
        let mut path = Vec::new();
        for (node, &ns) in self.self_ns.iter().enumerate() {
            if ns == 0 {
                continue;
            }
            path.clear();
            let mut at = node as u32;
            while at != ROOT {
                let (parent, frame) = self.nodes[at as usize];
                path.push(frame);
                at = parent;
            }
            let mut line = String::new();
            for (i, frame) in path.iter().rev().enumerate() {
                if i > 0 {
                    line.push(';');
                }
                let name = match frame {
                    Frame::Folded => FOLDED_FRAME,
                    Frame::Function(key) => names.entry(*key).or_insert_with(|| {
                        namer
                            .function(*key)
                            .name
                            .replace(';', "\u{ff1b}")
                            .replace(['\n', '\r'], " ")
                    }),
                };
                line.push_str(name);
            }
            line.push(' ');
            line.push_str(&ns.to_string());
            out.push(line);
        }
        out.sort();
        out
    }
}

struct ThreadStacks<'a> {
    trie: &'a mut StackTrie,
    stack: Vec<u32>,
    objects: ObjectTable,
}

impl Visitor for ThreadStacks<'_> {
    fn enter(&mut self, id: u32, _: u64, _: &[u64], depth: usize) {
        let frame = Frame::Function(self.objects.function(id));
        let node = if self.trie.folding.fold(depth) {
            // Under the last shown frame: the mark, then the function itself.
            let shown = self.stack.get(MAX_SHOWN_DEPTH - 1).copied().unwrap_or(ROOT);
            let mark = self.trie.child(shown, Frame::Folded);
            self.trie.child(mark, frame)
        } else {
            let parent = self.stack.last().copied().unwrap_or(ROOT);
            self.trie.child(parent, frame)
        };
        self.stack.push(node);
    }

    fn exit(&mut self, call: &Call) {
        if let Some(node) = self.stack.pop() {
            let ns = &mut self.trie.self_ns[node as usize];
            *ns = ns.saturating_add(call.self_time());
            if call.how == CallEnd::Returned {
                let r = &mut self.trie.returned[node as usize];
                r.calls += 1;
                r.total_ns = r.total_ns.saturating_add(call.duration());
                r.self_ns = r.self_ns.saturating_add(call.self_time());
            } else {
                self.trie.not_returned += 1;
            }
            let span = &mut self.trie.span;
            *span = if *span == (0, 0) {
                (call.start, call.end)
            } else {
                (span.0.min(call.start), span.1.max(call.end))
            };
        }
    }
}

/// Writes the folded stacks of `session`; returns problems found.
pub fn write_folded(session: &Session, out: &mut impl Write) -> io::Result<Vec<String>> {
    let (trie, warnings) = StackTrie::from_session(session);
    for line in trie.lines(session) {
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    Ok(warnings)
}

/// Writes a flame graph SVG of `session`; returns problems found.
pub fn write_svg(session: &Session, out: &mut impl Write) -> io::Result<Vec<String>> {
    let (trie, warnings) = StackTrie::from_session(session);
    let lines = trie.lines(session);
    if lines.is_empty() {
        return Err(io::Error::other(
            "no completed call with self time: nothing to draw",
        ));
    }
    let mut options = inferno::flamegraph::Options::default();
    options.title = format!("fdr-profiled: {}", session.layout.dir.display());
    options.count_name = "ns".to_owned();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut *out)
        .map_err(|e| io::Error::other(format!("drawing the flame graph: {e}")))?;
    out.flush()?;
    Ok(warnings)
}
