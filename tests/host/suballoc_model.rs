//! Model-based property tests of the suballocators: random allocate/deallocate sequences over
//! `Simulated` (exact accounting against a model) and `System` (real bytes, pattern checks) for
//! `Pool`, `Tlsf`, `ThreadHeaps` (also with operations on several threads), `FixedSize` and
//! `Binning`.

use mrstack::prelude::*;
use mrstack::resource::align_up;
use mrstack::suballoc::{
    BinningConfig, FixedSizeConfig, PoolConfig, ThreadHeapsConfig, TlsfConfig,
};
use mrstack::testing::Recorder;
use mrstack::{
    resource::AllocErrorKind,
    suballoc::{Binning, FixedSize, Pool, ThreadHeaps, Tlsf},
};
use proptest::prelude::*;

use crate::suballoc_support::{
    cases, check_pattern, nn, on_workers, ops, stream, Block, Coalescing, Job, Live, Op,
};

/// Takes the live block `pick` chooses out of `live`, and its bytes out of `extents`; `None`
/// when nothing is live.
fn take_live(
    live: &mut Vec<Block>,
    extents: &mut Live,
    pick: prop::sample::Index,
) -> Option<Block> {
    if live.is_empty() {
        return None;
    }
    let b = live.swap_remove(pick.index(live.len()));
    if b.size > 0 {
        extents.remove(b.addr);
    }
    Some(b)
}

/// The address of a block `allocate` returned, checked to meet `align` and the 256 bytes every
/// suballocator here gives.
fn aligned_addr(p: std::ptr::NonNull<u8>, align: usize) -> Result<usize, TestCaseError> {
    let addr = p.as_ptr() as usize;
    prop_assert_eq!(addr % align.max(256), 0);
    Ok(addr)
}

fn pool_config() -> impl Strategy<Value = (usize, usize, usize)> {
    // (initial, max, upstream capacity)
    (
        prop_oneof![Just(0usize), 0..(4usize << 20)],
        prop_oneof![Just(usize::MAX), (256usize << 10)..(8 << 20)],
        prop_oneof![Just(1usize << 40), (1usize << 20)..(16 << 20)],
    )
}

/// Random allocate/deallocate sequences on three streams against a model: alignment holds, no
/// two live blocks overlap, the pool's accounting agrees with the model and with the upstream's,
/// a failure is out-of-memory only and never happens with nothing live when the request fits
/// under the cap, and everything returns to the upstream.
fn coalescing_model<P: Coalescing>(
    pool: P,
    sim: &Simulated,
    capacity: usize,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let ops = ops.into_iter().map(|op| (0, op)).collect();
    coalescing_model_by(&pool, sim, capacity, ops, 1, &|_, job| job.run(&pool))?;
    drop(pool);
    prop_assert_eq!((sim.in_use(), sim.live()), (0, 0));
    Ok(())
}

