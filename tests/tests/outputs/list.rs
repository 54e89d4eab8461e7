//! `fdr-profiled list`: the table of instrumented functions must say what the reference tool
//! says — for every function of the C++ and Rust fixtures, the id, function address, number of
//! sleds and name equal `llvm-xray extract --symbolize` (LLVM 19), for a path and for a pid.
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use tests::{cpp_fixture, extract_sleds, rust_fixture};

/// (function address, sled count, name) per function id.
type Table = BTreeMap<u32, (u64, usize, String)>;

fn listed(target: &str) -> Table {
    tests::tools::list(target.as_ref())
        .1
        .into_iter()
        .map(|f| (f.id, (f.address, f.sleds, f.name)))
        .collect()
}

fn reference(bin: &Path) -> Table {
    let mut table = Table::new();
    for sled in extract_sleds(19, bin) {
        let entry = table
            .entry(sled.id)
            .or_insert((sled.function, 0, sled.function_name.clone()));
        entry.1 += 1;
    }
    table
}

fn check(bin: &Path) {
    let want = reference(bin);
    assert!(!want.is_empty());
    let got = listed(&bin.to_string_lossy());
    assert_eq!(got.len(), want.len(), "function count of {}", bin.display());
    for (id, (address, sleds, name)) in &want {
        let (a, s, n) = got.get(id).unwrap_or_else(|| panic!("id {id} missing"));
        assert_eq!(
            (a, s),
            (address, sleds),
            "function {id} of {}",
            bin.display()
        );
        // llvm-xray keeps Rust legacy-mangling escapes; compare the names it demangled fully.
        if !name.contains('$') {
            assert_eq!(n, name, "name of function {id} of {}", bin.display());
        }
    }
}

#[test]
fn cpp_fixture_matches_llvm_xray_extract() {
    check(&cpp_fixture());
}

#[test]
fn rust_fixture_matches_llvm_xray_extract() {
    check(&rust_fixture());
}

#[test]
fn running_process_is_listed_by_pid() {
    let bin = cpp_fixture();
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(&bin)
        .arg("--wait-file")
        .arg(dir.path().join("never"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let by_pid = listed(&child.id().to_string());
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(by_pid, listed(&bin.to_string_lossy()));
}

/// Probes go in one at a time while the target runs: every exit-side probe must come before any
/// entry probe, so the attach window can only lose exits of calls whose entry it also missed
/// (dropped and counted), never leave an entry whose exit goes unrecorded.
#[test]
fn attach_plan_places_exit_probes_before_entry_probes() {
    use profiler_common::SledKind;
    for bin in [cpp_fixture(), rust_fixture()] {
        let plan = profiler_daemon::plan::AttachPlan::for_binary(&bin).unwrap();
        let is_entry = |k: u8| SledKind::from_u8(k).is_some_and(SledKind::is_entry);
        let first_entry = plan
            .probes
            .iter()
            .position(|p| is_entry(p.cookie.kind))
            .expect("entry probes");
        assert!(first_entry > 0, "{}: exit probes exist", bin.display());
        assert!(
            plan.probes[first_entry..]
                .iter()
                .all(|p| is_entry(p.cookie.kind)),
            "{}: an exit probe comes after an entry probe",
            bin.display()
        );
    }
}

/// A real library's names (nlohmann/json, clang 19): every one demangled, none left as a raw
/// `_Z` name. The functions clang mangled with `Tn` template-parameter declarations, which
/// cpp_demangle cannot parse (`create<std::nullptr_t, 0>`, `erase<..., 0>`), read exactly as
/// llvm-xray names them. (Of the others, some differ where cpp_demangle prints a parameter
/// pack of references, `Args&&...`, without the `&&`: its own, with or without `Tn`.)
#[test]
fn a_json_library_s_names_are_all_demangled() {
    let bin = tests::fixtures::workloads::json_parse_fixture();
    let want = reference(&bin);
    let got = listed(&bin.to_string_lossy());
    let mut declared = 0;
    for (id, (_, _, name)) in &want {
        let (_, _, ours) = &got[id];
        assert!(
            !ours.starts_with("_Z"),
            "function {id} left mangled: {ours}"
        );
        // The `Tn` functions of json.hpp without a pack: `create` of each exception, `erase`.
        let tn = name.contains("::create<") || name.contains("::erase<");
        if tn && name.contains(", 0>(") {
            assert_eq!(ours, name, "function {id}");
            declared += 1;
        }
    }
    assert!(declared >= 6, "{declared} functions with a Tn declaration");
}

/// AArch64 (issue 33): an arm64 build's instrumentation map (its sleds' addresses, ids and
/// kinds, `b #32` entry sleds and exit sleds at each `ret`) reads as llvm-xray reads it.
#[test]
fn an_aarch64_binary_matches_llvm_xray_extract() {
    check(&tests::fixtures::workloads::paced_aarch64_fixture());
}
