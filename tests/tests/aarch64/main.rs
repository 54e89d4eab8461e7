//! End to end on AArch64 (issue 33), in the emulated arm64 machine (`tests::machine`): the
//! daemon cross-built for arm64 traces arm64 builds of the fixtures there, and compiler-rt's own
//! FDR runtime traces the same programs in the same machine. One boot runs every scenario in a
//! row (the script is [`script`]); each test checks its scenario here, on the host, with the
//! references of the x86-64 tests: llvm-xray 14 and 19 load every file (they read arm64
//! instrumentation maps), counts equal what the fixtures counted, and the call structure
//! equals compiler-rt's trace.
//!
//! - `--exits auto` is exit sleds on arm64 (`arch::EXIT_SLEDS_CHEAP`): C++ exceptions (static,
//!   and linked dynamically: the catches probed in libstdc++) and `longjmp` through traced
//!   frames, exact against compiler-rt; `longjmp` under return probes too, exceptions under
//!   `--exits per-function`; `--exits repair` refused in one line;
//! - a position-independent executable linked dynamically;
//! - threads moved between the machine's CPUs: exact counts, a NewCPUId at every change;
//! - `--pid` and `--attach`: exact counts of what ran after the attach;
//! - logged arguments and custom events: as compiler-rt records them;
//! - a real C program: Lua 5.4's interpreter running a script whose errors `pcall` catches
//!   (Lua's C code longjmps out of its frames), as compiler-rt records it;
//! - instrumented shared objects, linked and `dlopen`ed: ids, counts, names;
//! - `report` names the functions, in the machine and read back on the host.
//!
//! Not here: the inline engine (x86-64 code, refused in one line on arm64), the service,
//! timings (the machine is emulated).
//!
//! Needs what `cargo xtask test` prepares: the machine's image, the arm64 daemon, the cross
//! toolchain, compiler-rt's arm64 runtime and Lua's source.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use tests::counts::{expected_calls, parse_count_lines};
use tests::fixtures::arm64;
use tests::fixtures::workloads::{
    parse_returned_lines, CALLS_FUNCTIONS, EXCEPTIONS_DONE_20, EXCEPTIONS_FUNCTIONS,
    LONGJMP_DONE_20, LONGJMP_FUNCTIONS,
};
use tests::launched::{function_names, EXITS_PREFIX};
use tests::machine::{self, shell_quote, MachineRun};
use tests::structure::{
    assert_same_structure, entries_and_exits, per_thread, without_closing_exits, Payloads,
};
use tests::trace::{
    assert_every_event_accounted, assert_process_calls, check_trace_dir, MainCall,
    ProcessExpectation, TraceDir,
};
use tests::{convert, LLVM_XRAY_VERSIONS, RECORDING_PREFIX};

/// The arm64 programs of the scenarios.
struct Programs {
    daemon: PathBuf,
    calls: PathBuf,
    calls_dynamic: PathBuf,
    exceptions: PathBuf,
    exceptions_dynamic: PathBuf,
    exceptions_native: PathBuf,
    longjmp: PathBuf,
    longjmp_native: PathBuf,
    events: PathBuf,
    events_native: PathBuf,
    lua: PathBuf,
    lua_script: PathBuf,
    dso: &'static arm64::Dso,
}

fn programs() -> &'static Programs {
    static P: OnceLock<Programs> = OnceLock::new();
    P.get_or_init(|| Programs {
        daemon: machine::arm64_daemon(),
        calls: arm64::c("calls", "calls.c", &[]),
        calls_dynamic: arm64::dynamic("calls-dynamic", "calls.c", false),
        exceptions_dynamic: arm64::dynamic("exceptions-dynamic", "exceptions.cpp", true),
        exceptions: arm64::cxx("exceptions", "exceptions.cpp", &[]),
        exceptions_native: arm64::cxx("exceptions-native", "exceptions.cpp", &["-DFX_NATIVE_FDR"]),
        longjmp: arm64::c("longjmp", "longjmp.c", &[]),
        longjmp_native: arm64::c("longjmp-native", "longjmp.c", &["-DFX_NATIVE_FDR"]),
        events: arm64::cxx("events", "events.cpp", &[]),
        events_native: arm64::cxx("events-native", "events.cpp", &["-DFX_NATIVE_FDR"]),
        lua: arm64::lua(),
        lua_script: Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/errors.lua"),
        dso: arm64::dso(),
    })
}

