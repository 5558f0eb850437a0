//! Host tests over every suballocator: usage with its peak, per-stream state bounded by the
//! streams that hold something, absurd and contradictory configurations, blocks no allocation can
//! hold, a panicking upstream free at drop, and a suballocator dropped with a block live.

use mrstack::prelude::*;
use mrstack::suballoc::{BinningConfig, FixedSizeConfig, PoolConfig, TlsfConfig};
use mrstack::{
    resource::AllocErrorKind,
    suballoc::{Arena, Binning, FixedSize, Pool, Tlsf},
};

use crate::suballoc_support::{free_per_bin, stream, PanicsOnce};

#[test]
fn a_panicking_upstream_free_at_drop_loses_no_other_chunk_of_a_bin() {
    // A panic giving back one chunk at FixedSize's or Binning's drop loses none of the rest (nor
    // any later bin's).
    let d = StreamRef::DEFAULT;
    let up = PanicsOnce::new();
    let fixed = resource_stack![&up, FixedSize { block_size: 4 KiB, blocks_to_preallocate: 1 }];
    // Three chunks of one block each, all free again.
    let blocks: Vec<_> = (0..3)
        .map(|_| fixed.allocate(4096, 256, d).unwrap())
        .collect();
    for p in blocks {
        // SAFETY: live with this size.
        unsafe { fixed.deallocate(p, 4096, 256, d) };
    }
    let up2 = PanicsOnce::new();
    let binning = resource_stack![&up2, Binning { min: 256 B, max: 1 KiB }];
    // One chunk per bin, all free again.
    let blocks: Vec<_> = [256, 512, 1024]
        .map(|n| (binning.allocate(n, 256, d).unwrap(), n))
        .to_vec();
    for (p, n) in blocks {
        // SAFETY: live with this size.
        unsafe { binning.deallocate(p, n, 256, d) };
    }
    for (up, drop_it) in [
        (&up, Box::new(move || drop(fixed)) as Box<dyn FnOnce()>),
        (&up2, Box::new(move || drop(binning))),
    ] {
        assert_eq!(up.inner.record().live(), 3);
        up.on_deallocate
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(drop_it));
        assert!(r.is_err(), "the upstream's panic comes through");
        // The chunk whose free panicked is the upstream's own to lose; none other is live.
        assert_eq!(up.inner.record().live(), 1);
    }
}

#[test]
fn absurd_configurations_still_serve_what_fits() {
    let sim = Simulated::new(1 << 30);
    let fixed = resource_stack![
        &sim,
        FixedSize { block_size: 1 MiB, blocks_to_preallocate: 1 << 50 },
    ];
    let p = fixed.allocate(1000, 256, StreamRef::DEFAULT).unwrap();
    // SAFETY: p came from fixed with this size and align.
    unsafe { fixed.deallocate(p, 1000, 256, StreamRef::DEFAULT) };
    drop(fixed);
    assert_eq!(sim.in_use(), 0);

    let arena = mrstack::suballoc::Arena::new(
        &sim,
        mrstack::suballoc::ArenaConfig {
            size: usize::MAX,
            ..Default::default()
        },
    );
    crate::support::serve_one(&arena, 1000, 256, StreamRef::DEFAULT);
    drop(arena);
    assert_eq!(sim.in_use(), 0);
}

