//! fdr-profiled: traces programs built with LLVM XRay without their cooperation.
//!
//! The recorder is a pipeline; each stage is a folder, and imports only run down it:
//!
//! 1. [`traced`]: what is traced: a running process, the files it maps, a command to launch.
//!    (The ELF files themselves are read by the `xray-object` crate.)
//! 2. [`plan`]: what to probe: which objects of a process ([`plan::discovery`]), which
//!    functions ([`plan::select`]), how exits are observed ([`plan::exits`]), where event sleds
//!    keep their arguments ([`plan::eventsled`]); the result is one [`plan::AttachPlan`] per
//!    object.
//! 3. [`kernel`]: the eBPF programs loaded and attached ([`kernel::bpf`],
//!    [`kernel::uprobe_multi`]), and the events drained from the per-CPU ring buffers
//!    ([`kernel::intake`]).
//! 4. [`session`]: each thread's events put back in program order ([`session::order`]) and
//!    written as one FDR file per thread (through the `xray-fdr` crate), with the summary and
//!    the manifest.
//!
//! 5. [`repair`]: `--exits repair`, the ptrace keeper that makes return probes safe for
//!    exceptions ([`repair::keeper`]), and every process of a binary traced that way
//!    ([`repair::processes`]); [`budget`], the overhead budget; [`inline`], `--engine
//!    inline`: sleds patched from outside to call a handler in the process, its hits read
//!    from shared memory into the same pipeline.
//!
//! Reading a session back (replay, symbolization, reports, conversions) is the `fdr-analysis`
//! crate, which needs no BPF. On top of both sit the commands: [`record`] (the default
//! command), [`service`] (the system service) and [`tools`] (`list`, `dump`, `verify`,
//! `report`, `convert`), and [`cli`], which
//! only parses the command line. ARCHITECTURE.md walks one event through these stages.
#[macro_use]
pub mod console;
pub mod arch;
pub mod budget;
pub mod cli;
pub mod inline;
pub mod kernel;
pub mod plan;
pub mod record;
pub mod repair;
pub mod service;
pub mod session;
pub mod tools;
pub mod traced;