/// What `errors.lua` prints.
const LUA_DONE: &str = "lua: caught=60 sorted=300 first=k000";
/// Rounds of `events.cpp`.
const EVENT_ROUNDS: &str = "8";

/// Every scenario, in one `sh` script. Each leaves in `$RESULTS`: `NAME.stdout`,
/// `NAME.stderr`, `NAME.status` and the session `NAME.session/` (written in the machine's
/// `/tmp`, and for `attach` on the share itself, then copied); a compiler-rt run leaves
/// `NAME.native/` (its one FDR file) and `NAME.native.stdout`.
fn script(p: &Programs) -> String {
    let q = |path: &Path| shell_quote(path);
    format!(
        r#"set -u
P={daemon}
O=/tmp/o
mkdir -p $O
# The same addresses in every run (Lua's and compiler-rt's runs are compared call for call).
echo 0 > /proc/sys/kernel/randomize_va_space
# scenario NAME COMMAND...: COMMAND's output and status.
scenario() {{ n=$1; shift; echo "fdr-aarch64: $n"; timeout 900 "$@" > $O/$n.stdout 2> $O/$n.stderr; echo $? > $O/$n.status; }}
# native NAME COMMAND...: a program with XRay's runtime writing its FDR log.
native() {{ n=$1; shift; echo "fdr-aarch64: $n (compiler-rt)"; mkdir -p $O/$n.native; XRAY_OPTIONS="xray_logfile_base=$O/$n.native/" timeout 900 "$@" > $O/$n.native.stdout 2> $O/$n.native.stderr; echo $? > $O/$n.native.status; }}
# wait_for FILE TEXT: until FILE holds TEXT (two minutes at most).
wait_for() {{ i=0; while ! grep -q "$2" "$1" 2>/dev/null; do i=$((i+1)); if [ $i -gt 1200 ]; then echo "fdr-aarch64: no '$2' in $1"; return 1; fi; sleep 0.1; done; }}

scenario exceptions $P --out $O/exceptions.session -- {exceptions} --iterations 20
native exceptions {exceptions_native} --iterations 20
scenario exceptions-dynamic $P --out $O/exceptions-dynamic.session -- {exceptions_dynamic} --iterations 20
scenario exceptions-per-function $P --exits per-function --out $O/exceptions-per-function.session -- {exceptions} --iterations 20
scenario repair $P --exits repair --out $O/repair.session -- {exceptions} --iterations 20
scenario longjmp $P --out $O/longjmp.session -- {longjmp} --iterations 20
scenario longjmp-return $P --exits return --out $O/longjmp-return.session -- {longjmp} --iterations 20
native longjmp {longjmp_native} --iterations 20
scenario dynamic $P --out $O/dynamic.session -- {calls_dynamic} --threads 2 --iterations 300
scenario hops $P --out $O/hops.session -- {calls} --threads 2 --iterations 300 --hops 4 --hops-each 4
scenario events $P --args 6 --out $O/events.session -- {events} --iterations {rounds}
native events {events_native} --iterations {rounds}
export XRAY_FDR_START=0
scenario lua $P --out $O/lua.session -- {lua} {lua_script}
export XRAY_FDR_START=1
native lua {lua} {lua_script}
export XRAY_FDR_START=0
scenario report $P report $O/exceptions.session

echo "fdr-aarch64: pid"
rm -f /tmp/go
{calls} --threads 2 --iterations 400 --wait-file /tmp/go > $O/pid.fixture.stdout 2> $O/pid.fixture.stderr &
fixture=$!
wait_for $O/pid.fixture.stderr "waiting for"
$P --pid $fixture --out $O/pid.session > $O/pid.stdout 2> $O/pid.stderr &
daemon=$!
wait_for $O/pid.stderr "{recording}"
touch /tmp/go
wait $fixture; echo $? > $O/pid.fixture.status
wait $daemon; echo $? > $O/pid.status

echo "fdr-aarch64: attach"
# This session is written on the share itself (9p).
$P --attach {calls} --out "$RESULTS/attach.session" > $O/attach.stdout 2> $O/attach.stderr &
daemon=$!
wait_for $O/attach.stderr "{recording}"
{calls} --threads 2 --iterations 200 > $O/attach.first.stdout; echo $? > $O/attach.first.status
{calls} --iterations 100 > $O/attach.second.stdout; echo $? > $O/attach.second.status
kill -INT $daemon
wait $daemon; echo $? > $O/attach.status

echo "fdr-aarch64: dso"
( echo "run 2"; wait_for $O/dso.stderr "fixture: run 1 done"; echo dlopen
  wait_for $O/dso.stderr " (object 2)"; echo "run 2"; wait_for $O/dso.stderr "fixture: run 2 done"
  echo quit ) | $P --out $O/dso.session -- {dso_main} > $O/dso.stdout 2> $O/dso.stderr
echo $? > $O/dso.status

cp -r $O/. "$RESULTS"/
"#,
        daemon = q(&p.daemon),
        calls = q(&p.calls),
        calls_dynamic = q(&p.calls_dynamic),
        exceptions = q(&p.exceptions),
        exceptions_dynamic = q(&p.exceptions_dynamic),
        exceptions_native = q(&p.exceptions_native),
        longjmp = q(&p.longjmp),
        longjmp_native = q(&p.longjmp_native),
        events = q(&p.events),
        events_native = q(&p.events_native),
        lua = q(&p.lua),
        lua_script = q(&p.lua_script),
        dso_main = q(&p.dso.exe),
        rounds = EVENT_ROUNDS,
        recording = RECORDING_PREFIX,
    )
}

