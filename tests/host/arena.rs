//! `Arena`: model tests over `Simulated`, pattern and stress tests over `System`, stream ordering
//! with a recording upstream, out-of-memory behaviour, and a GPU round trip.

use crate::support::gpu;

use mrstack::prelude::*;
use mrstack::suballoc::ArenaConfig;
use mrstack::{resource::AllocErrorKind, suballoc::Arena};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Mutex;

const MIB: usize = 1 << 20;
const D: StreamRef = StreamRef::DEFAULT;

fn stream(n: usize) -> StreamRef<'static> {
    StreamRef::simulated(n as u32)
}

/// The number a test stream was made from (0 for the default stream).
fn sid(s: mrstack::stream::StreamId) -> usize {
    (s.get() & u64::from(u32::MAX)) as usize
}

fn config(size: usize, superblock: usize) -> ArenaConfig {
    ArenaConfig { size, superblock }
}

/// `Simulated` that records the `order_after` and `synchronize` calls it gets.
type Recorder = mrstack::testing::Recorder<Simulated>;

fn recorder(capacity: usize) -> Recorder {
    Recorder::new(Simulated::new(capacity))
}

/// The `order_after` calls `rec` got since the last look, as test stream numbers. The look
/// forgets them, and the `synchronize` calls with them.
fn orders(rec: &Recorder) -> Vec<(usize, usize)> {
    let orders = rec.record().ordered();
    rec.record().clear_streams();
    orders.into_iter().map(|(s, a)| (sid(s), sid(a))).collect()
}

/// The `synchronize` calls `rec` got, as test stream numbers.
fn syncs(rec: &Recorder) -> Vec<usize> {
    rec.record().synchronized().into_iter().map(sid).collect()
}

fn addr(p: NonNull<u8>) -> usize {
    p.as_ptr() as usize
}

// Bad and zero-size requests: the conformance battery (conformance.rs).
#[test]
fn more_than_the_arena_is_out_of_memory() {
    let sim = Simulated::new(64 * MIB);
    let arena = Arena::new(&sim, config(16 * MIB, 4 * MIB));
    let err = arena.allocate(17 * MIB, 256, D).unwrap_err();
    assert!(err.is_out_of_memory());
    assert_eq!((err.size, err.resource), (17 * MIB, "Arena"));
}

#[test]
fn resource_stack_builds_an_arena_reserving_lazily() {
    let sim = Simulated::new(2 << 30);
    let mr = resource_stack![&sim, Arena { size: 64 MiB }];
    assert_eq!((mr.max_size(), mr.superblock_size()), (64 * MIB, 4 * MIB));
    assert_eq!(sim.in_use(), 0);
    let p = mr.allocate(100, 1, D).unwrap();
    assert_eq!(
        (sim.in_use(), sim.live(), mr.usage().held),
        (64 * MIB, 1, 64 * MIB)
    );
    // SAFETY: p came from mr with this size.
    unsafe { mr.deallocate(p, 100, 1, D) };
    drop(mr);
    assert_eq!((sim.in_use(), sim.live()), (0, 0));
    let defaults = resource_stack![&sim, Arena];
    assert_eq!(
        (defaults.max_size(), defaults.superblock_size()),
        (1 << 30, 4 * MIB)
    );
    let odd = resource_stack![&sim, Arena { superblock: 3 MiB }];
    assert_eq!(
        odd.superblock_size(),
        4 * MIB,
        "rounded up to a power of two"
    );
}

#[test]
fn try_new_reserves_now_or_fails() {
    let sim = Simulated::new(32 * MIB);
    let arena = Arena::try_new(&sim, config(16 * MIB, MIB)).unwrap();
    assert_eq!((sim.in_use(), arena.usage().held), (16 * MIB, 16 * MIB));
    drop(arena);
    let err = Arena::try_new(&sim, config(64 * MIB, MIB)).unwrap_err();
    assert!(err.is_out_of_memory());
    assert_eq!(sim.in_use(), 0);
}

#[test]
fn freed_memory_is_reused_at_once_on_its_stream() {
    let sim = Simulated::new(64 * MIB);
    let arena = Arena::new(&sim, config(32 * MIB, 4 * MIB));
    for (s, size) in [
        (D, 1000),
        (stream(1), 5000),
        (D, 3 * MIB),
        (stream(2), 3 * MIB),
    ] {
        let a = arena.allocate(size, 256, s).unwrap();
        // SAFETY: a came from arena with this size.
        unsafe { arena.deallocate(a, size, 256, s) };
        let b = arena.allocate(size, 256, s).unwrap();
        assert_eq!(a, b, "{size} bytes on stream {s:?}");
        // SAFETY: b came from arena with this size.
        unsafe { arena.deallocate(b, size, 256, s) };
    }
}

