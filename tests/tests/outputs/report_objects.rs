//! `report` and `convert` on sessions whose processes had shared objects instrumented: trace
//! records carry packed function ids (`object << 24 | id`) and `session.json` lists each
//! process's `objects`. Three different fixture binaries stand in for the executable and two
//! shared objects (symbolizing reads only their instrumentation maps, symbols and DWARF); every
//! function is named from its own object as `llvm-xray extract --symbolize` (LLVM 19) names it
//! in that file, and shown by its packed id. Then an old manifest without `objects`, and bad
//! objects: missing, rebuilt, replaced, unlisted, out of range.

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tests::fixtures::symbolize::unescape_rust_legacy;
use tests::fixtures::workloads::calls_fixture;
use tests::synthetic_session::*;
use tests::tools::LLVM_XRAY_VERSIONS;
use tests::{cpp_fixture, extract_sleds, rust_fixture, scratch_dir};

/// Function id → name in `bin`, per llvm-xray 19.
fn reference(bin: &Path) -> BTreeMap<u32, String> {
    extract_sleds(19, bin)
        .into_iter()
        .map(|s| (s.id, unescape_rust_legacy(&s.function_name)))
        .collect()
}

fn packed(object: u32, id: u32) -> u32 {
    object << 24 | id
}

/// The fixtures copied into `dir` under shared-object names; index = XRay object id.
fn objects_in(dir: &Path) -> Vec<PathBuf> {
    let libs = dir.join("libs");
    std::fs::create_dir_all(&libs).unwrap();
    let mut out = vec![cpp_fixture()];
    for (bin, name) in [
        (rust_fixture(), "libone.so"),
        (calls_fixture(), "libtwo.so"),
    ] {
        std::fs::copy(&bin, libs.join(name)).unwrap();
        out.push(libs.join(name));
    }
    out
}

/// `session.json`'s `objects` entry for `path` as object `id`.
fn object_json(id: i64, path: &Path, build_id: Option<String>, deleted: bool) -> Value {
    json!({"object_id": id, "path": path, "deleted": deleted, "build_id": build_id,
           "load_address": 0, "functions": 0, "probes": 0, "attached_ns": 0})
}

