//! The event pipeline spread over worker threads, for a host whose programs write more events
//! than one thread can order and write (issue 29: one thread tops out near 20M events/s).
//!
//! Each of `W` workers owns a share of the traced threads (thread `tid` is ordered and written
//! by worker `tid % W`: consecutive thread ids, as a process's threads mostly have, spread
//! evenly), so each thread's events meet in one worker's [`Sequencer`], in exact program
//! order, with no lock, no copy and no allocation per event. `record` has the programs write
//! each CPU's events to `W` rings, thread `tid`'s to the one `tid % W` along
//! (`profiler_common::ring_index`): then each worker reads only its own rings, from positions
//! of its own, and finds only its own threads' records in them (the pipeline is *routed*).
//! Rings shared by every worker (one per CPU, as the service has) work too: each worker then
//! reads every ring, skipping the others' records after reading their thread id
//! ([`Intake::scan_part`]), which costs each worker a cache miss per record of the others'.
//! Either way a record's space goes back to the programs once every worker reading its ring
//! is past it, after each drain.
//!
//! A quiet host keeps costing what one thread costs: the helpers are woken only for a drain
//! with more than [`PARALLEL_FROM`] bytes waiting in the rings, and only when the drain before
//! handed events to more than one worker (one busy traced thread gains nothing from them); any
//! other drain the calling thread does alone, reading each ring once and handing each event
//! to its worker's sequencer and sink ([`Intake::scan_all`]). The calling thread is worker 0,
//! its sink the caller's, handed in at each call (the service's routes to state only its
//! thread may touch); with one worker the pipeline is the single-threaded one, the space given
//! back as it reads.
use super::super::order::{Gap, Sequencer};
use crate::kernel::intake::{Event, Intake, Wakeups};
use crate::session::files::ThreadFiles;
use anyhow::{Context as _, Result};
use profiler_common::ThreadState;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

/// Where a helper (worker 1 to `W - 1`) puts the events it is handed, in each thread's
/// program order.
pub trait Sink: Send + 'static {
    fn record(&mut self, event: &Event, gap: Option<Gap>);
}

impl Sink for ThreadFiles {
    #[inline]
    fn record(&mut self, event: &Event, gap: Option<Gap>) {
        ThreadFiles::record(self, event, gap);
    }
}

/// A sink shared with others (a part of a session's files) as the calling thread's sink:
/// locked once, for as long as the returned closure lives (one call of the pipeline).
pub fn locked<S: Sink>(sink: &Mutex<S>) -> impl FnMut(&mut Event, Option<Gap>) + '_ {
    let mut sink = lock(sink);
    move |e: &mut Event, g| sink.record(e, g)
}

/// The helpers' sink of a pipeline that has none: one worker, the caller's thread.
pub enum NoHelpers {}

impl Sink for NoHelpers {
    fn record(&mut self, _: &Event, _: Option<Gap>) {
        match *self {}
    }
}

/// Runs `f` with worker `worker`'s sink: a helper's own, or `local` for worker 0. Generic in
/// both, so that each event's call to the sink is a direct one.
macro_rules! with_sink {
    ($worker:expr, $local:expr, |$sink:ident| $body:expr) => {
        match $worker.sink.clone() {
            Some(helper) => {
                let mut helper = lock(&helper);
                let $sink = &mut |e: &mut Event, g: Option<Gap>| helper.record(e, g);
                $body
            }
            None => {
                let $sink = $local;
                $body
            }
        }
    };
}

/// Bytes waiting in the rings from which a drain wakes the helpers (about 4,700 events:
/// 0.2 ms of one worker's time, against the tens of microseconds waking them costs).
pub const PARALLEL_FROM: u64 = 256 << 10;

/// Most workers by default: past that, the kernel side is the limit (see BENCHMARKS.md).
pub const MAX_DEFAULT_WORKERS: usize = 8;

