//! Host tests of `Pool`: block reuse, best fit, chunk boundaries, its maximum, alignment, bad
//! requests, stream ordering, growth past `isize::MAX`, and a 16-thread stress test.

use mrstack::prelude::*;
use mrstack::suballoc::PoolConfig;
use mrstack::testing::Recorder;
use mrstack::{resource::AllocErrorKind, suballoc::Pool};

use crate::suballoc_support::{sixteen_threads, stream};

#[test]
fn pool_reuses_blocks_and_returns_everything() {
    let sim = Simulated::new(1 << 30);
    let pool = resource_stack![&sim, Pool { initial: 4 MiB }];
    assert_eq!((pool.usage().held, sim.in_use()), (4 << 20, 4 << 20));
    let a = pool.allocate(1000, 8, StreamRef::DEFAULT).unwrap();
    let b = pool.allocate(3000, 8, StreamRef::DEFAULT).unwrap();
    assert_eq!(pool.usage().allocated, 1024 + 3072);
    // SAFETY: a and b are live with these sizes.
    unsafe {
        pool.deallocate(a, 1000, 8, StreamRef::DEFAULT);
        pool.deallocate(b, 3000, 8, StreamRef::DEFAULT);
    }
    let stats = pool.usage();
    assert_eq!(
        (stats.allocated, stats.free_blocks, stats.chunks),
        (0, 1, 1),
        "coalesced"
    );
    assert_eq!(
        sim.allocation_count(),
        1,
        "no upstream call after the reservation"
    );
    drop(pool);
    assert_eq!((sim.in_use(), sim.live()), (0, 0));
}

#[test]
fn pool_best_fit_picks_the_smallest_block_that_fits() {
    let sim = Simulated::new(1 << 30);
    let pool = resource_stack![&sim, Pool { initial: 1 MiB, max: 1 MiB }];
    let d = StreamRef::DEFAULT;
    // Carve holes of 8 KiB, 2 KiB and 4 KiB separated by live blocks.
    let sizes = [8192, 256, 2048, 256, 4096, 256];
    let blocks: Vec<_> = sizes
        .iter()
        .map(|&s| pool.allocate(s, 256, d).unwrap())
        .collect();
    for i in [0, 2, 4] {
        // SAFETY: live with this size.
        unsafe { pool.deallocate(blocks[i], sizes[i], 256, d) };
    }
    let p = pool.allocate(3000, 256, d).unwrap().as_ptr() as usize;
    let hole = blocks[4].as_ptr() as usize;
    assert!(
        (hole..hole + 4096).contains(&p),
        "a 3000-byte request takes the 4 KiB hole, not the 8 KiB one"
    );
    let q = pool.allocate(2048, 256, d).unwrap();
    assert_eq!(q, blocks[2]);
}

#[test]
fn pool_never_coalesces_across_upstream_chunks() {
    // Simulated hands out adjacent ranges for 256-multiple sizes, so two chunks touch.
    let sim = Simulated::new(1 << 30);
    let pool = resource_stack![&sim, Pool { initial: 0, max: 4 MiB }];
    let d = StreamRef::DEFAULT;
    let a = pool.allocate(2 << 20, 256, d).unwrap();
    let b = pool.allocate(2 << 20, 256, d).unwrap();
    assert_eq!(pool.usage().chunks, 2);
    assert_eq!(
        b.as_ptr() as usize,
        a.as_ptr() as usize + (2 << 20),
        "the chunks are adjacent"
    );
    // SAFETY: live with these sizes.
    unsafe {
        pool.deallocate(a, 2 << 20, 256, d);
        pool.deallocate(b, 2 << 20, 256, d);
    }
    assert_eq!(pool.usage().free_blocks, 2, "one free block per chunk");
    let err = pool.allocate(3 << 20, 256, d);
    // Both chunks are wholly free: the pool gives them back to make room for one that fits.
    let p = err.expect("released free chunks to grow within the cap");
    assert_eq!(pool.usage().chunks, 1);
    // SAFETY: live with this size.
    unsafe { pool.deallocate(p, 3 << 20, 256, d) };
    drop(pool);
    assert_eq!((sim.in_use(), sim.live()), (0, 0));
}

#[test]
fn pool_at_its_maximum_is_out_of_memory_and_recovers() {
    let sim = Simulated::new(1 << 30);
    let pool = resource_stack![&sim, Pool { initial: 0, max: 1 MiB }];
    let d = StreamRef::DEFAULT;
    let blocks: Vec<_> = (0..4)
        .map(|_| pool.allocate(256 << 10, 256, d).unwrap())
        .collect();
    assert_eq!(pool.usage().held, 1 << 20, "grew to exactly the maximum");
    let err = pool.allocate(1, 1, d).unwrap_err();
    assert_eq!(err.kind, AllocErrorKind::OutOfMemory);
    assert_eq!(err.resource, "Pool");
    assert!(err.to_string().contains("Pool: out of memory"), "{err}");
    // SAFETY: live with this size.
    unsafe { pool.deallocate(blocks[1], 256 << 10, 256, d) };
    let again = pool.allocate(256 << 10, 256, d).unwrap();
    assert_eq!(again, blocks[1]);
    for b in [blocks[0], again, blocks[2], blocks[3]] {
        // SAFETY: live with this size.
        unsafe { pool.deallocate(b, 256 << 10, 256, d) };
    }
    assert_eq!(pool.usage().allocated, 0);
    crate::support::serve_one(&pool, 1 << 20, 256, d);
}