#[test]
fn streams_and_threads_get_their_own_superblocks() {
    let sim = Simulated::new(64 * MIB);
    let sb = 4 * MIB;
    let arena = Arena::new(&sim, config(32 * MIB, sb));
    let a = arena.allocate(256, 256, D).unwrap();
    let b = arena.allocate(256, 256, stream(1)).unwrap();
    let c = arena.allocate(256, 256, stream(2)).unwrap();
    let d = std::thread::scope(|s| {
        s.spawn(|| addr(arena.allocate(256, 256, D).unwrap()))
            .join()
    })
    .unwrap();
    let e = arena.allocate(256, 256, stream(1)).unwrap();
    let windows: Vec<usize> = [addr(a), addr(b), addr(c), d]
        .iter()
        .map(|p| p / sb)
        .collect();
    let mut distinct = windows.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "one superblock per arena: {windows:x?}");
    assert_eq!(
        addr(e) / sb,
        addr(b) / sb,
        "stream 1 keeps using its superblock"
    );
    // The other thread's block is freed here: found by address, returned to its own arena.
    for (p, s) in [(a, D), (b, stream(1)), (c, stream(2)), (e, stream(1))] {
        // SAFETY: p came from arena with 256 bytes.
        unsafe { arena.deallocate(p, 256, 256, s) };
    }
    // SAFETY: d came from arena (on the other thread) with 256 bytes.
    unsafe { arena.deallocate(NonNull::new(d as *mut u8).unwrap(), 256, 256, D) };
    drop(arena);
    assert_eq!((sim.in_use(), sim.live()), (0, 0));
}

#[test]
fn a_superblock_changing_streams_is_ordered_after_the_old_one() {
    let rec = recorder(64 * MIB);
    let sb = MIB;
    // Room for exactly one superblock: stream 2 can only get it after stream 1 gave it back.
    let arena = Arena::new(&rec, config(sb, sb));
    let a = arena.allocate(1000, 256, stream(1)).unwrap();
    assert_eq!(syncs(&rec), [0], "it was synchronized once taken");
    assert_eq!(orders(&rec), [], "fresh memory goes to any stream");
    // SAFETY: a came from arena with this size.
    unsafe { arena.deallocate(a, 1000, 256, stream(1)) };
    let b = arena.allocate(1000, 256, stream(2)).unwrap();
    assert_eq!(addr(a) / sb, addr(b) / sb);
    assert!(
        orders(&rec).contains(&(2, 1)),
        "stream 2 waits for stream 1"
    );
    // SAFETY: b came from arena with this size.
    unsafe { arena.deallocate(b, 1000, 256, stream(2)) };
    // Back and forth on the same stream: no ordering needed.
    let c = arena.allocate(1000, 256, stream(2)).unwrap();
    assert_eq!(orders(&rec), []);
    // SAFETY: c came from arena with this size.
    unsafe { arena.deallocate(c, 1000, 256, stream(2)) };
}

#[test]
fn a_large_block_changing_streams_is_ordered_after_the_old_one() {
    let rec = recorder(64 * MIB);
    let arena = Arena::new(&rec, config(8 * MIB, MIB));
    let a = arena.allocate(3 * MIB, 256, stream(1)).unwrap();
    // SAFETY: a came from arena with this size.
    unsafe { arena.deallocate(a, 3 * MIB, 256, stream(1)) };
    orders(&rec);
    let b = arena.allocate(3 * MIB, 256, stream(1)).unwrap();
    assert_eq!(a, b);
    assert_eq!(orders(&rec), [], "same stream: reused at once");
    // SAFETY: b came from arena with this size.
    unsafe { arena.deallocate(b, 3 * MIB, 256, stream(1)) };
    let c = arena.allocate(3 * MIB, 256, stream(3)).unwrap();
    assert_eq!(a, c);
    assert!(orders(&rec).contains(&(3, 1)));
    // SAFETY: c came from arena with this size.
    unsafe { arena.deallocate(c, 3 * MIB, 256, stream(3)) };
}

