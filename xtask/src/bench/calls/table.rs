//! The call benchmark's markdown section: the table of medians and ratios, the issues' targets,
//! failed runs, and the commands of one round.
use super::{
    command, Binaries, Measured, Workload, CONFIGS, CPP_BPFTRACE, CPP_DEFAULTS, CPP_THROWS, FLAGS,
    TARGET_CPP_VS_BPFTRACE, TARGET_RATIO,
};
use crate::bench::support::median;
use crate::run;
use std::fmt::Write as _;
use std::path::Path;

/// The markdown section: the table, the issues' targets, how to reproduce.
pub fn render(
    rounds: usize,
    machine: &str,
    bins: &Binaries,
    results: &[Vec<Result<Measured, String>>],
    kernel: &super::KernelTimes,
) -> String {
    let index = |name: &str| CONFIGS.iter().position(|c| c.name == name);
    let ok = |i: usize| -> Vec<f64> {
        results[i]
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .map(|m| m.ns_per_call)
            .collect()
    };
    // Per-round ratios of configuration `i` to configuration `f`, for rounds where both ran.
    let ratios_to = |i: usize, f: usize| -> Vec<f64> {
        results[i]
            .iter()
            .zip(&results[f])
            .filter_map(|(a, b)| Some(a.as_ref().ok()?.ns_per_call / b.as_ref().ok()?.ns_per_call))
            .collect()
    };
    // Per-round ratios to the floor.
    let ratios = |i: usize| -> Vec<f64> {
        CONFIGS[i]
            .floor
            .and_then(index)
            .map_or_else(Vec::new, |f| ratios_to(i, f))
    };
    let verdict = |ratios: &[f64], target: f64| match median(ratios) {
        Some(r) if r <= target => format!("{r:.3}x: met"),
        Some(r) => format!("{r:.3}x: NOT met"),
        None => "not measured".to_owned(),
    };
    let mut s = String::new();
    let _ = writeln!(s, "## Call overhead\n");
    let _ = writeln!(
        s,
        "One thread calls `{}` (tests/fixtures/calls.c, `clang-19 {flags}`) in a tight loop and \
         times the loop itself. {rounds} rounds; in each round every configuration runs once and a \
         ratio is taken against that round's floor (empty BPF programs on exactly the same probes: \
         `fdr-profiled --floor`); the table shows medians over rounds. bpftrace and uftrace are \
         compared with the return-probe floor (bpftrace uses the same uprobe + uretprobe pair).\n\n\
         The `C++:` rows run a C++ workload (tests/fixtures/hot_leaf.cpp, `clang++-19 {flags}`): \
         it first throws {CPP_THROWS} exceptions through two instrumented functions, each caught \
         in `main`, then times a loop calling the leaf `{}`. Under fdr-profiled's defaults \
         (`--exits auto`, for a launched command: repair) every function has a return probe and \
         the stack is repaired at each throw; under `--exits per-function` a return probe where \
         the machine code proves no exception can leave it (the leaf), exit sleds elsewhere. Its floor \
         is a return probe on the leaf alone (`--functions {}`: the exceptions must not cross a \
         return probe); every C++ run must still catch all {CPP_THROWS} exceptions.\n\n\
         The `return,` rows change one part of the kernel-side work to show what it costs \
         (traces made with them are wrong): *no ring-buffer write*, *no per-thread state* (a \
         per-CPU stand-in instead of the thread's task storage), *no clock read*, *none of the \
         three*; *write by one copy* writes each event with `bpf_ringbuf_output` instead of \
         reserving room and writing into it; *write to per-CPU memory* writes each event into a \
         per-CPU array instead of the ring: what gathering events per CPU and submitting them in \
         batches would cost before the batches' own submission (not exact as it stands: on a \
         preemptible kernel two threads' programs can interleave on one CPU).\n",
        Workload::C.function(),
        Workload::Cpp.function(),
        Workload::Cpp.function(),
        flags = FLAGS.join(" ")
    );
    let _ = writeln!(s, "{machine}\n");
    let _ = writeln!(s, "| configuration | calls per run | ns/call, median | min - max | ratio to floor, median of per-round ratios | events lost | rounds ok |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    for (i, c) in CONFIGS.iter().enumerate() {
        let values = ok(i);
        let cell = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.1}"));
        let min = values.iter().copied().reduce(f64::min);
        let max = values.iter().copied().reduce(f64::max);
        let ratio = median(&ratios(i)).map_or("-".to_owned(), |r| format!("{r:.3}x"));
        let lost: Vec<String> = results[i]
            .iter()
            .filter_map(|r| r.as_ref().ok()?.lost)
            .map(|l| l.to_string())
            .collect();
        let lost = if lost.is_empty() {
            "-".to_owned()
        } else {
            lost.join(", ")
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} - {} | {ratio} | {lost} | {}/{rounds} |",
            c.name,
            c.calls,
            cell(median(&values)),
            cell(min),
            cell(max),
            values.len()
        );
    }
    render_kernel_times(&mut s, kernel);
    let _ = writeln!(s, "\nTarget (issues 4 and 17): fdr-profiled at most {TARGET_RATIO:.2}x its floor in both exit modes.\n");
    for name in ["fdr-profiled --exits sleds", "fdr-profiled --exits return"] {
        if let Some(i) = index(name) {
            let _ = writeln!(s, "- {name}: {}", verdict(&ratios(i), TARGET_RATIO));
        }
    }
    let _ = writeln!(
        s,
        "\nTarget (issue 14): the C++ hot leaf under fdr-profiled's defaults at most \
         {TARGET_CPP_VS_BPFTRACE:.2}x bpftrace's uprobe + uretprobe `count()` on it (median of \
         per-round ratios), with the program's exceptions still caught.\n"
    );
    if let Some(i) = index(CPP_DEFAULTS) {
        let to_floor = median(&ratios(i)).map_or("not measured".to_owned(), |r| format!("{r:.3}x"));
        let _ = writeln!(
            s,
            "- {CPP_DEFAULTS}, ratio to its floor (return probe on the leaf alone): {to_floor}"
        );
        if let Some(b) = index(CPP_BPFTRACE) {
            let _ = writeln!(
                s,
                "- {CPP_DEFAULTS}, ratio to {CPP_BPFTRACE}: {}",
                verdict(&ratios_to(i, b), TARGET_CPP_VS_BPFTRACE)
            );
        }
    }
    let _ = writeln!(
        s,
        "\nTarget (issue 31): fdr-profiled's inline engine, attached by pid to the workload \
         already running, at most {:.1}x XRay's own FDR runtime per call (median of per-round \
         ratios; both record every call).\n",
        super::inline::TARGET_VS_XRAY
    );
    if let (Some(i), Some(x)) = (index(super::inline::INLINE), index(super::inline::XRAY_FDR)) {
        let _ = writeln!(
            s,
            "- {}, ratio to {}: {}",
            super::inline::INLINE,
            super::inline::XRAY_FDR,
            verdict(&ratios_to(i, x), super::inline::TARGET_VS_XRAY)
        );
    }
    let failures: Vec<String> = CONFIGS
        .iter()
        .zip(results)
        .flat_map(|(c, rs)| {
            rs.iter()
                .filter_map(move |r| r.as_ref().err().map(|e| format!("- {}: {e}", c.name)))
        })
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(s, "\nFailed runs:\n{}", failures.join("\n"));
    }
    let _ = writeln!(
        s,
        "\nCommands of one round (`WORK` is a per-run scratch directory):\n\n```"
    );
    // Paths relative to the workspace root, where the commands are run from.
    let root = run::workspace_root();
    let shown = |p: &Path| p.strip_prefix(&root).unwrap_or(p).to_path_buf();
    let daemon = shown(
        &crate::bench::support::target_dir()
            .join("release")
            .join("fdr-profiled"),
    );
    let bins = Binaries {
        c: shown(&bins.c),
        cpp: shown(&bins.cpp),
    };
    for c in CONFIGS {
        let (program, args) = command(c, &bins, &daemon, Path::new("WORK"));
        let quoted: Vec<String> = args
            .iter()
            .map(|a| {
                if a.contains(' ') {
                    format!("'{a}'")
                } else {
                    a.clone()
                }
            })
            .collect();
        let _ = writeln!(s, "{program} {}", quoted.join(" "));
    }
    let _ = writeln!(s, "```");
    s
}

