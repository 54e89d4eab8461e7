//! `report`: per function, calls, total and self time, minimum, median, 90th and 99th
//! percentile and maximum, over every thread and process of a session, or per thread.
//!
//! Calls, minimum, percentiles and maximum are those `llvm-xray account` gives for the same
//! file (its percentile definition, its pairing of exits with entries); on top of that come
//! self (exclusive) time, calls that ended unwound or unfinished, and custom events with the
//! source location of the code that emitted them.
pub mod render;
pub mod stats;

use crate::replay::{self, Call, CallEnd, FunctionKey, ObjectTable, Session, TraceEvent, Visitor};
use crate::symbolize::{EventSite, FunctionInfo};
use profiler_common::SledKind;
use serde::Serialize;
use stats::{FunctionStats, Percentiles};
use std::collections::HashMap;
use std::sync::Arc;

/// Where a row's numbers come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ThreadKey {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct RowKey {
    thread: Option<ThreadKey>,
    function: FunctionKey,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct EventKey {
    function: Option<FunctionKey>,
    event_type: Option<u16>,
}

#[derive(Debug, Default)]
struct EventStats {
    count: u64,
    bytes: u64,
    /// The first payload seen, cut to [`EXAMPLE_BYTES`].
    example: Vec<u8>,
}

const EXAMPLE_BYTES: usize = 64;

/// A multiply-rotate hasher for the small integer keys of the per-call lookup: SipHash (the
/// default) is a third of `report`'s time over 10 million events. Keys come from the trace, but
/// a collision flood can only slow the report down, and ids are bounded by the map.
#[derive(Default, Clone, Copy)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// Collects statistics from replayed threads.
pub struct Aggregator {
    per_thread: bool,
    rows: FastMap<RowKey, FunctionStats>,
    events: HashMap<EventKey, EventStats>,
    exact_kept: usize,
    exact_budget: usize,
    totals: Totals,
}

/// Session-wide counts.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Totals {
    /// Processes.
    pub processes: usize,
    /// Thread files replayed.
    pub threads: usize,
    /// Calls that returned.
    pub calls: u64,
    /// Entry records.
    pub entries: u64,
    /// Exits with no open call of their function (tracing started inside the call).
    pub unmatched_exits: u64,
    /// Calls ended by a caller's exit.
    pub unwound: u64,
    /// Calls the recorder closed where they were proven gone (see
    /// `replay::ThreadEntry::closed_by_recorder`): counted and timed as calls.
    pub closed_by_recorder: u64,
    /// Calls open at the end of their file.
    pub unfinished: u64,
    /// Custom and typed events.
    pub events: u64,
}

/// The visitor for one thread.
struct ThreadAggregator<'a> {
    agg: &'a mut Aggregator,
    thread: Option<ThreadKey>,
    objects: ObjectTable,
}

impl Visitor for ThreadAggregator<'_> {
    fn enter(&mut self, _: u32, _: u64, _: &[u64], _: usize) {}

    fn exit(&mut self, call: &Call) {
        let key = RowKey {
            thread: self.thread,
            function: self.objects.function(call.id),
        };
        let row = self.agg.rows.entry(key).or_default();
        match call.how {
            CallEnd::Returned => {
                self.agg.exact_kept += row.add(call.duration(), call.self_time());
                self.agg.totals.calls += 1;
                if self.agg.exact_kept > self.agg.exact_budget {
                    self.agg.spill();
                }
            }
            CallEnd::Unwound => row.unwound += 1,
            CallEnd::Unfinished => row.unfinished += 1,
        }
    }

    fn event(&mut self, e: &TraceEvent<'_>) {
        let key = EventKey {
            function: e.function.map(|id| self.objects.function(id)),
            event_type: e.event_type,
        };
        let s = self.agg.events.entry(key).or_default();
        if s.count == 0 {
            s.example = e.data[..e.data.len().min(EXAMPLE_BYTES)].to_vec();
        }
        s.count += 1;
        s.bytes += e.data.len() as u64;
    }
}

impl Aggregator {
    /// A new aggregator: per thread or overall, keeping up to `exact_budget` durations exactly.
    pub fn new(per_thread: bool, exact_budget: usize) -> Aggregator {
        Aggregator {
            per_thread,
            rows: FastMap::default(),
            events: HashMap::new(),
            exact_kept: 0,
            exact_budget,
            totals: Totals::default(),
        }
    }

    /// Moves the largest exact duration sets to histograms until under budget.
    fn spill(&mut self) {
        while self.exact_kept > self.exact_budget {
            let Some(largest) = self
                .rows
                .values_mut()
                .max_by_key(|r| r.durations.exact_len())
                .filter(|r| r.durations.exact_len() > 0)
            else {
                return;
            };
            self.exact_kept -= largest.durations.spill();
        }
    }

