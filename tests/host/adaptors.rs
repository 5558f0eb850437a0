//! Host-only tests of the behaviour adaptors: Statistics, Tracking, Logging, Limiting, Aligned,
//! Retry (Prefetch needs a GPU: tests/gpu_adaptors.rs), each through `resource_stack!`.

use mrstack::adaptor::{BadFreeKind, Counter, RetryCallback, Stats};
use mrstack::prelude::*;
use mrstack::replay::rmm_log::HEADER as LOG_HEADER;
use mrstack::resource::{check_request, dangling};
use mrstack::stream::StreamId;
use mrstack::{
    adaptor::{Aligned, Limiting, Logging, Prefetch, Retry, Statistics, Tracking},
    erased::{AnyResource, ResourceRef},
    resource::AllocErrorKind,
    suballoc::{Arena, Binning, FixedSize, Pool},
};
use proptest::prelude::*;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use typenum::{B0, B1, U1024, U16, U256, U4096, U64};

const S: StreamRef = StreamRef::DEFAULT;

fn stream(n: usize) -> StreamRef<'static> {
    StreamRef::simulated(n as u32)
}

fn counter(current: i128, peak: i128, total: i128) -> Counter {
    Counter {
        current,
        peak,
        total,
    }
}

/// Host memory that, like the CUDA leaves, guarantees 256 bytes and refuses any larger alignment
/// with `Unsupported`; counts its live blocks so a test can check that everything came back.
#[derive(Default)]
struct Refusing {
    live: Mutex<HashMap<usize, usize>>,
}

// SAFETY: memory from System at alignment 256, freed with the same size; larger alignments refused.
unsafe impl MemoryResource for Refusing {
    type Host = B1;
    type Device = B0;
    type Managed = B0;
    type Pageable = B0;
    type Alignment = U256;

    fn allocate(&self, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>, AllocError> {
        if let Some(p) = check_request::<Self>(size, align, "Refusing")? {
            return Ok(p);
        }
        if align > 256 {
            return Err(AllocError::new(
                AllocErrorKind::Unsupported("alignment above 256"),
                size,
                align,
                "Refusing",
            ));
        }
        let p = System.allocate(size, 256, s)?;
        self.live.lock().unwrap().insert(p.as_ptr() as usize, size);
        Ok(p)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, _: usize, s: StreamRef) {
        if size == 0 {
            return;
        }
        let was = self.live.lock().unwrap().remove(&(ptr.as_ptr() as usize));
        assert_eq!(was, Some(size), "Refusing: bad deallocate");
        // SAFETY: allocated above from System with this size and alignment 256.
        unsafe { System.deallocate(ptr, size, 256, s) };
    }

    fn synchronize(&self, _: StreamRef) -> Result<(), AllocError> {
        Ok(())
    }
    fn order_after(&self, _: StreamRef, _: StreamRef) -> Result<(), AllocError> {
        Ok(())
    }
}

/// Fills `len` bytes at `p` with `tag`.
fn fill(p: NonNull<u8>, len: usize, tag: u8) {
    // SAFETY: callers pass a live host allocation of at least `len` bytes.
    unsafe { p.as_ptr().write_bytes(tag, len) };
}

/// True when the `len` bytes at `p` all hold `tag`.
fn holds(p: NonNull<u8>, len: usize, tag: u8) -> bool {
    // SAFETY: callers pass a live host allocation of at least `len` bytes, filled by `fill`.
    unsafe { std::slice::from_raw_parts(p.as_ptr(), len) }
        .iter()
        .all(|&b| b == tag)
}

// ---------------------------------------------------------------- Statistics

#[test]
fn statistics_after_a_known_sequence() {
    let sim = Simulated::new(1 << 20);
    let mr = resource_stack![&sim, Statistics];
    let a = mr.allocate(100, 8, S).unwrap();
    let b = mr.allocate(200, 8, S).unwrap();
    // SAFETY: a came from mr with this size and alignment.
    unsafe { mr.deallocate(a, 100, 8, S) };
    let c = mr.allocate(50, 8, S).unwrap();
    assert_eq!(mr.bytes(), counter(250, 300, 350));
    assert_eq!(mr.allocations(), counter(2, 2, 3));

    mr.reset_peak();
    assert_eq!(mr.bytes(), counter(250, 250, 350));
    assert_eq!(mr.allocations(), counter(2, 2, 3));
    let d = mr.allocate(10, 8, S).unwrap();
    assert_eq!(mr.bytes(), counter(260, 260, 360));

    // Zero-size requests and failures take no memory and are not counted.
    let z = mr.allocate(0, 8, S).unwrap();
    assert!(mr.allocate(1 << 21, 8, S).is_err());
    assert!(mr.allocate(8, 3, S).is_err());
    assert_eq!(mr.allocations(), counter(3, 3, 4));
    // SAFETY: each came from mr with this size and alignment.
    unsafe {
        mr.deallocate(z, 0, 8, S);
        mr.deallocate(b, 200, 8, S);
        mr.deallocate(c, 50, 8, S);
        mr.deallocate(d, 10, 8, S);
    }
    assert_eq!(
        mr.stats(),
        Stats {
            bytes: counter(0, 260, 360),
            allocations: counter(0, 3, 4)
        }
    );
    assert_eq!(sim.in_use(), 0);
    assert_eq!(mr.name(), "Statistics");
}

#[test]
fn statistics_scopes_nest_as_rmm() {
    let mr = resource_stack![Simulated::new(1 << 20), Statistics];
    let before = mr.allocate(1000, 8, S).unwrap();
    assert_eq!(mr.scope_stats(), None);
    assert_eq!(mr.pop_scope(), None);

    mr.push_scope();
    let a = mr.allocate(100, 8, S).unwrap();
    // SAFETY: before came from mr with this size and alignment.
    unsafe { mr.deallocate(before, 1000, 8, S) }; // freed inside, allocated outside: goes negative
    assert_eq!(mr.scope_stats().unwrap().bytes, counter(-900, 100, 100));

    mr.push_scope();
    assert_eq!(mr.scope_depth(), 2);
    let b = mr.allocate(300, 8, S).unwrap();
    let c = mr.allocate(200, 8, S).unwrap();
    // SAFETY: c came from mr with this size and alignment.
    unsafe { mr.deallocate(c, 200, 8, S) };
    let inner = mr.pop_scope().unwrap();
    assert_eq!(inner.bytes, counter(300, 500, 500));
    assert_eq!(inner.allocations, counter(1, 2, 2));

    // The outer scope absorbed the inner one: peak = max(100, -900 + 500).
    let outer = mr.pop_scope().unwrap();
    assert_eq!(outer.bytes, counter(-600, 100, 600));
    assert_eq!(outer.allocations, counter(1, 2, 3));
    // A scope that freed more than it allocated shows its bytes below zero.
    assert_eq!(
        outer.to_string(),
        "bytes -600 B (peak 100 B, total 600 B), allocations 1 (peak 2, total 3)"
    );
    assert_eq!(mr.scope_depth(), 0);

    // The lifetime counters saw everything.
    assert_eq!(mr.bytes(), counter(400, 1100, 1600));
    assert_eq!(
        mr.stats().to_string(),
        "bytes 400 B (peak 1.07 KiB, total 1.56 KiB), allocations 2 (peak 3, total 4)"
    );
    let negative_kib = Stats {
        bytes: counter(-3 << 29, 0, 0),
        ..Stats::default()
    };
    assert!(
        negative_kib
            .to_string()
            .starts_with("bytes -1.50 GiB (peak 0 B"),
        "{negative_kib}"
    );
    // SAFETY: each came from mr with this size and alignment.
    unsafe {
        mr.deallocate(a, 100, 8, S);
        mr.deallocate(b, 300, 8, S);
    }
    assert_eq!(mr.bytes().current, 0);
}

#[test]
fn statistics_are_exact_across_threads() {
    let mr = resource_stack![System::new(), Statistics];
    let threads = 4;
    let rounds = 500;
    std::thread::scope(|s| {
        for t in 0..threads {
            let mr = &mr;
            s.spawn(move || {
                for i in 0..rounds {
                    let size = 1 + (i * 7 + t) % 300;
                    let p = mr.allocate(size, 16, S).unwrap();
                    fill(p, size, t as u8);
                    assert!(holds(p, size, t as u8));
                    // SAFETY: p came from mr with this size and alignment.
                    unsafe { mr.deallocate(p, size, 16, S) };
                }
            });
        }
    });
    let total: i128 = (0..threads)
        .flat_map(|t| (0..rounds).map(move |i| (1 + (i * 7 + t) % 300) as i128))
        .sum();
    let s = mr.stats();
    assert_eq!((s.bytes.current, s.bytes.total), (0, total));
    assert_eq!(
        (s.allocations.current, s.allocations.total),
        (0, (threads * rounds) as i128)
    );
    // Each thread holds at most one block at a time; with several threads the peak may read high
    // by what the other threads hold reserved: two chunks (32 allocations, 2 MiB) each.
    assert!(s.allocations.peak >= 1);
    assert!(s.allocations.peak <= threads as i128 + 32 * (threads as i128 - 1));
    assert!(s.bytes.peak <= threads as i128 * 300 + (2 << 20) * (threads as i128 - 1));
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(usize),
    Free(usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            (0usize..5000).prop_map(Op::Alloc),
            (0usize..64).prop_map(Op::Free)
        ],
        0..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Statistics agree with a model that sums sizes, whatever the sequence.
    #[test]
    fn statistics_match_a_model(ops in ops()) {
        let sim = Simulated::new(1 << 24);
        let mr = resource_stack![&sim, Statistics];
        let mut live: Vec<(NonNull<u8>, usize)> = Vec::new();
        let (mut cur, mut peak, mut total, mut n, mut npeak, mut ntotal) = (0i128, 0i128, 0i128, 0i128, 0i128, 0i128);
        for op in ops {
            match op {
                Op::Alloc(size) => {
                    let p = mr.allocate(size, 64, S).unwrap();
                    if size > 0 {
                        live.push((p, size));
                        cur += size as i128; total += size as i128; peak = peak.max(cur);
                        n += 1; ntotal += 1; npeak = npeak.max(n);
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let (p, size) = live.swap_remove(i % live.len());
                    // SAFETY: p came from mr with this size and alignment.
                    unsafe { mr.deallocate(p, size, 64, S) };
                    cur -= size as i128; n -= 1;
                }
                Op::Free(_) => {}
            }
            prop_assert_eq!(mr.bytes(), counter(cur, peak, total));
            prop_assert_eq!(mr.allocations(), counter(n, npeak, ntotal));
            prop_assert_eq!(sim.in_use() as i128, cur);
        }
        for (p, size) in live {
            // SAFETY: p came from mr with this size and alignment.
            unsafe { mr.deallocate(p, size, 64, S) };
        }
        prop_assert_eq!(sim.in_use(), 0);
    }
}

// ---------------------------------------------------------------- Limiting

#[test]
fn limiting_refuses_over_the_cap() {
    let sim = Simulated::new(1 << 30);
    let mr = resource_stack![&sim, Limiting { limit: 1 MiB }];
    assert_eq!(mr.limit(), 1 << 20);
    let a = mr.allocate(600 << 10, 256, S).unwrap();
    let err = mr.allocate(500 << 10, 256, S).unwrap_err();
    assert_eq!(
        err,
        AllocError::new(
            AllocErrorKind::LimitExceeded {
                limit: 1 << 20,
                in_use: 600 << 10
            },
            500 << 10,
            256,
            "Limiting"
        )
    );
    assert!(err.is_out_of_memory());
    assert_eq!(
        err.to_string(),
        "Limiting: limit of 1048576 bytes exceeded (614400 bytes already allocated) (requested 512000 bytes, alignment 256)"
    );
    // The refused request never reached the upstream.
    assert_eq!(sim.allocation_count(), 1);
    // Exactly up to the cap is allowed.
    let b = mr.allocate(424 << 10, 256, S).unwrap();
    assert_eq!((mr.in_use(), mr.available()), (1 << 20, 0));
    assert!(mr.allocate(1, 1, S).is_err());
    // SAFETY: a came from mr with this size and alignment.
    unsafe { mr.deallocate(a, 600 << 10, 256, S) };
    let c = mr.allocate(500 << 10, 256, S).unwrap();
    // SAFETY: each came from mr with this size and alignment.
    unsafe {
        mr.deallocate(b, 424 << 10, 256, S);
        mr.deallocate(c, 500 << 10, 256, S);
    }
    assert_eq!((mr.in_use(), sim.in_use()), (0, 0));
    // A huge size is refused by the cap, before the upstream sees it.
    let big = mr.allocate(usize::MAX / 4, 1, S).unwrap_err();
    assert!(matches!(big.kind, AllocErrorKind::LimitExceeded { .. }));
}

#[test]
fn limiting_gives_back_the_reservation_when_the_upstream_fails() {
    let mr = resource_stack![Simulated::new(1000), Limiting { limit: 5000 B }];
    let err = mr.allocate(2000, 1, S).unwrap_err();
    assert_eq!(err.kind, AllocErrorKind::OutOfMemory);
    assert_eq!(mr.in_use(), 0);
    let p = mr.allocate(1000, 1, S).unwrap();
    assert_eq!(mr.in_use(), 1000);
    // SAFETY: p came from mr with this size and alignment.
    unsafe { mr.deallocate(p, 1000, 1, S) };
}

#[test]
fn limiting_holds_under_concurrency() {
    let sim = Simulated::new(1 << 30);
    let mr = Limiting::new(&sim, 10_000);
    std::thread::scope(|s| {
        for t in 0..4 {
            let (mr, sim) = (&mr, &sim);
            s.spawn(move || {
                for i in 0..400 {
                    let size = 500 + (i * 13 + t * 7) % 2500;
                    if let Ok(p) = mr.allocate(size, 256, S) {
                        // What the upstream holds, read under its lock: exact at every moment
                        // (`in_use()` sums the threads' shards, exact only between calls).
                        assert!(sim.in_use() <= 10_000);
                        // SAFETY: p came from mr with this size and alignment.
                        unsafe { mr.deallocate(p, size, 256, S) };
                    }
                }
            });
        }
    });
    assert!(sim.peak() <= 10_000, "peak {} over the cap", sim.peak());
    assert_eq!((mr.in_use(), sim.in_use()), (0, 0));
}

/// Blocks one thread allocates and another frees: each thread's shard counts up or down without
/// end, and wraps. Hands `rounds` blocks of `size` from this thread to another, one at a time.
fn hand_over<R: MemoryResource + Sync>(mr: &R, size: usize, rounds: usize) {
    let (to_other, blocks) = std::sync::mpsc::channel::<usize>();
    let (freed, wait) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            for addr in blocks {
                let p = NonNull::new(addr as *mut u8).unwrap();
                // SAFETY: p came from mr with this size and alignment, and is freed once.
                unsafe { mr.deallocate(p, size, 256, S) };
                freed.send(()).unwrap();
            }
        });
        for _ in 0..rounds {
            let p = mr.allocate(size, 256, S).unwrap();
            to_other.send(p.as_ptr() as usize).unwrap();
            wait.recv().unwrap();
        }
        drop(to_other);
    });
}