/// [`coalescing_model`]'s checks, each op run by `run` on the thread the op names (of
/// `threads`): everything but the pool's drop.
fn coalescing_model_by<P: Coalescing>(
    pool: &P,
    sim: &Simulated,
    capacity: usize,
    ops: Vec<(usize, Op)>,
    threads: usize,
    run: &dyn Fn(usize, Job) -> Result<usize, AllocError>,
) -> Result<(), TestCaseError> {
    let cap = pool.max_size().min(capacity);
    let mut live: Vec<Block> = Vec::new();
    let mut extents = Live::default();
    for (t, op) in ops {
        match op {
            Op::Alloc {
                size,
                align,
                stream: s,
            } => match run(t, Job::Alloc(size, align, stream(s))) {
                Ok(addr) => {
                    prop_assert_eq!(addr % align.max(256), 0);
                    if size > 0 {
                        extents.insert(addr, size);
                    }
                    live.push(Block { addr, size, align });
                }
                Err(e) => {
                    prop_assert!(e.is_out_of_memory(), "{e}");
                    let need = align_up(size, 256).unwrap() + align.max(256) - 256;
                    let nothing_live = live.iter().all(|b| b.size == 0);
                    prop_assert!(!(nothing_live && need <= cap), "{e} with nothing live");
                }
            },
            Op::Free { pick, stream: s } => {
                if let Some(b) = take_live(&mut live, &mut extents, pick) {
                    run(t, Job::Free(b.addr, b.size, b.align, stream(s))).unwrap();
                }
            }
        }
        let stats = pool.usage();
        let allocated: usize = live.iter().map(|b| align_up(b.size, 256).unwrap()).sum();
        prop_assert_eq!(stats.allocated, allocated);
        prop_assert_eq!(stats.held, sim.in_use());
        prop_assert_eq!(stats.chunks, sim.live());
        prop_assert!(stats.held <= pool.max_size());
    }
    for (i, b) in live.drain(..).enumerate() {
        run(
            i % threads,
            Job::Free(b.addr, b.size, b.align, StreamRef::DEFAULT),
        )
        .unwrap();
    }
    prop_assert_eq!(pool.usage().allocated, 0);
    let size = pool.usage().held;
    prop_assert_eq!(
        pool.release(),
        size,
        "every chunk is wholly free once all is freed"
    );
    prop_assert_eq!(
        pool.usage(),
        mrstack::suballoc::Usage {
            peak_held: pool.usage().peak_held,
            ..Default::default()
        }
    );
    Ok(())
}

/// The same sequences over real host memory: each block is filled with its own byte, and
/// checked when freed, so an overlap or a block handed out twice shows up as a wrong byte.
fn coalescing_patterns<P: Coalescing>(
    pool: P,
    rec: &Recorder<System>,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let mut live: Vec<(Block, u8)> = Vec::new();
    let mut tag = 0u8;
    for op in ops {
        match op {
            Op::Alloc {
                size,
                align,
                stream: s,
            } => {
                if let Ok(p) = pool.allocate(size, align, stream(s)) {
                    prop_assert_eq!(p.as_ptr() as usize % align.max(256), 0);
                    tag = tag.wrapping_add(1);
                    // SAFETY: p is a live host block of at least `size` bytes.
                    unsafe { p.as_ptr().write_bytes(tag, size) };
                    live.push((
                        Block {
                            addr: p.as_ptr() as usize,
                            size,
                            align,
                        },
                        tag,
                    ));
                }
            }
            Op::Free { pick, stream: s } => {
                if !live.is_empty() {
                    let (b, t) = live.swap_remove(pick.index(live.len()));
                    check_pattern(b.addr, b.size, t);
                    // SAFETY: b is live, from this pool, with this size and alignment.
                    unsafe { pool.deallocate(nn(b.addr), b.size, b.align, stream(s)) };
                }
            }
        }
    }
    for (b, t) in live {
        check_pattern(b.addr, b.size, t);
        // SAFETY: b is live, from this pool, with this size and alignment.
        unsafe { pool.deallocate(nn(b.addr), b.size, b.align, StreamRef::DEFAULT) };
    }
    drop(pool);
    prop_assert_eq!(rec.record().in_use(), 0);
    Ok(())
}

fn pattern_max() -> impl Strategy<Value = usize> {
    prop_oneof![Just(usize::MAX), (256usize << 10)..(4 << 20)]
}

proptest! {
    #![proptest_config(cases(10_000))]

    #[test]
    fn pool_model((initial, max, capacity) in pool_config(), ops in ops(1 << 20)) {
        let sim = Simulated::new(capacity);
        coalescing_model(Pool::new(&sim, PoolConfig { initial, max }), &sim, capacity, ops)?;
    }

    #[test]
    fn tlsf_model((initial, max, capacity) in pool_config(), ops in ops(1 << 20)) {
        let sim = Simulated::new(capacity);
        coalescing_model(Tlsf::new(&sim, TlsfConfig { initial, max }), &sim, capacity, ops)?;
    }

    #[test]
    fn thread_heaps_model((_, max, capacity) in pool_config(), ops in ops(1 << 20)) {
        let sim = Simulated::new(capacity);
        coalescing_model(ThreadHeaps::new(&sim, ThreadHeapsConfig { max }), &sim, capacity, ops)?;
    }
}