#[test]
fn a_block_freed_on_another_stream_orders_its_arena_after_that_stream() {
    let rec = recorder(64 * MIB);
    let arena = Arena::new(&rec, config(8 * MIB, MIB));
    let a = arena.allocate(1000, 256, stream(1)).unwrap();
    orders(&rec);
    // SAFETY: a came from arena with this size; the caller's work on it is on stream 5.
    unsafe { arena.deallocate(a, 1000, 256, stream(5)) };
    assert_eq!(orders(&rec), [(1, 5)]);
    drop(arena);
    assert_eq!(rec.inner().in_use(), 0);
    assert!(
        orders(&rec).contains(&(0, 1)),
        "chunks go back after stream 1's work"
    );
}

#[test]
fn many_streams_merging_are_synchronized_not_forgotten() {
    let rec = recorder(64 * MIB);
    let arena = Arena::new(&rec, config(8 * MIB, MIB));
    let blocks: Vec<_> = (0..6)
        .map(|_| arena.allocate(1 << 20 | 256, 256, D).unwrap())
        .collect();
    rec.record().clear_streams();
    for (i, p) in blocks.into_iter().enumerate() {
        // SAFETY: p came from arena with this size.
        unsafe { arena.deallocate(p, 1 << 20 | 256, 256, stream(10 + i)) };
    }
    // Six streams' ranges coalesced: more than a range remembers, so some were waited for.
    assert!(!syncs(&rec).is_empty());
    crate::support::serve_one(&arena, 6 * MIB, 256, stream(99));
}

#[test]
fn out_of_memory_at_the_arena_size_then_usable_again() {
    let sim = Simulated::new(1 << 30);
    let arena = Arena::new(&sim, config(32 * MIB, MIB));
    let mut live = Vec::new();
    let err = loop {
        match arena.allocate(100_000, 256, D) {
            Ok(p) => live.push(p),
            Err(e) => break e,
        }
    };
    assert_eq!(err.kind, AllocErrorKind::OutOfMemory);
    assert_eq!(
        arena.usage().held,
        32 * MIB,
        "never more than the configured size"
    );
    // Nearly all of it was handed out (a superblock holds 10 blocks of 100,000 bytes).
    assert!(live.len() * 100_000 > 30 * MIB, "{} blocks", live.len());
    assert!(arena
        .allocate(8 * MIB, 256, D)
        .unwrap_err()
        .is_out_of_memory());
    for p in live.drain(..) {
        // SAFETY: p came from arena with this size.
        unsafe { arena.deallocate(p, 100_000, 256, D) };
    }
    // Everything coalesced back, even the superblock the thread keeps.
    crate::support::serve_one(&arena, 32 * MIB, 256, stream(7));
    let p = arena.allocate(1000, 256, D).unwrap();
    // SAFETY: p came from arena with this size.
    unsafe { arena.deallocate(p, 1000, 256, D) };
}

#[test]
fn empty_superblocks_of_other_arenas_are_reclaimed_when_memory_runs_out() {
    let sim = Simulated::new(1 << 30);
    let arena = Arena::new(&sim, config(4 * MIB, MIB));
    // Four streams each take a superblock, then free it: each arena keeps its empty superblock.
    for s in 1..=4 {
        let p = arena.allocate(1000, 256, stream(s)).unwrap();
        // SAFETY: p came from arena with this size.
        unsafe { arena.deallocate(p, 1000, 256, stream(s)) };
    }
    // Another stream needs the whole arena: all four come back and coalesce.
    crate::support::serve_one(&arena, 4 * MIB, 256, stream(5));
}

#[test]
fn a_small_request_uses_the_global_arena_when_no_superblock_is_free() {
    let sim = Simulated::new(1 << 30);
    let arena = Arena::new(&sim, config(4 * MIB, MIB));
    // A large block straddling every window: no whole superblock is left.
    let big = arena.allocate(3 * MIB + 512 * 1024, 256, D).unwrap();
    let small = arena.allocate(1000, 256, D).unwrap();
    assert!(addr(small) >= addr(big) + 3 * MIB + 512 * 1024);
    for (p, n) in [(big, 3 * MIB + 512 * 1024), (small, 1000)] {
        // SAFETY: p came from arena with this size.
        unsafe { arena.deallocate(p, n, 256, D) };
    }
    crate::support::serve_one(&arena, 4 * MIB, 256, D);
}

