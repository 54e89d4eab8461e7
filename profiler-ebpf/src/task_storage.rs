//! `BPF_MAP_TYPE_TASK_STORAGE`: a value attached to each thread (`struct task_struct`) by the
//! kernel, found from the thread itself without a hash lookup, and freed with the thread.
//!
//! aya-ebpf 0.2 has no map type for it. The definition below is what the kernel expects of a
//! BTF-defined map (the layout `aya_ebpf::btf_maps` uses for its own, and libbpf's
//! `__uint`/`__type` fields): `type`, `key` and `value` types, `max_entries` 0 and
//! `BPF_F_NO_PREALLOC` (the only ones a local-storage map accepts), a 4-byte integer key (the
//! kernel checks it: from user space the key is a pidfd).
use aya_ebpf::{
    bindings::{bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE, task_struct, BPF_F_NO_PREALLOC},
    helpers::generated::{bpf_get_current_task_btf, bpf_task_storage_delete, bpf_task_storage_get},
};
use core::ffi::c_void;

/// `BPF_LOCAL_STORAGE_GET_F_CREATE` (uapi).
const GET_F_CREATE: u64 = 1;

/// A task-storage map of `T` (place it in `.maps` with `#[btf_map]`).
#[repr(C)]
pub struct TaskStorage<T> {
    // Field names, order and pointer-to-array encoding are the BTF map-definition convention.
    r#type: *const [i32; BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}

// SAFETY: the fields are placeholders the loader reads from BTF; they are never dereferenced.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    /// The placeholder definition the loader replaces with the map.
    pub const fn new() -> Self {
        TaskStorage {
            r#type: core::ptr::null(),
            key: core::ptr::null(),
            value: core::ptr::null(),
            max_entries: core::ptr::null(),
            map_flags: core::ptr::null(),
        }
    }

    fn as_ptr(&self) -> *mut c_void {
        self as *const Self as *mut c_void
    }

    /// The current thread's value; when `create`, a zeroed one is attached first if it has
    /// none. `None` when it has none and none is to be created, when the kernel could not
    /// allocate one, or when another program holding the storage lock runs on this CPU.
    #[inline(always)]
    pub fn current(&self, create: bool) -> Option<&'static mut T> {
        let flags = if create { GET_F_CREATE } else { 0 };
        // SAFETY: the helper returns null or a pointer to this map's value for the current
        // task, valid for the program's run; only the thread's own programs touch it, one at
        // a time, and the daemon only reads it.
        unsafe {
            let task = bpf_get_current_task_btf();
            let v = bpf_task_storage_get(self.as_ptr(), task, core::ptr::null_mut(), flags);
            (v as *mut T).as_mut()
        }
    }

    /// `task`'s value, if it has one (`task` a trusted pointer from the kernel, such as a task
    /// iterator's).
    #[inline(always)]
    pub fn of(&self, task: *mut task_struct) -> Option<&'static mut T> {
        // SAFETY: as in `current`.
        unsafe {
            let v = bpf_task_storage_get(self.as_ptr(), task, core::ptr::null_mut(), 0);
            (v as *mut T).as_mut()
        }
    }

    /// Removes the current thread's value.
    #[inline(always)]
    pub fn remove_current(&self) {
        // SAFETY: plain helper calls on the current task.
        unsafe {
            bpf_task_storage_delete(self.as_ptr(), bpf_get_current_task_btf());
        }
    }
}