proptest! {
    #![proptest_config(cases(2_000))]

    #[test]
    fn pool_system_patterns(max in pattern_max(), ops in ops(256 << 10)) {
        let rec = Recorder::new(System::new());
        coalescing_patterns(Pool::new(&rec, PoolConfig { initial: 0, max }), &rec, ops)?;
    }

    #[test]
    fn tlsf_system_patterns(max in pattern_max(), ops in ops(256 << 10)) {
        let rec = Recorder::new(System::new());
        coalescing_patterns(Tlsf::new(&rec, TlsfConfig { initial: 0, max }), &rec, ops)?;
    }

    #[test]
    fn thread_heaps_system_patterns(max in pattern_max(), ops in ops(256 << 10)) {
        let rec = Recorder::new(System::new());
        coalescing_patterns(ThreadHeaps::new(&rec, ThreadHeapsConfig { max }), &rec, ops)?;
    }
}

/// Random sequences whose operations run on three threads, each with a heap of its own, a block
/// freed by any of them: no two live blocks overlap, the heaps' accounting agrees with the model
/// and with the upstream's, the cap holds, and everything returns to the upstream.
fn thread_heaps_threads_model(
    max: usize,
    capacity: usize,
    ops: Vec<(usize, Op)>,
) -> Result<(), TestCaseError> {
    let sim = Simulated::new(capacity);
    let heaps = ThreadHeaps::new(&sim, ThreadHeapsConfig { max });
    let mut result = Ok(());
    on_workers(&heaps, 3, |run| {
        result = coalescing_model_by(&heaps, &sim, capacity, ops, 3, run);
    });
    result?;
    drop(heaps);
    prop_assert_eq!((sim.in_use(), sim.live()), (0, 0));
    Ok(())
}

proptest! {
    #![proptest_config(cases(1_000))]

    #[test]
    fn thread_heaps_threads_match_the_model(
        (_, max, capacity) in pool_config(),
        ops in ops(1 << 20).prop_flat_map(|ops| {
            let n = ops.len();
            (Just(ops), prop::collection::vec(0..3usize, n))
        }).prop_map(|(ops, threads)| threads.into_iter().zip(ops).collect::<Vec<_>>()),
    ) {
        thread_heaps_threads_model(max, capacity, ops)?;
    }
}

