//! Host tests: the conformance battery over every host resource, every algorithm over `Simulated`
//! and `System`, property tests against models, the compile-time property checks at run time,
//! replay and text configs. No GPU needed; the few tests that touch CUDA skip where there is none.

// Tests and benches may unwrap: a failed unwrap is a failed test (clippy::unwrap_used is for
// the library).
#![allow(clippy::unwrap_used)]

#[path = "../support/mod.rs"]
mod support;

mod adaptor_support;
mod aligned;
mod arena;
mod binning;
mod callback;
mod config;
mod conformance;
mod erased;
mod every_adaptor;
mod every_suballocator;
mod failing_upstream;
mod fixed_size;
mod host_allocator;
mod leaves;
mod limiting;
mod logging;
mod pool;
mod registry;
mod replay;
mod retry;
mod retry_reentry;
mod stack;
mod stand_in;
mod statistics;
mod suballoc_model;
mod suballoc_support;
mod thread_cache;
mod thread_heaps;
mod tlsf;
mod tracking;
mod virtual_memory;
// The op files of the side-by-side benchmark with RMM (benches/rmm): its round-trip tests.
#[path = "../../benches/rmm/ops.rs"]
mod rmm_ops;