/// Workers for `cpus` CPUs that produce events: one for every 4, at most
/// [`MAX_DEFAULT_WORKERS`] and at most the CPUs this process may run on. One worker takes
/// the events of about ten CPUs that trace flat out (~27M events/s, see BENCHMARKS.md); more
/// leaves room for a daemon that competes with the traced threads for the CPUs, at the cost
/// of each CPU's ring memory being split further (one ring per worker).
pub fn default_workers(cpus: usize) -> usize {
    let mine = std::thread::available_parallelism().map_or(1, |n| n.get());
    cpus.div_ceil(4).clamp(1, MAX_DEFAULT_WORKERS).min(mine)
}

/// The kernel's rings drained, put in order and handed on by `W` workers.
pub struct EventPipeline<S: Sink = NoHelpers> {
    shared: Arc<Shared<S>>,
    /// Workers 1 to `W - 1`, each told to drain through its channel.
    helpers: Vec<(mpsc::Sender<u64>, std::thread::JoinHandle<()>)>,
    /// Each helper's word at the end of a drain: whether it read every ring to its end.
    done: mpsc::Receiver<bool>,
    wakeups: Wakeups,
    /// Threads that exited with their ring full, their books taken, not ended yet.
    exited: Vec<(u32, ThreadState)>,
    /// Whether the last drain handed events to more than one worker: if not, the next is
    /// done by this thread alone (one traced thread, say, gains nothing from the others).
    spread: bool,
    /// Each worker's `handled` after the last drain.
    handled: Vec<u64>,
    /// Tests: every drain is one of every worker at once.
    #[cfg(test)]
    always_parallel: bool,
}

struct Shared<S> {
    /// Read by every worker at once during a drain; written (space given back) between.
    intake: RwLock<Intake>,
    workers: Vec<Mutex<Worker<S>>>,
    /// Whether each ring holds the events of one worker's threads only (the programs spread
    /// each CPU's events over a multiple of the workers' number of rings, by thread id):
    /// then each worker reads its own rings only, the ones [`Shared::reader`] names.
    routed: bool,
    rings_per_cpu: usize,
}

// Each worker's own cache lines (two: the prefetcher fetches lines in pairs): its counts and
// its sequencer change on every event, and a neighbour's on the same line would cost every
// event of both a cache miss.
#[repr(align(128))]
struct Worker<S> {
    index: usize,
    order: Sequencer,
    /// A helper's sink; worker 0's is the caller's.
    sink: Option<Arc<Mutex<S>>>,
    /// Where this worker is in each ring.
    positions: Vec<u64>,
    /// Records of its threads that were not an event.
    malformed: u64,
    /// Events it has handed on.
    handled: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A worker that panicked left its part as it was: the rest goes on.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The worker that orders and writes thread `tid`'s events.
#[inline]
fn owner(tid: u32, workers: usize) -> usize {
    tid as usize % workers
}

/// The books of the threads worker `index` (of `workers`) handles.
fn books_of(books: &[(u32, ThreadState)], index: usize, workers: usize) -> Vec<(u32, ThreadState)> {
    books
        .iter()
        .filter(|(tid, _)| owner(*tid, workers) == index)
        .copied()
        .collect()
}

impl<S: Sink> Worker<S> {
    /// Reads the rings `rings` selects from this worker's positions (at most `budget` records
    /// of each), handing its threads' events to its sink in order. Whether every ring read
    /// was read to its end.
    fn drain(
        &mut self,
        intake: &Intake,
        budget: u64,
        workers: usize,
        rings: impl FnMut(usize) -> bool,
        sink: &mut impl FnMut(&mut Event, Option<Gap>),
    ) -> bool {
        let me = self.index;
        let order = &mut self.order;
        let handled = &mut self.handled;
        // A ring holds runs of one thread's events: its owner is computed once a run.
        let mut last = (u32::MAX, false);
        let mine = |tid: u32| {
            if tid != last.0 {
                last = (tid, owner(tid, workers) == me);
            }
            last.1
        };
        intake.scan_part(
            &mut self.positions,
            budget,
            rings,
            mine,
            &mut self.malformed,
            |event| {
                *handled += 1;
                order.push(event, sink)
            },
        )
    }