#[test]
fn pool_near_its_maximum_grows_by_what_is_left() {
    let sim = Simulated::new(1 << 30);
    let max = (10 << 20) + 768;
    let pool = Pool::new(&sim, PoolConfig { initial: 0, max });
    let d = StreamRef::DEFAULT;
    let a = pool.allocate(6 << 20, 256, d).unwrap();
    let b = pool.allocate((4 << 20) + 700, 256, d).unwrap();
    assert_eq!(pool.usage().held, (10 << 20) + 768);
    // SAFETY: live with these sizes.
    unsafe {
        pool.deallocate(a, 6 << 20, 256, d);
        pool.deallocate(b, (4 << 20) + 700, 256, d);
    }
}

#[test]
fn pool_honours_large_alignments() {
    let sim = Simulated::new(1 << 30);
    let pool = Pool::new(&sim, PoolConfig::default());
    let d = StreamRef::DEFAULT;
    let mut blocks = Vec::new();
    for shift in 8..=20 {
        let p = pool.allocate(300, 1 << shift, d).unwrap();
        assert_eq!(p.as_ptr() as usize % (1 << shift), 0);
        blocks.push((p, 1 << shift));
    }
    for (p, align) in blocks {
        // SAFETY: live with this size and alignment.
        unsafe { pool.deallocate(p, 300, align, d) };
    }
    assert_eq!(pool.usage().allocated, 0);
    let size = pool.usage().held;
    assert_eq!(pool.release(), size);
}

#[test]
fn pool_rejects_bad_requests_without_panicking() {
    let sim = Simulated::new(1 << 30);
    let pool = Pool::new(&sim, PoolConfig::default());
    let d = StreamRef::DEFAULT;
    let e = pool.allocate(64, 3, d).unwrap_err();
    assert!(matches!(e.kind, AllocErrorKind::InvalidArgument(_)), "{e}");
    let e = pool.allocate(usize::MAX, 1, d).unwrap_err();
    assert!(matches!(e.kind, AllocErrorKind::InvalidArgument(_)), "{e}");
    let e = pool.allocate(1 << 41, 1, d).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let z = pool.allocate(0, 4096, d).unwrap();
    assert_eq!(z.as_ptr() as usize % 4096, 0);
    // SAFETY: a zero-size block, whose deallocation is a no-op.
    unsafe { pool.deallocate(z, 0, 4096, d) };
    assert_eq!(sim.allocation_count(), 0, "nothing reached the upstream");
}

#[test]
fn pool_try_new_reports_a_failed_reservation() {
    let sim = Simulated::new(1 << 20);
    let e = Pool::try_new(
        &sim,
        PoolConfig {
            initial: 2 << 20,
            max: usize::MAX,
        },
    )
    .unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let e = Pool::try_new(
        &sim,
        PoolConfig {
            initial: 2 << 20,
            max: 1 << 20,
        },
    )
    .unwrap_err();
    assert!(matches!(e.kind, AllocErrorKind::InvalidArgument(_)), "{e}");
    // `new` (and the macro) start empty instead, and still serve what fits.
    let pool = resource_stack![&sim, Pool { initial: 2 MiB }];
    assert_eq!(pool.usage().held, 0);
    crate::support::serve_one(&pool, 1000, 256, StreamRef::DEFAULT);
    drop(pool);
    let ok = Pool::try_new(
        &sim,
        PoolConfig {
            initial: 1 << 20,
            max: 1 << 20,
        },
    )
    .unwrap();
    assert_eq!(ok.usage().held, 1 << 20);
}

#[test]
fn pool_orders_streams_before_handing_blocks_across() {
    let rec = Recorder::new(Simulated::new(1 << 30));
    let pool = Pool::new(&rec, PoolConfig::default());
    let (s, t) = (stream(1), stream(2));
    let a = pool.allocate(1000, 256, s).unwrap();
    // SAFETY: live with this size.
    unsafe { pool.deallocate(a, 1000, 256, s) };
    let b = pool.allocate(1000, 256, s).unwrap();
    assert_eq!(b, a, "same-stream reuse is immediate");
    assert!(rec.record().ordered().is_empty(), "and needs no ordering");
    // SAFETY: live with this size.
    unsafe { pool.deallocate(b, 1000, 256, s) };

    let c = pool.allocate(1000, 256, t).unwrap();
    assert_eq!(c, a, "the block freed on s goes to t");
    assert_eq!(
        rec.record().ordered(),
        [(t.id(), s.id())],
        "after t is ordered behind s, once"
    );
    let d = pool.allocate(5000, 256, t).unwrap();
    assert_eq!(
        rec.record().ordered().len(),
        1,
        "s's other free blocks came along"
    );
    // SAFETY: live with these sizes.
    unsafe {
        pool.deallocate(c, 1000, 256, t);
        pool.deallocate(d, 5000, 256, t);
    }
    let e = pool.allocate(1000, 256, t).unwrap();
    assert_eq!(rec.record().ordered().len(), 1);
    // SAFETY: live with this size.
    unsafe { pool.deallocate(e, 1000, 256, t) };
    assert_eq!(pool.usage().free_blocks, 1, "all coalesced on t");
    drop(pool);
    assert_eq!(rec.record().in_use(), 0);
}