/// The one run of the machine every test reads (an error if it failed: said once per test,
/// not booted again).
fn machine() -> &'static MachineRun {
    static RUN: OnceLock<Result<MachineRun, String>> = OnceLock::new();
    let run = RUN.get_or_init(|| {
        std::panic::catch_unwind(|| {
            let run = machine::run("aarch64", &script(programs()), Duration::from_secs(40 * 60));
            eprintln!("the arm64 machine ran every scenario in {:?}", run.wall);
            run
        })
        .map_err(|e| {
            e.downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        })
    });
    match run {
        Ok(run) => run,
        Err(why) => panic!("the arm64 machine's run failed: {why}"),
    }
}

/// Scenario `name` ended with status 0; its stderr.
fn succeeded(m: &MachineRun, name: &str) -> String {
    let stderr = m.text(&format!("{name}.stderr"));
    assert_eq!(
        m.text(&format!("{name}.status")).trim(),
        "0",
        "{name}: exit status in the machine; stderr:\n{stderr}\nconsole:\n{}",
        m.console
    );
    stderr
}

/// The one FDR file compiler-rt wrote for scenario `name`.
fn native_file(m: &MachineRun, name: &str) -> PathBuf {
    assert_eq!(
        m.text(&format!("{name}.native.status")).trim(),
        "0",
        "{name} under compiler-rt: {}",
        m.text(&format!("{name}.native.stderr"))
    );
    let files: Vec<PathBuf> = std::fs::read_dir(m.path(&format!("{name}.native")))
        .expect("compiler-rt's directory")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(files.len(), 1, "{name}: compiler-rt's files {files:?}");
    files.into_iter().next().unwrap()
}

/// The session of scenario `name`, loaded by llvm-xray 14 and 19, nothing lost.
fn session(m: &MachineRun, name: &str, bin: &Path) -> TraceDir {
    let trace = check_trace_dir(&m.path(&format!("{name}.session")), bin);
    assert_eq!(
        trace.session.events_lost, 0,
        "{name}: {}",
        trace.session.json
    );
    assert_every_event_accounted(&trace.session);
    trace
}

/// The line saying how exits are observed.
fn exits_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix(EXITS_PREFIX))
        .unwrap_or_else(|| panic!("no exits line:\n{stderr}"))
}

