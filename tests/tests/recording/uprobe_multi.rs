//! `profiler_daemon::kernel::uprobe_multi` against the running kernel (root, Linux 6.6+).
//!
//! A hand-assembled counting program (independent of our eBPF object) checks the link itself:
//! for each hit it adds 1 to `counts[cookie]` and stores the probed thread's `rax` in
//! `counts[cookie + 128]`. Targets are functions of this test binary (each test its own, as
//! tests run in parallel in one process) and the C++ fixture, whose own call counts are the
//! reference. [`MultiProgram::load`] is checked on the real eBPF object.
use aya::maps::{Array, IterableMap as _, MapData};
use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_prog_info};
use profiler_common::SledKind;
use profiler_daemon::kernel::uprobe_multi::{self, MultiProgram};
use profiler_daemon::plan::AttachPlan;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::num::NonZeroU32;
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd};
use std::path::Path;
use std::time::Duration;
use tests::counts::parse_count_lines;
use tests::fixtures::{cpp_fixture, private_copy, CPP_FUNCTIONS};
use tests::run::{assert_success, spawn_fixture, WAITING_PREFIX};
use tests::tools::scratch_dir;

const SLOTS: u32 = 256;
const RAX_SLOT: u32 = 128;

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | (u64::from(dst | (src << 4)) << 8)
        | (u64::from(off as u16) << 16)
        | (u64::from(imm as u32) << 32)
}

/// The counting program, with its `counts` array map.
fn counting_program() -> (MultiProgram, Array<MapData, u64>) {
    let counts = Array::<MapData, u64>::create(SLOTS, 0).expect("create the counts map");
    let fd = counts.map().fd().as_fd().as_raw_fd();
    let lookup = |key_reg: u8| {
        [
            insn(0x63, 10, key_reg, -4, 0), // *(u32 *)(r10 - 4) = w_key
            insn(0xbf, 2, 10, 0, 0),        // r2 = r10
            insn(0x07, 2, 0, 0, -4),        // r2 += -4
            insn(0x18, 1, 1, 0, fd),        // r1 = counts (BPF_PSEUDO_MAP_FD)
            0,
            insn(0x85, 0, 0, 0, 1), // call bpf_map_lookup_elem
            insn(0x15, 0, 0, 2, 0), // if r0 == 0 goto +2
        ]
    };
    let mut code = vec![
        insn(0xbf, 6, 1, 0, 0),   // r6 = ctx
        insn(0x85, 0, 0, 0, 174), // call bpf_get_attach_cookie
        insn(0xbf, 7, 0, 0, 0),   // r7 = cookie
    ];
    code.extend(lookup(7));
    code.extend([
        insn(0xb7, 1, 0, 0, 1),               // r1 = 1
        insn(0xdb, 0, 1, 0, 0),               // lock *(u64 *)(r0 + 0) += r1
        insn(0x04, 7, 0, 0, RAX_SLOT as i32), // w7 += RAX_SLOT
    ]);
    code.extend(lookup(7));
    code.extend([
        insn(0x79, 1, 6, 80, 0), // r1 = ctx->ax (struct pt_regs, x86-64)
        insn(0x7b, 0, 1, 0, 0),  // *(u64 *)(r0 + 0) = r1
        insn(0xb7, 0, 0, 0, 0),  // r0 = 0
        insn(0x95, 0, 0, 0, 0),  // exit
    ]);
    let program = MultiProgram::from_instructions("test_count", &code, c"GPL")
        .expect("load the counting program");
    (program, counts)
}

fn count(counts: &Array<MapData, u64>, slot: u32) -> u64 {
    counts.get(&slot, 0).expect("read the counts map")
}

/// File offset in /proc/self/exe of code at `addr`, from /proc/self/maps.
fn self_offset(addr: usize) -> u64 {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (start, end) = fields[0].split_once('-').expect("maps range");
        let start = usize::from_str_radix(start, 16).expect("maps start");
        let end = usize::from_str_radix(end, 16).expect("maps end");
        if (start..end).contains(&addr) {
            assert!(fields[1].contains('x'), "{addr:#x} is not in code: {line}");
            let offset = u64::from_str_radix(fields[2], 16).expect("maps offset");
            return offset + (addr - start) as u64;
        }
    }
    panic!("{addr:#x} is not mapped");
}

fn own_pid() -> Option<NonZeroU32> {
    NonZeroU32::new(std::process::id())
}

macro_rules! targets {
    ($($name:ident),*) => {$(
        #[inline(never)]
        #[no_mangle]
        extern "C" fn $name(x: u64) -> u64 {
            std::hint::black_box(x).wrapping_add(1)
        }
    )*};
}
targets!(
    um_cookie_a,
    um_cookie_b,
    um_cookie_c,
    um_ret,
    um_detach,
    um_other_pid,
    um_refused
);

fn offset_of(f: extern "C" fn(u64) -> u64) -> u64 {
    self_offset(f as usize)
}

fn call(f: extern "C" fn(u64) -> u64, times: u64) {
    for i in 0..times {
        std::hint::black_box(f(std::hint::black_box(i)));
    }
}

