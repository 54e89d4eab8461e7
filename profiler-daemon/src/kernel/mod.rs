//! Stage 3, the kernel side: the eBPF programs (crate `profiler-ebpf`) loaded with their
//! per-CPU ring buffers and attached where an [`crate::plan::AttachPlan`] says ([`bpf`], with
//! [`uprobe_multi`] placing one link per program and file, [`rlimit`] making room for the
//! descriptors the fallback needs, [`btf`] reading the kernel's own type layout), and the
//! events drained from the buffers ([`intake`]), with the kernel side's own accounts of what it
//! could not deliver ([`books`]); [`task_iter`] runs a task iterator over the threads of one
//! process; [`caps`] checks the capabilities all this needs.
//! This is the only stage that makes BPF system calls.
pub mod books;
pub mod bpf;
pub mod btf;
pub mod caps;
pub mod intake;
pub mod rlimit;
mod sys;
pub mod task_iter;
pub mod uprobe_multi;