#[test]
fn grows_in_pieces_when_the_upstream_refuses_the_whole_size() {
    let sim = Simulated::new(10 * MIB);
    let arena = Arena::new(&sim, config(1 << 30, MIB));
    let mut live = Vec::new();
    while let Ok(p) = arena.allocate(200_000, 256, D) {
        live.push(p);
    }
    assert!(arena.usage().held <= 10 * MIB);
    assert!(live.len() * 200_000 > 7 * MIB, "{} blocks", live.len());
    for p in live {
        // SAFETY: p came from arena with this size.
        unsafe { arena.deallocate(p, 200_000, 256, D) };
    }
    drop(arena);
    assert_eq!((sim.in_use(), sim.live()), (0, 0), "every piece goes back");
}

#[test]
fn threads_exiting_leave_their_arenas_to_the_next_threads() {
    let sim = Simulated::new(1 << 30);
    let arena = Arena::new(&sim, config(64 * MIB, MIB));
    // Each thread keeps one block and an arena's worth of superblock; later threads adopt arenas
    // of earlier ones, so 200 threads fit in 64 superblocks.
    let kept: Vec<usize> = (0..200)
        .map(|_| {
            std::thread::scope(|s| {
                s.spawn(|| {
                    let p = arena.allocate(5000, 256, D).unwrap();
                    crate::support::serve_one(&arena, 7000, 256, D);
                    addr(p)
                })
                .join()
                .unwrap()
            })
        })
        .collect();
    for p in kept {
        // SAFETY: p came from arena with 5000 bytes, on a thread now gone.
        unsafe { arena.deallocate(NonNull::new(p as *mut u8).unwrap(), 5000, 256, D) };
    }
    drop(arena);
    assert_eq!(sim.in_use(), 0);
}

// ---------------------------------------------------------------- model test over Simulated

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        size: usize,
        align: usize,
        stream: usize,
    },
    Free {
        index: usize,
        stream: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        4 => 1usize..4096,
        3 => 4096usize..(300 << 10),
        2 => (300usize << 10)..(3 << 20),
        1 => Just(0usize),
    ];
    let align = prop_oneof![8 => Just(256usize), 1 => Just(1), 1 => Just(4096), 1 => Just(1 << 17)];
    prop_oneof![
        3 => (size, align, 0usize..3).prop_map(|(size, align, stream)| Op::Alloc { size, align, stream }),
        2 => (any::<usize>(), 0usize..3).prop_map(|(index, stream)| Op::Free { index, stream }),
    ]
}

/// The live blocks, by address: checks that a new block overlaps none of them.
#[derive(Default)]
struct Model {
    live: BTreeMap<usize, (usize, usize, usize)>,
}

impl Model {
    fn insert(&mut self, p: usize, size: usize, align: usize, stream: usize) {
        assert_eq!(p % align.max(256), 0, "{p:#x} not aligned to {align}");
        if let Some((&q, &(n, _, _))) = self.live.range(..=p).next_back() {
            assert!(q + n <= p, "{p:#x}+{size} overlaps {q:#x}+{n}");
        }
        if let Some((&q, _)) = self.live.range(p..).next() {
            assert!(p + size <= q, "{p:#x}+{size} overlaps {q:#x}");
        }
        self.live.insert(p, (size, align, stream));
    }
}

fn run_model(ops: &[Op], size: usize, superblock: usize) {
    let sim = Simulated::new(size + 8 * MIB);
    let arena = Arena::new(&sim, config(size, superblock));
    let mut model = Model::default();
    let mut zero = Vec::new();
    for op in ops {
        match *op {
            Op::Alloc {
                size: n,
                align,
                stream: s,
            } => match arena.allocate(n, align, stream(s)) {
                Ok(p) if n == 0 => zero.push((p, align)),
                Ok(p) => model.insert(addr(p), n, align, s),
                Err(e) => {
                    assert!(e.is_out_of_memory(), "{e}");
                    let live: usize = model.live.values().map(|v| v.0).sum();
                    // Failing is fine only when the arena is fairly full or the request is big.
                    assert!(
                        live + 2 * (n + align + superblock) > size / 2,
                        "{e}: {live} live"
                    );
                }
            },
            Op::Free { index, stream: s } if !model.live.is_empty() => {
                let (&p, &(n, align, _)) = model.live.iter().nth(index % model.live.len()).unwrap();
                model.live.remove(&p);
                // SAFETY: p is live in the model, allocated with this size and alignment.
                unsafe {
                    arena.deallocate(NonNull::new(p as *mut u8).unwrap(), n, align, stream(s))
                };
            }
            Op::Free { .. } => {}
        }
        assert_eq!(sim.in_use(), arena.usage().held);
        assert!(arena.usage().held <= size);
    }
    for (p, align) in zero {
        assert_eq!(addr(p) % align.max(256), 0);
    }
    for (p, (n, align, s)) in std::mem::take(&mut model.live) {
        // SAFETY: p is live in the model, allocated with this size and alignment.
        unsafe { arena.deallocate(NonNull::new(p as *mut u8).unwrap(), n, align, stream(s)) };
    }
    if arena.usage().held == size {
        // Everything came back together: the whole arena is one free range again.
        let p = arena
            .allocate(size, 256, stream(9))
            .expect("whole arena after freeing all");
        // SAFETY: p came from arena with this size.
        unsafe { arena.deallocate(p, size, 256, stream(9)) };
    }
    drop(arena);
    assert_eq!((sim.in_use(), sim.live()), (0, 0));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn model_over_simulated(ops in prop::collection::vec(op(), 1..64)) {
        run_model(&ops, 16 * MIB, MIB);
    }
}

