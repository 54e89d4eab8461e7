//! Test support: fixture builds and reference tools.
