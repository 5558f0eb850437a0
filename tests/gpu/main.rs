//! GPU tests: the conformance battery over every CUDA leaf, containers under kernels, adaptors on device memory, run-time choice on a GPU, and
//! the soundness rules (stream ordering after dropped streams, pinned copies). Each test writes,
//! copies back and compares. Without a CUDA driver each test prints why and returns; with
//! `MRSTACK_REQUIRE_GPU=1` a missing GPU fails the test instead.

// Tests and benches may unwrap: a failed unwrap is a failed test (clippy::unwrap_used is for
// the library).
#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod adaptors;
mod conformance;
mod containers;
mod driver_pools;
mod erased;
mod graphs;
mod hostile;
mod hostile_leaves;
mod multi_gpu;
mod sam_headroom;
mod soundness;
mod streams;
mod virtual_memory;