#[test]
fn model_with_small_arena_and_large_superblocks() {
    // A deterministic sweep of tight configurations: superblocks as large as the arena.
    let mut rng = Rng(7);
    for _ in 0..300 {
        let ops: Vec<Op> = (0..64)
            .map(|_| {
                if rng.below(5) < 3 {
                    Op::Alloc {
                        size: 1 + rng.below(2 * MIB),
                        align: 1 << (8 + rng.below(6)),
                        stream: rng.below(3),
                    }
                } else {
                    Op::Free {
                        index: rng.below(64),
                        stream: rng.below(3),
                    }
                }
            })
            .collect();
        run_model(&ops, 4 * MIB, 4 * MIB);
    }
}

// ---------------------------------------------------------------- real bytes over System

/// Fills `n` bytes at `p` with `byte`.
fn fill(p: NonNull<u8>, n: usize, byte: u8) {
    // SAFETY: p is a live host block of at least n bytes owned by the caller.
    unsafe { std::ptr::write_bytes(p.as_ptr(), byte, n) };
}

/// True when all `n` bytes at `p` still hold `byte`.
fn holds(p: NonNull<u8>, n: usize, byte: u8) -> bool {
    // SAFETY: p is a live host block of at least n bytes owned by the caller.
    unsafe { std::slice::from_raw_parts(p.as_ptr(), n) == vec![byte; n].as_slice() }
}

#[test]
fn patterns_survive_over_system() {
    let arena = Arena::new(System, config(64 * MIB, MIB));
    let mut rng = Rng(11);
    let mut live: Vec<(NonNull<u8>, usize, u8)> = Vec::new();
    for i in 0..3000 {
        if live.is_empty() || rng.below(100) < 60 {
            let n = if rng.below(10) == 0 {
                MIB + rng.below(2 * MIB)
            } else {
                1 + rng.below(64 << 10)
            };
            let s = if rng.below(4) == 0 { stream(1) } else { D };
            if let Ok(p) = arena.allocate(n, 256, s) {
                let byte = (i % 251) as u8;
                fill(p, n, byte);
                live.push((p, n, byte));
            }
        } else {
            let (p, n, byte) = live.swap_remove(rng.below(live.len()));
            assert!(
                holds(p, n, byte),
                "block {p:?} of {n} bytes was overwritten"
            );
            // SAFETY: p came from arena with this size.
            unsafe { arena.deallocate(p, n, 256, D) };
        }
    }
    for (p, n, byte) in live {
        assert!(holds(p, n, byte));
        // SAFETY: p came from arena with this size.
        unsafe { arena.deallocate(p, n, 256, D) };
    }
}