/// A fixture whose frames are left by a throw or a jump (`exceptions.cpp`, `longjmp.c`),
/// traced in scenario `name`: per thread and function, entries equal the calls the fixture
/// counted, exits its returns plus one closing exit for each frame it left (as session.json
/// lists them); without the closing exits, the call structure of compiler-rt's trace.
fn exact_against_native(
    name: &str,
    native: &str,
    bin: &Path,
    native_bin: &Path,
    done: &str,
    functions: &[&str],
) {
    let m = machine();
    succeeded(m, name);
    let stdout = m.text(&format!("{name}.stdout"));
    assert_eq!(stdout.lines().last(), Some(done), "{name}");
    let calls = expected_calls(&parse_count_lines(&stdout));
    let returned = parse_returned_lines(&stdout);
    let trace = session(m, name, bin);
    assert_eq!(
        trace.threads.len(),
        3,
        "{name}: 3 threads ran instrumented code"
    );
    let mut ours = Vec::new();
    let mut left = 0;
    for t in &trace.threads {
        let (kept, closing) =
            without_closing_exits(t.records.iter(), &trace.session.closing_exits(t.tid));
        for f in functions {
            let (entries, exits) = entries_and_exits(&t.records, f);
            let want = calls[&t.tid].get(*f).copied().unwrap_or(0);
            let want_ret = returned[&t.tid].get(*f).copied().unwrap_or(0);
            let closed = closing.get(&(t.tid, f.to_string())).copied().unwrap_or(0);
            assert_eq!(
                (entries, exits - closed, closed),
                (want, want_ret, want - want_ret),
                "{name} tid {} {f}: (entries, returns, exits of frames left)",
                t.tid
            );
            left += closed;
        }
        ours.extend(kept);
    }
    assert!(
        left > 0,
        "{name}: no frame was left: the fixture throws or jumps"
    );
    let native_file = native_file(m, native);
    let native_stdout = m.text(&format!("{native}.native.stdout"));
    assert_eq!(native_stdout.lines().last(), Some(done), "{native} native");
    let native = convert(19, native_bin, &native_file);
    assert_same_structure(
        &format!("{name} on arm64"),
        &per_thread(ours),
        &per_thread(&native.records),
        Payloads { max_bytes: 0 },
    );
}

/// `--exits auto` on arm64 is exit sleds, and C++ exceptions thrown through them are recorded
/// as compiler-rt records them.
#[test]
fn exceptions_exact_against_compiler_rt() {
    let p = programs();
    let stderr = succeeded(machine(), "exceptions");
    assert!(
        exits_line(&stderr).starts_with("exit sleds (auto: on aarch64"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("warning"),
        "no warning under the defaults:\n{stderr}"
    );
    exact_against_native(
        "exceptions",
        "exceptions",
        &p.exceptions,
        &p.exceptions_native,
        EXCEPTIONS_DONE_20,
        EXCEPTIONS_FUNCTIONS,
    );
    let json = &session(machine(), "exceptions", &p.exceptions).session.json;
    assert_eq!(json["exits"], "sleds", "{json}");
    // Linked against libstdc++ dynamically: the catches are probed in the library the
    // process maps, found where the dynamic loader finds it (arm64's multiarch directory).
    let stderr = succeeded(machine(), "exceptions-dynamic");
    assert!(
        stderr.lines().any(|l| l
            .starts_with("fdr-profiled: catches: probed __cxa_begin_catch in ")
            && l.contains("/aarch64-linux-gnu/libstdc++.so.6")),
        "{stderr}"
    );
    exact_against_native(
        "exceptions-dynamic",
        "exceptions",
        &p.exceptions_dynamic,
        &p.exceptions_native,
        EXCEPTIONS_DONE_20,
        EXCEPTIONS_FUNCTIONS,
    );
    // Per function: the analysis reads x86-64 code only, so every function gets exit sleds,
    // which is what auto chose anyway.
    exact_against_native(
        "exceptions-per-function",
        "exceptions",
        &p.exceptions,
        &p.exceptions_native,
        EXCEPTIONS_DONE_20,
        EXCEPTIONS_FUNCTIONS,
    );
}

/// `--exits repair` is refused on arm64 in one line, before the command runs: exit sleds
/// cost what return probes do there and record exceptions exactly.
#[test]
fn repair_refused_in_one_line() {
    let m = machine();
    assert_eq!(
        m.text("repair.status").trim(),
        "1",
        "{}",
        m.text("repair.stderr")
    );
    assert_eq!(m.text("repair.stdout"), "", "the command ran");
    let stderr = m.text("repair.stderr");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("fdr-profiled: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains(
            "--exits repair: not on aarch64, where an exit sled costs what a return probe does"
        ),
        "{stderr}"
    );
}

/// `longjmp` out of traced frames, under the defaults (exit sleds) and under return probes
/// (the kernel drops the return instances the jump left; the daemon closes their frames).
#[test]
fn longjmp_exact_against_compiler_rt() {
    let p = programs();
    for name in ["longjmp", "longjmp-return"] {
        exact_against_native(
            name,
            "longjmp",
            &p.longjmp,
            &p.longjmp_native,
            LONGJMP_DONE_20,
            LONGJMP_FUNCTIONS,
        );
    }
    let stderr = succeeded(machine(), "longjmp-return");
    assert!(
        exits_line(&stderr).starts_with("return probes ("),
        "{stderr}"
    );
}

