//! How much the traced program ran: its threads that used the CPU in each period, and the
//! CPU time they used, from `/proc/PID/task/TID/stat` (clock ticks: 10 ms each where the
//! kernel counts at 100 Hz, fine enough over a second for budgets of 1% and more).
use std::collections::HashMap;
use std::path::Path;

/// The CPU time of the threads of a set of processes, from one call to the next.
#[derive(Debug, Default)]
pub struct ThreadsCpu {
    /// Each thread's CPU time (ticks) at the last call, by (pid, tid).
    last: HashMap<(u32, u32), u64>,
    first: bool,
}

impl ThreadsCpu {
    pub fn new() -> ThreadsCpu {
        ThreadsCpu {
            last: HashMap::new(),
            first: true,
        }
    }

    /// The threads of `pids` that used the CPU since the last call, and the nanoseconds they
    /// used; `None` at the first call (which only takes the starting point). A thread born
    /// since counts with all its time; one that ended since, not at all.
    pub fn sample(&mut self, pids: &[u32]) -> Option<(u32, u64)> {
        let tick_ns = 1_000_000_000 / clock_ticks_per_second();
        let mut now = HashMap::new();
        let (mut threads, mut ticks) = (0u32, 0u64);
        for &pid in pids {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            for task in tasks.flatten() {
                let Some(tid) = task
                    .file_name()
                    .to_str()
                    .and_then(|t| t.parse::<u32>().ok())
                else {
                    continue;
                };
                let Some(cpu) = thread_ticks(&task.path().join("stat")) else {
                    continue;
                };
                let used = cpu.saturating_sub(self.last.get(&(pid, tid)).copied().unwrap_or(0));
                if used > 0 {
                    threads += 1;
                    ticks += used;
                }
                now.insert((pid, tid), cpu);
            }
        }
        self.last = now;
        if std::mem::take(&mut self.first) {
            return None;
        }
        Some((threads, ticks * tick_ns))
    }
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&hz| hz > 0).unwrap_or(100)
}

/// utime + stime of a `stat` file (fields 14 and 15, counted after the command name, which
/// may hold spaces and parentheses).
fn thread_ticks(stat: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(stat).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_stat_line_whose_name_has_spaces_and_parentheses() {
        let dir = std::env::temp_dir().join(format!("fdr-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let stat = dir.join("stat");
        std::fs::write(
            &stat,
            "42 (a (b) c) R 1 42 42 0 -1 4194304 100 0 0 0 250 17 0 0 20 0 1 0 5 0 0\n",
        )
        .unwrap();
        assert_eq!(thread_ticks(&stat), Some(267));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn this_process_uses_the_cpu() {
        let me = std::process::id();
        let mut cpu = ThreadsCpu::new();
        assert_eq!(cpu.sample(&[me]), None);
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(120) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let (threads, ns) = cpu.sample(&[me]).unwrap();
        assert!(threads >= 1, "{threads}");
        assert!(ns >= 50_000_000, "{ns} ns of CPU in a 120 ms spin");
    }
}