#[test]
fn sixteen_threads_over_system() {
    let arena = Arena::new(System, config(256 * MIB, MIB));
    // Blocks handed between threads: a thread frees what another allocated and filled.
    let exchange: Mutex<Vec<(usize, usize, u8)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..16u8 {
            let (arena, exchange) = (&arena, &exchange);
            s.spawn(move || {
                let mut rng = Rng(u64::from(t) + 100);
                let mut live: Vec<(NonNull<u8>, usize, u8)> = Vec::new();
                let st = if t % 4 == 3 {
                    stream(usize::from(t))
                } else {
                    D
                };
                for _ in 0..1500 {
                    match rng.below(10) {
                        0..=3 => {
                            let n = if rng.below(20) == 0 {
                                MIB + rng.below(MIB)
                            } else {
                                1 + rng.below(32 << 10)
                            };
                            let p = arena.allocate(n, 256, st).expect("the arena has room");
                            fill(p, n, t);
                            live.push((p, n, t));
                        }
                        4 if !live.is_empty() => {
                            let (p, n, b) = live.swap_remove(rng.below(live.len()));
                            exchange.lock().unwrap().push((addr(p), n, b));
                        }
                        5 => {
                            let got = exchange.lock().unwrap().pop();
                            if let Some((p, n, b)) = got {
                                let p = NonNull::new(p as *mut u8).unwrap();
                                assert!(holds(p, n, b), "shared block overwritten");
                                // SAFETY: p came from arena with this size, on another thread.
                                unsafe { arena.deallocate(p, n, 256, st) };
                            }
                        }
                        _ if !live.is_empty() => {
                            let (p, n, b) = live.swap_remove(rng.below(live.len()));
                            assert!(holds(p, n, b), "thread {t}: block overwritten");
                            // SAFETY: p came from arena with this size.
                            unsafe { arena.deallocate(p, n, 256, st) };
                        }
                        _ => {}
                    }
                }
                for (p, n, b) in live {
                    assert!(holds(p, n, b));
                    // SAFETY: p came from arena with this size.
                    unsafe { arena.deallocate(p, n, 256, st) };
                }
            });
        }
    });
    for (p, n, b) in exchange.into_inner().unwrap() {
        let p = NonNull::new(p as *mut u8).unwrap();
        assert!(holds(p, n, b));
        // SAFETY: p came from arena with this size.
        unsafe { arena.deallocate(p, n, 256, D) };
    }
    // Everything is free again: the whole arena can be taken in one block.
    let whole = arena
        .allocate(256 * MIB, 256, D)
        .expect("all superblocks came back");
    // SAFETY: whole came from arena with this size.
    unsafe { arena.deallocate(whole, 256 * MIB, 256, D) };
}

// ---------------------------------------------------------------- GPU

#[test]
fn gpu_round_trip_over_cuda() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.default_stream();
    let other = ctx.new_stream().expect("a second stream");
    let arena = Arena::new(Cuda::new(&ctx).unwrap(), config(64 * MIB, MIB));
    for round in 0..3u32 {
        let small: Vec<u32> = (0..1000).map(|i| i * 7 + round).collect();
        let large: Vec<u32> = (0..(1 << 20)).map(|i| i ^ 0x5a5a_5a5a ^ round).collect();
        let a = DeviceVec::from_slice(&small, &arena, &stream).unwrap();
        let b = DeviceVec::from_slice(&large, &arena, &stream).unwrap();
        let c = DeviceVec::from_slice(&small[..500], &arena, &other).unwrap();
        assert_eq!(a.to_vec().unwrap(), small);
        assert_eq!(b.to_vec().unwrap(), large);
        assert_eq!(c.to_vec().unwrap(), &small[..500]);
    }
}

// ---------------------------------------------------------------- measurements (run by hand)

/// splitmix64: a small deterministic generator for workloads.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn usage_counts_live_blocks_in_local_and_global_arenas() {
    let sim = Simulated::new(1 << 30);
    let arena = resource_stack![&sim, Arena { size: 64 MiB, superblock: 1 MiB }];
    let d = StreamRef::DEFAULT;
    let small = arena.allocate(1000, 256, d).unwrap(); // a local arena's superblock
    let large = arena.allocate(8 << 20, 256, d).unwrap(); // the global arena
    let u = arena.usage();
    assert_eq!((u.held, u.peak_held, u.chunks), (64 << 20, 64 << 20, 1));
    assert_eq!(u.allocated, 1024 + (8 << 20));
    assert_eq!(u.free(), u.held - u.allocated);
    // SAFETY: each came from arena with this size and alignment.
    unsafe {
        arena.deallocate(small, 1000, 256, d);
        arena.deallocate(large, 8 << 20, 256, d);
    }
    assert_eq!(arena.usage().allocated, 0);
}

/// Allocates `n` blocks of `size` bytes on `s`, as many as the arena gives.
fn take_blocks<R: MemoryResource>(mr: &R, n: usize, size: usize, s: StreamRef) -> Vec<NonNull<u8>> {
    (0..n).map(|_| mr.allocate(size, 256, s).unwrap()).collect()
}

fn free_blocks<R: MemoryResource>(mr: &R, blocks: Vec<NonNull<u8>>, size: usize, s: StreamRef) {
    for p in blocks {
        // SAFETY: each block came from mr with this size and alignment, on stream s.
        unsafe { mr.deallocate(p, size, 256, s) };
    }
}