/// `calls.c`'s process in `trace`, whose `count` lines are in `stdout`: every call it counted,
/// and nothing else. Returns its pid (its main thread's tid, the smallest).
fn calls_exact(trace: &TraceDir, stdout: &str, main: MainCall) -> u32 {
    let calls = expected_calls(&parse_count_lines(stdout));
    let pid = *calls.keys().min().expect("count lines");
    assert_process_calls(
        trace,
        &ProcessExpectation {
            pid,
            calls: &calls,
            known: CALLS_FUNCTIONS,
            main_fn: "main",
            main,
            only_known: true,
        },
    );
    pid
}

/// Two threads each moved between the machine's CPUs at every step: exact counts, and in each
/// thread's file a NewCPUId record at every change of CPU.
#[test]
fn threads_moved_between_cpus_keep_order() {
    let p = programs();
    let m = machine();
    succeeded(m, "hops");
    let stdout = m.text("hops.stdout");
    let trace = session(m, "hops", &p.calls);
    calls_exact(&trace, &stdout, MainCall::Traced);
    let names = function_names(&p.calls);
    let mut changes = 0;
    for t in &trace.threads {
        let records = tests::cpu_records::read_cpu_calls(&t.path, &names);
        changes +=
            tests::cpu_records::assert_cpu_changes_marked(&records, &format!("tid {}", t.tid));
    }
    let hops = stdout.lines().filter(|l| l.starts_with("hop ")).count();
    assert!(hops >= 8, "the fixture hopped {hops} times:\n{stdout}");
    assert!(changes > 0, "no change of CPU in the files:\n{stdout}");
}

/// A position-independent executable linked against the C library dynamically: exact counts.
#[test]
fn dynamically_linked_pie_exact() {
    let p = programs();
    let m = machine();
    succeeded(m, "dynamic");
    let trace = session(m, "dynamic", &p.calls_dynamic);
    calls_exact(&trace, &m.text("dynamic.stdout"), MainCall::Traced);
}

/// `--pid` on a process waiting to start its loops: every call it makes after the attach,
/// `main` already running.
#[test]
fn by_pid_exact() {
    let p = programs();
    let m = machine();
    succeeded(m, "pid");
    assert_eq!(m.text("pid.fixture.status").trim(), "0");
    let trace = session(m, "pid", &p.calls);
    let pid = calls_exact(&trace, &m.text("pid.fixture.stdout"), MainCall::InProgress);
    assert_eq!(trace.pids().into_iter().collect::<Vec<_>>(), vec![pid]);
}

/// `--attach` traces each process that runs the binary while it records, from its first call.
#[test]
fn attach_exact_for_every_process() {
    let p = programs();
    let m = machine();
    succeeded(m, "attach");
    let trace = session(m, "attach", &p.calls);
    let mut pids = Vec::new();
    for run in ["first", "second"] {
        assert_eq!(m.text(&format!("attach.{run}.status")).trim(), "0");
        let stdout = m.text(&format!("attach.{run}.stdout"));
        pids.push(calls_exact(&trace, &stdout, MainCall::Traced));
    }
    pids.sort_unstable();
    assert_eq!(trace.pids().into_iter().collect::<Vec<_>>(), pids);
}

/// Six logged arguments, tail calls and custom events (some bigger than a buffer's worth):
/// the records compiler-rt writes, payloads included, read by llvm-xray 14 and 19.
#[test]
fn arguments_and_custom_events_as_compiler_rt() {
    let p = programs();
    let m = machine();
    succeeded(m, "events");
    let stdout = m.text("events.stdout");
    assert!(stdout.ends_with("events: done rounds=8\n"), "{stdout}");
    let file = native_file(m, "events");
    let native = per_thread(&convert(19, &p.events_native, &file).records);
    let dir = m.path("events.session");
    let trace = session(m, "events", &p.events);
    assert!(
        trace
            .threads
            .iter()
            .flat_map(|t| &t.records)
            .any(|r| r.kind == tests::RecordKind::EnterArg),
        "no logged arguments in {}",
        dir.display()
    );
    for major in LLVM_XRAY_VERSIONS {
        let ours: Vec<_> = trace
            .threads
            .iter()
            .flat_map(|t| convert(major, &p.events, &t.path).records)
            .collect();
        assert_same_structure(
            &format!("events.cpp on arm64, llvm-xray {major}"),
            &per_thread(&ours),
            &native,
            Payloads { max_bytes: 4096 },
        );
    }
}

