//! The allocation path of `Pool` and `Binning` alone: one allocate + deallocate pair of 4 KiB on
//! the default stream, over `Simulated`, timed by criterion. No replayer in the loop, so a change
//! in the suballocators' own path shows undiluted.
//!
//! `cargo bench --bench pairs`

// Tests and benches may unwrap: a failed unwrap is a failed test (clippy::unwrap_used is for
// the library).
#![allow(clippy::unwrap_used, missing_docs)] // criterion's macros make undocumented pub fns

use criterion::{criterion_group, criterion_main, Criterion};
use mrstack::prelude::*;
use std::hint::black_box;
use std::time::Duration;

fn pair<R: MemoryResource>(c: &mut Criterion, name: &str, mr: R) {
    c.bench_function(name, |b| {
        b.iter(|| {
            let p = mr
                .allocate(black_box(4096), 256, StreamRef::DEFAULT)
                .expect("room");
            // SAFETY: p came from mr with this size and alignment.
            unsafe { mr.deallocate(p, 4096, 256, StreamRef::DEFAULT) };
        })
    });
}

fn bench(c: &mut Criterion) {
    pair(
        c,
        "pool",
        resource_stack![Simulated::new(1 << 30), Pool { initial: 64 MiB }],
    );
    pair(
        c,
        "binning",
        resource_stack![Simulated::new(1 << 30), Pool { initial: 64 MiB }, Binning],
    );
}

/// Short runs (30 samples of 4 s after criterion's warm-up): a pair takes nanoseconds.
fn config() -> Criterion {
    Criterion::default()
        .sample_size(30)
        .measurement_time(Duration::from_secs(4))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench
}
criterion_main!(benches);