    /// Replays every thread of `session`.
    pub fn add_session(&mut self, session: &mut Session) {
        let mut warnings = Vec::new();
        let threads = session.threads();
        self.totals.processes += session.layout.processes.len();
        for t in &threads {
            let mut v = ThreadAggregator {
                thread: self.per_thread.then_some(ThreadKey {
                    pid: t.process.pid,
                    tid: t.thread.tid,
                }),
                objects: t.objects,
                agg: self,
            };
            if let Some(outcome) = replay::replay_thread(t, &mut v, &mut warnings) {
                self.totals.threads += 1;
                self.totals.entries += outcome.entries;
                self.totals.unmatched_exits += outcome.unmatched_exits;
                self.totals.unwound += outcome.unwound;
                self.totals.closed_by_recorder += t.thread.closed_by_recorder;
                self.totals.unfinished += outcome.unfinished;
                self.totals.events += outcome.events;
            }
        }
        // The session's listing may have said the same (a file that breaks off is found
        // both when it is listed and when it is replayed): each said once.
        for w in warnings {
            if !session.warnings.contains(&w) {
                session.warnings.push(w);
            }
        }
    }

    /// The report: rows named through `session`.
    pub fn finish(self, session: &Session) -> Report {
        let mut namer = session.namer();
        let mut functions: Vec<FunctionRow> = self
            .rows
            .into_iter()
            .map(|(key, mut s)| {
                let info = namer.function(key.function);
                let p = s.durations.percentiles();
                FunctionRow {
                    thread: key.thread,
                    object: key.function.object,
                    object_path: object_path(session, key.function),
                    shared_object: session.shared_object_name(key.function),
                    info,
                    calls: s.calls,
                    total: s.total,
                    self_time: s.self_time,
                    min: s.min,
                    max: s.max,
                    percentiles: p,
                    unwound: s.unwound,
                    unfinished: s.unfinished,
                }
            })
            .collect();
        functions.sort_by(|a, b| SortKey::Total.compare(a, b));
        let mut events: Vec<EventRow> = self
            .events
            .into_iter()
            .map(|(key, s)| {
                let function = key.function.map(|f| namer.function(f));
                let kind = match key.event_type {
                    None => SledKind::CustomEvent,
                    Some(_) => SledKind::TypedEvent,
                };
                let sites = key
                    .function
                    .and_then(|f| Some(namer.object(f.object)?.event_sites(f.function_id(), kind)))
                    .unwrap_or_default();
                EventRow {
                    function,
                    shared_object: key.function.and_then(|f| session.shared_object_name(f)),
                    event_type: key.event_type,
                    count: s.count,
                    bytes: s.bytes,
                    example: String::from_utf8_lossy(&s.example).into_owned(),
                    sites,
                }
            })
            .collect();
        events.sort_by_key(|e| std::cmp::Reverse(e.count));
        let mut warnings = session.warnings.clone();
        let unlisted: std::collections::BTreeSet<u32> = functions
            .iter()
            .filter(|r| r.object == replay::NO_OBJECT)
            .map(|r| r.info.id >> 24)
            .collect();
        for k in unlisted {
            warnings.push(format!(
                "the trace has functions of XRay object {k}, which session.json does not list for their process; they are shown by id"
            ));
        }
        Report {
            dir: session.layout.dir.display().to_string(),
            per_thread: self.per_thread,
            totals: self.totals,
            probe_cost_ns: 0.0,
            costliest: Vec::new(),
            warnings,
            functions,
            events,
            costs: session.layout.costs.clone(),
            budget: session.layout.budget.clone(),
        }
        .with_costliest()
    }
}

/// The file of the object `key` belongs to, as recorded.
fn object_path(session: &Session, key: FunctionKey) -> Option<String> {
    let object = session.objects.get(key.object as usize)?;
    Some(object.path.as_deref()?.display().to_string())
}

/// One function's line.
#[derive(Clone, Debug)]
pub struct FunctionRow {
    /// The thread, in a per-thread report.
    pub thread: Option<ThreadKey>,
    /// The object's index in the session ([`replay::NO_OBJECT`] when the session does not
    /// know the object).
    pub object: u32,
    /// The object's file, when known.
    pub object_path: Option<String>,
    /// The file name of the shared object the function is from; `None` for the executable's
    /// functions.
    pub shared_object: Option<String>,
    /// Name, id, location.
    pub info: Arc<FunctionInfo>,
    /// Calls that returned.
    pub calls: u64,
    /// Their total inclusive time, ns.
    pub total: u64,
    /// Their total exclusive time, ns.
    pub self_time: u64,
    /// Shortest, ns.
    pub min: u64,
    /// Longest, ns.
    pub max: u64,
    /// Median and percentiles, ns.
    pub percentiles: Percentiles,
    /// Calls ended by a caller's exit.
    pub unwound: u64,
    /// Calls open at the end.
    pub unfinished: u64,
}

/// Custom or typed events of one function.
#[derive(Clone, Debug)]
pub struct EventRow {
    /// The function whose sled fired (the innermost open call), if any was open.
    pub function: Option<Arc<FunctionInfo>>,
    /// The file name of the shared object that function is from; `None` for the executable's.
    pub shared_object: Option<String>,
    /// `None` for custom events.
    pub event_type: Option<u16>,
    /// How many.
    pub count: u64,
    /// Payload bytes in all.
    pub bytes: u64,
    /// The first payload (up to 64 bytes), lossily as text.
    pub example: String,
    /// The function's sleds of this kind, with their source locations: the record does not say
    /// which fired, so with several sleds each is a candidate.
    pub sites: Vec<EventSite>,
}

