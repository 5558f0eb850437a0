//! `AnyResource` against the concrete resource it erases: one allocate + deallocate pair per
//! iteration, so the difference is the cost of erasure (one virtual call per operation).
//!
//! Run: `cargo bench --bench erased`

// Tests and benches may unwrap: a failed unwrap is a failed test (clippy::unwrap_used is for
// the library).
#![allow(clippy::unwrap_used, missing_docs)] // criterion's macros make undocumented pub fns

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use mrstack::erased::{AnyResource, ResourceRef};
use mrstack::prelude::*;
use std::hint::black_box;

#[path = "support/null.rs"]
mod null;
use null::Null;

fn pair<R: MemoryResource>(r: &R, size: usize) {
    let p = r.allocate(black_box(size), 8, StreamRef::DEFAULT).unwrap();
    // SAFETY: p came from r with this size and alignment.
    unsafe { r.deallocate(black_box(p), size, 8, StreamRef::DEFAULT) };
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("alloc_free");
    let size = 256;

    let null = Null;
    g.bench_function(BenchmarkId::new("concrete", "Null"), |b| {
        b.iter(|| pair(&null, size))
    });
    let any = AnyResource::<()>::new(Null);
    g.bench_function(BenchmarkId::new("AnyResource", "Null"), |b| {
        b.iter(|| pair(&any, size))
    });
    let r = ResourceRef::<()>::new(&null);
    g.bench_function(BenchmarkId::new("ResourceRef", "Null"), |b| {
        b.iter(|| pair(&r, size))
    });

    let system = System::new();
    g.bench_function(BenchmarkId::new("concrete", "System"), |b| {
        b.iter(|| pair(&system, size))
    });
    let any = AnyResource::<HostAccessible>::new(System::new());
    g.bench_function(BenchmarkId::new("AnyResource", "System"), |b| {
        b.iter(|| pair(&any, size))
    });

    let sim = Simulated::new(1 << 40);
    g.bench_function(BenchmarkId::new("concrete", "Simulated"), |b| {
        b.iter(|| pair(&sim, size))
    });
    let any = AnyResource::<()>::new(Simulated::new(1 << 40));
    g.bench_function(BenchmarkId::new("AnyResource", "Simulated"), |b| {
        b.iter(|| pair(&any, size))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