#[test]
fn a_huge_arena_keeps_metadata_proportional_to_superblocks_in_use() {
    let mut sizes = Vec::new();
    for (capacity, superblock) in [
        (1usize << 62, 4 * MIB),
        (1 << 52, 64 << 10),
        (1 << 46, 1 << 30),
    ] {
        let sim = Simulated::new(capacity);
        let arena = Arena::new(&sim, config(capacity, superblock));
        let fresh = arena.metadata_bytes();
        // Small blocks on the default stream and three others, a large block and a huge one.
        let mut small: Vec<_> = (0..4)
            .map(|s| (s, take_blocks(&arena, 300, superblock / 8, stream(s))))
            .collect();
        let large = arena.allocate(1 << 40, 256, D).unwrap();
        let huge = arena.allocate(capacity / 2, 4096, stream(2)).unwrap();
        assert_eq!(arena.usage().held, capacity);
        let sbs = arena.local_superblocks();
        // 300 blocks of an eighth of a superblock: 38 superblocks per arena, up to 3 spare.
        assert!((4 * 38..=4 * 41).contains(&sbs), "{sbs} superblocks");
        let used = arena.metadata_bytes();
        assert!(
            used < fresh + 512 * sbs,
            "{capacity:#x}: {used} bytes of metadata for {sbs} superblocks (fresh: {fresh})"
        );
        assert!(used < 128 << 10, "{capacity:#x}: {used} bytes of metadata");
        // SAFETY: each came from arena with this size and alignment.
        unsafe {
            arena.deallocate(large, 1 << 40, 256, D);
            arena.deallocate(huge, capacity / 2, 4096, stream(2));
        }
        for (s, blocks) in small.drain(..) {
            free_blocks(&arena, blocks, superblock / 8, stream(s));
        }
        assert_eq!(arena.usage().allocated, 0);
        // What the local arenas gave back shrank their tables and the owner map.
        let (after, free_blocks) = (arena.metadata_bytes(), arena.usage().free_blocks);
        assert!(arena.local_superblocks() <= 4 * 8);
        // What is left: the local arenas' free superblocks and the global arena's free ranges.
        assert!(
            after < fresh + 512 * (arena.local_superblocks() + free_blocks),
            "{capacity:#x}: {after} bytes of metadata for {free_blocks} free blocks"
        );
        sizes.push((fresh, used, after));
        // Everything coalesces again: the whole capacity in one block.
        let all = arena.allocate(capacity, 256, stream(9)).unwrap();
        // SAFETY: all came from arena with this size and alignment.
        unsafe { arena.deallocate(all, capacity, 256, stream(9)) };
        drop(arena);
        assert_eq!((sim.in_use(), sim.live()), (0, 0));
    }
    // The same work takes the same metadata, whatever the capacity and superblock size.
    assert!(sizes.iter().all(|&s| s == sizes[0]), "{sizes:?}");
}

#[test]
fn a_stack_of_two_to_the_62_bytes_serves_one_huge_allocation() {
    // What the replay tool builds from a log with one huge allocation.
    let mr = resource_stack![Simulated::new(1 << 62), Arena { size: 1 << 62 }];
    let p = mr.allocate(3 << 60, 256, D).unwrap();
    let q = mr.allocate(1000, 256, D).unwrap();
    assert!(mr.metadata_bytes() < 64 << 10, "{}", mr.metadata_bytes());
    // SAFETY: each came from mr with this size and alignment.
    unsafe {
        mr.deallocate(q, 1000, 256, D);
        mr.deallocate(p, 3 << 60, 256, D);
    }
    assert_eq!(mr.usage().allocated, 0);
}

#[test]
fn new_streams_take_evicted_arenas_and_old_streams_are_let_go() {
    let sim = Simulated::new(1 << 40);
    let arena = Arena::new(&sim, config(1 << 30, 64 << 10));
    // 5,000 streams, more than the 1,024 local arenas, each allocate a small block (its own
    // arena) and a large one (the global arena), then free both.
    for n in 1..=5_000 {
        let small = arena.allocate(1000, 256, stream(n)).unwrap();
        let large = arena.allocate(100 << 10, 256, stream(n)).unwrap();
        // A stream past the first thousand still gets a local arena.
        assert!(arena.in_local_arena(small), "stream {n}");
        assert!(!arena.in_local_arena(large), "stream {n}");
        // SAFETY: each came from arena with this size and alignment, on stream(n).
        unsafe {
            arena.deallocate(large, 100 << 10, 256, stream(n));
            arena.deallocate(small, 1000, 256, stream(n));
        }
    }
    // One stream per local arena and a few tags per free range: not 5,000.
    let held = arena.held_streams();
    assert!(held <= 1024 + 16, "{held} streams held");
    // A stream whose arena passed to another still allocates, and its block is ordered.
    crate::support::serve_one(&arena, 1000, 256, stream(1));
    assert_eq!(arena.usage().allocated, 0);
    drop(arena);
    assert_eq!((sim.in_use(), sim.live()), (0, 0));
}

