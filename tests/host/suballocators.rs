//! Host tests of the suballocators `Pool`, `Tlsf`, `ThreadHeaps`, `FixedSize` and `Binning`:
//! model-based property tests over `Simulated` (exact accounting) and `System` (real bytes,
//! pattern checks), stream ordering with a recording upstream, out of memory and recovery, and a
//! 16-thread stress test.

use mrstack::prelude::*;
use mrstack::resource::{align_up, GrowInPlace};
use mrstack::suballoc::{
    BinningConfig, FixedSizeConfig, PoolConfig, ThreadHeapsConfig, TlsfConfig,
};
use mrstack::testing::Recorder;
use mrstack::{
    adaptor::{Limiting, Retry, Statistics},
    resource::AllocErrorKind,
    suballoc::{Arena, Binning, FixedSize, Pool, ThreadHeaps, Tlsf},
};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Arc;

// ---------------------------------------------------------------------------------------------
// Helpers

/// A simulated stream (0 is the default stream).
fn stream(n: usize) -> StreamRef<'static> {
    StreamRef::simulated(n as u32)
}

/// Live blocks by address, for overlap checks: `[addr, addr + len)`.
#[derive(Default)]
struct Live(BTreeMap<usize, usize>);

impl Live {
    /// Records a block, panicking if it overlaps a live one.
    fn insert(&mut self, addr: usize, len: usize) {
        if let Some((&a, &l)) = self.0.range(..=addr).next_back() {
            assert!(a + l <= addr, "block {addr:#x}+{len} overlaps {a:#x}+{l}");
        }
        if let Some((&a, &l)) = self.0.range(addr..).next() {
            assert!(addr + len <= a, "block {addr:#x}+{len} overlaps {a:#x}+{l}");
        }
        self.0.insert(addr, len);
    }
    fn remove(&mut self, addr: usize) {
        self.0
            .remove(&addr)
            .expect("freeing a block that is not live");
    }
}

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        size: usize,
        align: usize,
        stream: usize,
    },
    Free {
        pick: prop::sample::Index,
        stream: usize,
    },
}

/// Up to 64 operations, sizes mostly small, some large, alignments 1 to 4096, three streams.
fn ops(max_size: usize) -> impl Strategy<Value = Vec<Op>> {
    let size = prop_oneof![
        2 => 0..=1024usize,
        3 => 1..=max_size / 8,
        1 => 1..=max_size,
    ];
    let op = prop_oneof![
        3 => (size, 0..=12u32, 0..3usize).prop_map(|(size, a, stream)| Op::Alloc {
            size,
            align: 1 << a,
            stream
        }),
        2 => (any::<prop::sample::Index>(), 0..3usize)
            .prop_map(|(pick, stream)| Op::Free { pick, stream }),
    ];
    prop::collection::vec(op, 1..64)
}

