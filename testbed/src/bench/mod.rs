//! What `ccm-bench` (issue #35) shares with tests: the kubelet-realistic Node.
//!
//! The per-cloud world set-up of the benchmark lives beside it in `cloud/` and is compiled
//! into the `ccm-bench` binary only (`#[path]` modules of `src/bin/ccm_bench.rs`), so the
//! library every test links stays free of it.

pub mod node;
