//! The event pipeline after the kernel, measured without it (`cargo xtask bench pipeline`).
//!
//! Events are generated in memory in the rings' own format (the kernel's ring-buffer layout,
//! `Intake::in_memory`): `--threads` threads of four processes, each calling and returning
//! through a small call tree, written in runs to the ring of the CPU they run on, and moving
//! to another of the `--cpus` CPUs now and then, so that a thread's events arrive out of
//! order across rings as they do from the kernel. A ring that is full loses the event, as the
//! kernel's does: the thread's next written event says how many came before it. Before each
//! drain the records just written are evicted from the caches: the kernel writes its records
//! on the traced threads' CPUs, so the daemon never finds them in its own cache. Each round
//! writes `--round` events of each thread, then drains the rings through the pipeline `record`
//! and the service use (`EventPipeline`: intake, per-thread order) into a session writing FDR
//! files under `--out`, as `record` does; only the drains are timed (wall and this thread's
//! CPU time).
//!
//! `--workers N` runs it with N workers, the calling thread one of them (1: the calling
//! thread alone, as the service runs it, reading each ring once and giving its space back as
//! it goes: the path every drain took before the parallel one). As `record` does, each CPU's
//! events go to one ring per worker, by thread id (`profiler_common::ring_index`), the CPU's
//! `--ring-size` shared between them, so that each worker reads its own rings only;
//! `--shared-rings` keeps one ring per CPU, which every worker reads, skipping the others'
//! records. CPU time is the whole process's during the drains (the generating thread waits
//! meanwhile).
//!
//! At the end the session's own counts are checked against what was generated: every event
//! written is recorded, every one lost is counted as lost. Prints one JSON object.
use anyhow::{bail, Context as _, Result};
use profiler_common::{EventHeader, SledKind, ThreadState};
use profiler_daemon::kernel::intake::Intake;
use profiler_daemon::plan::exits::ExitsChoice;
use profiler_daemon::plan::objects::Executable;
use profiler_daemon::session::output::OutputDir;
use profiler_daemon::session::pipeline::{locked, EventPipeline};
use profiler_daemon::session::{IntakeLosses, Session};
use std::time::{Duration, Instant};

struct Options {
    threads: u32,
    /// CPUs the threads run on, each with its rings.
    cpus: usize,
    events: u64,
    ring_size: u64,
    /// Events each thread writes between two drains.
    round: u64,
    /// 0: the single-threaded pipeline.
    workers: usize,
    /// One ring per CPU whatever the workers.
    shared_rings: bool,
    out: std::path::PathBuf,
}

fn options() -> Result<Options> {
    let mut o = Options {
        threads: 16,
        cpus: 16,
        events: 40_000_000,
        ring_size: 8 << 20,
        round: 25_000,
        workers: 1,
        shared_rings: false,
        out: std::env::temp_dir().join("fdr-pipeline-bench"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--threads" => o.threads = value()?.parse()?,
            "--cpus" => o.cpus = value()?.parse()?,
            "--events" => o.events = value()?.parse()?,
            "--ring-size" => o.ring_size = value()?.parse()?,
            "--round" => o.round = value()?.parse()?,
            "--workers" => o.workers = value()?.parse()?,
            "--shared-rings" => o.shared_rings = true,
            "--out" => o.out = value()?.into(),
            other => bail!("unknown argument {other:?}"),
        }
    }
    if o.threads == 0 || o.cpus == 0 {
        bail!("--threads and --cpus must be at least 1");
    }
    Ok(o)
}

/// One traced thread as the kernel side sees it.
struct Thread {
    pid: u32,
    tid: u32,
    /// The number of its next event, written or lost.
    seq: u64,
    /// Lost since its last written event.
    gap: u32,
    depth: u32,
    cpu: usize,
    rng: u64,
}

/// How deep the generated call trees go.
const MAX_DEPTH: u32 = 12;
/// Events a thread writes to one CPU's ring before another thread may run there.
const RUN: u32 = 256;
/// One run in this many ends with the thread moving to another CPU (every 32,768 events: about
/// every 30 ms for a thread calling at 1M calls a second).
const MIGRATE_EVERY: u64 = 128;
const STACK_TOP: u64 = 0x7fff_f000_0000;