fn cases(n: u32) -> ProptestConfig {
    ProptestConfig {
        cases: n,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn nn(addr: usize) -> NonNull<u8> {
    NonNull::new(addr as *mut u8).unwrap()
}

/// A live allocation in a model test.
#[derive(Debug, Clone, Copy)]
struct Block {
    addr: usize,
    size: usize,
    align: usize,
}

// ---------------------------------------------------------------------------------------------
// Pool

fn pool_config() -> impl Strategy<Value = (usize, usize, usize)> {
    // (initial, max, upstream capacity)
    (
        prop_oneof![Just(0usize), 0..(4usize << 20)],
        prop_oneof![Just(usize::MAX), (256usize << 10)..(8 << 20)],
        prop_oneof![Just(1usize << 40), (1usize << 20)..(16 << 20)],
    )
}

/// What the model tests read of the two coalescing pools, `Pool` and `Tlsf`.
trait Coalescing: MemoryResource {
    fn usage(&self) -> mrstack::suballoc::Usage;
    fn max_size(&self) -> usize;
    fn release(&self) -> usize;
}

impl<U: MemoryResource> Coalescing for Pool<U> {
    fn usage(&self) -> mrstack::suballoc::Usage {
        Pool::usage(self)
    }
    fn max_size(&self) -> usize {
        Pool::max_size(self)
    }
    fn release(&self) -> usize {
        Pool::release(self)
    }
}

impl<U: MemoryResource> Coalescing for Tlsf<U> {
    fn usage(&self) -> mrstack::suballoc::Usage {
        Tlsf::usage(self)
    }
    fn max_size(&self) -> usize {
        Tlsf::max_size(self)
    }
    fn release(&self) -> usize {
        Tlsf::release(self)
    }
}

impl<U: MemoryResource> Coalescing for ThreadHeaps<U> {
    fn usage(&self) -> mrstack::suballoc::Usage {
        ThreadHeaps::usage(self)
    }
    fn max_size(&self) -> usize {
        ThreadHeaps::max_size(self)
    }
    fn release(&self) -> usize {
        ThreadHeaps::release(self)
    }
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

/// What a model op asks of the resource: an allocation (size, alignment, stream) or a free
/// (address, size, alignment, stream).
enum Job {
    Alloc(usize, usize, StreamRef<'static>),
    Free(usize, usize, usize, StreamRef<'static>),
}

impl Job {
    /// Runs the job on `mr`: the address allocated (0 for a free).
    fn run<R: MemoryResource>(self, mr: &R) -> Result<usize, AllocError> {
        match self {
            Job::Alloc(size, align, s) => mr.allocate(size, align, s).map(|p| p.as_ptr() as usize),
            Job::Free(addr, size, align, s) => {
                // SAFETY: the model frees only live blocks of `mr`, with their size and
                // alignment.
                unsafe { mr.deallocate(nn(addr), size, align, s) };
                Ok(0)
            }
        }
    }
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
                if !live.is_empty() {
                    let b = live.swap_remove(pick.index(live.len()));
                    if b.size > 0 {
                        extents.remove(b.addr);
                    }
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

/// Panics unless the `size` bytes at `addr` all hold `tag`.
fn check_pattern(addr: usize, size: usize, tag: u8) {
    if size == 0 {
        return;
    }
    // SAFETY: the caller passes a live host block of `size` bytes that it filled.
    let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, size) };
    assert!(
        bytes == vec![tag; size].as_slice(),
        "block {addr:#x}+{size} was overwritten"
    );
}

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
    let pool = Pool::new(
        &sim,
        PoolConfig {
            initial: 1 << 20,
            max: 1 << 20,
        },
    );
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
    let pool = Pool::new(
        &sim,
        PoolConfig {
            initial: 0,
            max: 4 << 20,
        },
    );
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
    let pool = Pool::new(
        &sim,
        PoolConfig {
            initial: 0,
            max: 1 << 20,
        },
    );
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
    let all = pool.allocate(1 << 20, 256, d).unwrap();
    // SAFETY: live with this size.
    unsafe { pool.deallocate(all, 1 << 20, 256, d) };
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
    let p = pool.allocate(1000, 256, StreamRef::DEFAULT).unwrap();
    // SAFETY: live with this size.
    unsafe { pool.deallocate(p, 1000, 256, StreamRef::DEFAULT) };
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

/// 16 threads allocate, fill, check and free random blocks through `mr`, half on the default
/// stream and half on their own: a block whose bytes changed while it was live proves an overlap.
/// `pick` draws a request's size and alignment from a random number.
fn hammer<R: MemoryResource + Sync>(
    mr: &R,
    seed: u64,
    pick: impl Fn(&mut dyn FnMut() -> u64) -> (usize, usize) + Sync,
) {
    std::thread::scope(|scope| {
        for t in 0..16usize {
            let pick = &pick;
            scope.spawn(move || {
                let s = if t % 2 == 0 {
                    StreamRef::DEFAULT
                } else {
                    stream(t)
                };
                let mut rng = seed ^ (t as u64 + 1);
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut live: Vec<(NonNull<u8>, usize, usize, u8)> = Vec::new();
                for i in 0..1500usize {
                    if live.len() < 24 && next() % 8 < 5 {
                        let (size, align) = pick(&mut next);
                        let p = mr
                            .allocate(size, align, s)
                            .expect("room for 16 x 24 blocks");
                        assert_eq!(p.as_ptr() as usize % align.max(256), 0);
                        let tag = (t * 16 + i % 16) as u8;
                        // SAFETY: p is a live host block of at least `size` bytes.
                        unsafe { p.as_ptr().write_bytes(tag, size) };
                        live.push((p, size, align, tag));
                    } else if !live.is_empty() {
                        let (p, size, align, tag) = live.swap_remove(next() as usize % live.len());
                        check_pattern(p.as_ptr() as usize, size, tag);
                        // SAFETY: p is live, from `mr`, with this size and alignment.
                        unsafe { mr.deallocate(p, size, align, s) };
                    }
                }
                for (p, size, align, tag) in live {
                    check_pattern(p.as_ptr() as usize, size, tag);
                    // SAFETY: as above.
                    unsafe { mr.deallocate(p, size, align, s) };
                }
            });
        }
    });
}

/// 16 threads through a coalescing pool over host memory (`hammer`), then every chunk comes back
/// whole.
fn sixteen_threads<P: Coalescing + Sync>(pool: P, rec: &Recorder<System>, seed: u64) {
    hammer(&pool, seed, |next| {
        let size = match next() % 16 {
            0 => (next() % (1 << 20)) as usize + 1,
            _ => (next() % 8192) as usize + 1,
        };
        (size, 1 << (next() % 13))
    });
    assert_eq!(pool.usage().allocated, 0);
    let size = pool.usage().held;
    assert_eq!(pool.release(), size, "every chunk came back whole");
    drop(pool);
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

// ---------------------------------------------------------------------------------------------
// Tlsf

#[test]
fn tlsf_sixteen_threads_nothing_overlaps_nothing_is_lost() {
    let rec = Recorder::new(System::new());
    let config = TlsfConfig {
        initial: 0,
        max: 1 << 30,
    };
    sixteen_threads(Tlsf::new(&rec, config), &rec, 0x2545_F491_4F6C_DD1D);
}

#[test]
fn tlsf_orders_a_stream_before_each_block_it_takes_across() {
    let rec = Recorder::new(Simulated::new(1 << 30));
    let tlsf = Tlsf::new(&rec, TlsfConfig::default());
    let (s, t) = (stream(1), stream(2));
    let a = tlsf.allocate(1000, 256, s).unwrap();
    let keep = tlsf.allocate(1000, 256, s).unwrap();
    // SAFETY: live with this size.
    unsafe { tlsf.deallocate(a, 1000, 256, s) };
    let b = tlsf.allocate(1000, 256, s).unwrap();
    assert_eq!(b, a, "same-stream reuse is immediate");
    assert!(rec.record().ordered().is_empty(), "and needs no ordering");
    // SAFETY: live with this size.
    unsafe { tlsf.deallocate(b, 1000, 256, s) };
    // t has no block of its own: it takes one of s's, once ordered after s.
    let c = tlsf.allocate(1000, 256, t).unwrap();
    assert_eq!(rec.record().ordered(), [(t.id(), s.id())]);
    // SAFETY: live with these sizes.
    unsafe {
        tlsf.deallocate(c, 1000, 256, t);
        tlsf.deallocate(keep, 1000, 256, s);
    }
    // c's block is t's now: t reuses it without ordering again.
    let d = tlsf.allocate(1000, 256, t).unwrap();
    assert_eq!(d, c);
    assert_eq!(rec.record().ordered().len(), 1);
    // SAFETY: live with this size.
    unsafe { tlsf.deallocate(d, 1000, 256, t) };
    let held = tlsf.usage().held;
    assert_eq!(tlsf.release(), held);
    drop(tlsf);
    assert_eq!(rec.record().in_use(), 0);
}

#[test]
fn tlsf_fits_a_request_within_its_class_and_splits_the_rest() {
    let sim = Simulated::new(1 << 30);
    let tlsf = Tlsf::new(
        &sim,
        TlsfConfig {
            initial: 4 << 20,
            max: 4 << 20,
        },
    );
    // Holes of 96 KiB, 64 KiB and 72 KiB, kept apart by live blocks.
    let sizes = [96 << 10, 4096, 64 << 10, 4096, 72 << 10, 4096];
    let blocks: Vec<_> = sizes
        .iter()
        .map(|&n| tlsf.allocate(n, 256, StreamRef::DEFAULT).unwrap())
        .collect();
    for i in [0, 2, 4] {
        // SAFETY: live with this size.
        unsafe { tlsf.deallocate(blocks[i], sizes[i], 256, StreamRef::DEFAULT) };
    }
    // 70 KiB: the 72 KiB hole (the closest in its own class), not the first or the largest.
    let p = tlsf.allocate(70 << 10, 256, StreamRef::DEFAULT).unwrap();
    assert_eq!(p, blocks[4]);
    // 64 KiB exactly: the 64 KiB hole.
    let q = tlsf.allocate(64 << 10, 256, StreamRef::DEFAULT).unwrap();
    assert_eq!(q, blocks[2]);
    // SAFETY: live with these sizes.
    unsafe {
        tlsf.deallocate(p, 70 << 10, 256, StreamRef::DEFAULT);
        tlsf.deallocate(q, 64 << 10, 256, StreamRef::DEFAULT);
        for i in [1, 3, 5] {
            tlsf.deallocate(blocks[i], sizes[i], 256, StreamRef::DEFAULT);
        }
    }
    let u = tlsf.usage();
    assert_eq!((u.allocated, u.free_blocks, u.chunks), (0, 1, 1), "{u:?}");
}

#[test]
fn tlsf_at_its_maximum_is_out_of_memory_and_recovers() {
    let sim = Simulated::new(1 << 30);
    let tlsf = Tlsf::new(
        &sim,
        TlsfConfig {
            initial: 0,
            max: 4 << 20,
        },
    );
    let a = tlsf.allocate(3 << 20, 256, StreamRef::DEFAULT).unwrap();
    let err = tlsf.allocate(2 << 20, 256, StreamRef::DEFAULT).unwrap_err();
    assert!(err.is_out_of_memory());
    assert!(err.to_string().contains("Tlsf: out of memory"), "{err}");
    // SAFETY: live with this size.
    unsafe { tlsf.deallocate(a, 3 << 20, 256, StreamRef::DEFAULT) };
    let b = tlsf.allocate(4 << 20, 256, StreamRef::DEFAULT).unwrap();
    // SAFETY: live with this size.
    unsafe { tlsf.deallocate(b, 4 << 20, 256, StreamRef::DEFAULT) };
    assert!(tlsf
        .allocate(1 << 40, 256, StreamRef::DEFAULT)
        .unwrap_err()
        .is_out_of_memory());
    let bad = tlsf.allocate(64, 3, StreamRef::DEFAULT).unwrap_err();
    assert!(
        matches!(bad.kind, AllocErrorKind::InvalidArgument(_)),
        "{bad}"
    );
    drop(tlsf);
    assert_eq!(sim.in_use(), 0);
}

#[test]
fn tlsf_forgets_idle_streams() {
    let sim = Simulated::new(1 << 30);
    let tlsf = Tlsf::new(&sim, TlsfConfig::default());
    for round in 0..200u32 {
        let s = StreamRef::simulated(round + 1).to_handle();
        let p = tlsf.allocate(4096, 256, s.as_ref()).unwrap();
        // SAFETY: live with this size.
        unsafe { tlsf.deallocate(p, 4096, 256, s.as_ref()) };
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

// ---------------------------------------------------------------------------------------------
// ThreadHeaps

#[test]
fn thread_heaps_sixteen_threads_nothing_overlaps_nothing_is_lost() {
    let rec = Recorder::new(System::new());
    let heaps = ThreadHeaps::new(&rec, ThreadHeapsConfig { max: 1 << 30 });
    sixteen_threads(&heaps, &rec, 0x6A09_E667_F3BC_C908);
    assert!(heaps.heaps() >= 2, "the threads had heaps of their own");
}

impl<P: Coalescing> Coalescing for &P {
    fn usage(&self) -> mrstack::suballoc::Usage {
        (**self).usage()
    }
    fn max_size(&self) -> usize {
        (**self).max_size()
    }
    fn release(&self) -> usize {
        (**self).release()
    }
}

/// Runs `body` with a function that has worker thread `t` (of `n`) run a job on `mr` and
/// returns the address it allocated (0 for a failure or a free).
fn on_workers<R: MemoryResource + Sync>(
    mr: &R,
    n: usize,
    body: impl FnOnce(&dyn Fn(usize, Job) -> Result<usize, AllocError>),
) {
    use std::sync::mpsc;
    std::thread::scope(|s| {
        let mut senders = Vec::new();
        for _ in 0..n {
            let (tx, rx) = mpsc::channel::<(Job, mpsc::Sender<Result<usize, AllocError>>)>();
            senders.push(tx);
            s.spawn(move || {
                for (job, answer) in rx {
                    answer.send(job.run(mr)).unwrap();
                }
            });
        }
        let run = |t: usize, job: Job| {
            let (tx, rx) = mpsc::channel();
            senders[t].send((job, tx)).unwrap();
            rx.recv().unwrap()
        };
        body(&run);
        drop(senders);
    });
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

#[test]
fn thread_heaps_outlive_their_threads_and_serve_more_threads_than_slots() {
    // A hostile caller's day: 80 threads (more than the 64 slots of their own) allocate and
    // exit, leaving their blocks to be freed by this thread and their heaps to the next threads;
    // one block is leaked outright. Nothing overlaps, every byte is what its owner wrote, and
    // dropping the heaps with the leaked block live gives back no chunk under it.
    let rec = Recorder::new(System::new());
    let heaps = ThreadHeaps::new(&rec, ThreadHeapsConfig { max: 1 << 30 });
    let blocks: Vec<(usize, usize, u8)> = std::thread::scope(|s| {
        let spawned: Vec<_> = (0..80u8)
            .map(|t| {
                let heaps = &heaps;
                s.spawn(move || {
                    let size = 4096 * (1 + usize::from(t % 7));
                    let p = heaps.allocate(size, 256, StreamRef::DEFAULT).unwrap();
                    // SAFETY: a live block of `size` bytes of host memory, this thread's alone.
                    unsafe { p.as_ptr().write_bytes(t, size) };
                    (p.as_ptr() as usize, size, t)
                })
            })
            .collect();
        spawned.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut extents = Live::default();
    for &(addr, size, _) in &blocks {
        extents.insert(addr, size);
    }
    let (leaked, rest) = blocks.split_first().unwrap();
    for &(addr, size, t) in rest {
        // SAFETY: written above by the thread that allocated it, which has exited.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, size) };
        assert!(
            bytes.iter().all(|&b| b == t),
            "thread {t}'s block was overwritten"
        );
        // SAFETY: live, from `heaps`, with this size.
        unsafe { heaps.deallocate(nn(addr), size, 256, StreamRef::DEFAULT) };
    }
    assert_eq!(heaps.usage().allocated, leaked.1);
    drop(heaps);
    assert!(
        rec.record().in_use() > 0,
        "the chunk under the leaked block stays with the upstream's caller"
    );
}

#[test]
fn thread_heaps_give_a_block_back_to_the_heap_it_came_from() {
    let rec = Recorder::new(Simulated::new(1 << 30));
    let heaps = ThreadHeaps::new(&rec, ThreadHeapsConfig::default());
    on_workers(&heaps, 1, |run| {
        let a = run(0, Job::Alloc(4096, 256, stream(0))).unwrap();
        // Freed here, on this thread (whose heap is made by its own request first).
        let mine = heaps.allocate(4096, 256, StreamRef::DEFAULT).unwrap();
        // SAFETY: live blocks of `heaps` with this size.
        unsafe { heaps.deallocate(nn(a), 4096, 256, StreamRef::DEFAULT) };
        assert_eq!(heaps.heaps(), 2);
        // The worker's heap has it back: its next request of that size gets it, with no
        // ordering (same stream) and no new chunk.
        let chunks = rec.record().live();
        assert_eq!(run(0, Job::Alloc(4096, 256, stream(0))).unwrap(), a);
        assert_eq!(rec.record().live(), chunks);
        run(0, Job::Free(a, 4096, 256, stream(0))).unwrap();
        // SAFETY: as above.
        unsafe { heaps.deallocate(mine, 4096, 256, StreamRef::DEFAULT) };
    });
    assert_eq!(heaps.usage().allocated, 0);
    drop(heaps);
    assert_eq!(rec.record().in_use(), 0);
}

#[test]
fn thread_heaps_take_back_other_heaps_free_chunks_at_the_cap() {
    let sim = Simulated::new(1 << 30);
    let heaps = ThreadHeaps::new(&sim, ThreadHeapsConfig { max: 8 << 20 });
    on_workers(&heaps, 1, |run| {
        // The worker's heap keeps a chunk of 6 MiB or more (its growth rule), wholly free.
        let a = run(0, Job::Alloc(6 << 20, 256, stream(0))).unwrap();
        run(0, Job::Free(a, 6 << 20, 256, stream(0))).unwrap();
        assert!(heaps.usage().held >= 6 << 20);
        // This thread's heap needs 6 MiB too: only once the worker's chunk went back.
        let b = heaps.allocate(6 << 20, 256, StreamRef::DEFAULT).unwrap();
        assert!(sim.in_use() <= 8 << 20);
        // Over the cap with everything live: out of memory, named.
        let err = run(0, Job::Alloc(4 << 20, 256, stream(0))).unwrap_err();
        assert!(err.is_out_of_memory());
        assert!(
            err.to_string().contains("ThreadHeaps: out of memory"),
            "{err}"
        );
        // SAFETY: live with this size.
        unsafe { heaps.deallocate(b, 6 << 20, 256, StreamRef::DEFAULT) };
        let c = run(0, Job::Alloc(4 << 20, 256, stream(0))).unwrap();
        run(0, Job::Free(c, 4 << 20, 256, stream(0))).unwrap();
    });
    drop(heaps);
    assert_eq!(sim.in_use(), 0);
}

/// An upstream that panics once on its next `allocate` or `deallocate` when armed for it, before
/// reaching the `Simulated` inside (safe code: a panic, no lie; the memory stays its own).
struct PanicsOnce {
    inner: Recorder<Simulated>,
    on_allocate: std::sync::atomic::AtomicBool,
    on_deallocate: std::sync::atomic::AtomicBool,
}

impl PanicsOnce {
    fn new() -> Self {
        PanicsOnce {
            inner: Recorder::new(Simulated::new(1 << 30)),
            on_allocate: Default::default(),
            on_deallocate: Default::default(),
        }
    }
}

// SAFETY: forwards everything unchanged, or panics before reaching the inner resource.
unsafe impl MemoryResource for PanicsOnce {
    type Host = <Simulated as MemoryResource>::Host;
    type Device = <Simulated as MemoryResource>::Device;
    type Managed = <Simulated as MemoryResource>::Managed;
    type Pageable = <Simulated as MemoryResource>::Pageable;
    type Alignment = <Simulated as MemoryResource>::Alignment;
    fn allocate(&self, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>, AllocError> {
        if self
            .on_allocate
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            panic!("the upstream's allocate panics (expected by the test)");
        }
        self.inner.allocate(size, align, s)
    }
    unsafe fn deallocate(&self, p: NonNull<u8>, size: usize, align: usize, s: StreamRef) {
        if self
            .on_deallocate
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            panic!("the upstream's deallocate panics (expected by the test)");
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.deallocate(p, size, align, s) }
    }
    fn synchronize(&self, s: StreamRef) -> Result<(), AllocError> {
        self.inner.synchronize(s)
    }
    fn order_after(&self, s: StreamRef, a: StreamRef) -> Result<(), AllocError> {
        self.inner.order_after(s, a)
    }
}

#[test]
fn thread_heaps_keep_their_cap_after_an_upstream_panics() {
    // The cap counted before the upstream call is given back when the upstream panics.
    let up = PanicsOnce::new();
    up.on_allocate
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let heaps = ThreadHeaps::new(&up, ThreadHeapsConfig { max: 4 << 20 });
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        heaps.allocate(1 << 20, 256, StreamRef::DEFAULT)
    }));
    assert!(r.is_err(), "the upstream's panic comes through");
    assert_eq!((heaps.usage().held, up.inner.record().in_use()), (0, 0));
    // Nothing is held: the whole cap is there.
    let p = heaps.allocate(4 << 20, 256, StreamRef::DEFAULT).unwrap();
    // SAFETY: live with this size.
    unsafe { heaps.deallocate(p, 4 << 20, 256, StreamRef::DEFAULT) };
    drop(heaps);
    assert_eq!(up.inner.record().in_use(), 0);
}

#[test]
fn thread_heaps_report_only_what_the_upstream_gave() {
    // A refused request does not count in the peak.
    let sim = Simulated::new(1 << 20);
    let heaps = ThreadHeaps::new(&sim, ThreadHeapsConfig::default());
    let p = heaps.allocate(256, 256, StreamRef::DEFAULT).unwrap();
    assert!(heaps.allocate(1 << 20, 256, StreamRef::DEFAULT).is_err());
    let u = heaps.usage();
    assert!(
        u.peak_held <= sim.capacity() && u.held == sim.in_use(),
        "{u:?}"
    );
    // SAFETY: live with this size.
    unsafe { heaps.deallocate(p, 256, 256, StreamRef::DEFAULT) };
}

#[test]
fn thread_heaps_under_a_small_cap_serve_every_thread() {
    // The first heap must not take the whole cap for 256 bytes (as a growth rule reading its own
    // bytes against the cap would) and leave the second thread's 256 bytes refused. Each heap
    // takes 2 MiB at least from the shared pool: three of them fit under 8 MiB.
    let sim = Simulated::new(1 << 30);
    let heaps = ThreadHeaps::new(&sim, ThreadHeapsConfig { max: 8 << 20 });
    on_workers(&heaps, 2, |run| {
        let a = run(0, Job::Alloc(256, 256, stream(0))).unwrap();
        let b = run(1, Job::Alloc(256, 256, stream(0))).unwrap();
        let c = heaps.allocate(256, 256, StreamRef::DEFAULT).unwrap();
        assert_eq!(heaps.heaps(), 3);
        assert!(sim.in_use() <= 8 << 20);
        run(0, Job::Free(a, 256, 256, stream(0))).unwrap();
        run(1, Job::Free(b, 256, 256, stream(0))).unwrap();
        // SAFETY: live with this size.
        unsafe { heaps.deallocate(c, 256, 256, StreamRef::DEFAULT) };
    });
}

#[test]
fn a_panicking_upstream_free_loses_no_other_chunk() {
    // A panic giving back one free chunk in `release` loses none of the others for good (the
    // pools' shared growth rules: Pool, Tlsf, ThreadHeaps).
    let up = PanicsOnce::new();
    let heaps = ThreadHeaps::new(&up, ThreadHeapsConfig::default());
    // Three upstream chunks in the shared pool (each request larger than what is free).
    let sizes = [2 << 20, 4 << 20, 16 << 20];
    let blocks: Vec<_> = sizes
        .iter()
        .map(|&n| heaps.allocate(n, 256, StreamRef::DEFAULT).unwrap())
        .collect();
    for (&p, &n) in blocks.iter().zip(&sizes) {
        // SAFETY: live with this size.
        unsafe { heaps.deallocate(p, n, 256, StreamRef::DEFAULT) };
    }
    assert_eq!(up.inner.record().live(), 3);
    up.on_deallocate
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| heaps.release()));
    assert!(r.is_err());
    heaps.release();
    drop(heaps);
    // The chunk whose free panicked is the upstream's own to lose; none other is live.
    assert_eq!(up.inner.record().live(), 1);
}

#[test]
fn a_panicking_upstream_free_at_drop_loses_no_other_chunk_of_a_bin() {
    // A panic giving back one chunk at FixedSize's or Binning's drop loses none of the rest (nor
    // any later bin's).
    let d = StreamRef::DEFAULT;
    let up = PanicsOnce::new();
    let fixed = FixedSize::new(
        &up,
        FixedSizeConfig {
            block_size: 4096,
            blocks_to_preallocate: 1,
        },
    );
    // Three chunks of one block each, all free again.
    let blocks: Vec<_> = (0..3)
        .map(|_| fixed.allocate(4096, 256, d).unwrap())
        .collect();
    for p in blocks {
        // SAFETY: live with this size.
        unsafe { fixed.deallocate(p, 4096, 256, d) };
    }
    let up2 = PanicsOnce::new();
    let binning = Binning::new(
        &up2,
        BinningConfig {
            min: 256,
            max: 1024,
        },
    );
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
fn a_request_above_the_cap_gives_nothing_back() {
    // A request no chunk under the cap could hold is refused without every heap and the shared
    // pool giving their free chunks to the upstream (cuMemFree of everything, on a GPU).
    let rec = Recorder::new(Simulated::new(1 << 30));
    let heaps = ThreadHeaps::new(&rec, ThreadHeapsConfig { max: 64 << 20 });
    on_workers(&heaps, 1, |run| {
        let p = run(0, Job::Alloc(8 << 20, 256, stream(0))).unwrap();
        run(0, Job::Free(p, 8 << 20, 256, stream(0))).unwrap();
    });
    let keep = heaps.allocate(256, 256, StreamRef::DEFAULT).unwrap();
    let p = heaps.allocate(8 << 20, 256, StreamRef::DEFAULT).unwrap();
    // SAFETY: live with this size.
    unsafe { heaps.deallocate(p, 8 << 20, 256, StreamRef::DEFAULT) };
    let (held, frees) = (heaps.usage().held, rec.record().deallocations());
    let err = heaps
        .allocate(1 << 30, 256, StreamRef::DEFAULT)
        .unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert_eq!(
        (heaps.usage().held, rec.record().deallocations()),
        (held, frees),
        "a refused request gave memory back"
    );
    // SAFETY: live with this size.
    unsafe { heaps.deallocate(keep, 256, 256, StreamRef::DEFAULT) };
}

// ---------------------------------------------------------------------------------------------
// FixedSize

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
                        let addr = p.as_ptr() as usize;
                        prop_assert_eq!(addr % align.max(256), 0);
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
                    if !live.is_empty() {
                        let b = live.swap_remove(pick.index(live.len()));
                        if b.size > 0 {
                            extents.remove(b.addr);
                        }
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

#[test]
fn fixed_size_preallocates_and_grows_by_chunks() {
    let sim = Simulated::new(1 << 30);
    // Naming every field in `resource_stack!` trips clippy's needless_update on the macro's
    // `..Default::default()`, so this names one and leaves the count to a plain constructor below.
    let mr = resource_stack![&sim, FixedSize { block_size: 4 KiB }];
    assert_eq!(mr.usage().free_blocks, 128);
    drop(mr);
    let mr = FixedSize::new(
        &sim,
        FixedSizeConfig {
            block_size: 4096,
            blocks_to_preallocate: 4,
        },
    );
    assert_eq!(
        (sim.in_use(), sim.live(), mr.usage().free_blocks),
        (16 << 10, 1, 4)
    );
    let d = StreamRef::DEFAULT;
    let blocks: Vec<_> = (0..5).map(|_| mr.allocate(4096, 256, d).unwrap()).collect();
    assert_eq!(
        (sim.live(), mr.usage().free_blocks),
        (2, 3),
        "a second chunk of 4 blocks"
    );
    assert_eq!(
        blocks[1].as_ptr() as usize,
        blocks[0].as_ptr() as usize + 4096,
        "handed out from the chunk's start"
    );
    for p in blocks {
        // SAFETY: live with this size.
        unsafe { mr.deallocate(p, 4096, 256, d) };
    }
    let defaults = resource_stack![&sim, FixedSize];
    assert_eq!(
        (defaults.block_size(), defaults.usage().free_blocks),
        (1 << 20, 128)
    );
    drop((mr, defaults));
    assert_eq!((sim.in_use(), sim.live()), (0, 0));
}

/// Blocks `mr` frees on `s` are reused at once on `s`, and on `t` only after `order_after(t, s)`
/// reached the upstream, `rec`.
fn check_cross_stream_reuse<R: MemoryResource>(mr: R, rec: &Recorder<Simulated>, size: usize) {
    let (s, t) = (stream(1), stream(2));
    let a = mr.allocate(size, 256, s).unwrap();
    // SAFETY: each call frees `a`, live with this size, after the allocation before it.
    let free = |on| unsafe { mr.deallocate(a, size, 256, on) };
    free(s);
    assert_eq!(
        mr.allocate(size, 256, s).unwrap(),
        a,
        "same stream: reused at once"
    );
    assert!(rec.record().ordered().is_empty());
    free(s);
    assert_eq!(mr.allocate(size, 256, t).unwrap(), a);
    assert_eq!(rec.record().ordered(), [(t.id(), s.id())]);
    free(t);
    assert_eq!(mr.allocate(size, 256, t).unwrap(), a);
    assert_eq!(
        rec.record().ordered().len(),
        1,
        "t's own free block needs no order"
    );
    free(t);
    drop(mr);
    assert_eq!(rec.record().in_use(), 0);
}

#[test]
fn fixed_size_and_binning_order_streams_before_handing_blocks_across() {
    let rec = Recorder::new(Simulated::new(1 << 30));
    let fixed = FixedSizeConfig {
        block_size: 4096,
        blocks_to_preallocate: 0,
    };
    check_cross_stream_reuse(FixedSize::new(&rec, fixed), &rec, 100);
    let rec = Recorder::new(Simulated::new(1 << 30));
    let bins = BinningConfig {
        min: 256,
        max: 4096,
    };
    check_cross_stream_reuse(Binning::new(&rec, bins), &rec, 2000);
}

#[test]
fn fixed_size_out_of_memory_recovers() {
    let sim = Simulated::new(3 * 4096);
    let mr = FixedSize::new(
        &sim,
        FixedSizeConfig {
            block_size: 4096,
            blocks_to_preallocate: 2,
        },
    );
    let d = StreamRef::DEFAULT;
    let a = mr.allocate(4096, 256, d).unwrap();
    let b = mr.allocate(4096, 256, d).unwrap();
    // The next chunk of 2 blocks does not fit; one block does.
    let c = mr.allocate(4096, 256, d).unwrap();
    let e = mr.allocate(4096, 256, d).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    // SAFETY: live with this size.
    unsafe { mr.deallocate(b, 4096, 256, d) };
    assert_eq!(mr.allocate(4096, 256, d).unwrap(), b);
    for p in [a, b, c] {
        // SAFETY: live with this size.
        unsafe { mr.deallocate(p, 4096, 256, d) };
    }
}

// ---------------------------------------------------------------------------------------------
// Binning

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
                        let addr = p.as_ptr() as usize;
                        prop_assert_eq!(addr % align.max(256), 0);
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
                    if !live.is_empty() {
                        let b = live.swap_remove(pick.index(live.len()));
                        if b.size > 0 {
                            extents.remove(b.addr);
                        }
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

#[test]
fn binning_routes_by_size_and_alignment() {
    let sim = Simulated::new(1 << 30);
    let mr = Binning::new(
        &sim,
        BinningConfig {
            min: 1024,
            max: 8192,
        },
    );
    assert_eq!(mr.bin_sizes(), [1024, 2048, 4096, 8192]);
    let d = StreamRef::DEFAULT;
    let small = mr.allocate(10, 1, d).unwrap();
    let mid = mr.allocate(3000, 256, d).unwrap();
    assert_eq!(sim.live(), 2, "one chunk per bin used");
    assert_eq!(
        free_per_bin(&mr),
        [0, 0, 0, 0],
        "a new bin takes one block first"
    );
    let large = mr.allocate(9000, 256, d).unwrap();
    let aligned = mr.allocate(100, 4096, d).unwrap();
    assert_eq!(aligned.as_ptr() as usize % 4096, 0);
    assert_eq!(
        sim.live(),
        4,
        "large and over-aligned requests went to the upstream"
    );
    assert_eq!(sim.in_use(), 1024 + 4096 + 9000 + 100);
    // SAFETY: live with these sizes and alignments.
    unsafe {
        mr.deallocate(small, 10, 1, d);
        mr.deallocate(mid, 3000, 256, d);
        mr.deallocate(large, 9000, 256, d);
        mr.deallocate(aligned, 100, 4096, d);
    }
    assert_eq!(free_per_bin(&mr), [1, 0, 1, 0]);
    assert_eq!(sim.in_use(), 1024 + 4096);
    // The next refill of a bin doubles what it holds.
    let a = mr.allocate(1000, 256, d).unwrap();
    let b = mr.allocate(1000, 256, d).unwrap();
    assert_eq!(mr.usage().held, 1024 * 2 + 4096);
    // SAFETY: live with these sizes.
    unsafe {
        mr.deallocate(a, 1000, 256, d);
        mr.deallocate(b, 1000, 256, d);
    }
    drop(mr);
    assert_eq!((sim.in_use(), sim.live()), (0, 0));
}

#[test]
fn binning_over_a_pool_shares_one_upstream() {
    let sim = Simulated::new(1 << 30);
    let mr = resource_stack![
        &sim,
        Pool { max: 64 MiB },
        Binning { min: 256 KiB },
    ];
    let d = StreamRef::DEFAULT;
    let small = mr.allocate(1000, 256, d).unwrap();
    assert_eq!(mr.bin_sizes(), [256 << 10, 512 << 10, 1 << 20]);
    let large = mr.allocate(16 << 20, 256, d).unwrap();
    let pool = mr.upstream();
    assert_eq!(pool.usage().allocated, (256 << 10) + (16 << 20));
    // The pool is out of room for another 64 MiB; the bins' blocks still serve.
    assert!(mr
        .allocate(60 << 20, 256, d)
        .unwrap_err()
        .is_out_of_memory());
    let small2 = mr.allocate(2000, 256, d).unwrap();
    // SAFETY: live with these sizes.
    unsafe {
        mr.deallocate(small, 1000, 256, d);
        mr.deallocate(small2, 2000, 256, d);
        mr.deallocate(large, 16 << 20, 256, d);
    }
    drop(mr);
    assert_eq!((sim.in_use(), sim.live()), (0, 0));
}

#[test]
fn binning_sixteen_threads_over_a_pool() {
    let rec = Recorder::new(System::new());
    let mr = Binning::new(
        Pool::new(
            &rec,
            PoolConfig {
                initial: 0,
                max: 512 << 20,
            },
        ),
        BinningConfig {
            min: 256,
            max: 64 << 10,
        },
    );
    hammer(&mr, 0xD1B5_4A32_D192_ED03, |next| {
        ((next() % (128 << 10)) as usize + 1, 256)
    });
    assert_eq!(mr.upstream().usage().allocated, mr.usage().held);
    drop(mr);
    assert_eq!(rec.record().in_use(), 0);
}

#[test]
fn absurd_configurations_still_serve_what_fits() {
    let sim = Simulated::new(1 << 30);
    let fixed = FixedSize::new(
        &sim,
        FixedSizeConfig {
            block_size: 1 << 20,
            blocks_to_preallocate: 1 << 50,
        },
    );
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
    let p = arena.allocate(1000, 256, StreamRef::DEFAULT).unwrap();
    // SAFETY: p came from arena with this size and align.
    unsafe { arena.deallocate(p, 1000, 256, StreamRef::DEFAULT) };
    drop(arena);
    assert_eq!(sim.in_use(), 0);
}

#[test]
fn fixed_size_preallocates_any_count_without_listing_each_block() {
    // 2^54 blocks of 256 bytes fit Simulated's address space; one address each would take 128
    // PiB of host memory (10^9 blocks alone would take 7.6 GB): a fresh chunk is a range.
    let sim = Simulated::new(usize::MAX);
    let config = FixedSizeConfig {
        block_size: 256,
        blocks_to_preallocate: 1 << 54,
    };
    let mr = FixedSize::try_new(&sim, config).unwrap();
    assert_eq!(mr.usage().free_blocks, 1 << 54);
    let d = StreamRef::DEFAULT;
    let (a, b) = (
        mr.allocate(256, 256, d).unwrap(),
        mr.allocate(1, 1, d).unwrap(),
    );
    // From the chunk's start, in address order.
    assert_eq!(b.as_ptr() as usize - a.as_ptr() as usize, 256);
    assert_eq!(mr.usage().free_blocks, (1 << 54) - 2);
    // SAFETY: both came from mr with these sizes and alignments.
    unsafe {
        mr.deallocate(a, 256, 256, d);
        mr.deallocate(b, 1, 1, d);
    }
    assert_eq!(mr.usage().free_blocks, 1 << 54);
    drop(mr);
    assert_eq!(sim.in_use(), 0, "the whole chunk went back");
}

#[test]
fn binning_usage_is_read_at_one_instant_under_threads() {
    // Usage is read at one instant: a block moving between a thread's cache and its bin
    // meanwhile is counted once, not twice (or not at all).
    use std::sync::atomic::{AtomicBool, Ordering};
    let sim = Simulated::new(1 << 30);
    let mr = Binning::new(&sim, BinningConfig { min: 256, max: 256 });
    let stop = AtomicBool::new(false);
    let mut bad = Vec::new();
    std::thread::scope(|sc| {
        for t in 0..2u64 {
            let (mr, stop) = (&mr, &stop);
            sc.spawn(move || {
                let mut x = t * 2 + 1;
                let mut mine = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if mine.len() < 200 && (mine.is_empty() || x % 2 == 0) {
                        mine.push(mr.allocate(256, 256, StreamRef::DEFAULT).unwrap());
                    } else {
                        let p = mine.swap_remove((x as usize / 2) % mine.len());
                        // SAFETY: live, with this size.
                        unsafe { mr.deallocate(p, 256, 256, StreamRef::DEFAULT) };
                    }
                }
                for p in mine {
                    // SAFETY: live, with this size.
                    unsafe { mr.deallocate(p, 256, 256, StreamRef::DEFAULT) };
                }
            });
        }
        for _ in 0..50_000 {
            let u = mr.bin_usage()[0];
            if u.held != u.allocated + u.free_blocks * 256 {
                bad.push(u);
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        bad.is_empty(),
        "{} torn readings, first {:?}",
        bad.len(),
        bad.first()
    );
    assert_eq!(mr.usage().allocated, 0);
}

/// Free blocks in each bin of `mr`, smallest bin first.
fn free_per_bin<U: MemoryResource>(mr: &Binning<U>) -> Vec<usize> {
    mr.bin_usage().iter().map(|u| u.free_blocks).collect()
}

#[test]
fn every_suballocator_reports_usage_with_its_peak() {
    let sim = Simulated::new(1 << 30);
    let d = StreamRef::DEFAULT;

    let pool = Pool::new(
        &sim,
        PoolConfig {
            initial: 0,
            max: 1 << 30,
        },
    );
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

    let fixed = FixedSize::new(
        &sim,
        FixedSizeConfig {
            block_size: 1024,
            blocks_to_preallocate: 4,
        },
    );
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

    let binning = Binning::new(
        &sim,
        BinningConfig {
            min: 256,
            max: 1024,
        },
    );
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

// ---------------------------------------------------------------------------------------------
// Per-stream state is bounded by the streams that hold something

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
    let mr = Binning::new(
        &sim,
        BinningConfig {
            min: 256,
            max: usize::MAX,
        },
    );
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
        let freed = mr.allocate(size, 256, stream(2)).unwrap();
        // SAFETY: freed came from mr with this size.
        unsafe { mr.deallocate(freed, size, 256, stream(2)) };
        let _ = kept; // leaked, as by `mem::forget` of its container
        drop(mr);
        assert!(
            sim.live() > 0,
            "{name}: the chunk under a live block went back"
        );
    }
    fn all_back<R: MemoryResource>(name: &str, sim: &Simulated, mr: R, size: usize) {
        let p = mr.allocate(size, 256, stream(1)).unwrap();
        // SAFETY: p came from mr with this size.
        unsafe { mr.deallocate(p, size, 256, stream(1)) };
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
    let sim = Simulated::new(1 << 30);
    check("Pool", &sim, Pool::new(&sim, PoolConfig::default()), 4096);
    let sim = Simulated::new(1 << 30);
    check("FixedSize", &sim, FixedSize::new(&sim, fixed()), 4096);
    let sim = Simulated::new(1 << 30);
    check(
        "Binning",
        &sim,
        Binning::new(&sim, BinningConfig::default()),
        4096,
    );
    let sim = Simulated::new(1 << 30);
    check("Arena", &sim, Arena::new(&sim, arena()), 4096);
    let sim = Simulated::new(1 << 30);
    all_back("Pool", &sim, Pool::new(&sim, PoolConfig::default()), 4096);
    let sim = Simulated::new(1 << 30);
    all_back("FixedSize", &sim, FixedSize::new(&sim, fixed()), 4096);
    let sim = Simulated::new(1 << 30);
    all_back(
        "Binning",
        &sim,
        Binning::new(&sim, BinningConfig::default()),
        4096,
    );
    let sim = Simulated::new(1 << 30);
    all_back("Arena", &sim, Arena::new(&sim, arena()), 4096);
}

#[test]
fn binning_takes_back_blocks_other_threads_cache_when_the_upstream_is_out() {
    // Four 256 KiB blocks in all: one thread takes them and frees them into its own cache; another
    // thread then gets every one of them (the caches are emptied when the upstream is out).
    let sim = Simulated::new(1 << 20);
    let mr = Binning::new(
        &sim,
        BinningConfig {
            min: 256 << 10,
            max: 256 << 10,
        },
    );
    let s = StreamRef::DEFAULT;
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let blocks: Vec<_> = (0..4)
                .map(|_| mr.allocate(200 << 10, 256, s).unwrap())
                .collect();
            for p in blocks {
                // SAFETY: p came from mr with this size and alignment.
                unsafe { mr.deallocate(p, 200 << 10, 256, s) };
            }
        });
    });
    assert_eq!(mr.usage().free_blocks, 4);
    let again: Vec<_> = (0..4)
        .map(|_| mr.allocate(256 << 10, 256, s).unwrap())
        .collect();
    assert!(mr.allocate(1, 256, s).is_err());
    assert_eq!(sim.in_use(), 1 << 20);
    for p in again {
        // SAFETY: p came from mr with this size and alignment.
        unsafe { mr.deallocate(p, 256 << 10, 256, s) };
    }
    drop(mr);
    assert_eq!(sim.in_use(), 0);
}

#[test]
fn binning_caches_serve_many_threads_and_give_everything_back() {
    // Host memory, so that each thread can check that no other thread wrote its blocks.
    let base = Statistics::new(System::new());
    let mr = resource_stack![&base, Pool { max: 1 GiB }, Binning];
    std::thread::scope(|sc| {
        for t in 0..8u8 {
            let mr = &mr;
            sc.spawn(move || {
                let s = stream(t as usize % 3);
                let mut live = Vec::new();
                for i in 0..3000usize {
                    let size = 1 + (i * 7919 + t as usize * 104_729) % (1 << 20);
                    let p = mr.allocate(size, 256, s).unwrap();
                    // SAFETY: p is a fresh block of at least size bytes of host memory.
                    unsafe { p.as_ptr().write_bytes(t, size.min(64)) };
                    live.push((p, size));
                    // At most 32 live per thread (32 MiB each, 256 MiB in all, beside at most
                    // ~40 MiB per thread in caches): within the pool's 1 GiB.
                    if live.len() > 32 {
                        let (p, size) = live.swap_remove(i % live.len());
                        // SAFETY: the block is ours; check no other thread wrote it.
                        assert!((0..size.min(64)).all(|k| unsafe { *p.as_ptr().add(k) } == t));
                        // SAFETY: p came from mr with this size and alignment.
                        unsafe { mr.deallocate(p, size, 256, s) };
                    }
                }
                for (p, size) in live {
                    // SAFETY: as above.
                    unsafe { mr.deallocate(p, size, 256, s) };
                }
            });
        }
    });
    assert_eq!(mr.usage().allocated, 0);
    drop(mr);
    assert_eq!(base.bytes().current, 0);
}

/// The stack of `binning_lets_a_retry_callback_free_through_it`: reached from the callback.
type RetryStack = Binning<Retry<Limiting<Simulated>, fn(&AllocError, usize) -> bool>>;
static RETRY_STACK: std::sync::OnceLock<RetryStack> = std::sync::OnceLock::new();
/// Blocks the application keeps for later, as (address, size): what the callback gives back.
static APP_CACHE: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());

fn free_app_cache(_: &AllocError, attempt: usize) -> bool {
    let blocks: Vec<_> = APP_CACHE.lock().unwrap().drain(..).collect();
    let mr = RETRY_STACK.get().unwrap();
    for &(addr, size) in &blocks {
        // SAFETY: each came from mr with this size and alignment 256, and is freed once.
        unsafe { mr.deallocate(nn(addr), size, 256, StreamRef::DEFAULT) };
    }
    attempt == 0 && !blocks.is_empty()
}

#[test]
fn binning_lets_a_retry_callback_free_through_it() {
    // Out of memory, Retry's callback frees blocks the application kept, through the same
    // Binning, while that Binning is asking its upstream for a chunk: the callback must find the
    // thread's cache free (it hung when the cache stayed locked across the upstream call).
    let mr = RETRY_STACK.get_or_init(|| {
        let cap = Limiting::new(Simulated::new(1 << 30), 1 << 20);
        Binning::new(
            Retry::new(cap, free_app_cache as fn(&AllocError, usize) -> bool),
            BinningConfig {
                min: 256,
                max: 64 << 10,
            },
        )
    });
    let s = StreamRef::DEFAULT;
    let small = mr.allocate(1000, 256, s).unwrap();
    let large = mr.allocate(960 << 10, 256, s).unwrap();
    APP_CACHE.lock().unwrap().extend([
        (small.as_ptr() as usize, 1000),
        (large.as_ptr() as usize, 960 << 10),
    ]);
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = RETRY_STACK
            .get()
            .unwrap()
            .allocate(64 << 10, 256, StreamRef::DEFAULT);
        let _ = done.send(r.map(|p| p.as_ptr() as usize));
    });
    let got = finished
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the allocation came back (it hung before)")
        .expect("the callback freed enough");
    assert!(APP_CACHE.lock().unwrap().is_empty());
    // SAFETY: got came from mr with this size and alignment.
    unsafe { mr.deallocate(nn(got), 64 << 10, 256, s) };
}

#[test]
fn tlsf_grows_a_block_in_place_into_the_free_block_after_it() {
    let mr = Tlsf::new(
        System,
        TlsfConfig {
            initial: 1 << 20,
            max: 1 << 20,
        },
    );
    let s = StreamRef::DEFAULT;
    let a = mr.allocate(1000, 8, s).unwrap();
    // Every call below passes `a` live, with the size it has then.
    let grow = |size, new, stream| {
        // SAFETY: as said above.
        unsafe { mr.grow_in_place(a, size, 8, new, stream) }.unwrap()
    };
    let b = mr.allocate(4096, 8, s).unwrap();
    // SAFETY: live host allocations of these sizes.
    unsafe {
        std::ptr::write_bytes(a.as_ptr(), 0xA5, 1000);
        std::ptr::write_bytes(b.as_ptr(), 0x5A, 4096);
    }
    assert!(!grow(1000, 2000, s), "b is in the way");
    assert!(grow(1000, 1024, s), "within its granule");
    // SAFETY: b is live, of this size.
    unsafe { mr.deallocate(b, 4096, 8, s) };
    assert!(
        !grow(1024, 8192, StreamRef::simulated(3)),
        "the bytes after it are free on another stream"
    );
    assert!(grow(1024, 8192, s));
    assert_eq!(mr.usage().allocated, 8192);
    // SAFETY: `a` is 8192 bytes now.
    unsafe {
        std::ptr::write_bytes(a.as_ptr().add(1024), 0x3C, 8192 - 1024);
        let bytes = std::slice::from_raw_parts(a.as_ptr(), 8192);
        assert!(
            bytes[..1000].iter().all(|&x| x == 0xA5),
            "the old bytes stayed"
        );
        assert!(bytes[1024..].iter().all(|&x| x == 0x3C));
    }
    let c = mr.allocate(256, 8, s).unwrap();
    assert!(
        c.as_ptr() as usize >= a.as_ptr() as usize + 8192,
        "the grown block is not handed out again"
    );
    assert!(!grow(8192, 2 << 20, s), "beyond the chunk");
    assert!(!grow(8192, 4096, s), "no shrinking");
    assert!(
        !grow(8192, 8191, s),
        "no shrinking, even to a size of the same block"
    );
    // SAFETY: live; either size frees a grown block.
    unsafe {
        mr.deallocate(c, 256, 8, s);
        mr.deallocate(a, 1000, 8, s);
    }
    assert_eq!(mr.usage().allocated, 0);
}

#[test]
fn binning_routes_a_bin_to_its_own_resource_and_only_that_bin() {
    let main = Arc::new(Simulated::new(1 << 30));
    let other = Arc::new(Simulated::new(64 << 20));
    // Recorded, to see which requests reach it (FixedSize takes its chunk up front).
    let slab = Arc::new(mrstack::testing::Recorder::new(FixedSize::new(
        other.clone(),
        FixedSizeConfig {
            block_size: 64 << 10,
            ..Default::default()
        },
    )));
    let config = BinningConfig {
        min: 256,
        max: 1 << 20,
    };
    let mr = Binning::new(main.clone(), config.clone())
        .with_bin(64 << 10, slab.clone())
        .unwrap();
    let s = StreamRef::DEFAULT;
    let mut live = Vec::new();
    for size in [100, 4000, 32_769, 40_000, 65_536, 65_537, 200_000, 2 << 20] {
        let before = slab.record().allocations();
        let p = mr.allocate(size, 256, s).unwrap();
        let from_other = slab.record().allocations() != before;
        assert_eq!(
            from_other,
            (32_769..=65_536).contains(&size),
            "{size} bytes went to {}",
            if from_other {
                "the bin's own resource"
            } else {
                "the bins or the upstream"
            }
        );
        live.push((p, size));
    }
    for (p, size) in live {
        // SAFETY: allocated above with this size and alignment.
        unsafe { mr.deallocate(p, size, 256, s) };
    }
    let text = mr.describe().to_string();
    assert!(text.contains("bins=\"64 KiB = "), "{text}");
    assert_eq!(
        slab.record().in_use(),
        0,
        "the bin's requests went back to it"
    );
    drop((mr, slab));
    assert_eq!(other.in_use(), 0, "everything went back");
    assert_eq!(main.in_use(), 0);
    // Not a bin size: refused, naming it (0 must not overflow the bin search).
    for size in [0, 1000, 48 << 10, 2 << 20] {
        let e = Binning::new(main.clone(), config.clone())
            .with_bin(size, Arc::new(Simulated::new(1 << 20)))
            .map(drop);
        assert!(e.is_err(), "{size}");
    }
}

#[test]
fn a_binning_orders_and_synchronizes_every_bins_own_resource() {
    // A block of a bin's own resource freed on one stream and handed to another by a resource
    // above must be ordered by whoever holds it: the bin's resource hears what the binning hears.
    let main = Recorder::new(Simulated::new(1 << 30));
    let bin = Arc::new(Recorder::new(Simulated::new(1 << 20)));
    let other = Arc::new(Recorder::new(Simulated::new(1 << 20)));
    let mr = Binning::new(&main, BinningConfig::default())
        .with_bin(1024, bin.clone())
        .unwrap()
        .with_bin(64 << 10, other.clone())
        .unwrap();
    let (s, t) = (StreamRef::simulated(1), StreamRef::simulated(2));
    mr.order_after(t, s).unwrap();
    mr.synchronize(s).unwrap();
    for (name, record) in [
        ("the upstream", main.record()),
        ("the 1 KiB bin", bin.record()),
        ("the 64 KiB bin", other.record()),
    ] {
        assert_eq!(record.ordered(), [(t.id(), s.id())], "{name}");
        assert_eq!(record.synchronized(), [s.id()], "{name}");
    }
}

#[test]
fn a_simulated_bin_inside_a_simulated_stack_gives_no_overlapping_blocks() {
    // The 2 MiB bin (the tlsf's first chunk) comes from its own simulated, the larger chunks
    // from the outer one: the tlsf carves blocks out of both.
    let mr = mrstack::config::build::<()>(
        "simulated(capacity=1 GiB) > binning(max=2 MiB, bins=\"2 MiB = simulated(capacity=64 MiB)\") > tlsf",
    )
    .unwrap();
    let s = StreamRef::DEFAULT;
    let sizes: Vec<usize> = (0..12).map(|i| (1 << 20) - 256 * (i % 3)).collect();
    let mut live: Vec<(usize, usize)> = sizes
        .iter()
        .map(|&size| (mr.allocate(size, 256, s).unwrap().as_ptr() as usize, size))
        .collect();
    live.sort_unstable();
    for pair in live.windows(2) {
        let ((a, n), (b, _)) = (pair[0], pair[1]);
        assert!(a + n <= b, "{a:#x} + {n} overlaps {b:#x}");
    }
    for (addr, size) in live {
        let p = NonNull::new(std::ptr::without_provenance_mut(addr)).unwrap();
        // SAFETY: allocated above with this size and alignment.
        unsafe { mr.deallocate(p, size, 256, s) };
    }
}

#[test]
fn a_binning_with_own_bins_describes_itself_as_text_that_builds_it_back() {
    let sim = Arc::new(Simulated::new(1 << 30));
    let mr = Binning::new(sim.clone(), BinningConfig::default())
        .with_bin(1024, Arc::new(Simulated::new(1 << 20)))
        .unwrap()
        .with_bin(64 << 10, Arc::new(Simulated::new(4 << 20)))
        .unwrap();
    let text = mr.describe().to_string();
    assert_eq!(
        text,
        "simulated(capacity=1 GiB) > binning(min=256 B, max=1 MiB, bins=\"1 KiB = simulated(capacity=1 MiB); 64 KiB = simulated(capacity=4 MiB)\")"
    );
    let built = mrstack::config::build::<()>(&text).unwrap();
    assert_eq!(built.describe().to_string(), text, "the round trip");
    // The 1 KiB bin's resource holds 1 MiB: it runs out after about 1,000 requests of 1,000
    // bytes, while the binning's other bins (over 1 GiB) still serve.
    let s = StreamRef::DEFAULT;
    let mut small = Vec::new();
    while let Ok(p) = built.allocate(1000, 256, s) {
        small.push(p);
        assert!(small.len() <= 1 << 20, "bounded by the bin's 1 MiB");
    }
    assert!((1000..=1048).contains(&small.len()), "{}", small.len());
    let other = built.allocate(300, 256, s).unwrap();
    // SAFETY: each allocated above with these arguments.
    unsafe {
        built.deallocate(other, 300, 256, s);
        for p in small {
            built.deallocate(p, 1000, 256, s);
        }
    }
    // Bad input, each named.
    for (bins, says) in [
        ("oops", "size = stack"),
        ("3 KiB = simulated(capacity=1 MiB)", "a bin size"),
        ("1 KiB = frobnicate", "a stack for the 1024-byte bin"),
        (
            "1 KiB = simulated(capacity=1 MiB) > binning(bins=\\\"1 KiB = system\\\")",
            "one level deep",
        ),
        (
            "1 KiB = simulated(capacity=1 MiB); 1 KiB = simulated(capacity=2 MiB)",
            "the 1 KiB bin is given twice",
        ),
    ] {
        let text = format!("simulated(capacity=1 GiB) > binning(bins=\"{bins}\")");
        let e = mrstack::config::build::<()>(&text).unwrap_err().to_string();
        assert!(e.contains(says), "{text}: {e}");
    }
}