/// A real C program: Lua's interpreter, whose errors unwind by `longjmp`, recorded as
/// compiler-rt records it.
#[test]
fn lua_as_compiler_rt() {
    let p = programs();
    let m = machine();
    succeeded(m, "lua");
    assert_eq!(m.text("lua.stdout").trim(), LUA_DONE);
    assert_eq!(m.text("lua.native.stdout").trim(), LUA_DONE);
    let trace = session(m, "lua", &p.lua);
    assert_eq!(trace.threads.len(), 1);
    let t = &trace.threads[0];
    let (ours, closing) =
        without_closing_exits(t.records.iter(), &trace.session.closing_exits(t.tid));
    let closed: u64 = closing.values().sum();
    assert!(closed > 0, "no frame closed: pcall caught 60 errors");
    let functions: std::collections::BTreeSet<&str> =
        ours.iter().map(|r| r.function.as_str()).collect();
    assert!(functions.len() >= 10, "functions traced: {functions:?}");
    let native = convert(19, &p.lua, &native_file(m, "lua"));
    assert_same_structure(
        "Lua on arm64",
        &per_thread(ours),
        &per_thread(&native.records),
        Payloads { max_bytes: 0 },
    );
}

/// Instrumented shared objects: the one the executable links, and one it `dlopen`s while
/// traced; each object's id in the records' high bits, every call of each run counted, the
/// objects named in the manifest and the report.
#[test]
fn shared_objects_by_id() {
    use tests::fixtures::dso::{
        run_section, LINKED_FUNCTIONS, LOADED_FUNCTIONS, MAIN_FUNCTIONS, MARKER_BEGIN, MARKER_END,
    };
    use tests::objects::{load_trace, Object};
    let p = programs();
    let m = machine();
    let stderr = succeeded(m, "dso");
    let stdout = m.text("dso.stdout");
    let trace = load_trace(&m.path("dso.session"));
    assert_eq!(trace.session.events_lost, 0, "{}", trace.session.json);
    let pid = *trace.pids().iter().next().expect("a traced process");
    let object = |id: u32, path: &Path, functions: &[&'static str]| Object {
        id,
        path: path.to_path_buf(),
        file: path.to_path_buf(),
        deleted: false,
        functions: functions.to_vec(),
    };
    let mut main_functions = MAIN_FUNCTIONS.to_vec();
    main_functions.extend([MARKER_BEGIN, MARKER_END]);
    let objects = [
        object(0, &p.dso.exe, &main_functions),
        object(1, &p.dso.linked, LINKED_FUNCTIONS),
        object(2, &p.dso.loaded, LOADED_FUNCTIONS),
    ];
    for o in &objects[1..] {
        assert!(
            stderr.contains(&format!("{} (object {})", o.path.display(), o.id)),
            "object {} attached:\n{stderr}",
            o.id
        );
    }
    let sections = [run_section(&stdout, 1), run_section(&stdout, 2)];
    tests::objects::counts::assert_runs_counts(&trace, pid, &objects, &sections, true);
    let report = std::fs::read_to_string(m.path("dso.session/report.txt")).expect("report.txt");
    for f in LINKED_FUNCTIONS.iter().chain(LOADED_FUNCTIONS) {
        assert!(
            report.contains(f),
            "report.txt does not name {f}:\n{report}"
        );
    }
}

/// `report` in the machine, and here on the arm64 session: the fixture's functions by name.
#[test]
fn report_names_functions() {
    let m = machine();
    let inside = {
        succeeded(m, "report");
        m.text("report.stdout")
    };
    let out = tests::tools::run_output(
        std::process::Command::new(tests::fdr_profiled())
            .arg("report")
            .arg(m.path("exceptions.session")),
    );
    assert!(out.status.success(), "report here: {out:?}");
    let here = String::from_utf8_lossy(&out.stdout);
    let count = |text: &str| -> BTreeMap<&str, usize> {
        EXCEPTIONS_FUNCTIONS
            .iter()
            .map(|f| (*f, text.matches(f).count()))
            .collect()
    };
    for (what, text) in [("in the machine", inside.as_str()), ("here", &here)] {
        for (f, n) in count(text) {
            if f != "ex_on_signal" {
                assert!(n > 0, "report {what} does not name {f}:\n{text}");
            }
        }
    }
    assert_eq!(count(&inside), count(&here), "{inside}\n---\n{here}");
}