#[test]
fn every_suballocator_reports_usage_with_its_peak() {
    let sim = Simulated::new(1 << 30);
    let d = StreamRef::DEFAULT;

    let pool = resource_stack![&sim, Pool { initial: 0, max: 1 GiB }];
    let p = pool.allocate(4 << 20, 256, d).unwrap();
    let busy = pool.usage();
    assert_eq!(
        (busy.held, busy.allocated, busy.chunks),
        (sim.in_use(), 4 << 20, 1)
    );
    // SAFETY: p came from pool with this size and alignment.
    unsafe { pool.deallocate(p, 4 << 20, 256, d) };
    assert_eq!(pool.release(), busy.held);
    let idle = pool.usage();
    assert_eq!(
        (idle.held, idle.allocated, idle.peak_held),
        (0, 0, busy.held)
    );

    let fixed = resource_stack![&sim, FixedSize { block_size: 1 KiB, blocks_to_preallocate: 4 }];
    let blocks: Vec<_> = (0..5)
        .map(|_| fixed.allocate(1000, 256, d).unwrap())
        .collect();
    let u = fixed.usage();
    assert_eq!(
        (u.held, u.allocated, u.chunks, u.free_blocks),
        (8 * 1024, 5 * 1024, 2, 3)
    );
    assert_eq!(u.peak_held, u.held);
    for b in blocks {
        // SAFETY: b came from fixed with this size and alignment.
        unsafe { fixed.deallocate(b, 1000, 256, d) };
    }
    assert_eq!(fixed.usage().allocated, 0);

    let binning = resource_stack![&sim, Binning { min: 256 B, max: 1 KiB }];
    let a = binning.allocate(300, 256, d).unwrap();
    let big = binning.allocate(1 << 20, 256, d).unwrap(); // to the upstream: not counted
    let u = binning.usage();
    assert_eq!(
        (u.held, u.allocated, u.chunks, u.peak_held),
        (512, 512, 1, 512)
    );
    assert_eq!(free_per_bin(&binning), [0, 0, 0]);
    // SAFETY: each came from binning with this size and alignment.
    unsafe {
        binning.deallocate(a, 300, 256, d);
        binning.deallocate(big, 1 << 20, 256, d);
    }
    assert_eq!(binning.bin_usage()[1].free_blocks, 1);
    assert!(binning
        .usage()
        .to_string()
        .starts_with("512 B held (peak 512 B) in 1 chunk: 0 B allocated"));
}

/// Runs the two idle-stream phases over `mr`, whose `tracked` gives (per-stream lists, streams
/// kept), and checks after each that both are bounded by `bound`, not by the streams seen.
fn idle_streams_are_forgotten<R: MemoryResource>(
    mr: &R,
    size: usize,
    blocks: usize,
    tracked: impl Fn(&R) -> (usize, usize),
    bound: impl Fn(&R) -> (usize, usize),
) {
    // Phase 1: 3000 streams, one after another, each takes a block and frees it.
    for i in 1..=3000 {
        let p = mr.allocate(size, 256, stream(i)).unwrap();
        // SAFETY: p came from mr with this size and align.
        unsafe { mr.deallocate(p, size, 256, stream(i)) };
    }
    let (lists, kept) = tracked(mr);
    let (max_lists, max_kept) = bound(mr);
    assert!(
        lists <= max_lists && kept <= max_kept,
        "after phase 1: {lists} lists, {kept} streams kept"
    );
    // Phase 2: `blocks` streams each free a block on their own stream (each then holds a list),
    // then one stream takes every block back: the others go idle and must be forgotten.
    let ptrs: Vec<_> = (0..blocks)
        .map(|i| (mr.allocate(size, 256, stream(5000 + i)).unwrap(), 5000 + i))
        .collect();
    for &(p, s) in &ptrs {
        // SAFETY: p came from mr with this size and align.
        unsafe { mr.deallocate(p, size, 256, stream(s)) };
    }
    assert!(
        tracked(mr).0 >= blocks / 2,
        "the freeing streams hold lists"
    );
    let ptrs: Vec<_> = (0..blocks)
        .map(|_| mr.allocate(size, 256, stream(9999)).unwrap())
        .collect();
    for p in ptrs {
        // SAFETY: p came from mr with this size and align.
        unsafe { mr.deallocate(p, size, 256, stream(9999)) };
    }
    let (lists, kept) = tracked(mr);
    let (max_lists, max_kept) = bound(mr);
    assert!(
        lists <= max_lists && kept <= max_kept,
        "after phase 2: {lists} lists, {kept} streams kept"
    );
}

