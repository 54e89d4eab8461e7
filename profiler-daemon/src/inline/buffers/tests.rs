//! The handler run for real, in this process: a function of two patched sleds calls it, and
//! what it wrote is read back as events.
use super::*;
use crate::inline::handler::handler;
use crate::inline::patch::{patched, Sled, Trampoline, SLED_BYTES};

/// The shared memory (mapped in this process, read through its own second mapping, as
/// fdr-profiled reads a traced process's), a copy of the handler filled in for it, and a
/// function `f(x) -> x` made of an entry sled, `mov eax, edi` and an exit sled, patched.
struct Rig {
    buffers: SharedBuffers,
    function: extern "C" fn(u32) -> u32,
    code: *mut u8,
    shared: *mut u8,
    layout: Layout,
}

impl Rig {
    fn new(ring_bytes: u64) -> Rig {
        let layout = Layout::new(4, ring_bytes).unwrap();
        // SAFETY: fresh mappings, checked.
        let shared = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.bytes() as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(shared, libc::MAP_FAILED);
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        let buffers = SharedBuffers::map(pid, shared as u64, layout).unwrap();
        let tid_offset = crate::inline::glibc::tid_offset(pid).unwrap();
        let handler = handler();
        // SAFETY: as above.
        let code = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        }
        .cast::<u8>();
        assert_ne!(code.cast(), libc::MAP_FAILED);
        let base = code as u64;
        let function = base + 4096;
        let block = layout.data_block(shared as u64, tid_offset);
        let entry = Sled {
            address: function,
            function_id: 42,
            kind: Trampoline::Entry,
        };
        let exit = Sled {
            address: function + SLED_BYTES as u64 + 2,
            function_id: 42,
            kind: Trampoline::Exit,
        };
        let mut body = Vec::new();
        body.extend(patched(&entry, base + handler.entry as u64).unwrap());
        body.extend([0x89, 0xf8]); // mov eax, edi
        body.extend(patched(&exit, base + handler.exit as u64).unwrap());
        // SAFETY: writes within the 8 KiB mapping, then makes it executable.
        unsafe {
            std::ptr::copy_nonoverlapping(handler.bytes.as_ptr(), code, handler.bytes.len());
            std::ptr::copy_nonoverlapping(block.as_ptr(), code.add(handler.data), block.len());
            std::ptr::copy_nonoverlapping(body.as_ptr(), code.add(4096), body.len());
            assert_eq!(
                libc::mprotect(code.cast(), 8192, libc::PROT_READ | libc::PROT_EXEC),
                0
            );
        }
        Rig {
            buffers,
            // SAFETY: the bytes at `function` are a function of that type (above).
            function: unsafe { std::mem::transmute::<u64, extern "C" fn(u32) -> u32>(function) },
            code,
            shared: shared.cast(),
            layout,
        }
    }

    fn drain(&mut self) -> Vec<EventHeader> {
        let clock = TscClock::measure(std::time::Duration::from_millis(1));
        let mut out = Vec::new();
        let mut ended = Vec::new();
        self.buffers
            .drain(&clock, false, |e| out.push(e.header), &mut ended);
        out
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with these lengths.
        unsafe {
            libc::munmap(self.code.cast(), 8192);
            libc::munmap(self.shared.cast(), self.layout.bytes() as usize);
        }
    }
}

#[test]
fn every_hit_is_a_record_in_its_threads_order_and_the_function_runs_unchanged() {
    let mut rig = Rig::new(1 << 17);
    for x in 0..1000 {
        assert_eq!((rig.function)(x), x, "arguments and return value kept");
    }
    let f = rig.function;
    let other = std::thread::spawn(move || {
        for x in 0..500 {
            assert_eq!(f(x), x);
        }
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() as u32 }
    })
    .join()
    .unwrap();
    // SAFETY: as above.
    let me = unsafe { libc::gettid() as u32 };
    let events = rig.drain();
    for (tid, calls) in [(me, 1000u64), (other, 500)] {
        let mine: Vec<_> = events.iter().filter(|e| e.tid == tid).collect();
        assert_eq!(mine.len() as u64, 2 * calls, "thread {tid}");
        for (i, e) in mine.iter().enumerate() {
            assert_eq!(e.seq, i as u64);
            assert_eq!(e.function_id, 42);
            assert_eq!(e.gap_lost, 0);
            // SAFETY: sysconf has no preconditions.
            let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
            assert!(i64::from(e.cpu) < cpus, "cpu {}", e.cpu);
            let kind = if i % 2 == 0 {
                SledKindRef::Entry
            } else {
                SledKindRef::Exit
            };
            assert_eq!(e.kind, kind as u8);
            // SAFETY: getpid has no preconditions.
            assert_eq!(e.pid, unsafe { libc::getpid() } as u32);
        }
        // An entry and its exit name the same frame slot; times do not go back.
        for pair in mine.chunks(2) {
            assert_eq!(pair[0].sp, pair[1].sp);
            assert!(pair[0].ts_ns <= pair[1].ts_ns);
        }
        assert!(mine.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns));
    }
    assert_eq!(rig.buffers.no_slot(), 0);
}

/// Kinds as the records say them.
#[repr(u8)]
enum SledKindRef {
    Entry = 0,
    Exit = 1,
}

#[test]
fn a_full_ring_loses_hits_and_the_next_record_says_how_many() {
    // 256 records (the smallest ring): 192 fit before it counts as full.
    let mut rig = Rig::new(256 * 32);
    for x in 0..150 {
        (rig.function)(x);
    }
    let first = rig.drain();
    assert_eq!(first.len(), 192);
    assert!(first.iter().all(|e| e.gap_lost == 0));
    (rig.function)(7);
    let next = rig.drain();
    assert_eq!(next.len(), 2);
    // 300 hits before: 192 written, 108 lost; the next record comes after them.
    assert_eq!((next[0].seq, next[0].gap_lost), (300, 108));
    assert_eq!((next[1].seq, next[1].gap_lost), (301, 0));
    let books = rig.buffers.books();
    assert_eq!(books.len(), 1);
    assert_eq!((books[0].1.seq, books[0].1.lost), (302, 0));
}