proptest! {
    #![proptest_config(cases(10_000))]

    /// Random sequences against a model: each block is a whole block-sized extent, aligned, not
    /// overlapping any other; free plus live blocks are all the blocks taken; larger or
    /// over-aligned requests are refused; everything returns to the upstream.
    #[test]
    fn fixed_size_model(
        block in 1usize..(64 << 10),
        prealloc in 0usize..8,
        capacity in prop_oneof![Just(1usize << 40), (64usize << 10)..(4 << 20)],
        ops in ops(96 << 10),
    ) {
        let sim = Simulated::new(capacity);
        let mr = FixedSize::new(&sim, FixedSizeConfig { block_size: block, blocks_to_preallocate: prealloc });
        let bs = mr.block_size();
        prop_assert_eq!(bs, align_up(block, 256).unwrap());
        let mut live: Vec<Block> = Vec::new();
        let mut extents = Live::default();
        for op in ops {
            match op {
                Op::Alloc { size, align, stream: s } => match mr.allocate(size, align, stream(s)) {
                    Ok(p) => {
                        let addr = aligned_addr(p, align)?;
                        prop_assert!(size <= bs);
                        if size > 0 {
                            extents.insert(addr, bs);
                        }
                        live.push(Block { addr, size, align });
                    }
                    Err(e) => {
                        if size > bs {
                            prop_assert!(matches!(e.kind, AllocErrorKind::InvalidArgument(_)), "{e}");
                        } else if align > 256 {
                            prop_assert!(matches!(e.kind, AllocErrorKind::Unsupported(_)), "{e}");
                        } else {
                            prop_assert!(e.is_out_of_memory(), "{e}");
                            prop_assert_eq!(mr.usage().free_blocks, 0);
                            prop_assert!(capacity - sim.in_use() < bs, "the upstream had room for a block");
                        }
                    }
                },
                Op::Free { pick, stream: s } => {
                    if let Some(b) = take_live(&mut live, &mut extents, pick) {
                        // SAFETY: b is live, from this resource, with this size and alignment.
                        unsafe { mr.deallocate(nn(b.addr), b.size, b.align, stream(s)) };
                    }
                }
            }
            let nonzero = live.iter().filter(|b| b.size > 0).count();
            prop_assert_eq!(mr.usage().held, sim.in_use());
            prop_assert_eq!(mr.usage().free_blocks + nonzero, mr.usage().held / bs);
        }
        for b in live {
            // SAFETY: b is live, from this resource, with this size and alignment.
            unsafe { mr.deallocate(nn(b.addr), b.size, b.align, StreamRef::DEFAULT) };
        }
        prop_assert_eq!(mr.usage().free_blocks, mr.usage().held / bs);
        drop(mr);
        prop_assert_eq!((sim.in_use(), sim.live()), (0, 0));
    }
}

proptest! {
    #![proptest_config(cases(10_000))]

    /// Random sequences against a model, with bins between random bounds and requests above them
    /// and over-aligned: alignment holds, blocks do not overlap, the upstream holds exactly the
    /// bins' chunks plus the requests passed through, and everything returns to it.
    #[test]
    fn binning_model(
        min_shift in 0u32..14,
        bins in 0u32..6,
        capacity in prop_oneof![Just(1usize << 40), (1usize << 20)..(32 << 20)],
        ops in ops(1 << 20),
    ) {
        let sim = Simulated::new(capacity);
        let mr = Binning::new(&sim, BinningConfig { min: 1 << min_shift, max: 1 << (min_shift + bins) });
        let sizes = mr.bin_sizes();
        let max_bin = sizes.last().copied().unwrap_or(0);
        let mut live: Vec<Block> = Vec::new();
        let mut extents = Live::default();
        let passed = |b: &Block| b.size > max_bin || b.align > 256;
        for op in ops {
            match op {
                Op::Alloc { size, align, stream: s } => match mr.allocate(size, align, stream(s)) {
                    Ok(p) => {
                        let addr = aligned_addr(p, align)?;
                        if size > 0 {
                            let b = Block { addr, size, align };
                            let len = if passed(&b) { size } else { *sizes.iter().find(|&&s| s >= size).unwrap() };
                            extents.insert(addr, len);
                        }
                        live.push(Block { addr, size, align });
                    }
                    Err(e) => prop_assert!(e.is_out_of_memory(), "{e}"),
                },
                Op::Free { pick, stream: s } => {
                    if let Some(b) = take_live(&mut live, &mut extents, pick) {
                        // SAFETY: b is live, from this resource, with this size and alignment.
                        unsafe { mr.deallocate(nn(b.addr), b.size, b.align, stream(s)) };
                    }
                }
            }
            let direct: usize = live.iter().filter(|b| b.size > 0 && passed(b)).map(|b| b.size).sum();
            prop_assert_eq!(sim.in_use(), mr.usage().held + direct);
        }
        for b in live {
            // SAFETY: b is live, from this resource, with this size and alignment.
            unsafe { mr.deallocate(nn(b.addr), b.size, b.align, StreamRef::DEFAULT) };
        }
        prop_assert_eq!(sim.in_use(), mr.usage().held);
        drop(mr);
        prop_assert_eq!((sim.in_use(), sim.live()), (0, 0));
    }
}