/// The cap holds whatever the threads' own counts did: one thread's count passing 2^63, and
/// counts that wrapped through traffic between threads: neither lets the cap be passed.
#[test]
fn limiting_holds_its_cap_when_thread_counts_wrap() {
    let sim = Simulated::new(usize::MAX);
    let mr = Limiting::new(&sim, 3 << 61);
    let a = mr.allocate(1 << 62, 256, S).unwrap();
    let b = mr
        .allocate((1 << 62) + (1 << 61) - 256, 256, S)
        .unwrap_err();
    assert!(
        matches!(b.kind, AllocErrorKind::LimitExceeded { .. }),
        "{b}"
    );
    // SAFETY: a came from mr with this size and alignment.
    unsafe { mr.deallocate(a, 1 << 62, 256, S) };

    // Room beyond the blocks for the chunks of slack the two threads' shards hold (1 MiB each);
    // a new simulated device, whose address space the blocks above did not cut up.
    let sim = Simulated::new(usize::MAX);
    let mr = Limiting::new(&sim, (1 << 62) + (16 << 20));
    hand_over(&mr, 1 << 62, 2);
    assert_eq!((mr.in_use(), sim.in_use()), (0, 0));
    let blocks: Vec<_> = (0..3).map(|_| mr.allocate(1 << 61, 256, S)).collect();
    assert!(blocks[0].is_ok() && blocks[1].is_ok(), "{blocks:?}");
    assert!(
        blocks[2].is_err(),
        "a third 2^61 block passed a cap of 2^62 + 16 MiB"
    );
    for p in blocks.into_iter().flatten() {
        // SAFETY: p came from mr with this size and alignment.
        unsafe { mr.deallocate(p, 1 << 61, 256, S) };
    }
    assert_eq!(sim.in_use(), 0);
}

/// Statistics counts sizes up to `isize::MAX` and any traffic between threads without a panic:
/// an overflow after the upstream gave the block would panic, and a thread's exit then abort the
/// process.
#[test]
fn statistics_count_huge_sizes_and_wrapping_thread_counts() {
    let sim = Simulated::new(usize::MAX);
    let mr = Statistics::new(&sim);
    let small = mr.allocate(100, 256, S).unwrap();
    let huge = (1usize << 63) - 256;
    let p = mr.allocate(huge, 256, S).unwrap();
    assert_eq!(mr.bytes().current, 100 + huge as i128);
    // SAFETY: both came from mr with these sizes and alignments.
    unsafe {
        mr.deallocate(p, huge, 256, S);
        mr.deallocate(small, 100, 256, S);
    }
    hand_over(&mr, 1 << 61, 8);
    assert_eq!((mr.bytes().current, sim.in_use()), (0, 0));
    assert_eq!(mr.allocations().total, 10);
}

/// An upstream that panics once, on its first allocation, handing out nothing.
struct PanicsOnce(System, std::sync::atomic::AtomicBool);

