//! What each behaviour adaptor adds to an allocate + deallocate pair.
//!
//! Two baselines: `Null`, a resource that does no work (one fixed address), so that the time
//! measured is the adaptor's own; and `Simulated`, the host stand-in for device memory (a mutex
//! and a hash map per call). Each adaptor is measured over each baseline in the same run; the
//! cost it adds is "with" minus "without". Targets: Statistics ≤ 5 ns and Limiting ≤ 5 ns per
//! operation, Aligned 0.
//!
//! `cargo bench --bench adaptors` (add `-- --quick` for a shorter run).

// Tests and benches may unwrap: a failed unwrap is a failed test (clippy::unwrap_used is for
// the library).
#![allow(clippy::unwrap_used, missing_docs)] // criterion's macros make undocumented pub fns

// resource_stack! always adds `..Default::default()`, which clippy flags for a configuration whose
// every field is given (`Limiting { limit: 1 TiB }`).

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use mrstack::prelude::*;
use mrstack::resource::AllocError;
use std::hint::black_box;
use std::time::Duration;
use typenum::U4096;

const S: StreamRef = StreamRef::DEFAULT;
const SIZE: usize = 4096;
const ALIGN: usize = 256;

#[path = "support/null.rs"]
mod null;
use null::Null;

fn never(_: &AllocError, _: usize) -> bool {
    false
}

/// One allocate + deallocate pair through `mr`.
fn pair<R: MemoryResource>(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    mr: R,
) {
    group.bench_function(name, |b| {
        b.iter(|| {
            let p = mr.allocate(black_box(SIZE), ALIGN, S).expect("allocates");
            // SAFETY: p came from mr with this size and alignment.
            unsafe { mr.deallocate(black_box(p), SIZE, ALIGN, S) };
        })
    });
}

fn over_null(c: &mut Criterion) {
    let mut g = c.benchmark_group("null");
    pair(&mut g, "baseline", Null);
    pair(&mut g, "Statistics", resource_stack![Null, Statistics]);
    pair(
        &mut g,
        "Limiting",
        resource_stack![Null, Limiting { limit: 1 TiB }],
    );
    pair(
        &mut g,
        "Aligned<U4096>",
        resource_stack![Null, Aligned<U4096>],
    );
    pair(&mut g, "Retry(fn)", Retry::new(Null, never));
    pair(&mut g, "Tracking", resource_stack![Null, Tracking]);
    pair(&mut g, "Logging(sink)", Logging::new(Null, std::io::sink()));
    pair(
        &mut g,
        "Statistics+Limiting+Aligned",
        resource_stack![
            Null,
            Aligned<U4096>,
            Limiting { limit: 1 TiB },
            Statistics
        ],
    );
    g.finish();
}

fn over_simulated(c: &mut Criterion) {
    let mut g = c.benchmark_group("simulated");
    pair(&mut g, "baseline", Simulated::new(1 << 40));
    pair(
        &mut g,
        "Statistics",
        resource_stack![Simulated::new(1 << 40), Statistics],
    );
    pair(
        &mut g,
        "Limiting",
        resource_stack![Simulated::new(1 << 40), Limiting { limit: 1 TiB }],
    );
    pair(
        &mut g,
        "Aligned<U4096>",
        resource_stack![Simulated::new(1 << 40), Aligned<U4096>],
    );
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = over_null, over_simulated
}
criterion_main!(benches);
