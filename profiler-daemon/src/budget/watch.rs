//! A budget at work, looked at every [`BUDGET_PERIOD`] from an event loop (a recording's,
//! the service's for each binary): the traced processes' threads' CPU time read, the
//! functions that cost too much dropped, and those whose cost the load allows again
//! re-admitted.
use super::load::ThreadsCpu;
use super::probes::BudgetedProbes;
use super::Sample;
use crate::kernel::bpf::{Scope, Tracer};
use fdr_session::schema::BudgetChange;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How often the budget looks.
pub const BUDGET_PERIOD: Duration = Duration::from_secs(1);

/// Changes named in one line of the log; the summary and `session.json` have them all.
const NAMED_PER_LINE: usize = 4;

/// Whose threads' time the budget weighs the probes against.
pub enum Traced {
    /// The process (`--pid`, a launched command).
    Process(u32),
    /// Every process running the executable (`--attach`, a service target's binary).
    Running(PathBuf),
}

/// A budget at work.
pub struct Budgeting {
    pub probes: BudgetedProbes,
    traced: Traced,
    cpu: ThreadsCpu,
    stops: Stops,
    last: Option<(Instant, u64)>,
}

/// The time the traced threads spent stopped for the stack repair, as the repair keepers
/// record it (`Tracer::stop_times`: by process and hooked function's address), charged to
/// the budgeted functions.
struct Seen {
    ns: u64,
    function: Option<usize>,
    unhooked: bool,
}

#[derive(Default)]
struct Stops {
    /// By process and function address: the time seen at the last look, the budgeted
    /// function it is (`None`: none, or not known), and whether its frames are left
    /// unhooked (`Tracer::unhook`).
    seen: HashMap<(u32, u64), Seen>,
    /// Each budgeted function's share so far.
    by_function: Vec<u64>,
}

impl Stops {
    /// Takes the keepers' records of the processes `pids`; returns the time since the last
    /// look that no budgeted function is charged with. The records of processes gone are
    /// removed.
    fn look(&mut self, tracer: &mut Tracer, pids: &[u32], probes: &BudgetedProbes) -> u64 {
        let mut uncharged = 0;
        let mut gone = Vec::new();
        for (key, time) in tracer.stop_times() {
            if !pids.contains(&key.pid) {
                if !std::path::Path::new(&format!("/proc/{}", key.pid)).exists() {
                    gone.push(key);
                    self.seen.remove(&(key.pid, key.func));
                }
                continue;
            }
            let seen = self
                .seen
                .entry((key.pid, key.func))
                .or_insert_with(|| Seen {
                    ns: 0,
                    function: crate::traced::mappings::file_offset_of(key.pid, key.func)
                        .and_then(|(file, offset)| probes.hooked_at(file, offset)),
                    unhooked: false,
                });
            let delta = time.ns.saturating_sub(seen.ns);
            seen.ns = time.ns;
            match seen.function {
                Some(i) => {
                    if self.by_function.len() <= i {
                        self.by_function.resize(i + 1, 0);
                    }
                    self.by_function[i] += delta;
                }
                None => uncharged += delta,
            }
        }
        if !gone.is_empty() {
            tracer.forget_stop_times(&gone);
        }
        uncharged
    }

    /// Has the keepers leave the frames of the dropped functions unhooked at catches, and
    /// hook those of re-admitted ones again: a dropped function's frames hooked before its
    /// probes went would otherwise stop the thread at every throw until they return (a
    /// server's loop: never).
    fn unhook_dropped(&mut self, tracer: &mut Tracer, probes: &BudgetedProbes) {
        for (&(pid, func), seen) in &mut self.seen {
            let dropped = seen.function.is_some_and(|i| probes.is_dropped(i));
            if dropped != seen.unhooked {
                let key = profiler_common::StopKey {
                    pid,
                    reserved: 0,
                    func,
                };
                tracer.unhook(key, dropped);
                seen.unhooked = dropped;
            }
        }
    }
}

impl Budgeting {
    pub fn new(probes: BudgetedProbes, scope: Scope, executable: PathBuf) -> Budgeting {
        let traced = match scope {
            Scope::Process(pid) => Traced::Process(pid.get()),
            Scope::AllProcesses => Traced::Running(executable),
        };
        Budgeting {
            probes,
            traced,
            cpu: ThreadsCpu::new(),
            stops: Stops::default(),
            last: None,
        }
    }

    /// Looks once a [`BUDGET_PERIOD`] (call it from every tick of the event loop); returns
    /// what changed (none most of the time), and as lines for a log.
    pub fn tick(&mut self, tracer: &mut Tracer) -> (Vec<BudgetChange>, Vec<String>) {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|(at, _)| now.duration_since(at) < BUDGET_PERIOD)
        {
            return (Vec::new(), Vec::new());
        }
        let now_ns = crate::session::monotonic_ns();
        let pids = match &self.traced {
            Traced::Process(pid) => vec![*pid],
            Traced::Running(binary) => crate::traced::mappings::file_id(binary)
                .map(crate::traced::process::running)
                .unwrap_or_default(),
        };
        let measured = self.cpu.sample(&pids);
        let stopped_ns = self.stops.look(tracer, &pids, &self.probes);
        let last = self.last.replace((now, now_ns));
        let (Some((threads, cpu_ns)), Some((_, last_ns))) = (measured, last) else {
            return (Vec::new(), Vec::new());
        };
        let sample = Sample {
            now_ns,
            period_ns: now_ns.saturating_sub(last_ns),
            threads,
            cpu_ns,
            stopped_ns,
        };
        let (estimate, changes) = self.probes.tick(tracer, &sample, &self.stops.by_function);
        self.stops.unhook_dropped(tracer, &self.probes);
        let lines = change_lines(&changes, estimate.overhead, estimate.overhead_after);
        (changes, lines)
    }
}

/// One line per kind of change: `dropped 2 functions (overhead 49.7% -> 0.4%): ds_leaf: ...`.
fn change_lines(changes: &[BudgetChange], before: f64, after: f64) -> Vec<String> {
    let mut lines = Vec::new();
    for action in ["dropped", "readmitted"] {
        let these: Vec<&BudgetChange> = changes.iter().filter(|c| c.action == action).collect();
        if these.is_empty() {
            continue;
        }
        let named: Vec<String> = these
            .iter()
            .take(NAMED_PER_LINE)
            .map(|c| c.describe().trim_start_matches(action).trim().to_owned())
            .collect();
        let more = if these.len() > NAMED_PER_LINE {
            format!(" and {} more", these.len() - NAMED_PER_LINE)
        } else {
            String::new()
        };
        lines.push(format!(
            "{action} {} functions (overhead {} -> {:.1}%): {}{more}",
            these.len(),
            percent(before),
            after * 100.0,
            named.join("; ")
        ));
    }
    lines
}

fn percent(overhead: f64) -> String {
    if overhead.is_finite() {
        format!("{:.1}%", overhead * 100.0)
    } else {
        "more than the threads' whole time".to_owned()
    }
}