// SAFETY: every call goes to System, or panics before reaching it.
unsafe impl MemoryResource for PanicsOnce {
    type Host = B1;
    type Device = B0;
    type Managed = B0;
    type Pageable = B0;
    type Alignment = <System as MemoryResource>::Alignment;
    fn allocate(
        &self,
        size: usize,
        align: usize,
        s: StreamRef,
    ) -> mrstack::resource::Result<NonNull<u8>> {
        assert!(
            self.1.swap(true, Ordering::Relaxed),
            "the upstream panics once"
        );
        self.0.allocate(size, align, s)
    }
    unsafe fn deallocate(&self, p: NonNull<u8>, size: usize, align: usize, s: StreamRef) {
        // SAFETY: forwarded from the caller.
        unsafe { self.0.deallocate(p, size, align, s) }
    }
    fn synchronize(&self, s: StreamRef) -> mrstack::resource::Result<()> {
        self.0.synchronize(s)
    }
    fn order_after(&self, s: StreamRef, after: StreamRef) -> mrstack::resource::Result<()> {
        self.0.order_after(s, after)
    }
}

/// A panicking upstream leaves the cap as it was: the bytes it was asked for do not stay
/// reserved for good.
#[test]
fn limiting_gives_back_the_reservation_when_the_upstream_panics() {
    let mr = Limiting::new(PanicsOnce(System::new(), Default::default()), 1 << 20);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        mr.allocate(768 << 10, 8, S)
    }));
    assert!(panicked.is_err());
    assert_eq!(mr.in_use(), 0);
    let p = mr.allocate(768 << 10, 8, S).unwrap();
    // SAFETY: p came from mr with this size and alignment.
    unsafe { mr.deallocate(p, 768 << 10, 8, S) };
    assert_eq!(mr.in_use(), 0);
}

// ---------------------------------------------------------------- Tracking

#[test]
fn tracking_lists_outstanding_and_reports_leaks() {
    let sim = Simulated::new(1 << 30);
    let mr = resource_stack![&sim, Tracking];
    assert!(!mr.captures_backtraces());
    assert_eq!(mr.leak_report(), "");
    let a = mr.allocate(4096, 256, stream(7)).unwrap();
    let b = mr.allocate(12345, 512, S).unwrap();
    let z = mr.allocate(0, 1, S).unwrap();
    assert_eq!(
        (mr.outstanding_count(), mr.outstanding_bytes()),
        (2, 4096 + 12345)
    );
    let list = mr.outstanding();
    assert_eq!(list.len(), 2);
    let (la, lb) = (&list[0], &list[1]);
    assert_eq!(
        (la.address, la.size, la.align, la.stream),
        (a.as_ptr() as usize, 4096, 256, stream(7).id())
    );
    assert_eq!(
        (lb.address, lb.size, lb.align, lb.stream),
        (b.as_ptr() as usize, 12345, 512, S.id())
    );
    assert!(la.backtrace.is_none());

    // SAFETY: a came from mr with this size, alignment and stream.
    unsafe { mr.deallocate(a, 4096, 256, stream(7)) };
    // SAFETY: a zero-size block is a no-op.
    unsafe { mr.deallocate(z, 0, 1, S) };
    let report = mr.leak_report();
    assert_eq!(
        report,
        format!(
            "Tracking: 1 allocation(s) still live, 12345 bytes:\n  {:#x}: 12345 bytes, align 512, stream 0x0\n",
            b.as_ptr() as usize
        )
    );
    // SAFETY: b came from mr with this size and alignment.
    unsafe { mr.deallocate(b, 12345, 512, S) };
    assert_eq!(mr.leak_report(), "");
    assert_eq!(mr.bad_free_count(), 0);
    assert_eq!(sim.in_use(), 0);
}

#[test]
fn tracking_refuses_double_and_foreign_frees() {
    // Simulated panics on a double free: reaching it would fail the test.
    let sim = Simulated::new(1 << 30);
    let mr = resource_stack![&sim, Tracking];
    let a = mr.allocate(64, 8, S).unwrap();
    // SAFETY: a came from mr with this size and alignment.
    unsafe { mr.deallocate(a, 64, 8, S) };
    // SAFETY: deliberately broken (a double free): Tracking must refuse it before the upstream.
    unsafe { mr.deallocate(a, 64, 8, S) };
    let foreign = dangling(4096);
    // SAFETY: deliberately broken (never allocated here): Tracking must refuse it.
    unsafe { mr.deallocate(foreign, 32, 8, stream(3)) };
    let b = mr.allocate(100, 8, S).unwrap();
    // SAFETY: deliberately broken (wrong size): Tracking must refuse it and keep b live.
    unsafe { mr.deallocate(b, 99, 8, S) };
    assert_eq!(mr.outstanding_count(), 1);
    assert_eq!(mr.bad_free_count(), 3);
    let bad = mr.bad_frees();
    assert_eq!(bad[0].kind, BadFreeKind::NotLive);
    assert_eq!((bad[0].address, bad[0].size), (a.as_ptr() as usize, 64));
    assert_eq!(bad[1].kind, BadFreeKind::NotLive);
    assert_eq!((bad[1].address, bad[1].stream), (4096, stream(3).id()));
    assert_eq!(
        bad[2].kind,
        BadFreeKind::Mismatch {
            size: 100,
            align: 8
        }
    );
    assert!(bad[0].to_string().contains("not a live allocation"));
    // SAFETY: b came from mr with this size and alignment.
    unsafe { mr.deallocate(b, 100, 8, S) };
    assert_eq!((mr.outstanding_count(), sim.in_use()), (0, 0));
}

#[test]
fn tracking_captures_backtraces_when_asked() {
    let mr = resource_stack![Simulated::new(1 << 20), Tracking { backtraces: true }];
    assert!(mr.captures_backtraces());
    let p = mr.allocate(777, 8, S).unwrap();
    let list = mr.outstanding();
    assert!(list[0].backtrace.is_some());
    let report = mr.leak_report();
    assert!(report.contains("777 bytes"), "{report}");
    assert!(report.contains("allocated at:"), "{report}");
    // SAFETY: p came from mr with this size and alignment.
    unsafe { mr.deallocate(p, 777, 8, S) };
}

#[test]
fn tracking_drop_with_leaks_does_not_free_them() {
    let sim = Simulated::new(1 << 20);
    {
        let mr = resource_stack![&sim, Tracking];
        mr.allocate(321, 8, S).unwrap();
        // Dropped here with one live allocation: reported on stderr, left to its owner.
    }
    assert_eq!(sim.in_use(), 321);
}

// ---------------------------------------------------------------- Logging

/// One parsed line of the CSV log.
#[derive(Debug, PartialEq)]
struct Event {
    thread: u64,
    time: u64,
    action: String,
    pointer: usize,
    size: usize,
    stream: usize,
}

/// Parses a log as RMM's replay benchmark does: a header, then the named columns.
fn parse_log(text: &str) -> Vec<Event> {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(LOG_HEADER));
    lines
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            assert_eq!(f.len(), 6, "{line}");
            Event {
                thread: f[0].parse().unwrap(),
                time: f[1].parse().unwrap(),
                action: f[2].to_string(),
                pointer: usize::from_str_radix(f[3].strip_prefix("0x").unwrap(), 16).unwrap(),
                size: f[4].parse().unwrap(),
                stream: f[5].parse().unwrap(),
            }
        })
        .collect()
}

#[test]
fn logging_writes_rmm_csv() {
    assert_eq!(LOG_HEADER, "Thread,Time,Action,Pointer,Size,Stream");
    let mr = Logging::new(Simulated::new(10_000), Vec::new());
    let a = mr.allocate(1000, 256, S).unwrap();
    let b = mr.allocate(3000, 256, stream(0x5000)).unwrap();
    assert!(mr.allocate(9000, 256, S).is_err());
    let z = mr.allocate(0, 256, S).unwrap();
    // SAFETY: each came from mr with this size, alignment and stream.
    unsafe {
        mr.deallocate(z, 0, 256, S);
        mr.deallocate(a, 1000, 256, S);
        mr.deallocate(b, 3000, 256, stream(0x5000));
    }
    mr.flush().unwrap();
    let (sim, log) = mr.into_parts().unwrap();
    assert_eq!(sim.in_use(), 0);
    let text = String::from_utf8(log).unwrap();
    let events = parse_log(&text);
    let (a, b) = (a.as_ptr() as usize, b.as_ptr() as usize);
    let got: Vec<(&str, usize, usize, usize)> = events
        .iter()
        .map(|e| (e.action.as_str(), e.pointer, e.size, e.stream))
        .collect();
    assert_eq!(
        got,
        [
            ("allocate", a, 1000, 0),
            ("allocate", b, 3000, stream(0x5000).id().get() as usize),
            ("allocate failure", 0, 9000, 0),
            ("free", a, 1000, 0),
            ("free", b, 3000, stream(0x5000).id().get() as usize),
        ]
    );
    assert!(events.iter().all(|e| e.thread == events[0].thread));
    assert!(events.windows(2).all(|w| w[0].time <= w[1].time));
    // Microseconds since the epoch: after 2020, before 2100.
    assert!((1_577_836_800_000_000..4_102_444_800_000_000).contains(&events[0].time));
    // The text itself, column by column, for the failure line.
    let failure = text.lines().nth(3).unwrap();
    assert!(
        failure.ends_with(",allocate failure,0x0,9000,0"),
        "{failure}"
    );
    assert!(text
        .lines()
        .nth(1)
        .unwrap()
        .ends_with(&format!(",allocate,{a:#x},1000,0")));
}