    /// Ends threads from their kernel-side books (see [`Sequencer::end_threads`]).
    fn end_threads(
        &mut self,
        books: &[(u32, ThreadState)],
        local: &mut impl FnMut(&mut Event, Option<Gap>),
    ) {
        with_sink!(self, local, |sink| self.order.end_threads(books, sink))
    }

    /// See [`Sequencer::finish`].
    fn finish(
        &mut self,
        books: &[(u32, ThreadState)],
        local: &mut impl FnMut(&mut Event, Option<Gap>),
    ) {
        with_sink!(self, local, |sink| self.order.finish(books, sink))
    }
}

impl EventPipeline {
    /// A pipeline of one worker: the calling thread.
    pub fn alone(intake: Intake) -> Result<EventPipeline> {
        EventPipeline::new(intake, Vec::new())
    }
}

impl<S: Sink> EventPipeline<S> {
    /// A pipeline of the calling thread and one helper per sink in `helpers`.
    pub fn new(mut intake: Intake, helpers: Vec<Arc<Mutex<S>>>) -> Result<EventPipeline<S>> {
        let count = helpers.len() + 1;
        let wakeups = intake.take_wakeups();
        let workers = std::iter::once(None)
            .chain(helpers.into_iter().map(Some))
            .enumerate()
            .map(|(index, sink)| {
                Mutex::new(Worker {
                    index,
                    order: Sequencer::default(),
                    sink,
                    positions: Vec::new(),
                    malformed: 0,
                    handled: 0,
                })
            })
            .collect();
        let rings_per_cpu = intake.rings_per_cpu();
        let shared = Arc::new(Shared {
            intake: RwLock::new(intake),
            workers,
            routed: rings_per_cpu.is_multiple_of(count),
            rings_per_cpu,
        });
        let (done_tx, done) = mpsc::channel();
        let mut helpers = Vec::new();
        for index in 1..count {
            let (tx, rx) = mpsc::channel::<u64>();
            let shared = shared.clone();
            let done_tx = done_tx.clone();
            let handle = std::thread::Builder::new()
                .name(format!("fdr-pipeline-{index}"))
                .spawn(move || {
                    while let Ok(budget) = rx.recv() {
                        // A helper's sink is its own: this one is not called.
                        let emptied = shared.drain_part(index, budget, &mut |_, _| ());
                        if done_tx.send(emptied).is_err() {
                            break;
                        }
                    }
                })
                .context("starting a pipeline worker")?;
            helpers.push((tx, handle));
        }
        Ok(EventPipeline {
            shared,
            helpers,
            done,
            wakeups,
            exited: Vec::new(),
            spread: false,
            handled: vec![0; count],
            #[cfg(test)]
            always_parallel: false,
        })
    }

    /// Workers.
    pub fn workers(&self) -> usize {
        self.shared.workers.len()
    }

    /// Drains at most `budget` records of each ring (every one with `u64::MAX`) into the
    /// sinks (worker 0's: `local`); whether every ring was emptied.
    pub fn drain(&mut self, budget: u64, local: &mut impl FnMut(&mut Event, Option<Gap>)) -> bool {
        let shared = &*self.shared;
        if self.helpers.is_empty() {
            // One worker: the single-threaded path, space given back as it reads.
            let mut intake = shared.intake.write().unwrap_or_else(|p| p.into_inner());
            let mut worker = lock(&shared.workers[0]);
            let order = &mut worker.order;
            let (_, emptied) = intake.drain_some(budget, |event| order.push(event, local));
            return emptied;
        }
        let unread = shared
            .intake
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .unread_bytes();
        let alone = unread < PARALLEL_FROM || !self.spread;
        #[cfg(test)]
        let alone = alone && !self.always_parallel;
        let emptied = if alone {
            // Little to do, or all of it for one worker: this thread does it alone, waking
            // none, reading each ring once.
            shared.drain_alone(budget, local)
        } else {
            // The helpers end only with the pipeline, and a panic in a drain is caught: each
            // one told answers.
            for (tx, _) in &self.helpers {
                let _ = tx.send(budget);
            }
            let mut emptied = shared.drain_part(0, budget, local);
            for _ in &self.helpers {
                emptied &= self.done.recv().unwrap_or(false);
            }
            emptied
        };
        shared.release();
        let mut busy = 0;
        for (worker, last) in shared.workers.iter().zip(&mut self.handled) {
            let handled = lock(worker).handled;
            busy += usize::from(handled > *last);
            *last = handled;
        }
        self.spread = busy > 1;
        emptied
    }

