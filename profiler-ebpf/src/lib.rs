//! Empty host-side library: it exists so that `profiler-daemon` can build-depend on this crate and
//! be rebuilt when it changes. The programs themselves are in `main.rs`, built for
//! `bpfel-unknown-none` by `aya-build`.
#![no_std]