#[test]
fn logging_threads_get_their_own_numbers() {
    let mr = Logging::new(System::new(), Vec::new());
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                let p = mr.allocate(64, 16, S).unwrap();
                // SAFETY: p came from mr with this size and alignment.
                unsafe { mr.deallocate(p, 64, 16, S) };
            });
        }
    });
    let (_, log) = mr.into_parts().unwrap();
    let events = parse_log(&String::from_utf8(log).unwrap());
    assert_eq!(events.len(), 6);
    let mut threads: Vec<u64> = events.iter().map(|e| e.thread).collect();
    threads.sort_unstable();
    threads.dedup();
    assert_eq!(threads.len(), 3);
    // Each thread's free follows its allocate of the same pointer.
    for t in threads {
        let mine: Vec<&Event> = events.iter().filter(|e| e.thread == t).collect();
        assert_eq!(
            (mine[0].action.as_str(), mine[1].action.as_str()),
            ("allocate", "free")
        );
        assert_eq!(mine[0].pointer, mine[1].pointer);
    }
}

#[test]
fn logging_keeps_every_line_and_each_threads_order() {
    // Formatted on the writer thread: nothing lost, each thread's lines in its order, and an
    // address freed on one thread logged free before another thread's allocate of it.
    let mr = Logging::new(System::new(), Vec::new());
    let (threads, pairs) = (8, 2000);
    std::thread::scope(|s| {
        for t in 0..threads {
            let mr = &mr;
            s.spawn(move || {
                for i in 0..pairs {
                    let size = 16 + (i * 31 + t * 7) % 200;
                    let p = mr.allocate(size, 16, S).unwrap();
                    // SAFETY: p came from mr with this size and alignment.
                    unsafe { mr.deallocate(p, size, 16, S) };
                }
            });
        }
    });
    mr.flush().unwrap();
    let (_, log) = mr.into_parts().unwrap();
    let events = parse_log(&String::from_utf8(log).unwrap());
    assert_eq!(events.len(), threads * pairs * 2);
    let mut by_thread: HashMap<u64, Vec<&Event>> = HashMap::new();
    for e in &events {
        by_thread.entry(e.thread).or_default().push(e);
    }
    assert_eq!(by_thread.len(), threads);
    for mine in by_thread.values() {
        for pair in mine.chunks(2) {
            assert_eq!(
                (pair[0].action.as_str(), pair[1].action.as_str()),
                ("allocate", "free")
            );
            assert_eq!(
                (pair[0].pointer, pair[0].size),
                (pair[1].pointer, pair[1].size)
            );
        }
        assert!(mine.windows(2).all(|w| w[0].time <= w[1].time));
    }
    // Down the file, each address is allocated and freed in turn.
    let mut live: HashMap<usize, bool> = HashMap::new();
    for e in &events {
        let was = live.insert(e.pointer, e.action == "allocate");
        match e.action.as_str() {
            "allocate" => assert_ne!(was, Some(true), "{:#x} allocated twice", e.pointer),
            _ => assert_eq!(was, Some(true), "{:#x} freed while not live", e.pointer),
        }
    }
}

#[test]
fn logging_times_are_the_wall_clock_in_microseconds() {
    // Stamps are clock ticks (the time-stamp counter where the kernel keeps time with it): the
    // writer turns them into microseconds since the Unix epoch.
    let micros = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
    };
    let before = micros();
    let mr = Logging::new(System::new(), Vec::new());
    let mut times = Vec::new();
    for _ in 0..3 {
        times.push(micros());
        let p = mr.allocate(256, 16, S).unwrap();
        // SAFETY: p came from mr with this size and alignment.
        unsafe { mr.deallocate(p, 256, 16, S) };
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let after = micros();
    let (_, log) = mr.into_parts().unwrap();
    let events = parse_log(&String::from_utf8(log).unwrap());
    assert_eq!(events.len(), 6);
    for (k, e) in events.iter().enumerate() {
        assert!(
            (before.saturating_sub(1000)..=after + 1000).contains(&e.time),
            "line {k} at {} µs, outside [{before}, {after}]",
            e.time
        );
    }
    // 20 ms between the pairs, as the wall clock saw them (to a millisecond).
    for (w, pair) in events
        .chunks(2)
        .collect::<Vec<_>>()
        .windows(2)
        .zip(times.windows(2))
    {
        let (logged, seen) = (w[1][0].time - w[0][0].time, pair[1] - pair[0]);
        assert!(
            logged.abs_diff(seen) < 2000,
            "{logged} µs logged, {seen} µs seen"
        );
    }
}

/// A writer that panics on its first write.
struct Panics;

impl std::io::Write for Panics {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        panic!("a writer that panics (expected by the test)")
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn logging_survives_a_writer_that_panics() {
    // The writer thread dies at its first write: allocations go on, nothing waits for it forever,
    // and flush says what happened.
    let mr = Logging::new(System::new(), Panics);
    for i in 0..20_000 {
        let p = mr.allocate(64 + i % 100, 16, S).unwrap();
        // SAFETY: p came from mr with this size and alignment.
        unsafe { mr.deallocate(p, 64 + i % 100, 16, S) };
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut flushed = mr.flush();
    while flushed.is_ok() && std::time::Instant::now() < deadline {
        // The 64 KiB buffer may not have filled before the first flush: flushing writes it.
        flushed = mr.flush();
    }
    assert!(
        flushed.is_err(),
        "flush after the writer panicked: {flushed:?}"
    );
    assert!(mr.into_parts().is_err());
}

#[test]
fn logging_keeps_a_panicking_writer_out_of_drop_and_into_parts() {
    // With a few lines (the buffer never filled), the writer is first called by the last flush,
    // in the adaptor's drop or `into_parts`, on the caller's thread: its panic must come out of
    // neither `drop` (an abort when dropped while unwinding) nor `into_parts`.
    let few = |mr: &Logging<System, Panics>| {
        for _ in 0..4 {
            let p = mr.allocate(64, 8, S).unwrap();
            // SAFETY: p came from mr with this size and alignment.
            unsafe { mr.deallocate(p, 64, 8, S) };
        }
    };
    let mr = Logging::new(System::new(), Panics);
    few(&mr);
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(mr)));
    assert!(dropped.is_ok(), "drop(Logging) let the writer's panic out");
    let mr = Logging::new(System::new(), Panics);
    few(&mr);
    let parts = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        mr.into_parts().map(|_| ())
    }));
    assert!(
        matches!(parts, Ok(Err(_))),
        "into_parts: an error, not a panic"
    );
    // Dropped while another panic unwinds: no second panic, so no abort.
    let unwound = std::panic::catch_unwind(|| {
        let mr = Logging::new(System::new(), Panics);
        few(&mr);
        panic!("an unrelated panic (expected by the test)");
    });
    assert!(unwound.is_err());
}

/// A writer that fails every write.
struct Broken;

impl std::io::Write for Broken {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::Error::other("disk on fire"))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn logging_write_errors_do_not_fail_allocations() {
    let mr = Logging::new(System::new(), Broken);
    // The header sits in the buffer; the error shows when the buffer is written out.
    let p = mr.allocate(64, 16, S).unwrap();
    // SAFETY: p came from mr with this size and alignment.
    unsafe { mr.deallocate(p, 64, 16, S) };
    let err = mr.flush().unwrap_err();
    assert_eq!(err.to_string(), "disk on fire");
}

#[test]
fn logging_through_resource_stack_to_a_file() {
    let path = std::env::temp_dir().join(format!("mrstack-log-{}.csv", std::process::id()));
    let sim = Simulated::new(1 << 20);
    {
        let mr = resource_stack![
            &sim,
            Logging {
                to: Box::new(std::fs::File::create(&path).unwrap())
            }
        ];
        let p = mr.allocate(4 << 10, 256, S).unwrap();
        // SAFETY: p came from mr with this size and alignment.
        unsafe { mr.deallocate(p, 4 << 10, 256, S) };
        // Dropping the adaptor flushes the buffer.
    }
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let events = parse_log(&text);
    assert_eq!(events.len(), 2);
    assert_eq!(
        (events[0].action.as_str(), events[0].size),
        ("allocate", 4096)
    );
    assert_eq!(
        (events[1].action.as_str(), events[1].pointer),
        ("free", events[0].pointer)
    );
}

// ---------------------------------------------------------------- Aligned