impl Thread {
    fn next_random(&mut self) -> u64 {
        // xorshift64: deterministic, so runs compare.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// The thread's next event: an entry into a deeper function, or the return of the
    /// innermost one.
    fn next_event(&mut self, ts_ns: u64) -> EventHeader {
        let enter =
            self.depth == 0 || (self.depth < MAX_DEPTH && self.next_random().is_multiple_of(2));
        let (kind, depth) = if enter {
            self.depth += 1;
            (SledKind::Entry, self.depth)
        } else {
            self.depth -= 1;
            (SledKind::Exit, self.depth + 1)
        };
        let header = EventHeader {
            ts_ns,
            seq: self.seq,
            pid: self.pid,
            tid: self.tid,
            function_id: depth,
            kind: kind as u8,
            flags: 0,
            cpu: self.cpu as u16,
            gap_lost: self.gap,
            payload_len: 0,
            sp: STACK_TOP - 64 * u64::from(depth),
        };
        self.seq += 1;
        header
    }
}

fn process_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn main() -> Result<()> {
    let o = options()?;
    let _ = std::fs::remove_dir_all(&o.out);
    let out = OutputDir::create_root(&o.out)?;
    let mut session = Session::new(
        out,
        Executable {
            name: "bench".into(),
            path: "/bench".into(),
            deleted: false,
        },
        xray_fdr::FdrVersion::V1,
        ExitsChoice {
            mode: "return",
            reason: "pipeline benchmark".into(),
        },
    );
    if o.workers == 0 {
        bail!("--workers: at least 1");
    }
    let rings_per_cpu = if o.shared_rings { 1 } else { o.workers };
    // As `Tracer::load` sizes them: the CPU's size shared, each a power of two.
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let ring_size = profiler_common::ring_bytes(o.ring_size, rings_per_cpu as u64, page);
    let (intake, mut writers) = Intake::in_memory_split(o.cpus, rings_per_cpu, ring_size)?;
    // This thread is worker 0, with a part of the session's files of its own (as `record`).
    let mut parts = session.parts(o.workers);
    let own = parts.remove(0);
    let mut pipeline = EventPipeline::new(intake, parts)?;
    let mut threads: Vec<Thread> = (0..o.threads)
        .map(|i| Thread {
            pid: 1000 + i % 4,
            tid: 2000 + i,
            seq: 0,
            gap: 0,
            depth: 0,
            cpu: i as usize % o.cpus,
            rng: 0x9e37_79b9_7f4a_7c15 ^ u64::from(i + 1),
        })
        .collect();
    // Each round is what the daemon finds at a drain: `--round` events of each thread (the
    // default: 25 ms, record's drain period, of a thread calling at 1M calls a second). Where
    // threads crowd onto one CPU its ring may fill: it loses events, as the kernel's does.
    let per_round = (o.round * u64::from(o.threads)).max(u64::from(RUN));
    let (mut generated, mut written, mut lost) = (0u64, 0u64, 0u64);
    let mut ts_ns = 1_000_000u64;
    let (mut wall, mut cpu) = (Duration::ZERO, Duration::ZERO);
    let mut rounds = 0u32;
    while generated < o.events {
        let round_end = (generated + per_round).min(o.events);
        'fill: loop {
            for thread in &mut threads {
                for _ in 0..RUN {
                    if generated == round_end {
                        break 'fill;
                    }
                    ts_ns += 7;
                    let header = thread.next_event(ts_ns);
                    generated += 1;
                    let ring = profiler_common::ring_index(
                        thread.cpu as u32,
                        thread.tid,
                        rings_per_cpu as u32,
                    );
                    if writers[ring as usize].write(&header.to_bytes()) {
                        thread.gap = 0;
                        written += 1;
                    } else {
                        thread.gap += 1;
                        lost += 1;
                    }
                }
                if thread.next_random().is_multiple_of(MIGRATE_EVERY) {
                    thread.cpu = (thread.next_random() % o.cpus as u64) as usize;
                }
            }
        }
        // The kernel writes on the traced threads' CPUs: its records are never in the
        // reader's cache. Nor are these.
        for writer in &mut writers {
            writer.evict_unpublished();
            writer.publish();
        }
        let (start, start_cpu) = (Instant::now(), process_cpu_time());
        pipeline.drain(u64::MAX, &mut locked(&own));
        wall += start.elapsed();
        cpu += process_cpu_time() - start_cpu;
        rounds += 1;
    }
    // The end, as `record` ends: every thread's books (its trailing losses) close it.
    let books: Vec<(u32, ThreadState)> = threads
        .iter()
        .map(|t| {
            let state = ThreadState {
                seq: t.seq,
                gap_lost: t.gap,
                tid: t.tid,
                pid: t.pid,
                ..ThreadState::default()
            };
            (t.tid, state)
        })
        .collect();
    let (start, start_cpu) = (Instant::now(), process_cpu_time());
    pipeline.finish(&books, &mut locked(&own));
    let malformed = pipeline.malformed();
    drop(pipeline);
    let report = session.finish(IntakeLosses {
        unattributed_lost: 0,
        returns_before_tracing: 0,
        malformed,
    })?;
    wall += start.elapsed();
    cpu += process_cpu_time() - start_cpu;
    if report.events != written || report.events_lost != lost || report.events_malformed != 0 {
        bail!(
            "the session counted {} events, {} lost, {} malformed; generated {written} written, {lost} lost",
            report.events,
            report.events_lost,
            report.events_malformed
        );
    }
    let file_bytes: u64 = walk_size(&o.out);
    let _ = std::fs::remove_dir_all(&o.out);
    println!(
        "{}",
        serde_json::json!({
            "threads": o.threads,
            "cpus": o.cpus,
            "rings_per_cpu": rings_per_cpu,
            "ring_size": ring_size,
            "round": o.round,
            "workers": o.workers,
            "rounds": rounds,
            "events": written,
            "lost": lost,
            "seconds": wall.as_secs_f64(),
            "cpu_seconds": cpu.as_secs_f64(),
            "events_per_second": written as f64 / wall.as_secs_f64(),
            "cpu_ms_per_million": cpu.as_secs_f64() * 1e3 / (written as f64 / 1e6),
            "file_bytes": file_bytes,
        })
    );
    Ok(())
}

fn walk_size(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => walk_size(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}
