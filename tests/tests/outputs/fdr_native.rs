//! Real traces written by compiler-rt's own FDR runtime (version 5, all threads in one file,
//! several buffers per thread) are read by our reader, which must report the same function
//! records as llvm-xray 14 and 19 and as many events:
//! - the C++ fixture built with `-DFX_NATIVE_FDR` (`tests::native_fdr_trace`);
//! - a program built here that logs custom events from several threads into small (4 KiB)
//!   buffers, whose payloads the reader must return byte for byte.
//!
//! Typed events are not covered here: compiler-rt 19's FDR mode crashes on them on x86_64
//! (SIGSEGV in `FDRLogWriter::writeTypedEvent`), so they are checked against llvm-xray with the
//! writer's own version 5 files (`xray-fdr`'s `tests/roundtrip.rs`).
//!
//! Needs clang-19 and llvm-xray 14 and 19; no root.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use tests::fdr_agree;
use tests::tools::clangxx;
use tests::{native_fdr_trace, scratch_dir};
use xray_fdr::reader::{read, RecordKind};

#[test]
fn fixture_trace_reads_like_llvm_xray() {
    let dir = scratch_dir("fdr-native");
    let (file, _stdout) = native_fdr_trace(dir.path(), &["--iterations", "40"]);
    let bytes = std::fs::read(&file).unwrap();
    let trace = read(&bytes).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert_eq!(trace.header.version, 5);
    let threads: std::collections::BTreeSet<u32> = trace.blocks.iter().map(|b| b.tid).collect();
    assert_eq!(threads.len(), 4, "main + 3 threads");
    assert!(trace.records.len() > 1000, "{}", trace.records.len());
    fdr_agree::agree(&file, &trace).unwrap();
}

/// A C++ program that logs custom events between instrumented calls, in compiler-rt's FDR mode
/// with 4 KiB buffers. Each event's payload names its thread and index, so the test knows every
/// payload.
const EVENTS_CPP: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <xray/xray_interface.h>
#include <xray/xray_log_interface.h>

#define NOINLINE __attribute__((noinline))
volatile long g_sink;

NOINLINE long leaf(long x) { g_sink = x; return x + 1; }

[[clang::xray_always_instrument]] NOINLINE void emit(int thread, int i) {
  char buf[64];
  // Odd lengths: the payload is exactly the formatted text, no terminator.
  int n = snprintf(buf, sizeof buf, "custom t%d i%d%s", thread, i, (i % 2) ? "x" : "");
  __xray_customevent(buf, n);
}

[[clang::xray_always_instrument]] NOINLINE void *worker(void *arg) {
  int thread = (int)(long)arg;
  for (int i = 0; i < 400; i++) {
    g_sink += leaf(i);
    emit(thread, i);
  }
  return nullptr;
}

int main() {
  if (__xray_log_select_mode("xray-fdr") != XRayLogRegisterStatus::XRAY_REGISTRATION_OK ||
      __xray_log_init_mode("xray-fdr",
                           "buffer_size=4096:buffer_max=400:func_duration_threshold_us=0") !=
          XRayLogInitStatus::XRAY_LOG_INITIALIZED ||
      __xray_patch() != XRayPatchingStatus::SUCCESS) {
    fprintf(stderr, "xray fdr setup failed\n");
    return 1;
  }
  pthread_t t[3];
  for (long k = 0; k < 3; k++) pthread_create(&t[k], nullptr, worker, (void *)(k + 1));
  worker((void *)0);
  for (int k = 0; k < 3; k++) pthread_join(t[k], nullptr);
  __xray_log_finalize();
  __xray_log_flushLog();
  return 0;
}
"#;

fn build_events_program(dir: &Path) -> PathBuf {
    let src = dir.join("events.cpp");
    std::fs::write(&src, EVENTS_CPP).unwrap();
    let bin = dir.join("events");
    let out = Command::new(clangxx())
        .args([
            "-O1",
            "-fxray-instrument",
            "-fxray-instruction-threshold=1",
            "-pthread",
        ])
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "clang++-19 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

#[test]
fn events_trace_reads_like_llvm_xray() {
    let dir = scratch_dir("fdr-native-events");
    let bin = build_events_program(dir.path());
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let out = Command::new(&bin)
        .env(
            "XRAY_OPTIONS",
            format!("xray_logfile_base={}/ patch_premain=false", logs.display()),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files: Vec<PathBuf> = std::fs::read_dir(&logs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let bytes = std::fs::read(&files[0]).unwrap();
    let trace = read(&bytes).unwrap_or_else(|e| panic!("{}: {e}", files[0].display()));
    assert_eq!(trace.header.version, 5);
    fdr_agree::agree(&files[0], &trace).unwrap();

    // Several buffers per thread, and every payload as the program wrote it, in order.
    let mut blocks: BTreeMap<u32, usize> = BTreeMap::new();
    for b in &trace.blocks {
        *blocks.entry(b.tid).or_default() += 1;
    }
    assert_eq!(blocks.len(), 4);
    assert!(blocks.values().all(|&n| n > 3), "{blocks:?}");
    let mut per_thread: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for r in &trace.records {
        let text = match &r.kind {
            RecordKind::CustomEvent { data } => String::from_utf8(data.clone()).unwrap(),
            _ => continue,
        };
        per_thread.entry(r.tid).or_default().push(text);
    }
    let mut seen_threads: Vec<usize> = Vec::new();
    for events in per_thread.values() {
        assert_eq!(events.len(), 400, "{events:?}");
        let thread: usize = events[0]["custom t".len()..]
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        seen_threads.push(thread);
        for (i, event) in events.iter().enumerate() {
            let odd = if i % 2 == 1 { "x" } else { "" };
            assert_eq!(*event, format!("custom t{thread} i{i}{odd}"));
        }
    }
    seen_threads.sort();
    assert_eq!(seen_threads, [0, 1, 2, 3]);
}