#[test]
fn aligned_over_an_upstream_that_honours_the_alignment() {
    let mr = resource_stack![System::new(), Aligned<U4096>];
    let blocks: Vec<(NonNull<u8>, usize)> = (1..20)
        .map(|i| {
            let size = i * 300;
            let p = mr.allocate(size, 1, S).unwrap();
            assert_eq!(p.as_ptr() as usize % 4096, 0);
            fill(p, size, i as u8);
            (p, size)
        })
        .collect();
    for (i, &(p, size)) in blocks.iter().enumerate() {
        assert!(holds(p, size, i as u8 + 1));
        // SAFETY: p came from mr with this size and alignment.
        unsafe { mr.deallocate(p, size, 1, S) };
    }
    assert_eq!(mr.over_allocated(), 0);
    // A larger alignment than A in the request still wins.
    let p = mr.allocate(10, 1 << 14, S).unwrap();
    assert_eq!(p.as_ptr() as usize % (1 << 14), 0);
    // SAFETY: p came from mr with this size and alignment.
    unsafe { mr.deallocate(p, 10, 1 << 14, S) };
    // A zero-size request gets a dangling pointer with the type's alignment.
    assert_eq!(mr.allocate(0, 1, S).unwrap().as_ptr() as usize % 4096, 0);
}

#[test]
fn aligned_over_allocates_when_the_upstream_refuses() {
    let up = Refusing::default();
    let mr = resource_stack![&up, Aligned<U4096>];
    assert_eq!(
        mrstack::property::alignment_of::<Aligned<U4096, &Refusing>>(),
        4096
    );
    let mut blocks = Vec::new();
    for i in 1..30usize {
        let size = i * 1000;
        let p = mr.allocate(size, 64, S).unwrap();
        assert_eq!(p.as_ptr() as usize % 4096, 0);
        fill(p, size, i as u8);
        blocks.push((p, size, i as u8));
    }
    assert_eq!(mr.over_allocated(), 29);
    // Each block sits inside an upstream block of size + 4096 - 256 bytes.
    let live = up.live.lock().unwrap().clone();
    for &(p, size, _) in &blocks {
        let addr = p.as_ptr() as usize;
        let (&raw, &raw_size) = live
            .iter()
            .find(|(&raw, &raw_size)| raw <= addr && addr + size <= raw + raw_size)
            .expect("block inside an upstream block");
        assert_eq!(raw_size, size + 4096 - 256);
        assert!(addr - raw < 4096);
    }
    for &(p, size, tag) in &blocks {
        assert!(holds(p, size, tag));
        // SAFETY: p came from mr with this size and alignment.
        unsafe { mr.deallocate(p, size, 64, S) };
    }
    assert_eq!(mr.over_allocated(), 0);
    assert!(up.live.lock().unwrap().is_empty());
    // Requests the upstream's own alignment covers go straight through.
    let p = mr.allocate(100, 128, S).unwrap();
    assert_eq!(p.as_ptr() as usize % 4096, 0);
    // SAFETY: p came from mr with this size and alignment.
    unsafe { mr.deallocate(p, 100, 128, S) };
    assert!(up.live.lock().unwrap().is_empty());
}

#[test]
fn aligned_passes_errors_through_and_keeps_nothing() {
    let up = Refusing::default();
    let mr = Aligned::<U4096, _>::new(&up);
    let err = mr.allocate(isize::MAX as usize - 5000, 1, S).unwrap_err();
    assert_eq!(err.kind, AllocErrorKind::OutOfMemory);
    let err = mr.allocate(64, 6, S).unwrap_err();
    assert!(
        matches!(err.kind, AllocErrorKind::InvalidArgument(_)),
        "{err}"
    );
    assert_eq!(mr.over_allocated(), 0);
    assert!(up.live.lock().unwrap().is_empty());
}

#[test]
fn aligned_types_compute_the_maximum() {
    use mrstack::property::alignment_of;
    assert_eq!(alignment_of::<Aligned<U64, Simulated>>(), 256);
    assert_eq!(alignment_of::<Aligned<U1024, Simulated>>(), 1024);
    assert_eq!(alignment_of::<Aligned<U16, System>>(), 16);
    // Zero bytes for the alignment itself: the same size whatever A.
    assert_eq!(
        std::mem::size_of::<Aligned<U4096, System>>(),
        std::mem::size_of::<Aligned<U16, System>>()
    );
}

// ---------------------------------------------------------------- Retry

#[test]
fn retry_calls_back_until_told_to_stop() {
    let calls = AtomicUsize::new(0);
    let attempts = Mutex::new(Vec::new());
    let mr = Retry::new(Simulated::new(1000), |e: &AllocError, attempt| {
        calls.fetch_add(1, Ordering::Relaxed);
        attempts.lock().unwrap().push((e.kind, attempt));
        attempt < 4
    });
    let err = mr.allocate(5000, 1, S).unwrap_err();
    assert_eq!(err.kind, AllocErrorKind::OutOfMemory);
    assert_eq!(calls.load(Ordering::Relaxed), 4);
    assert_eq!(
        *attempts.lock().unwrap(),
        (1..=4)
            .map(|n| (AllocErrorKind::OutOfMemory, n))
            .collect::<Vec<_>>()
    );
}

#[test]
fn retry_succeeds_once_the_callback_frees_memory() {
    let sim = Simulated::new(10_000);
    // A "cache" holding memory that the callback releases.
    let cache: Mutex<Vec<NonNull<u8>>> = Mutex::new(
        (0..3)
            .map(|_| sim.allocate(3000, 256, S).unwrap())
            .collect(),
    );
    let calls = AtomicUsize::new(0);
    let mr = Retry::new(&sim, |_: &AllocError, _| {
        calls.fetch_add(1, Ordering::Relaxed);
        match cache.lock().unwrap().pop() {
            Some(p) => {
                // SAFETY: p came from sim with this size and alignment and is released once.
                unsafe { sim.deallocate(p, 3000, 256, S) };
                true
            }
            None => false,
        }
    });
    // 1000 free: needs two blocks released from the cache.
    let p = mr.allocate(6000, 256, S).unwrap();
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    assert_eq!(cache.lock().unwrap().len(), 1);
    // SAFETY: p came from mr with this size and alignment.
    unsafe { mr.deallocate(p, 6000, 256, S) };
    // A success costs no call.
    let q = mr.allocate(10, 1, S).unwrap();
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    // SAFETY: q came from mr with this size and alignment.
    unsafe { mr.deallocate(q, 10, 1, S) };
    let last = cache.lock().unwrap().pop().unwrap();
    // SAFETY: last came from sim with this size and alignment.
    unsafe { sim.deallocate(last, 3000, 256, S) };
    assert_eq!(sim.in_use(), 0);
}

#[test]
fn retry_leaves_other_errors_alone() {
    let calls = AtomicUsize::new(0);
    let up = Refusing::default();
    let mr = Retry::new(&up, |_: &AllocError, _| {
        calls.fetch_add(1, Ordering::Relaxed);
        true
    });
    let err = mr.allocate(64, 4096, S).unwrap_err();
    assert!(matches!(err.kind, AllocErrorKind::Unsupported(_)));
    assert!(mr.allocate(64, 3, S).is_err());
    assert_eq!(calls.load(Ordering::Relaxed), 0);
}

#[test]
fn retry_through_resource_stack_over_a_limit() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let mr = resource_stack![
        Simulated::new(1 << 30),
        Limiting { limit: 1 KiB },
        Retry {
            on_failure: Box::new(move |e, attempt| {
                seen.fetch_add(1, Ordering::Relaxed);
                assert!(matches!(e.kind, AllocErrorKind::LimitExceeded { limit: 1024, .. }));
                attempt < 2
            })
        },
    ];
    assert!(mr.allocate(2048, 1, S).is_err());
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    // The default configuration never retries.
    let plain = resource_stack![Simulated::new(100), Retry];
    assert!(plain.allocate(200, 1, S).is_err());
}

// ---------------------------------------------------------------- stacks

/// What the five-adaptor stack below builds.
type FiveStack<'a> =
    Logging<Retry<Statistics<Tracking<Limiting<Aligned<U4096, &'a Simulated>>>>, RetryCallback>>;

#[test]
fn five_adaptors_in_one_stack() {
    let sim = Simulated::new(1 << 30);
    let retries = Arc::new(AtomicUsize::new(0));
    let seen = retries.clone();
    let mr = resource_stack![
        &sim,
        Aligned<U4096>,
        Limiting { limit: 64 KiB },
        Tracking,
        Statistics,
        Retry {
            on_failure: Box::new(move |_, _| {
                seen.fetch_add(1, Ordering::Relaxed);
                false
            })
        },
        Logging { to: Box::new(std::io::sink()) },
    ];
    // The type is the stack, outermost first.
    let _: &FiveStack<'_> = &mr;
    assert_eq!(alignment(&mr), 4096);

    let a = mr.allocate(10_000, 8, S).unwrap();
    let b = mr.allocate(20_000, 8, stream(2)).unwrap();
    assert_eq!(a.as_ptr() as usize % 4096, 0);
    assert_eq!(b.as_ptr() as usize % 4096, 0);
    let err = mr.allocate(40_000, 8, S).unwrap_err();
    assert!(matches!(
        err.kind,
        AllocErrorKind::LimitExceeded {
            limit: 65536,
            in_use: 30_000
        }
    ));
    assert_eq!(retries.load(Ordering::Relaxed), 1);

    let stats = mr.upstream().upstream();
    assert_eq!(stats.bytes(), counter(30_000, 30_000, 30_000));
    let tracking = stats.upstream();
    assert_eq!(tracking.outstanding_bytes(), 30_000);
    assert_eq!(tracking.upstream().in_use(), 30_000);

    // SAFETY: each came from mr with this size, alignment and stream.
    unsafe {
        mr.deallocate(a, 10_000, 8, S);
        mr.deallocate(b, 20_000, 8, stream(2));
    }
    assert_eq!(stats.bytes(), counter(0, 30_000, 30_000));
    assert_eq!(tracking.outstanding_count(), 0);
    assert_eq!(sim.in_use(), 0);
    mr.flush().unwrap();
}