/// The table of the kernel's time per program run (see `super::kernel_times`).
fn render_kernel_times(s: &mut String, kernel: &super::KernelTimes) {
    if kernel.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\nWhere the time goes inside the kernel programs: one more run of each return-probe configuration with `--kernel-stats` (the kernel's BPF run-time statistics, `BPF_ENABLE_STATS`): nanoseconds per run of the entry program and of the return program. The statistics themselves add two clock reads to every run, so the floor's empty programs show their cost; *added* is the configuration's two runs (one call) minus the floor's.\n"
    );
    let _ = writeln!(
        s,
        "| configuration | entry program, ns/run | return program, ns/run | added per call, ns |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|");
    let floor = kernel.iter().find_map(|(i, r)| {
        matches!(CONFIGS[*i].tool, super::Tool::Daemon { floor: true, .. })
            .then(|| r.as_ref().ok().map(|(a, b)| a + b))
            .flatten()
    });
    for (i, r) in kernel {
        match r {
            Ok((a, b)) => {
                let added = floor.map_or("-".to_owned(), |f| format!("{:.1}", a + b - f));
                let _ = writeln!(s, "| {} | {a:.1} | {b:.1} | {added} |", CONFIGS[*i].name);
            }
            Err(e) => {
                let _ = writeln!(s, "| {} | failed: {e} | | |", CONFIGS[*i].name);
            }
        }
    }
}