#[test]
fn pool_keeps_streams_apart_until_ordered() {
    let rec = Recorder::new(Simulated::new(1 << 30));
    let pool = Pool::new(&rec, PoolConfig::default());
    let (s, t) = (stream(1), stream(2));
    // Two neighbouring blocks freed on different streams stay apart.
    let a = pool.allocate(1024, 256, s).unwrap();
    let b = pool.allocate(1024, 256, s).unwrap();
    let keep = pool.allocate(1024, 256, s).unwrap();
    // SAFETY: live with these sizes.
    unsafe {
        pool.deallocate(a, 1024, 256, s);
        pool.deallocate(b, 1024, 256, t);
    }
    let stats = pool.usage();
    assert_eq!(
        stats.free_blocks, 3,
        "a, b and the chunk's rest: a and b not merged"
    );
    // A request on s that fits a's hole takes it without ordering.
    let c = pool.allocate(1024, 256, s).unwrap();
    assert_eq!(c, a);
    assert!(rec.record().ordered().is_empty());
    // SAFETY: live with these sizes.
    unsafe {
        pool.deallocate(c, 1024, 256, s);
        pool.deallocate(keep, 1024, 256, s);
    }
    // Releasing a chunk whose blocks were freed on s and t orders the chunk's stream after t.
    assert_eq!(pool.release(), 2 << 20);
    assert_eq!(rec.record().ordered(), [(s.id(), t.id())]);
    assert_eq!(rec.record().in_use(), 0);
}

#[test]
fn pool_sixteen_threads_nothing_overlaps_nothing_is_lost() {
    let rec = Recorder::new(System::new());
    let config = PoolConfig {
        initial: 0,
        max: 1 << 30,
    };
    sixteen_threads(Pool::new(&rec, config), &rec, 0x9E37_79B9_7F4A_7C15);
}

#[test]
fn pool_growth_beyond_isize_max_is_out_of_memory_for_the_request() {
    // Room for it: the pool asks for at most isize::MAX bytes, and gets them.
    let sim = Simulated::new(usize::MAX);
    grow_past_isize_max(&sim).unwrap();
    assert_eq!(sim.in_use(), 0);
    // No room: out of memory for the caller's request (its size and alignment), not the
    // upstream's "invalid argument" for a chunk the caller never asked for.
    let sim = Simulated::new(7 << 60);
    let e = grow_past_isize_max(&sim).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!((e.size, e.align, e.resource), (1 << 61, 512, "Pool"));
    assert_eq!(sim.in_use(), 0);
    // An upstream short of memory for a plain growth: the caller's request again.
    let tight = Simulated::new(4 << 20);
    let pool = Pool::new(&tight, PoolConfig::default());
    let e = pool.allocate(8 << 20, 256, StreamRef::DEFAULT).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!((e.size, e.align, e.resource), (8 << 20, 256, "Pool"));
    // A reservation above isize::MAX is out of memory too.
    let sim = Simulated::new(usize::MAX);
    let config = PoolConfig {
        initial: usize::MAX,
        ..Default::default()
    };
    let e = Pool::try_new(&sim, config).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(e.size, usize::MAX);
}

/// Builds a pool over `sim` holding 3 * 2^61 bytes in two live blocks, then asks for 2^61 more:
/// doubling would take all that is left below `usize::MAX`, over `isize::MAX`.
fn grow_past_isize_max(sim: &Simulated) -> Result<(), AllocError> {
    let pool = Pool::new(sim, PoolConfig::default());
    let a = pool.allocate(1 << 61, 256, StreamRef::DEFAULT).unwrap();
    let b = pool.allocate(1 << 62, 256, StreamRef::DEFAULT).unwrap();
    assert_eq!(pool.usage().held, 3 << 61);
    let c = pool.allocate(1 << 61, 512, StreamRef::DEFAULT);
    // SAFETY: each block came from pool with this size and align.
    unsafe {
        if let Ok(c) = c {
            pool.deallocate(c, 1 << 61, 512, StreamRef::DEFAULT);
        }
        pool.deallocate(a, 1 << 61, 256, StreamRef::DEFAULT);
        pool.deallocate(b, 1 << 62, 256, StreamRef::DEFAULT);
    }
    assert!(sim.peak() <= (3 << 61) + (isize::MAX as usize));
    c.map(|_| ())
}