/// A resource's guaranteed alignment, read from a value whose type is long to write.
fn alignment<R: MemoryResource>(_: &R) -> usize {
    mrstack::property::alignment_of::<R>()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A stack of every host adaptor over real memory (an upstream that refuses large
    /// alignments, so Aligned over-allocates): every block aligned, no two overlapping (each
    /// keeps its pattern), the counters agree, and everything goes back.
    #[test]
    fn host_stack_matches_a_model(ops in ops()) {
        let up = Refusing::default();
        let mr = resource_stack![
            &up,
            Aligned<U1024>,
            Tracking,
            Limiting { limit: 64 KiB },
            Statistics,
        ];
        let mut live: Vec<(NonNull<u8>, usize, u8)> = Vec::new();
        let mut in_use = 0usize;
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Alloc(size) => match mr.allocate(size, 16, S) {
                    Ok(p) => {
                        prop_assert_eq!(p.as_ptr() as usize % 1024, 0);
                        if size > 0 {
                            let tag = i as u8;
                            fill(p, size, tag);
                            live.push((p, size, tag));
                            in_use += size;
                        }
                    }
                    Err(e) => {
                        prop_assert!(in_use + size > 64 << 10, "{}", e);
                        let over = matches!(e.kind, AllocErrorKind::LimitExceeded { limit: 65536, .. });
                        prop_assert!(over);
                    }
                },
                Op::Free(i) if !live.is_empty() => {
                    let (p, size, tag) = live.swap_remove(i % live.len());
                    prop_assert!(holds(p, size, tag));
                    // SAFETY: p came from mr with this size and alignment.
                    unsafe { mr.deallocate(p, size, 16, S) };
                    in_use -= size;
                }
                Op::Free(_) => {}
            }
            prop_assert_eq!(mr.bytes().current as usize, in_use);
            prop_assert_eq!(mr.upstream().in_use(), in_use);
            prop_assert_eq!(mr.upstream().upstream().outstanding_bytes(), in_use);
            prop_assert_eq!(mr.allocations().current as usize, live.len());
        }
        for (p, size, tag) in live {
            prop_assert!(holds(p, size, tag));
            // SAFETY: p came from mr with this size and alignment.
            unsafe { mr.deallocate(p, size, 16, S) };
        }
        prop_assert!(up.live.lock().unwrap().is_empty());
    }
}

// ---------------------------------------------------------------- stream ordering reaches the upstream

/// Records the `synchronize` and `order_after` calls it gets. It never hands out memory (every
/// allocation fails), so it may claim every property: a claim about no memory is true.
#[derive(Default)]
struct StreamRecorder {
    syncs: Mutex<Vec<StreamId>>,
    orders: Mutex<Vec<(StreamId, StreamId)>>,
}

// SAFETY: `allocate` always fails, so no memory is ever handed out and every property holds of
// none; the stream calls only record.
unsafe impl MemoryResource for StreamRecorder {
    type Host = B1;
    type Device = B1;
    type Managed = B1;
    type Pageable = B0;
    type Alignment = U256;
    fn allocate(&self, size: usize, align: usize, _: StreamRef) -> Result<NonNull<u8>, AllocError> {
        Err(AllocError::out_of_memory(size, align, "StreamRecorder"))
    }
    unsafe fn deallocate(&self, _: NonNull<u8>, _: usize, _: usize, _: StreamRef) {}
    fn synchronize(&self, s: StreamRef) -> Result<(), AllocError> {
        self.syncs.lock().unwrap().push(s.id());
        Ok(())
    }
    fn order_after(&self, s: StreamRef, after: StreamRef) -> Result<(), AllocError> {
        self.orders.lock().unwrap().push((s.id(), after.id()));
        Ok(())
    }
}

/// Calls `synchronize(3)` and `order_after(1, 2)` on `mr` and checks that `rec` saw exactly them.
fn check_forwarding<R: MemoryResource>(name: &str, mr: &R, rec: &StreamRecorder) {
    rec.syncs.lock().unwrap().clear();
    rec.orders.lock().unwrap().clear();
    mr.synchronize(stream(3)).unwrap();
    mr.order_after(stream(1), stream(2)).unwrap();
    assert_eq!(
        *rec.syncs.lock().unwrap(),
        [stream(3).id()],
        "{name}: synchronize did not reach the upstream"
    );
    assert_eq!(
        *rec.orders.lock().unwrap(),
        [(stream(1).id(), stream(2).id())],
        "{name}: order_after did not reach the upstream"
    );
}

#[test]
fn every_adaptor_forwards_synchronize_and_order_after() {
    use mrstack::suballoc::{ArenaConfig, BinningConfig, FixedSizeConfig, PoolConfig};
    let rec = StreamRecorder::default();
    let r = &rec;
    check_forwarding("&R", &r, r);
    check_forwarding("Arc<R>", &Arc::new(r), r);
    check_forwarding("Statistics", &Statistics::new(r), r);
    check_forwarding("Tracking", &Tracking::new(r), r);
    check_forwarding("Logging", &Logging::new(r, Vec::new()), r);
    check_forwarding("Limiting", &Limiting::new(r, 1 << 20), r);
    check_forwarding("Aligned", &Aligned::<U4096, _>::new(r), r);
    check_forwarding("Retry", &Retry::new(r, |_: &AllocError, _| false), r);
    check_forwarding("Prefetch", &Prefetch::new(r, 0), r);
    check_forwarding("Pool", &Pool::new(r, PoolConfig::default()), r);
    check_forwarding(
        "FixedSize",
        &FixedSize::new(r, FixedSizeConfig::default()),
        r,
    );
    check_forwarding("Binning", &Binning::new(r, BinningConfig::default()), r);
    check_forwarding("Arena", &Arena::new(r, ArenaConfig::default()), r);
    check_forwarding("Metered", &mrstack::replay::Metered::new(r), r);
    // AnyResource needs a 'static resource: a recorder of its own.
    let erased = Arc::new(StreamRecorder::default());
    let any =
        AnyResource::<(HostAccessible, DeviceAccessible, Migratable)>::from_arc(erased.clone());
    check_forwarding("AnyResource", &any, &erased);
    check_forwarding("ResourceRef", &ResourceRef::<DeviceAccessible>::new(r), r);
}

#[test]
fn statistics_count_huge_allocations_without_overflow() {
    // Two allocations of more than 2^62 bytes each: more than i64 can hold, live at once.
    let sim = Simulated::new(usize::MAX);
    let mr = Statistics::new(&sim);
    let huge = (1usize << 62) + 4096;
    let a = mr.allocate(huge, 256, S).unwrap();
    let b = mr.allocate(huge, 256, S).unwrap();
    assert_eq!(mr.bytes().current, 2 * huge as i128);
    assert_eq!(mr.bytes().total, 2 * huge as i128);
    // SAFETY: a and b came from mr with these sizes and alignments.
    unsafe {
        mr.deallocate(a, huge, 256, S);
        mr.deallocate(b, huge, 256, S);
    }
    assert_eq!(mr.bytes().current, 0);
    assert_eq!(mr.allocations().total, 2);
}

// ------------------------------------------------------------------------------- ThreadCache

mod thread_cache {
    use super::*;
    use mrstack::adaptor::{ThreadCache, ThreadCacheConfig};
    use mrstack::testing::Recorder;

    fn config(bytes: usize, max_block: usize) -> ThreadCacheConfig {
        ThreadCacheConfig { bytes, max_block }
    }

    #[test]
    fn a_freed_block_serves_the_next_request_of_its_class_on_its_stream_only() {
        let rec = Recorder::new(System::new());
        let mr = ThreadCache::new(&rec, config(64 << 20, 16 << 20));
        let a = mr.allocate(5000, 64, S).unwrap();
        // SAFETY: a came from mr with this size and alignment.
        unsafe { mr.deallocate(a, 5000, 64, S) };
        // 5000 and 5100 bytes share the class of 5120-byte blocks: the same block, no upstream call.
        let b = mr.allocate(5100, 256, S).unwrap();
        assert_eq!((a, rec.record().allocations()), (b, 1));
        // SAFETY: b came from mr with this size and alignment.
        unsafe { mr.deallocate(b, 5100, 256, S) };
        // Another stream does not get it: the free on S is not ordered before its work.
        let c = mr.allocate(5000, 64, stream(1)).unwrap();
        assert_ne!(c, a);
        assert_eq!(rec.record().allocations(), 2);
        // A free on stream 1 moves this thread's cache to it; S's block waits on the shared list
        // for S, where this thread (or another) takes it again.
        // SAFETY: c came from mr with this size and alignment.
        unsafe { mr.deallocate(c, 5000, 64, stream(1)) };
        let d = mr.allocate(5000, 64, S).unwrap();
        assert_eq!((d, rec.record().allocations()), (a, 2));
        assert_eq!(mr.cached(), 5120, "c waits for stream 1");
        // SAFETY: d came from mr with this size and alignment.
        unsafe { mr.deallocate(d, 5000, 64, S) };
        drop(mr);
        let r = rec.record();
        assert_eq!(
            (r.in_use(), r.bad_frees()),
            (0, 0),
            "everything back, freed as asked"
        );
    }

