//! A budget at work, looked at every [`BUDGET_PERIOD`] from an event loop (a recording's,
//! the service's for each binary): the traced processes' threads' CPU time read, the
//! functions that cost too much dropped, and those whose cost the load allows again
//! re-admitted.
use super::load::ThreadsCpu;
use super::probes::BudgetedProbes;
use super::Sample;
use crate::kernel::bpf::{Scope, Tracer};
use fdr_session::schema::BudgetChange;
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
    /// The repair keeper (`fdr-repair`), whose CPU time is the traced threads' time stopped
    /// for repairs.
    keeper: Option<(u32, ThreadsCpu)>,
    last: Option<(Instant, u64)>,
}

impl Budgeting {
    pub fn new(
        probes: BudgetedProbes,
        scope: Scope,
        executable: PathBuf,
        keeper: Option<u32>,
    ) -> Budgeting {
        let traced = match scope {
            Scope::Process(pid) => Traced::Process(pid.get()),
            Scope::AllProcesses => Traced::Running(executable),
        };
        Budgeting {
            probes,
            traced,
            cpu: ThreadsCpu::new(),
            keeper: keeper.map(|pid| (pid, ThreadsCpu::new())),
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
        let stopped_ns = self
            .keeper
            .as_mut()
            .and_then(|(pid, cpu)| cpu.sample(&[*pid]))
            .map_or(0, |(_, ns)| ns);
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
        let (estimate, changes) = self.probes.tick(tracer, &sample);
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