    /// Ends the threads that exited with their ring full (`exited`: their books, just taken
    /// from the kernel's table), with those taken before and not ended yet, once a drain
    /// (at most `budget` records of each ring) has emptied every ring.
    pub fn end_exited(
        &mut self,
        exited: Vec<(u32, ThreadState)>,
        budget: u64,
        local: &mut impl FnMut(&mut Event, Option<Gap>),
    ) {
        self.exited.extend(exited);
        if !self.exited.is_empty() && self.drain(budget, local) {
            let exited = std::mem::take(&mut self.exited);
            self.end_threads(&exited, local);
        }
    }

    /// Each thread's books to its worker.
    fn end_threads(
        &mut self,
        books: &[(u32, ThreadState)],
        local: &mut impl FnMut(&mut Event, Option<Gap>),
    ) {
        let workers = self.workers();
        for (index, worker) in self.shared.workers.iter().enumerate() {
            let mine = books_of(books, index, workers);
            if !mine.is_empty() {
                lock(worker).end_threads(&mine, local);
            }
        }
    }

    /// The end, once the programs are disarmed: every ring drained, the threads that exited
    /// ended, then those the kernel still has books for (`books`: live and exited), each with
    /// the events it lost at its very end; events still waiting for predecessors that never
    /// came are delivered, the missing ones counted as lost.
    pub fn finish(
        &mut self,
        books: &[(u32, ThreadState)],
        local: &mut impl FnMut(&mut Event, Option<Gap>),
    ) {
        self.drain(u64::MAX, local);
        let exited = std::mem::take(&mut self.exited);
        self.end_threads(&exited, local);
        let workers = self.workers();
        for (index, worker) in self.shared.workers.iter().enumerate() {
            lock(worker).finish(&books_of(books, index, workers), local);
        }
    }

    /// Events from a source of the caller's own rather than the kernel's rings (the inline
    /// engine's shared memory): `source` hands each to the closure it is given, which passes it
    /// to the sequencer and sink of the worker that owns its thread, as if a ring had held it.
    /// On this thread, every worker held for the call.
    pub fn deliver_from<R>(
        &mut self,
        local: &mut impl FnMut(&mut Event, Option<Gap>),
        source: impl FnOnce(&mut dyn FnMut(&mut Event)) -> R,
    ) -> R {
        let mut workers: Vec<_> = self.shared.workers.iter().map(lock).collect();
        let count = workers.len();
        let mut parts: Vec<_> = workers
            .iter_mut()
            .map(|worker| {
                let Worker {
                    order,
                    sink,
                    handled,
                    ..
                } = &mut **worker;
                (order, sink.as_ref().map(|s| lock(s)), handled)
            })
            .collect();
        source(&mut |event: &mut Event| {
            let (order, sink, handled) = &mut parts[owner(event.header.tid, count)];
            **handled += 1;
            match sink {
                Some(sink) => order.push(event, &mut |e: &mut Event, g| sink.record(e, g)),
                None => order.push(event, local),
            }
        })
    }

    /// Resolves when a program found its ring filling up and asked to be drained.
    pub async fn wakeup(&self) -> Result<()> {
        self.wakeups.wait().await
    }