/// A whole report.
#[derive(Clone, Debug)]
pub struct Report {
    /// The session directory.
    pub dir: String,
    /// Rows are per thread.
    pub per_thread: bool,
    /// Session-wide counts.
    pub totals: Totals,
    /// Problems found while reading.
    pub warnings: Vec<String>,
    /// One row per function (per thread).
    pub functions: Vec<FunctionRow>,
    /// Events by function.
    pub events: Vec<EventRow>,
    /// What the recorder measured a probe hit to cost, when it did.
    pub costs: Option<crate::replay::layout::RecordedCosts>,
    /// `--max-overhead`: the functions the budget dropped and re-admitted, and when: the
    /// calls of a function dropped for a while are missing from that while, not lost.
    pub budget: Option<fdr_session::schema::BudgetReport>,
    /// With `costs`: what the probes cost all functions (ns, estimated), and the costliest
    /// [`COSTLIEST`] of each thread (or overall), costliest first, whatever rows are shown.
    pub probe_cost_ns: f64,
    pub costliest: Vec<FunctionRow>,
}

/// Functions [`Report::costliest`] keeps (per thread in a per-thread report).
pub const COSTLIEST: usize = 10;

/// Orders of the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SortKey {
    /// Total (inclusive) time, longest first.
    Total,
    /// Self (exclusive) time, longest first.
    #[value(name = "self")]
    SelfTime,
    /// Number of calls, most first.
    Calls,
    /// Shortest call, longest first.
    Min,
    /// Median, longest first.
    Median,
    /// 90th percentile, longest first.
    P90,
    /// 99th percentile, longest first.
    P99,
    /// Longest call, longest first.
    Max,
    /// Function name, A to Z.
    Name,
    /// Function id, smallest first.
    Id,
}

impl SortKey {
    /// Compares two rows in this order; threads stay grouped in per-thread reports, and ties
    /// go by function id so the order is stable.
    pub fn compare(self, a: &FunctionRow, b: &FunctionRow) -> std::cmp::Ordering {
        let by = match self {
            SortKey::Total => b.total.cmp(&a.total),
            SortKey::SelfTime => b.self_time.cmp(&a.self_time),
            SortKey::Calls => b.calls.cmp(&a.calls),
            SortKey::Min => b.min.cmp(&a.min),
            SortKey::Median => b.percentiles.median.cmp(&a.percentiles.median),
            SortKey::P90 => b.percentiles.p90.cmp(&a.percentiles.p90),
            SortKey::P99 => b.percentiles.p99.cmp(&a.percentiles.p99),
            SortKey::Max => b.max.cmp(&a.max),
            SortKey::Name => a.info.name.cmp(&b.info.name),
            SortKey::Id => a.info.id.cmp(&b.info.id),
        };
        a.thread
            .cmp(&b.thread)
            .then(by)
            .then(a.object.cmp(&b.object))
            .then(a.info.id.cmp(&b.info.id))
    }
}

impl Report {
    /// What the probes cost one function's calls (ns, estimated; 0 without costs).
    pub fn probe_cost(&self, r: &FunctionRow) -> f64 {
        self.costs
            .as_ref()
            .map_or(0.0, |c| r.calls as f64 * c.per_call_ns(r.info.id))
    }

    /// Sets [`Report::probe_cost_ns`] and [`Report::costliest`] from every row.
    fn with_costliest(mut self) -> Report {
        if self.costs.is_none() {
            return self;
        }
        self.probe_cost_ns = self.functions.iter().map(|r| self.probe_cost(r)).sum();
        let mut rows: Vec<&FunctionRow> = self.functions.iter().filter(|r| r.calls > 0).collect();
        rows.sort_by(|a, b| {
            a.thread
                .cmp(&b.thread)
                .then(self.probe_cost(b).total_cmp(&self.probe_cost(a)))
                .then(a.info.id.cmp(&b.info.id))
        });
        let mut seen: HashMap<Option<ThreadKey>, usize> = HashMap::new();
        let costliest = rows
            .into_iter()
            .filter(|r| {
                let n = seen.entry(r.thread).or_default();
                *n += 1;
                *n <= COSTLIEST
            })
            .cloned()
            .collect();
        self.costliest = costliest;
        self
    }

    /// Sorts the rows and keeps the first `top` of each thread (or overall); 0 keeps all.
    pub fn sort_and_cut(&mut self, key: SortKey, top: usize) {
        self.functions.sort_by(|a, b| key.compare(a, b));
        if top > 0 {
            let mut seen: HashMap<Option<ThreadKey>, usize> = HashMap::new();
            self.functions.retain(|r| {
                let n = seen.entry(r.thread).or_default();
                *n += 1;
                *n <= top
            });
        }
    }
}

/// Reads a whole session and builds its report.
pub fn build(session: &mut Session, per_thread: bool) -> Report {
    let mut agg = Aggregator::new(per_thread, stats::DEFAULT_EXACT_BUDGET);
    agg.add_session(session);
    agg.finish(session)
}