#[test]
fn kernel_has_uprobe_multi() {
    let version = aya::util::KernelVersion::current().expect("kernel version");
    assert_eq!(
        uprobe_multi::supported(),
        version >= aya::util::KernelVersion::new(6, 6, 0),
        "uprobe_multi support on {version:?}"
    );
}

#[test]
fn each_offset_reports_its_own_cookie() {
    let (prog, counts) = counting_program();
    let offsets = [
        offset_of(um_cookie_a),
        offset_of(um_cookie_b),
        offset_of(um_cookie_c),
    ];
    let exe = Path::new("/proc/self/exe");
    let link = uprobe_multi::attach(prog.fd(), exe, &offsets, &[1, 2, 3], own_pid(), false)
        .expect("attach");
    assert_eq!((link.probes(), link.fds()), (3, 1));
    call(um_cookie_a, 3);
    call(um_cookie_b, 5);
    let seen: Vec<u64> = (0..5).map(|slot| count(&counts, slot)).collect();
    assert_eq!(seen, [0, 3, 5, 0, 0]);
}

#[test]
fn return_probes_run_after_the_function() {
    let (prog, counts) = counting_program();
    let offsets = [offset_of(um_ret)];
    let exe = Path::new("/proc/self/exe");
    let link =
        uprobe_multi::attach(prog.fd(), exe, &offsets, &[4], own_pid(), true).expect("attach");
    assert_eq!(um_ret(std::hint::black_box(41)), 42);
    // rax holds the return value only after the function ran.
    assert_eq!((count(&counts, 4), count(&counts, 4 + RAX_SLOT)), (1, 42));
    drop(link);
}

#[test]
fn dropping_the_link_detaches() {
    let (prog, counts) = counting_program();
    let offsets = [offset_of(um_detach)];
    let exe = Path::new("/proc/self/exe");
    let link =
        uprobe_multi::attach(prog.fd(), exe, &offsets, &[5], own_pid(), false).expect("attach");
    call(um_detach, 2);
    drop(link);
    call(um_detach, 3);
    assert_eq!(count(&counts, 5), 2);
}

#[test]
fn a_pid_filter_ignores_other_processes() {
    let (prog, counts) = counting_program();
    let offsets = [offset_of(um_other_pid)];
    let exe = Path::new("/proc/self/exe");
    let mut other = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("spawn sleep");
    let pid = NonZeroU32::new(other.id());
    let scoped = uprobe_multi::attach(prog.fd(), exe, &offsets, &[6], pid, false).expect("attach");
    call(um_other_pid, 4);
    assert_eq!(
        count(&counts, 6),
        0,
        "probe scoped to pid {pid:?} fired here"
    );
    drop(scoped);
    let everywhere =
        uprobe_multi::attach(prog.fd(), exe, &offsets, &[6], None, false).expect("attach");
    call(um_other_pid, 4);
    assert_eq!(count(&counts, 6), 4);
    drop(everywhere);
    let _ = other.kill();
    let _ = other.wait();
}

#[test]
fn bad_requests_are_errors() {
    let (prog, _counts) = counting_program();
    let exe = Path::new("/proc/self/exe");
    let off = offset_of(um_refused);
    let kind = |r: std::io::Result<uprobe_multi::MultiLink>| r.expect_err("accepted").kind();
    use std::io::ErrorKind::{InvalidInput, NotFound};
    assert_eq!(
        kind(uprobe_multi::attach(prog.fd(), exe, &[], &[], None, false)),
        InvalidInput
    );
    assert_eq!(
        kind(uprobe_multi::attach(
            prog.fd(),
            exe,
            &[off],
            &[1, 2],
            None,
            false
        )),
        InvalidInput
    );
    let missing = Path::new("/nonexistent/binary");
    assert_eq!(
        kind(uprobe_multi::attach(
            prog.fd(),
            missing,
            &[off],
            &[],
            None,
            false
        )),
        NotFound
    );
}

/// Offsets and cookies of the C++ fixture's entry sleds, and the function names by cookie.
fn entry_probes(exe: &Path) -> (Vec<u64>, Vec<u64>, BTreeMap<u64, String>) {
    let plan = AttachPlan::for_binary(exe).expect("plan the fixture");
    let entries: Vec<_> = plan
        .probes
        .iter()
        .filter(|p| SledKind::from_u8(p.cookie.kind).is_some_and(SledKind::is_entry))
        .collect();
    let names = entries
        .iter()
        .map(|p| {
            (
                u64::from(p.cookie.function_id),
                plan.names.name(p.cookie.function_id),
            )
        })
        .collect();
    let offsets = entries.iter().map(|p| p.file_offset).collect();
    let cookies = entries
        .iter()
        .map(|p| u64::from(p.cookie.function_id))
        .collect();
    (offsets, cookies, names)
}

