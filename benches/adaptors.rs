//! What each behaviour adaptor adds to an allocate + deallocate pair.
//!
//! Two baselines: `Null`, a resource that does no work (one fixed address), so that the time
//! measured is the adaptor's own; and `Simulated`, the host stand-in for device memory (a mutex
//! and a hash map per call). Each adaptor is measured over each baseline in the same run; the
//! cost it adds is "with" minus "without". Each over `Null` is measured on one thread and on
//! eight at once (`null-8-threads`: eight threads each doing their share of the pairs, timed
//! together; the figure is wall time per pair, so a perfectly scaling adaptor shows 1/8 of its
//! one-thread figure). Targets, per operation (half a pair): Statistics ≤ 5 ns,
//! Limiting ≤ 10, Tracking ≤ 30, Logging ≤ 100, Aligned 0, at 1 and 8 threads.
//!
//! `cargo bench --bench adaptors` (add `-- --quick` for a shorter run).

// Tests and benches may unwrap: a failed unwrap is a failed test (clippy::unwrap_used is for
// the library).
#![allow(clippy::unwrap_used, missing_docs)] // criterion's macros make undocumented pub fns

// resource_stack! always adds `..Default::default()`, which clippy flags for a configuration whose
// every field is given (`Limiting { limit: 1 TiB }`).

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use mrstack::adaptor::{Logging, Retry};
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

/// Allocate + deallocate pairs through `mr` on `THREADS` threads at once: the time is wall time
/// for all of them, divided by the pairs made in all.
fn pair_threads<R: MemoryResource + Sync>(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    mr: R,
) {
    const THREADS: u64 = 8;
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let each = iters.div_ceil(THREADS);
            let start = std::sync::Barrier::new(THREADS as usize + 1);
            std::thread::scope(|s| {
                for _ in 0..THREADS {
                    let (mr, start) = (&mr, &start);
                    s.spawn(move || {
                        start.wait();
                        for _ in 0..each {
                            let p = mr.allocate(black_box(SIZE), ALIGN, S).expect("allocates");
                            // SAFETY: p came from mr with this size and alignment.
                            unsafe { mr.deallocate(black_box(p), SIZE, ALIGN, S) };
                        }
                    });
                }
                start.wait();
                let t = std::time::Instant::now();
                // The scope joins every thread before returning.
                t
            })
            .elapsed()
                * (iters as u32).max(1)
                / (each * THREADS).max(1) as u32
        })
    });
}

/// `Null` with an address of each thread's own: what `Tracking` needs when threads overlap (it
/// keys live blocks by address). Addresses are never dereferenced (no access is claimed).
struct Distinct;

// SAFETY: claims no access property, so the addresses are never dereferenced; each is 256-aligned
// and, while live, another thread's never equals it (threads own disjoint 4 GiB windows; a
// thread has one block live at a time in these benches).
unsafe impl MemoryResource for Distinct {
    type Host = typenum::B0;
    type Device = typenum::B0;
    type Migratable = typenum::B0;
    type Pageable = typenum::B0;
    type Alignment = typenum::U256;

    #[inline]
    fn allocate(
        &self,
        size: usize,
        align: usize,
        _: StreamRef,
    ) -> Result<std::ptr::NonNull<u8>, AllocError> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(1);
        thread_local! {
            static BASE: usize = NEXT.fetch_add(1, Ordering::Relaxed) << 32;
        }
        if let Some(p) = mrstack::resource::check_request::<Self>(size, align, "Distinct")? {
            return Ok(p);
        }
        let addr = BASE.with(|b| *b);
        Ok(std::ptr::NonNull::new(std::ptr::without_provenance_mut(addr)).expect("not null"))
    }

    #[inline]
    unsafe fn deallocate(&self, _: std::ptr::NonNull<u8>, _: usize, _: usize, _: StreamRef) {}
    fn synchronize(&self, _: StreamRef) -> Result<(), AllocError> {
        Ok(())
    }
    fn order_after(&self, _: StreamRef, _: StreamRef) -> Result<(), AllocError> {
        Ok(())
    }
}

fn over_null_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("null-8-threads");
    pair_threads(&mut g, "baseline", Distinct);
    pair_threads(&mut g, "Statistics", resource_stack![Distinct, Statistics]);
    pair_threads(
        &mut g,
        "Limiting",
        resource_stack![Distinct, Limiting { limit: 1 TiB }],
    );
    pair_threads(&mut g, "Tracking", resource_stack![Distinct, Tracking]);
    pair_threads(
        &mut g,
        "Logging(sink)",
        Logging::new(Distinct, std::io::sink()),
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
    targets = over_null, over_null_threads, over_simulated
}
criterion_main!(benches);