    #[test]
    fn large_or_overaligned_requests_pass_through() {
        let rec = Recorder::new(System::new());
        let mr = ThreadCache::new(&rec, config(1 << 20, 64 << 10));
        for (size, align) in [(100 << 10, 256), (1000, 4096)] {
            let p = mr.allocate(size, align, S).unwrap();
            assert_eq!(p.as_ptr() as usize % align, 0);
            // SAFETY: p came from mr with this size and alignment.
            unsafe { mr.deallocate(p, size, align, S) };
        }
        assert_eq!(
            (mr.cached(), rec.record().in_use()),
            (0, 0),
            "nothing cached"
        );
        assert_eq!(rec.record().allocations(), 2);
    }

    #[test]
    fn the_budget_bounds_what_all_threads_keep() {
        let rec = Recorder::new(System::new());
        let budget = 4 << 20;
        let mr = ThreadCache::new(&rec, config(budget, 1 << 20));
        std::thread::scope(|s| {
            for t in 0..8usize {
                let mr = &mr;
                s.spawn(move || {
                    for round in 0..50 {
                        // Each thread frees 2 MiB of blocks of its own sizes, every round.
                        let size = (t + 1) * 4096 + round % 3 * 512;
                        let live: Vec<_> = (0..(2 << 20) / size)
                            .map(|_| mr.allocate(size, 256, stream(t % 2)).unwrap())
                            .collect();
                        for (i, p) in live.iter().enumerate() {
                            // SAFETY: each block is written only by this thread while it holds it.
                            unsafe { std::ptr::write_bytes(p.as_ptr(), (t * 31 + i) as u8, size) };
                        }
                        for (i, p) in live.into_iter().enumerate() {
                            // SAFETY: the pattern this thread wrote is intact: no other holder.
                            let first = unsafe { *p.as_ptr() };
                            assert_eq!(first, (t * 31 + i) as u8, "a block handed out twice");
                            // SAFETY: p came from mr with this size and alignment.
                            unsafe { mr.deallocate(p, size, 256, stream(t % 2)) };
                        }
                    }
                });
            }
        });
        // No block is live: what the upstream holds is what is cached, read exactly (`cached()`
        // may count a block twice while an exiting scoped thread's hook moves it).
        assert!(
            rec.record().in_use() <= budget,
            "{} cached",
            rec.record().in_use()
        );
        drop(mr);
        assert_eq!((rec.record().in_use(), rec.record().bad_frees()), (0, 0));
    }

    #[test]
    fn an_upstream_out_of_memory_gets_the_cached_blocks_back_first() {
        let sim = Simulated::new(8 << 20);
        let mr = ThreadCache::new(&sim, config(64 << 20, 8 << 20));
        // 6 MiB in 3 KiB..24 KiB blocks, freed: all cached, the upstream still holds them.
        let mut live = Vec::new();
        for i in 0..512 {
            let size = 3072 * (1 + i % 8);
            live.push((mr.allocate(size, 256, S).unwrap(), size));
        }
        for (p, size) in live {
            // SAFETY: p came from mr with this size and alignment.
            unsafe { mr.deallocate(p, size, 256, S) };
        }
        assert_eq!(sim.in_use(), mr.cached());
        // 6 MiB in one block: only once the caches gave their blocks back.
        let big = mr.allocate(6 << 20, 256, S).unwrap();
        assert_eq!(mr.cached(), 0);
        // SAFETY: big came from mr with this size and alignment.
        unsafe { mr.deallocate(big, 6 << 20, 256, S) };
        mr.empty();
        assert_eq!(sim.in_use(), 0);
    }