/// Through /proc/PID/exe, a process whose binary was deleted is traced, and only it: the counts
/// per function equal the ones the fixture printed; its twin running the same file adds none.
#[test]
fn deleted_binary_through_proc_pid_exe_counts_exactly() {
    let scratch = scratch_dir("umulti-deleted");
    let bin = private_copy(&cpp_fixture(), scratch.path());
    let wait = scratch.path().join("go");
    let args = [
        OsString::from("--wait-file"),
        wait.clone().into_os_string(),
        OsString::from("--iterations"),
        OsString::from("50"),
    ];
    let mut target = spawn_fixture("target", &bin, &args);
    let mut twin = spawn_fixture("twin", &bin, &args);
    target.wait_for_stderr_line(WAITING_PREFIX, Duration::from_secs(30));
    twin.wait_for_stderr_line(WAITING_PREFIX, Duration::from_secs(30));
    std::fs::remove_file(&bin).expect("delete the fixture");

    let exe = Path::new("/proc")
        .join(target.pid().to_string())
        .join("exe");
    let (offsets, cookies, names) = entry_probes(&exe);
    assert!(
        cookies.iter().all(|&c| c < u64::from(RAX_SLOT)),
        "ids {cookies:?}"
    );
    let (prog, counts) = counting_program();
    let pid = NonZeroU32::new(target.pid());
    let link = uprobe_multi::attach(prog.fd(), &exe, &offsets, &cookies, pid, false)
        .expect("attach through /proc/PID/exe");
    std::fs::write(&wait, b"go\n").expect("create the wait file");
    let target = target.finish(Duration::from_secs(120));
    let twin = twin.finish(Duration::from_secs(120));
    assert_success("target", &target);
    assert_success("twin", &twin);
    drop(link);

    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for line in parse_count_lines(&target.stdout) {
        *expected.entry(line.function).or_default() += line.calls;
    }
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    for (cookie, name) in &names {
        seen.insert(name.clone(), count(&counts, *cookie as u32));
    }
    // Functions the run did not call (fx_gap_probe without --gap-ms) have no count line.
    for name in CPP_FUNCTIONS {
        let want = expected.get(*name).copied().unwrap_or(0);
        assert_eq!(seen.get(*name), Some(&want), "calls of {name}");
    }
    assert!(expected.len() >= CPP_FUNCTIONS.len() - 1, "{expected:?}");
    // main was entered before the probes existed.
    assert_eq!(seen.get("main"), Some(&0));
}

/// The prog ids and map ids of a program fd (BPF_OBJ_GET_INFO_BY_FD).
fn map_ids(prog: BorrowedFd<'_>) -> Vec<u32> {
    let info_by_fd = |ids: &mut [u32]| {
        // SAFETY: zeroed plain-data C structs; pointers stay valid during the call.
        let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
        info.nr_map_ids = ids.len() as u32;
        info.map_ids = ids.as_mut_ptr() as u64;
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        attr.info.bpf_fd = prog.as_raw_fd() as u32;
        attr.info.info_len = std::mem::size_of::<bpf_prog_info>() as u32;
        attr.info.info = &mut info as *mut bpf_prog_info as u64;
        let size = std::mem::size_of::<bpf_attr>();
        let cmd = bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_long;
        // SAFETY: valid attr of the size passed.
        let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, &mut attr as *mut bpf_attr, size) };
        assert_eq!(
            ret,
            0,
            "BPF_OBJ_GET_INFO_BY_FD: {}",
            std::io::Error::last_os_error()
        );
        info.nr_map_ids as usize
    };
    let mut ids = vec![0u32; info_by_fd(&mut [])];
    info_by_fd(&mut ids);
    ids.sort_unstable();
    ids
}

/// Every uprobe program of our eBPF object loads for uprobe_multi and uses exactly the maps of
/// aya's own load of it; aya's load itself is refused by uprobe_multi links.
#[test]
fn object_programs_load_for_uprobe_multi_sharing_maps() {
    let object = profiler_daemon::kernel::bpf::EBPF_OBJECT;
    let mut ebpf = profiler_daemon::kernel::bpf::object_loader()
        .load(object)
        .expect("load the eBPF object");
    let names: Vec<String> = ebpf
        .programs()
        .filter(|(_, p)| matches!(p, aya::programs::Program::UProbe(_)))
        .map(|(name, _)| name.to_owned())
        .collect();
    assert!(
        names.iter().any(|n| n == profiler_common::SLED_PROGRAM),
        "{names:?}"
    );
    for name in &names {
        let program: &mut aya::programs::UProbe = ebpf
            .program_mut(name)
            .expect("program")
            .try_into()
            .expect("a uprobe program");
        program.load().expect("aya loads it");
        let aya_fd = program
            .fd()
            .expect("fd")
            .as_fd()
            .try_clone_to_owned()
            .expect("dup");
        let multi = MultiProgram::load(&ebpf, object, name).expect("loads for uprobe_multi");
        assert_eq!(
            map_ids(multi.fd()),
            map_ids(aya_fd.as_fd()),
            "maps of {name}"
        );
        assert!(!map_ids(multi.fd()).is_empty() || name != profiler_common::SLED_PROGRAM);

        let exe = Path::new("/proc/self/exe");
        let off = [offset_of(um_refused)];
        let err = uprobe_multi::attach(aya_fd.as_fd(), exe, &off, &[], own_pid(), false)
            .expect_err("a program loaded without the attach type is refused");
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    }
}