#[test]
fn pool_forgets_idle_streams() {
    // Exactly 500 blocks of 4 KiB: no remainder, so every free block is one of them.
    let sim = Simulated::new(1 << 30);
    let config = PoolConfig {
        initial: 500 << 12,
        max: 500 << 12,
    };
    let pool = Pool::try_new(&sim, config).unwrap();
    // One list (the last stream's) and the default stream, which holds the one chunk.
    idle_streams_are_forgotten(&pool, 4096, 500, Pool::tracked_streams, |p| {
        (1, 1 + p.usage().chunks)
    });
    assert_eq!(pool.usage().free_blocks, 1);
}

#[test]
fn tlsf_forgets_idle_streams() {
    let sim = Simulated::new(1 << 30);
    let tlsf = Tlsf::new(&sim, TlsfConfig::default());
    for round in 0..200u32 {
        let s = StreamRef::simulated(round + 1).to_handle();
        crate::support::serve_one(&tlsf, 4096, 256, s.as_ref());
        let q = tlsf.allocate(4096, 256, StreamRef::DEFAULT).unwrap();
        // SAFETY: live with this size.
        unsafe { tlsf.deallocate(q, 4096, 256, StreamRef::DEFAULT) };
    }
    let (lists, held) = tlsf.tracked_streams();
    assert!(
        lists <= 3 && held <= 3,
        "{lists} lists, {held} streams held"
    );
}

#[test]
fn fixed_size_forgets_idle_streams() {
    let sim = Simulated::new(1 << 30);
    let config = FixedSizeConfig {
        block_size: 4096,
        blocks_to_preallocate: 500,
    };
    let mr = FixedSize::try_new(&sim, config).unwrap();
    // The current list and one more, plus the streams of the chunks.
    idle_streams_are_forgotten(&mr, 4096, 500, FixedSize::tracked_streams, |m| {
        (2, 2 + m.usage().chunks)
    });
    assert_eq!(mr.usage().chunks, 1);
}

#[test]
fn binning_forgets_idle_streams() {
    let sim = Simulated::new(1 << 30);
    let mr = Binning::try_new(&sim, BinningConfig::default()).unwrap();
    // Per bin: the current list and one more, the default stream, and the chunks' streams.
    idle_streams_are_forgotten(&mr, 4096, 500, Binning::tracked_streams, |m| {
        let bins = m.bin_sizes().len();
        (2 * bins, 2 * bins + m.usage().chunks)
    });
}

#[test]
fn contradictory_configurations_are_refused_or_clamped() {
    let sim = Simulated::new(1 << 30);
    // Pool: initial above max.
    let config = PoolConfig {
        initial: 2 << 20,
        max: 1 << 20,
    };
    let e = Pool::try_new(&sim, config.clone()).unwrap_err();
    assert!(matches!(e.kind, AllocErrorKind::InvalidArgument(_)), "{e}");
    assert!(
        e.to_string().contains("`initial`") && e.to_string().contains("`max`"),
        "{e}"
    );
    // `new` (the Layer) clamps initial to max.
    let pool = Pool::new(&sim, config);
    assert_eq!(pool.usage().held, 1 << 20);
    drop(pool);
    // Binning: min above max.
    let config = BinningConfig {
        min: 4 << 20,
        max: 256 << 10,
    };
    let e = Binning::try_new(&sim, config.clone()).unwrap_err();
    assert!(matches!(e.kind, AllocErrorKind::InvalidArgument(_)), "{e}");
    assert!(
        e.to_string().contains("`min`") && e.to_string().contains("`max`"),
        "{e}"
    );
    assert_eq!(e.size, 4 << 20);
    // `new` builds no bin, as RMM does: every request goes to the upstream. (The macro refuses
    // these literal bounds at compile time; a configuration computed at run time reaches `new`.)
    let mr = Binning::new(&sim, config);
    assert!(mr.bin_sizes().is_empty());
    let p = mr.allocate(1000, 256, StreamRef::DEFAULT).unwrap();
    assert_eq!((mr.usage().held, sim.in_use()), (0, 1000));
    // SAFETY: p came from mr with this size and align.
    unsafe { mr.deallocate(p, 1000, 256, StreamRef::DEFAULT) };
    // Equal bounds are one bin, not an error.
    let one = Binning::try_new(
        &sim,
        BinningConfig {
            min: 1 << 20,
            max: 1 << 20,
        },
    )
    .unwrap();
    assert_eq!(one.bin_sizes(), vec![1 << 20]);
}