/// Adds `objects` lists to the processes of the manifest `write_session` wrote.
fn set_objects(dir: &Path, by_pid: &BTreeMap<u32, Vec<Value>>) {
    let path = dir.join("session.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for p in m["processes"].as_array_mut().unwrap() {
        let pid = p["pid"].as_u64().unwrap() as u32;
        p["objects"] = Value::Array(by_pid[&pid].clone());
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
}

/// Every function of every object, object K's called K + 1 times, in order: the events and
/// the names expected in that order (entries).
fn call_everything(names: &[BTreeMap<u32, String>]) -> (Vec<Ev>, Vec<(u32, String)>) {
    let (mut ev, mut order) = (Vec::new(), Vec::new());
    let mut t = 1_000;
    for (k, map) in names.iter().enumerate() {
        for (&f, name) in map {
            for _ in 0..=k {
                let id = packed(k as u32, f);
                ev.push(Ev::Enter(id, t));
                ev.push(Ev::Exit(id, t + 100 + u64::from(f)));
                order.push((id, name.clone()));
                t += 1_000;
            }
        }
    }
    (ev, order)
}

/// id 1 of object 0 calls id 1 of object 1, which calls id 1 of object 2: self times
/// 650, 100, 250 ns.
fn nested_across_objects() -> Vec<Ev> {
    let (a, b, c) = (packed(0, 1), packed(1, 1), packed(2, 1));
    vec![
        Ev::Enter(a, 1_000),
        Ev::Enter(b, 1_100),
        Ev::Enter(c, 1_150),
        Ev::Exit(c, 1_400),
        Ev::Exit(b, 1_450),
        Ev::Exit(a, 2_000),
    ]
}

/// llvm-xray 14 and 19 load `file` (packed ids and all) and find exactly the function
/// records written, in order.
fn assert_reference_reads(file: &Path, events: &[Ev]) {
    let want: Vec<(bool, i64)> = events
        .iter()
        .filter_map(|e| match e {
            Ev::Enter(id, _) | Ev::EnterArgs(id, _, _) => Some((true, i64::from(*id))),
            Ev::Exit(id, _) => Some((false, i64::from(*id))),
            Ev::Custom(..) => None,
        })
        .collect();
    for major in LLVM_XRAY_VERSIONS {
        let converted = tests::xray_reference::convert(major, file, &[]);
        let got: Vec<(bool, i64)> = converted
            .records
            .iter()
            .filter(|r| r.kind.is_function())
            .map(|r| (r.kind.is_entry(), r.func_id))
            .collect();
        assert_eq!(got, want, "llvm-xray {major} reading {}", file.display());
    }
}

fn tool(args: &[&str], dir: &Path) -> String {
    let mut a: Vec<&std::ffi::OsStr> = vec![args[0].as_ref(), dir.as_os_str()];
    a.extend(args[1..].iter().map(std::ffi::OsStr::new));
    let (ok, out, err) = run_tool(&a);
    assert!(ok, "{args:?}: {err}");
    out
}

#[test]
fn functions_of_each_object_are_named_from_that_object() {
    let dir = scratch_dir("objects-named");
    let bins = objects_in(dir.path());
    let names: Vec<_> = bins.iter().map(|b| reference(b)).collect();
    let ones: Vec<&String> = names.iter().map(|n| &n[&1]).collect();
    assert!(ones[0] != ones[1] && ones[1] != ones[2], "{ones:?}");
    let (flat, order) = call_everything(&names);
    // Process 2 has `libtwo.so` as its object 1 (process 1 as its object 2): loaded once,
    // shown by the ids of each process's trace.
    let two_as_one: Vec<Ev> = names[2]
        .keys()
        .flat_map(|&f| [Ev::Enter(packed(1, f), 10), Ev::Exit(packed(1, f), 20)])
        .collect();
    let written: BTreeMap<u32, Vec<Ev>> = BTreeMap::from([
        (1, flat.clone()),
        (2, nested_across_objects()),
        (3, two_as_one.clone()),
    ]);
    let files = write_session(
        dir.path(),
        &[
            SynthProcess {
                pid: 1,
                binary: bins[0].clone(),
                build_id: Some(build_id(&bins[0])),
                threads: vec![(1, flat), (2, nested_across_objects())],
            },
            SynthProcess {
                pid: 2,
                binary: bins[0].clone(),
                build_id: Some(build_id(&bins[0])),
                threads: vec![(3, two_as_one)],
            },
        ],
    );
    for ((_, tid), file) in &files {
        assert_reference_reads(file, &written[tid]);
    }
    let listed = |k: usize| object_json(k as i64, &bins[k], Some(build_id(&bins[k])), false);
    set_objects(
        dir.path(),
        &BTreeMap::from([
            (1, vec![listed(0), listed(1), listed(2)]),
            (
                2,
                vec![object_json(1, &bins[2], Some(build_id(&bins[2])), false)],
            ),
        ]),
    );

    let (json, _) = report_json(dir.path(), &["--per-thread"]);
    assert!(
        json["warnings"].as_array().unwrap().is_empty(),
        "{:#?}",
        json["warnings"]
    );
    let rows = rows_by_thread(&json);
    let mut seen = 0;
    for (k, map) in names.iter().enumerate() {
        for (&f, name) in map {
            let r = &rows[&(1, 1, packed(k as u32, f))];
            assert_eq!(r["name"], *name, "object {k} id {f}: {r}");
            assert_eq!(r["calls"], k as u64 + 1, "{r}");
            assert_eq!(r["object_path"], bins[k].display().to_string());
            let file = bins[k].file_name().unwrap().to_str().unwrap();
            assert_eq!(
                r["shared_object"],
                if k == 0 { json!(null) } else { json!(file) }
            );
            seen += 1;
        }
    }
    assert_eq!(rows.keys().filter(|(_, t, _)| *t == 1).count(), seen);
    for (&f, name) in &names[2] {
        let r = &rows[&(2, 3, packed(1, f))];
        assert_eq!(r["name"], *name, "{r}");
        assert_eq!(r["object"], rows[&(1, 1, packed(2, f))]["object"], "{r}");
        assert_ne!(r["object"], rows[&(1, 1, packed(1, 1))]["object"], "{r}");
    }
    assert_eq!(
        rows.keys().filter(|(_, t, _)| *t == 3).count(),
        names[2].len()
    );

    // Text: shared objects' functions carry their file name, the executable's do not.
    let text = tool(&["report"], dir.path());
    assert!(
        text.contains(&format!("  {} [libone.so]", ones[1])),
        "{text}"
    );
    assert!(
        text.contains(&format!("  {} [libtwo.so]", ones[2])),
        "{text}"
    );
    let exe_line = text
        .lines()
        .find(|l| l.contains(&format!("  {}  (", ones[0])))
        .unwrap_or_else(|| panic!("{} unadorned: {text}", ones[0]));
    assert!(!exe_line.contains(".so]"), "{exe_line}");

    // Chrome: thread 1's B events name the functions in trace order.
    let chrome: Value =
        serde_json::from_str(&tool(&["convert", "--format", "chrome"], dir.path())).unwrap();
    let begun: Vec<&str> = chrome["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "B" && e["tid"] == 1)
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    let want: Vec<&str> = order.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(begun, want);

    // speedscope: thread 1's O events, through the frame table, likewise.
    let ss: Value =
        serde_json::from_str(&tool(&["convert", "--format", "speedscope"], dir.path())).unwrap();
    let frames = ss["shared"]["frames"].as_array().unwrap();
    let profile = ss["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"].as_str().unwrap().ends_with("tid 1"))
        .unwrap();
    let opened: Vec<&str> = profile["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "O")
        .map(|e| {
            frames[e["frame"].as_u64().unwrap() as usize]["name"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(opened, want);

    // Folded: the stack through all three objects, with its self times.
    let folded = tool(&["convert", "--format", "folded"], dir.path());
    let fold = |n: &String| n.replace(';', "\u{ff1b}");
    let (a, b, c) = (fold(ones[0]), fold(ones[1]), fold(ones[2]));
    for (stack, ns) in [(format!("{a};{b};{c}"), 250), (format!("{a};{b}"), 100)] {
        assert!(
            folded.lines().any(|l| l == format!("{stack} {ns}")),
            "{stack} {ns} not in:\n{folded}"
        );
    }
}

#[test]
fn an_old_manifest_names_the_executable_and_shows_other_objects_by_packed_id() {
    let dir = scratch_dir("objects-old");
    let bin = cpp_fixture();
    let names = reference(&bin);
    let ev = vec![
        Ev::Enter(packed(0, 1), 10),
        Ev::Enter(packed(1, 1), 20),
        Ev::Exit(packed(1, 1), 30),
        Ev::Exit(packed(0, 1), 40),
    ];
    let files = write_session(
        dir.path(),
        &[SynthProcess {
            pid: 5,
            binary: bin.clone(),
            build_id: Some(build_id(&bin)),
            threads: vec![(5, ev.clone())],
        }],
    );
    assert_reference_reads(&files[&(5, 5)], &ev);
    let (json, _) = report_json(dir.path(), &[]);
    let warnings = json["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(warnings[0]
        .as_str()
        .unwrap()
        .contains("XRay object 1, which"));
    let rows = rows_by_thread(&json);
    assert_eq!(rows[&(0, 0, 1)]["name"], names[&1]);
    assert_eq!(rows[&(0, 0, 1)]["object_path"], bin.display().to_string());
    let unknown = &rows[&(0, 0, packed(1, 1))];
    assert_eq!(unknown["name"], format!("#{}", packed(1, 1)));
    assert_eq!(unknown["object"], Value::Null);
    let folded = tool(&["convert", "--format", "folded"], dir.path());
    assert!(
        folded.contains(&format!("{};#16777217 10", names[&1])),
        "{folded}"
    );
}

#[test]
fn bad_objects_are_warned_about_per_object_and_shown_by_packed_id() {
    let dir = scratch_dir("objects-bad");
    let bins = objects_in(dir.path());
    let exe = cpp_fixture();
    let names = reference(&exe);
    let gone_exe = dir.path().join("gone").join("threads-cpp");
    let gone_lib = dir.path().join("gone").join("libgone.so");
    // Object 2: libone.so (the Rust fixture) where the session recorded libtwo.so's build.
    // Object 3: replaced during the recording, no build-id to check. Object 5: not listed.
    let ids = [0, 1, 2, 3, 5].map(|k| packed(k, 1));
    let ev: Vec<Ev> = ids
        .iter()
        .flat_map(|&id| [Ev::Enter(id, 10), Ev::Exit(id, 20)])
        .collect();
    let files = write_session(
        dir.path(),
        &[SynthProcess {
            pid: 6,
            binary: gone_exe.clone(),
            build_id: Some(build_id(&exe)),
            threads: vec![(6, ev.clone())],
        }],
    );
    assert_reference_reads(&files[&(6, 6)], &ev);
    let objects = vec![
        object_json(0, &gone_exe, Some(build_id(&exe)), false),
        object_json(1, &gone_lib, Some("00ff".into()), false),
        object_json(2, &bins[1], Some(build_id(&bins[2])), false),
        object_json(3, &bins[2], None, true),
        object_json(16, &bins[2], None, false),
        object_json(1, &bins[1], None, false),
    ];
    set_objects(dir.path(), &BTreeMap::from([(6, objects)]));

    let (json, stderr) = report_json(dir.path(), &[]);
    let warnings: Vec<&str> = json["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    let has = |needles: &[&str]| {
        assert!(
            warnings
                .iter()
                .any(|w| needles.iter().all(|n| w.contains(n))),
            "{needles:?} in {warnings:#?}"
        )
    };
    let path = |p: &Path| p.display().to_string();
    has(&["threads-cpp (pid 6): ", &path(&gone_exe)]);
    has(&["(pid 6) object 1: ", &path(&gone_lib)]);
    has(&[
        "(pid 6) object 2: ",
        &path(&bins[1]),
        "has changed since the recording",
    ]);
    has(&["(pid 6) object 3: ", &path(&bins[2]), "replaced on disk"]);
    has(&["object_id 16, outside 0..=15"]);
    has(&["object 1 is listed twice"]);
    has(&["functions of XRay object 5, which session.json does not list"]);
    assert_eq!(warnings.len(), 7, "{warnings:#?}");
    assert!(warnings.iter().all(|w| !w.contains('\n')));
    assert!(stderr.contains("warning:"), "{stderr}");
    let rows = rows_by_thread(&json);
    assert_eq!(rows.len(), ids.len());
    for id in ids {
        assert_eq!(rows[&(0, 0, id)]["name"], format!("#{id}"));
        assert_eq!(rows[&(0, 0, id)]["calls"], 1);
    }
    let text = tool(&["report"], dir.path());
    assert!(
        text.contains(&format!("  #{} [libgone.so]", packed(1, 1))),
        "{text}"
    );
    assert!(text.contains(&format!("  #{}\n", packed(5, 1))), "{text}");

    // --binary replaces the executable only: object 0 named, the others still by id.
    let given = ["--binary", exe.to_str().unwrap()];
    let (json, _) = report_json(dir.path(), &given);
    let rows = rows_by_thread(&json);
    assert_eq!(rows[&(0, 0, packed(0, 1))]["name"], names[&1]);
    for id in &ids[1..] {
        assert_eq!(rows[&(0, 0, *id)]["name"], format!("#{id}"));
    }
    let chrome = tool(
        &["convert", "--format", "chrome", given[0], given[1]],
        dir.path(),
    );
    assert!(chrome.contains(&format!("\"name\":\"#{}\"", packed(2, 1))));
}