#[test]
fn a_block_of_an_arena_that_passed_to_another_stream_is_ordered() {
    // This thread caches stream 1's arena; on another thread, the arena is evicted and passes to
    // another stream; this thread's next block from it must be ordered after that stream.
    let rec = recorder(1 << 40);
    let arena = Arena::new(&rec, config(1 << 30, 64 << 10));
    let p = arena.allocate(1000, 256, stream(1)).unwrap();
    // SAFETY: p came from arena with this size and alignment.
    unsafe { arena.deallocate(p, 1000, 256, stream(1)) };
    std::thread::scope(|s| {
        s.spawn(|| {
            for n in 2..=3_000 {
                crate::support::serve_one(&arena, 1000, 256, stream(n));
            }
        });
    });
    orders(&rec);
    let p = arena.allocate(1000, 256, stream(1)).unwrap();
    assert!(arena.in_local_arena(p));
    let orders = orders(&rec);
    assert!(
        orders.iter().any(|&(s, after)| s == 1 && after > 1),
        "stream 1 is ordered after its arena's new stream: {orders:?}"
    );
    // SAFETY: p came from arena with this size and alignment.
    unsafe { arena.deallocate(p, 1000, 256, stream(1)) };
    assert_eq!(arena.usage().allocated, 0);
}

#[test]
fn idle_stream_arenas_give_their_superblocks_back() {
    let sim = Simulated::new(1 << 40);
    let arena = Arena::new(&sim, config(1 << 30, 64 << 10));
    // A block on the default stream stays live throughout.
    let kept = arena.allocate(5000, 256, D).unwrap();
    // 10,000 streams take turns: each allocates, the one three turns before frees.
    let mut live = std::collections::VecDeque::new();
    let mut most = 0;
    for n in 1..=10_000 {
        live.push_back((n, arena.allocate(700 + n % 3000, 256, stream(n)).unwrap()));
        if live.len() > 3 {
            let (m, p) = live.pop_front().unwrap();
            // SAFETY: p came from arena with this size and alignment, on stream(m).
            unsafe { arena.deallocate(p, 700 + m % 3000, 256, stream(m)) };
        }
        most = most.max(arena.local_superblocks());
    }
    // Three busy stream arenas, the thread arena and four idle ones, up to 8 free superblocks
    // each (plus a batch being taken): not one per stream.
    assert!(most <= 9 * 12, "{most} superblocks held by local arenas");
    for (m, p) in live.drain(..) {
        // SAFETY: p came from arena with this size and alignment, on stream(m).
        unsafe { arena.deallocate(p, 700 + m % 3000, 256, stream(m)) };
    }
    assert!(
        arena.local_superblocks() <= 6 * 8,
        "{}",
        arena.local_superblocks()
    );
    let u = arena.usage();
    assert_eq!(u.allocated, 5120);
    // Streams old and new still allocate, and the freed superblocks serve a large request.
    for n in [1, 5000, 20_000] {
        crate::support::serve_one(&arena, 1000, 256, stream(n));
    }
    let big = arena.allocate(1000 << 20, 256, D).unwrap();
    // SAFETY: each came from arena with this size and alignment.
    unsafe {
        arena.deallocate(big, 1000 << 20, 256, D);
        arena.deallocate(kept, 5000, 256, D);
    }
    assert_eq!(arena.usage().allocated, 0);
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "double free")]
fn a_large_block_freed_twice_is_caught_in_debug_builds() {
    let sim = Simulated::new(1 << 30);
    let arena = Arena::new(&sim, config(64 * MIB, MIB));
    // The first block starts the chunk: freed, it heads the free range that follows it.
    let p = arena.allocate(8 * MIB, 256, D).unwrap();
    // SAFETY: p came from arena with this size; the second call breaks the contract on purpose,
    // over an upstream with no memory behind it, to see the check catch it.
    unsafe {
        arena.deallocate(p, 8 * MIB, 256, D);
        arena.deallocate(p, 8 * MIB, 256, D);
    }
}