    #[test]
    fn a_large_request_gets_the_blocks_of_exited_threads_back_first() {
        let mr = Arc::new(resource_stack![
            Simulated::new(1 << 30),
            Limiting { limit: 64 MiB },
            ThreadCache { bytes: 256 MiB }
        ]);
        // Four threads hold 13 MiB at once, free it and exit: their blocks wait on the shared
        // lists, and nothing is live.
        let barrier = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = [4usize << 20, 4 << 20, 3 << 20, 2 << 20]
            .into_iter()
            .map(|size| {
                let (mr, barrier) = (mr.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let p = mr.allocate(size, 256, S).unwrap();
                    barrier.wait();
                    // SAFETY: p came from mr with this size and alignment.
                    unsafe { mr.deallocate(p, size, 256, S) };
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let limiting = mr.upstream();
        assert_eq!((mr.cached(), limiting.in_use()), (13 << 20, 13 << 20));
        // 60 MiB, above max_block, fits the limit only once the cached blocks are back.
        let big = mr.allocate(60 << 20, 256, S).unwrap();
        assert_eq!((mr.cached(), limiting.in_use()), (0, 60 << 20));
        // SAFETY: big came from mr with this size and alignment.
        unsafe { mr.deallocate(big, 60 << 20, 256, S) };
        assert_eq!(limiting.upstream().in_use(), 0);
    }

    #[test]
    fn a_text_config_builds_and_describes_itself() {
        let mr = mrstack::config::build::<()>(
            "simulated(capacity=1 GiB) > tlsf > thread_cache(bytes=64 MiB, max_block=4 MiB)",
        )
        .unwrap();
        assert_eq!(
            mr.describe().to_string(),
            "simulated(capacity=1 GiB) > tlsf > thread_cache(bytes=64 MiB, max_block=4 MiB)"
        );
        let err = mrstack::config::build::<()>(
            "simulated(capacity=1 GiB) > thread_cache(bytes=1 MiB, max_block=2 MiB)",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("max_block"), "{err}");
        let mr = resource_stack![Simulated::new(1 << 30), ThreadCache { bytes: 32 MiB }];
        assert_eq!(
            mr.describe().to_string(),
            "simulated(capacity=1 GiB) > thread_cache(bytes=32 MiB, max_block=16 MiB)"
        );
    }

    // Blocks and room handed on between streams, threads and the shared lists.

    #[test]
    fn a_stream_switch_hands_the_blocks_on_with_their_room() {
        let rec = Recorder::new(System::new());
        let budget = 1 << 20;
        let mr = ThreadCache::new(&rec, config(budget, 64 << 10));
        let v: Vec<_> = (0..16)
            .map(|_| mr.allocate(64 << 10, 256, stream(1)).unwrap())
            .collect();
        for p in v {
            // SAFETY: p came from mr with this size and alignment.
            unsafe { mr.deallocate(p, 64 << 10, 256, stream(1)) };
        }
        assert_eq!(mr.cached(), budget);
        let q = mr.allocate(256, 256, stream(2)).unwrap();
        // SAFETY: q came from mr with this size and alignment.
        unsafe { mr.deallocate(q, 256, 256, stream(2)) };
        // Stream 1's blocks wait on the shared list with their room (before, they went upstream
        // and their room stayed with this thread); the budget is full, so q went upstream.
        assert_eq!(
            rec.record().in_use(),
            budget,
            "stream 1's blocks still cached"
        );
        assert_eq!(mr.cached(), budget);
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..4 {
                    let p = mr.allocate(64 << 10, 256, stream(1)).unwrap();
                    // SAFETY: p came from mr with this size and alignment.
                    unsafe { mr.deallocate(p, 64 << 10, 256, stream(1)) };
                }
            });
        });
        assert_eq!(
            rec.record().allocations(),
            17,
            "another thread took stream 1's blocks"
        );
    }

    #[test]
    fn an_exiting_thread_hands_its_blocks_and_room_on() {
        let rec = Arc::new(Recorder::new(System::new()));
        let budget = 1 << 20;
        let mr = Arc::new(ThreadCache::new(rec.clone(), config(budget, 64 << 10)));
        // This thread's slot first, so that it cannot take over the worker's.
        let mine = mr.allocate(256, 256, stream(7)).unwrap();
        let worker = mr.clone();
        // Joined, not scoped: `join` returns once the thread's exit hooks have run.
        std::thread::spawn(move || {
            let v: Vec<_> = (0..16)
                .map(|_| worker.allocate(64 << 10, 256, stream(1)).unwrap())
                .collect();
            for p in v {
                // SAFETY: p came from worker with this size and alignment.
                unsafe { worker.deallocate(p, 64 << 10, 256, stream(1)) };
            }
        })
        .join()
        .unwrap();
        let before = rec.record().allocations();
        for _ in 0..100 {
            let p = mr.allocate(64 << 10, 256, stream(1)).unwrap();
            // SAFETY: p came from mr with this size and alignment.
            unsafe { mr.deallocate(p, 64 << 10, 256, stream(1)) };
        }
        assert_eq!(
            rec.record().allocations(),
            before,
            "the dead thread's blocks served"
        );
        // SAFETY: mine came from mr with this size and alignment.
        unsafe { mr.deallocate(mine, 256, 256, stream(7)) };
        drop(mr);
        assert_eq!((rec.record().in_use(), rec.record().bad_frees()), (0, 0));
    }

    #[test]
    fn idle_threads_hold_no_room_from_a_thread_that_needs_it() {
        let rec = Recorder::new(System::new());
        let budget = 1 << 20;
        let mr = ThreadCache::new(&rec, config(budget, 64 << 10));
        let barrier = std::sync::Barrier::new(33);
        std::thread::scope(|s| {
            for _ in 0..32 {
                let (mr, barrier) = (&mr, &barrier);
                s.spawn(move || {
                    let p = mr.allocate(32 << 10, 256, stream(1)).unwrap();
                    // SAFETY: p came from mr with this size and alignment.
                    unsafe { mr.deallocate(p, 32 << 10, 256, stream(1)) };
                    // A hit: the cache is empty again, and keeps its room (two pieces of 16
                    // KiB): 32 threads together hold the whole budget, and then idle.
                    let a = mr.allocate(32 << 10, 256, stream(1)).unwrap();
                    barrier.wait();
                    barrier.wait();
                    // SAFETY: a came from mr with this size and alignment.
                    unsafe { mr.deallocate(a, 32 << 10, 256, stream(1)) };
                });
            }
            barrier.wait();
            // Meanwhile this thread frees 512 KiB: the first refusal takes the idle threads'
            // room back, and every block is cached (none goes to the upstream).
            let v: Vec<_> = (0..32)
                .map(|_| mr.allocate(16 << 10, 256, stream(2)).unwrap())
                .collect();
            let freed = rec.record().deallocations();
            for p in v {
                // SAFETY: p came from mr with this size and alignment.
                unsafe { mr.deallocate(p, 16 << 10, 256, stream(2)) };
            }
            assert_eq!(rec.record().deallocations(), freed, "all 32 cached");
            barrier.wait();
        });
        // No block is live: what the upstream holds is what is cached, read exactly (`cached()`
        // may count a block twice while an exiting scoped thread's hook moves it).
        assert!(rec.record().in_use() <= budget);
    }

    #[test]
    fn threads_beyond_the_slots_and_exiting_threads_leave_their_blocks_to_the_others() {
        let rec = Arc::new(Recorder::new(System::new()));
        let mr = Arc::new(ThreadCache::new(rec.clone(), config(8 << 20, 64 << 10)));
        // 70 threads alive at once: the last ones have no slot of their own (64), so their frees
        // go to the shared lists at once; the others' go there when they exit.
        let barrier = Arc::new(std::sync::Barrier::new(70));
        let threads: Vec<_> = (0..70)
            .map(|_| {
                let (mr, barrier) = (mr.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let p = mr.allocate(64 << 10, 256, stream(1)).unwrap();
                    barrier.wait();
                    // SAFETY: p came from mr with this size and alignment.
                    unsafe { mr.deallocate(p, 64 << 10, 256, stream(1)) };
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let before = rec.record().allocations();
        let v: Vec<_> = (0..70)
            .map(|_| mr.allocate(64 << 10, 256, stream(1)).unwrap())
            .collect();
        assert_eq!(
            rec.record().allocations(),
            before,
            "all 70 blocks served again"
        );
        for p in v {
            // SAFETY: p came from mr with this size and alignment.
            unsafe { mr.deallocate(p, 64 << 10, 256, stream(1)) };
        }
    }

    #[test]
    fn exiting_threads_on_streams_of_their_own_leave_at_most_eight_lists_a_class() {
        let rec = Arc::new(Recorder::new(System::new()));
        let mr = Arc::new(ThreadCache::new(rec.clone(), config(256 << 20, 16 << 20)));
        for k in 1..=200 {
            let mr = mr.clone();
            std::thread::spawn(move || {
                let p = mr.allocate(256, 256, stream(k)).unwrap();
                // SAFETY: p came from mr with this size and alignment.
                unsafe { mr.deallocate(p, 256, 256, stream(k)) };
            })
            .join()
            .unwrap();
        }
        // The exit hooks could not give the lists past eight to the upstream; this thread's next
        // free does.
        let p = mr.allocate(256, 256, stream(1000)).unwrap();
        // SAFETY: p came from mr with this size and alignment.
        unsafe { mr.deallocate(p, 256, 256, stream(1000)) };
        assert_eq!(
            rec.record().in_use(),
            9 * 256,
            "eight lists and this thread's block"
        );
    }

    #[test]
    fn a_full_class_gives_up_its_oldest_stream() {
        let rec = Recorder::new(System::new());
        let mr = ThreadCache::new(&rec, config(256 << 20, 16 << 20));
        // An allocation and a free on stream k: the free moves this thread's cache, stream k-1's
        // block, to the shared list.
        let round = |k: usize| {
            let p = mr.allocate(256, 256, stream(k)).unwrap();
            // SAFETY: p came from mr with this size and alignment.
            unsafe { mr.deallocate(p, 256, 256, stream(k)) };
        };
        (1..=9).for_each(round); // lists of streams 1..=8, oldest first
        round(1); // takes stream 1's list's block (the list goes), gives stream 9's: 2..=9
        round(10); // gives stream 1's: nine lists, so the oldest, stream 2's, goes upstream
        let made = rec.record().allocations();
        let p = mr.allocate(256, 256, stream(8)).unwrap();
        assert_eq!(
            rec.record().allocations(),
            made,
            "stream 8's block is still kept"
        );
        let q = mr.allocate(256, 256, stream(2)).unwrap();
        assert_eq!(rec.record().allocations(), made + 1, "stream 2's went");
        // SAFETY: p and q came from mr with this size and alignment.
        unsafe {
            mr.deallocate(p, 256, 256, stream(8));
            mr.deallocate(q, 256, 256, stream(2));
        }
    }

    #[test]
    fn streams_used_once_do_not_pile_up_on_the_shared_lists() {
        let rec = Recorder::new(System::new());
        let mr = ThreadCache::new(&rec, config(256 << 20, 16 << 20));
        for k in 1..=2_000u32 {
            let p = mr.allocate(256, 256, stream(k as usize)).unwrap();
            // SAFETY: p came from mr with this size and alignment.
            unsafe { mr.deallocate(p, 256, 256, stream(k as usize)) };
        }
        // The thread's cache holds the last stream's block, the class's list eight others.
        assert_eq!(mr.cached(), 9 * 256);
        assert_eq!(rec.record().in_use(), 9 * 256, "the rest went back");
        drop(mr);
        assert_eq!((rec.record().in_use(), rec.record().bad_frees()), (0, 0));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Over any sequence on two streams, every block is the upstream's and distinct, the
        /// cache never holds more than its budget, the upstream holds exactly the live blocks'
        /// classes and the cache, and everything goes back.
        #[test]
        fn thread_cache_matches_a_model(ops in ops(), budget in 0usize..(64 << 10)) {
            let rec = Recorder::new(System::new());
            let mr = ThreadCache::new(&rec, config(budget, 8 << 10));
            let mut live: Vec<(NonNull<u8>, usize, u8, usize)> = Vec::new();
            for (k, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Alloc(size) => {
                        let p = mr.allocate(size, 64, stream(k % 2)).unwrap();
                        if size > 0 {
                            // SAFETY: a live block of `size` bytes of this test's alone.
                            unsafe { std::ptr::write_bytes(p.as_ptr(), k as u8, size) };
                            live.push((p, size, k as u8, k % 2));
                        }
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let (p, size, byte, s) = live.swap_remove(i % live.len());
                        // SAFETY: the block is still this test's: no one else wrote it.
                        let seen = unsafe { std::slice::from_raw_parts(p.as_ptr(), size) };
                        prop_assert!(seen.iter().all(|&b| b == byte), "a block was shared");
                        // SAFETY: p came from mr with this size and alignment, on stream s.
                        unsafe { mr.deallocate(p, size, 64, stream(s)) };
                    }
                    Op::Free(_) => {}
                }
                prop_assert!(mr.cached() <= budget);
                // The upstream holds every live block (at least its size) and the cache, no more.
                let held: usize = live.iter().map(|b| b.1).sum();
                prop_assert!(rec.record().in_use() >= held + mr.cached());
                prop_assert!(rec.record().in_use() <= held + held / 8 + 256 * live.len() + mr.cached());
            }
            for (p, size, _, s) in live {
                // SAFETY: p came from mr with this size and alignment, on stream s.
                unsafe { mr.deallocate(p, size, 64, stream(s)) };
            }
            prop_assert_eq!(rec.record().in_use(), mr.cached());
            drop(mr);
            prop_assert_eq!((rec.record().in_use(), rec.record().bad_frees()), (0, 0));
        }
    }
}