    /// Records that could not be decoded, or whose numbers could not be right (counted,
    /// dropped; never expected from our own programs).
    pub fn malformed(&self) -> u64 {
        let intake = self
            .shared
            .intake
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .malformed();
        let workers: u64 = self
            .shared
            .workers
            .iter()
            .map(|w| {
                let w = lock(w);
                w.malformed + w.order.stale()
            })
            .sum();
        intake + workers
    }
}

impl<S: Sink> Shared<S> {
    /// Worker `index`'s part of a drain; whether it read every ring to its end. A panic in
    /// a sink (a bug) is contained to the drain, so that the caller is still answered.
    /// A panic in the caller's own sink (`local`, worker 0's) goes on to the caller.
    fn drain_part(
        &self,
        index: usize,
        budget: u64,
        local: &mut impl FnMut(&mut Event, Option<Gap>),
    ) -> bool {
        let drain = |local: &mut _| {
            let intake = self.intake.read().unwrap_or_else(|p| p.into_inner());
            let rings = |ring| !self.routed || self.reader(ring) == index;
            let workers = self.workers.len();
            let mut worker = lock(&self.workers[index]);
            let worker = &mut *worker;
            with_sink!(worker, local, |sink| worker
                .drain(&intake, budget, workers, rings, sink))
        };
        if index == 0 {
            return drain(local);
        }
        // A helper's sink is its own: `local` is not called.
        std::panic::catch_unwind(AssertUnwindSafe(|| drain(local))).unwrap_or(false)
    }

    /// Every worker's part of a drain, on this thread, each ring read once.
    fn drain_alone(&self, budget: u64, local: &mut impl FnMut(&mut Event, Option<Gap>)) -> bool {
        let intake = self.intake.read().unwrap_or_else(|p| p.into_inner());
        let mut workers: Vec<_> = self.workers.iter().map(lock).collect();
        let count = workers.len();
        let mut positions = Vec::with_capacity(count);
        let mut parts = Vec::with_capacity(count);
        let mut malformed = 0;
        for worker in &mut workers {
            let Worker {
                order,
                sink,
                positions: at,
                handled,
                ..
            } = &mut **worker;
            positions.push(at);
            parts.push((order, sink.as_ref().map(|s| lock(s)), handled));
        }
        let emptied = intake.scan_all(
            &mut positions,
            budget,
            |tid| owner(tid, count),
            &mut malformed,
            |index, event| {
                let (order, sink, handled) = &mut parts[index];
                **handled += 1;
                match sink {
                    Some(sink) => order.push(event, &mut |e: &mut Event, g| sink.record(e, g)),
                    None => order.push(event, local),
                }
            },
        );
        drop(parts);
        drop(positions);
        workers[0].malformed += malformed;
        emptied
    }

    /// The one worker that reads ring `ring` when [`Shared::routed`]: the one whose threads
    /// write to it (`profiler_common::ring_index`).
    fn reader(&self, ring: usize) -> usize {
        ring % self.rings_per_cpu % self.workers.len()
    }

