//! `fdr-profiled list`: the table of instrumented functions must say what the reference tool
//! says — for every function of the C++ and Rust fixtures, the id, function address, number of
//! sleds and name equal `llvm-xray extract --symbolize` (LLVM 19), for a path and for a pid.
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use tests::tools::run_output;
use tests::{cpp_fixture, extract_sleds, fdr_profiled, rust_fixture};

/// (function address, sled count, name) per function id.
type Table = BTreeMap<u32, (u64, usize, String)>;

fn listed(target: &str) -> Table {
    let out = run_output(Command::new(fdr_profiled()).arg("list").arg(target));
    assert!(
        out.status.success(),
        "list {target}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = String::from_utf8(out.stdout).unwrap();
    let mut table = Table::new();
    for line in out.lines().skip(2) {
        // id, address, sleds, kinds, exit method, then the name (which may contain spaces),
        // then why the exit method.
        let (line, why) = line
            .rsplit_once("  | ")
            .expect("a reason for the exit method");
        assert!(!why.is_empty(), "{line}");
        let mut cols = line.split_whitespace();
        let id: u32 = cols.next().unwrap().parse().unwrap();
        let address =
            u64::from_str_radix(cols.next().unwrap().trim_start_matches("0x"), 16).unwrap();
        let sleds: usize = cols.next().unwrap().parse().unwrap();
        let _kinds = cols.next().unwrap();
        let exit = cols.next().unwrap();
        assert!(exit == "return" || exit == "sleds", "{line}");
        let name = cols.collect::<Vec<_>>().join(" ");
        table.insert(id, (address, sleds, name));
    }
    table
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