#[test]
fn blocks_no_allocation_can_hold_are_out_of_memory() {
    let sim = Simulated::new(usize::MAX);
    // FixedSize: a block above isize::MAX is an error from try_new, never an abort.
    let config = FixedSizeConfig {
        block_size: usize::MAX,
        blocks_to_preallocate: 4,
    };
    let e = FixedSize::try_new(&sim, config.clone()).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let mr = FixedSize::new(&sim, config);
    let e = mr.allocate(1 << 20, 256, StreamRef::DEFAULT).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!((e.size, e.resource), (1 << 20, "FixedSize"));
    // Binning: the largest bin's growth for a request just over 2^62 bytes.
    let mr = resource_stack![&sim, Binning { min: 256 B, max: usize::MAX }];
    let size = (1 << 62) + 1;
    let e = mr.allocate(size, 256, StreamRef::DEFAULT).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!((e.size, e.align, e.resource), (size, 256, "Binning"));
    // Binning's geometric growth of a bin whose blocks a host cannot list is bounded by 128
    // blocks, so it never needs an address list the host cannot hold.
    assert_eq!(sim.in_use(), 0);
}

/// A suballocator dropped while a block is still allocated (its owner leaked with `mem::forget`,
/// and device work queued before may still use it) keeps the chunk that holds the block: it never
/// goes back to the upstream for reuse. Wholly free chunks still go back.
#[test]
fn a_suballocator_dropped_with_a_block_live_leaks_its_chunk() {
    fn check<R: MemoryResource>(name: &str, sim: &Simulated, mr: R, size: usize) {
        let kept = mr.allocate(size, 256, stream(1)).unwrap();
        crate::support::serve_one(&mr, size, 256, stream(2));
        let _ = kept; // leaked, as by `mem::forget` of its container
        drop(mr);
        assert!(
            sim.live() > 0,
            "{name}: the chunk under a live block went back"
        );
    }
    fn all_back<R: MemoryResource>(name: &str, sim: &Simulated, mr: R, size: usize) {
        crate::support::serve_one(&mr, size, 256, stream(1));
        drop(mr);
        assert_eq!(sim.live(), 0, "{name}: a wholly free chunk was kept");
    }
    let fixed = || FixedSizeConfig {
        block_size: 4096,
        blocks_to_preallocate: 4,
    };
    let arena = || mrstack::suballoc::ArenaConfig {
        size: 8 << 20,
        ..Default::default()
    };
    // Both checks over a fresh upstream each, the suballocator sharing it.
    fn both<R: MemoryResource>(name: &str, make: impl Fn(std::sync::Arc<Simulated>) -> R) {
        let sim = std::sync::Arc::new(Simulated::new(1 << 30));
        check(name, &sim, make(sim.clone()), 4096);
        let sim = std::sync::Arc::new(Simulated::new(1 << 30));
        all_back(name, &sim, make(sim.clone()), 4096);
    }
    both("Pool", |sim| Pool::new(sim, PoolConfig::default()));
    both("FixedSize", |sim| FixedSize::new(sim, fixed()));
    both("Binning", |sim| Binning::new(sim, BinningConfig::default()));
    both("Arena", |sim| Arena::new(sim, arena()));
}