    /// Gives each ring's space back up to the position every worker is past.
    fn release(&self) {
        let mut intake = self.intake.write().unwrap_or_else(|p| p.into_inner());
        let mut workers: Vec<_> = self.workers.iter().map(lock).collect();
        if self.routed {
            // Only each ring's reader moved on in it: the others are where it is (none of
            // their threads' events are in it), for this and a drain that reads every ring.
            for ring in 0..intake.rings() {
                let Some(&past) = workers[self.reader(ring)].positions.get(ring) else {
                    continue;
                };
                for worker in &mut workers {
                    if let Some(at) = worker.positions.get_mut(ring) {
                        *at = past;
                    }
                }
            }
        }
        for ring in 0..intake.rings() {
            let past = workers
                .iter()
                .map(|w| w.positions.get(ring).copied())
                .min()
                .flatten();
            if let Some(past) = past {
                intake.release(ring, past);
            }
        }
    }
}

impl<S: Sink> Drop for EventPipeline<S> {
    fn drop(&mut self) {
        for (tx, handle) in std::mem::take(&mut self.helpers) {
            drop(tx);
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::intake::in_memory::RingWriter;
    use profiler_common::{event_kind, EventHeader, SledKind};
    use std::collections::BTreeMap;

    /// What a sink saw of each thread, in the order it saw it: (seq, kind, gap).
    type Seen = BTreeMap<u32, Vec<(u64, u8, Option<u64>)>>;

    #[derive(Default)]
    struct Collect(Seen);

    impl Sink for Collect {
        fn record(&mut self, event: &Event, gap: Option<Gap>) {
            let h = &event.header;
            self.0
                .entry(h.tid)
                .or_default()
                .push((h.seq, h.kind, gap.map(|g| g.lost)));
        }
    }

    /// A fixed stream of rounds: threads moving between `RINGS` rings, some events lost to a
    /// full ring, some threads ending (their exit record written, or lost and their books
    /// handed to `end_exited`), new threads starting.
    const RINGS: usize = 5;

    struct Stream {
        rng: u64,
        /// (tid, next seq, lost since the last written, ring)
        threads: Vec<(u32, u64, u32, usize)>,
        next_tid: u32,
    }

    impl Stream {
        fn new() -> Stream {
            Stream {
                rng: 0x2545_f491_4f6c_dd1d,
                threads: (0..7)
                    .map(|i| (100 + i, 0, 0, i as usize % RINGS))
                    .collect(),
                next_tid: 107,
            }
        }

        fn below(&mut self, n: u64) -> u64 {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            self.rng % n
        }

        /// Writes one round, each CPU's events to its `rings_per_cpu` rings by thread as the
        /// programs do; returns the books of the threads whose exit record was lost.
        fn round(
            &mut self,
            rings: &mut [RingWriter],
            rings_per_cpu: usize,
        ) -> Vec<(u32, ThreadState)> {
            let ring_of = |cpu: usize, tid: u32| {
                profiler_common::ring_index(cpu as u32, tid, rings_per_cpu as u32) as usize
            };
            let mut exited = Vec::new();
            for i in 0..self.threads.len() {
                let run = 1 + self.below(40);
                for _ in 0..run {
                    let lose = self.below(50) == 0;
                    let (tid, seq, gap, ring) = &mut self.threads[i];
                    if lose {
                        *gap += 1;
                    } else {
                        let header = EventHeader {
                            seq: *seq,
                            tid: *tid,
                            pid: 1,
                            kind: SledKind::Entry as u8,
                            gap_lost: *gap,
                            ..EventHeader::default()
                        };
                        assert!(rings[ring_of(*ring, *tid)].write(&header.to_bytes()));
                        *gap = 0;
                    }
                    *seq += 1;
                }
                if self.below(4) == 0 {
                    self.threads[i].3 = self.below(RINGS as u64) as usize;
                }
            }
            // One thread ends now and then; a new one starts.
            if self.below(3) == 0 {
                let at = self.below(self.threads.len() as u64) as usize;
                let (tid, seq, gap, ring) = self.threads.swap_remove(at);
                let exit = EventHeader {
                    seq,
                    tid,
                    kind: event_kind::THREAD_EXIT,
                    gap_lost: gap,
                    ..EventHeader::default()
                };
                if self.below(2) == 0 {
                    assert!(rings[ring_of(ring, tid)].write(&exit.to_bytes()));
                } else {
                    let books = ThreadState {
                        seq,
                        gap_lost: gap,
                        tid,
                        ..ThreadState::default()
                    };
                    exited.push((tid, books));
                }
                let ring = self.below(RINGS as u64) as usize;
                self.threads.push((self.next_tid, 0, 0, ring));
                self.next_tid += 1;
            }
            rings.iter_mut().for_each(RingWriter::publish);
            exited
        }

        fn books(&self) -> Vec<(u32, ThreadState)> {
            self.threads
                .iter()
                .map(|&(tid, seq, gap, _)| {
                    let books = ThreadState {
                        seq,
                        gap_lost: gap,
                        tid,
                        ..ThreadState::default()
                    };
                    (tid, books)
                })
                .collect()
        }
    }

    const ROUNDS: usize = 200;

    /// The stream through the calling thread alone (one worker: `Intake::drain_some`, a path
    /// of its own that reads each ring once and gives its space back as it goes), as the
    /// service runs the pipeline: the reference for every number of workers.
    fn single_threaded() -> Seen {
        let (intake, mut rings) = Intake::in_memory(RINGS, 1 << 16).unwrap();
        let mut pipeline = EventPipeline::alone(intake).unwrap();
        let mut sink = Collect::default();
        let mut stream = Stream::new();
        for round in 0..ROUNDS {
            let exited = stream.round(&mut rings, 1);
            // Small budgets now and then: drains that leave records behind.
            let budget = if round % 7 == 0 { 3 } else { u64::MAX };
            pipeline.end_exited(exited, budget, &mut |e, g| sink.record(e, g));
            pipeline.drain(budget, &mut |e, g| sink.record(e, g));
        }
        pipeline.finish(&stream.books(), &mut |e, g| sink.record(e, g));
        assert_eq!(pipeline.malformed(), 0);
        sink.0
    }

    /// The stream through `workers` workers; with `busy`, every drain is one of every worker
    /// at once, else one of this thread alone (the rings here hold less than
    /// [`PARALLEL_FROM`]); each CPU's events in `rings_per_cpu` rings.
    fn parallel(workers: usize, busy: bool, rings_per_cpu: usize) -> Seen {
        let (intake, mut rings) = Intake::in_memory_split(RINGS, rings_per_cpu, 1 << 16).unwrap();
        let sinks: Vec<_> = (0..workers)
            .map(|_| Arc::new(Mutex::new(Collect::default())))
            .collect();
        let mut pipeline = EventPipeline::new(intake, sinks[1..].to_vec()).unwrap();
        pipeline.always_parallel = busy;
        assert_eq!(pipeline.workers(), workers);
        let mut stream = Stream::new();
        for round in 0..ROUNDS {
            let exited = stream.round(&mut rings, rings_per_cpu);
            let budget = if round % 7 == 0 { 3 } else { u64::MAX };
            pipeline.end_exited(exited, budget, &mut locked(&sinks[0]));
            pipeline.drain(budget, &mut locked(&sinks[0]));
        }
        pipeline.finish(&stream.books(), &mut locked(&sinks[0]));
        assert_eq!(pipeline.malformed(), 0);
        drop(pipeline);
        let mut seen = Seen::new();
        for (index, sink) in sinks.iter().enumerate() {
            for (tid, events) in std::mem::take(&mut lock(sink).0) {
                assert_eq!(
                    owner(tid, workers),
                    index,
                    "thread {tid} in one worker only"
                );
                assert!(seen.insert(tid, events).is_none());
            }
        }
        seen
    }

    /// Every thread's events, gaps and end come out of any number of workers exactly as
    /// they come out of the single-threaded pipeline, each thread from its one worker:
    /// whether every worker reads every ring, or each its own (each CPU's events spread over
    /// rings by thread, as many as the workers or a multiple).
    #[test]
    fn workers_hand_on_each_thread_exactly_as_one_thread_does() {
        let want = single_threaded();
        let events: usize = want.values().map(Vec::len).sum();
        assert!(want.len() > 40 && events > 20_000, "{} threads", want.len());
        for (tid, events) in &want {
            // In order, ended once, losses reported.
            assert!(events.windows(2).all(|w| w[0].0 < w[1].0), "thread {tid}");
            assert_eq!(events.last().map(|e| e.1), Some(event_kind::THREAD_EXIT));
        }
        assert!(want.values().flatten().any(|e| e.2.is_some()), "some gaps");
        for (workers, rings_per_cpu) in [(1, 1), (2, 1), (3, 1), (2, 2), (3, 3), (2, 4)] {
            for busy in [false, true] {
                assert_eq!(
                    parallel(workers, busy, rings_per_cpu),
                    want,
                    "{workers} workers, {rings_per_cpu} rings per CPU, busy {busy}"
                );
            }
        }
    }

    /// A record the kernel has not committed stops every reader; when it is committed
    /// between two workers' reads (they read at once), one is further on than the other, and
    /// a drain by this thread alone then hands on what the one behind has not seen, once.
    #[test]
    fn workers_that_stopped_at_different_records_each_get_their_threads_once() {
        let (intake, mut rings) = Intake::in_memory(1, 1 << 16).unwrap();
        let sinks: Vec<_> = (0..2)
            .map(|_| Arc::new(Mutex::new(Collect::default())))
            .collect();
        let mut pipeline = EventPipeline::new(intake, sinks[1..].to_vec()).unwrap();
        let ring = &mut rings[0];
        let header = |tid: u32, seq: u64| {
            EventHeader {
                seq,
                tid,
                ..EventHeader::default()
            }
            .to_bytes()
        };
        // Threads 10 (worker 0) and 11 (worker 1); the third record not committed yet.
        assert!(ring.write(&header(10, 0)));
        assert!(ring.write(&header(11, 0)));
        let busy = ring.reserve(&header(10, 1)).unwrap();
        assert!(ring.write(&header(11, 1)));
        ring.publish();
        assert!(pipeline
            .shared
            .drain_part(0, u64::MAX, &mut locked(&sinks[0])));
        ring.commit(busy);
        assert!(ring.write(&header(10, 2)));
        ring.publish();
        assert!(pipeline.shared.drain_part(1, u64::MAX, &mut |_, _| ()));
        pipeline.shared.release();
        // Worker 1 is past everything; worker 0 is at the record just committed.
        assert!(pipeline.drain(u64::MAX, &mut locked(&sinks[0])));
        pipeline.finish(&[], &mut locked(&sinks[0]));
        let seqs = |index: usize, tid: u32| -> Vec<u64> {
            lock(&sinks[index]).0[&tid].iter().map(|e| e.0).collect()
        };
        assert_eq!(seqs(0, 10), vec![0, 1, 2]);
        assert_eq!(seqs(1, 11), vec![0, 1]);
        assert_eq!(pipeline.malformed(), 0);
    }

    /// A drain of more than [`PARALLEL_FROM`] bytes is done by every worker at once, and
    /// the rings' space is given back once they all are past it: four rounds of half a ring
    /// each fit in it. Each ring holds one thread's events: on two CPUs, both workers reading
    /// both rings; or on one CPU with a ring for each worker, each reading its own only
    /// (the other must not hold the space back).
    #[test]
    fn a_busy_drain_gives_the_space_back_once_every_worker_is_past_it() {
        for (cpus, rings_per_cpu) in [(2, 1), (1, 2)] {
            let (intake, mut rings) =
                Intake::in_memory_split(cpus, rings_per_cpu, 512 << 10).unwrap();
            let sinks: Vec<_> = (0..2)
                .map(|_| Arc::new(Mutex::new(Collect::default())))
                .collect();
            let mut pipeline = EventPipeline::new(intake, sinks[1..].to_vec()).unwrap();
            assert_eq!(pipeline.shared.routed, rings_per_cpu == 2);
            // An even number, each thread half.
            let records = 2 * (PARALLEL_FROM / (EventHeader::SIZE as u64 + 8));
            for round in 0..4u64 {
                for seq in 0..records {
                    let header = EventHeader {
                        // Each thread's own numbers: 0, 1, 2...
                        seq: (round * records + seq) / 2,
                        tid: 10 + (seq % 2) as u32,
                        ..EventHeader::default()
                    };
                    // Without the space given back, the fourth round would not fit.
                    assert!(rings[(seq % 2) as usize].write(&header.to_bytes()));
                }
                rings.iter_mut().for_each(RingWriter::publish);
                assert!(pipeline.drain(u64::MAX, &mut locked(&sinks[0])));
                assert!(pipeline.spread || round == 0, "both workers were busy");
            }
            for (tid, sink) in [(10, &sinks[0]), (11, &sinks[1])] {
                let seen = &lock(sink).0;
                assert_eq!(seen.len(), 1);
                assert_eq!(seen[&tid].len() as u64, 4 * records / 2);
            }
        }
    }
}
