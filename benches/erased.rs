//! `AnyResource` against the concrete resource it erases: one allocate + deallocate pair per
//! iteration, so the difference is the cost of erasure (one virtual call per operation).
//!
//! Run: `cargo bench --bench erased`

// Tests and benches may unwrap: a failed unwrap is a failed test (clippy::unwrap_used is for
// the library).
#![allow(clippy::unwrap_used, missing_docs)] // criterion's macros make undocumented pub fns

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use mrstack::prelude::*;
use mrstack::resource::{align_up, check_request};
use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use typenum::{B0, U256};

/// Address ranges from an atomic bump pointer, never reused and never dereferenced: the cheapest
/// resource there is, so that the dispatch cost is what remains to be seen.
struct Bump(AtomicUsize);

// SAFETY: ranges come from a bump pointer that only grows, so live ranges never overlap; each is
// aligned to max(align, 256). No access property is claimed, so nothing dereferences them.
unsafe impl MemoryResource for Bump {
    type Host = B0;
    type Device = B0;
    type Managed = B0;
    type Alignment = U256;

    #[inline]
    fn allocate(&self, size: usize, align: usize, _: StreamRef) -> Result<NonNull<u8>, AllocError> {
        if let Some(empty) = check_request::<Self>(size, align, "Bump")? {
            return Ok(empty);
        }
        let step =
            align_up(size, align.max(256)).ok_or(AllocError::out_of_memory(size, align, "Bump"))?;
        let addr = self.0.fetch_add(step, Ordering::Relaxed);
        NonNull::new(std::ptr::without_provenance_mut(addr))
            .ok_or(AllocError::out_of_memory(size, align, "Bump"))
    }

    #[inline]
    unsafe fn deallocate(&self, _: NonNull<u8>, _: usize, _: usize, _: StreamRef) {}
    fn synchronize(&self, _: StreamRef) -> Result<(), AllocError> {
        Ok(())
    }
    fn order_after(&self, _: StreamRef, _: StreamRef) -> Result<(), AllocError> {
        Ok(())
    }
}

fn pair<R: MemoryResource>(r: &R, size: usize) {
    let p = r.allocate(black_box(size), 8, StreamRef::DEFAULT).unwrap();
    // SAFETY: p came from r with this size and alignment.
    unsafe { r.deallocate(black_box(p), size, 8, StreamRef::DEFAULT) };
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("alloc_free");
    let size = 256;

    let bump = Bump(AtomicUsize::new(1 << 40));
    g.bench_function(BenchmarkId::new("concrete", "Bump"), |b| {
        b.iter(|| pair(&bump, size))
    });
    let any = AnyResource::<()>::new(Bump(AtomicUsize::new(1 << 40)));
    g.bench_function(BenchmarkId::new("AnyResource", "Bump"), |b| {
        b.iter(|| pair(&any, size))
    });
    let r = ResourceRef::<()>::new(&bump);
    g.bench_function(BenchmarkId::new("ResourceRef", "Bump"), |b| {
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
