//! A `Retry` callback may call back into the resource above it, as its docs invite ("free a
//! cache, trim a pool"): every suballocator lets its lock go around the upstream's `allocate`, so
//! such a callback neither deadlocks nor finds the suballocator half-updated. Each test runs on a
//! thread of its own and fails if that thread has not finished within 20 seconds.

use crate::adaptor_support::{claims, deallocate_to, streams};
use mrstack::adaptor::RetryCallback;
use mrstack::prelude::*;
use mrstack::suballoc::{
    ArenaConfig, BinningConfig, FixedSizeConfig, PoolConfig, ThreadHeapsConfig, TlsfConfig,
};
use mrstack::{
    adaptor::{Limiting, Retry},
    suballoc::{Arena, Binning, FixedSize, Pool, ThreadHeaps, Tlsf},
};
use std::ptr::NonNull;
use std::sync::{mpsc, Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// What the upstream gives: 8 MiB.
const LIMIT: usize = 8 << 20;

type Below = Retry<Limiting<Simulated>, RetryCallback>;

/// Blocks the test keeps through the resource above and its callback gives back: addresses
/// (Simulated's, never dereferenced) and sizes.
type Cache = Mutex<Vec<(usize, usize)>>;

struct Shared<R> {
    above: OnceLock<R>,
    cache: Cache,
    /// Calls of the callback.
    calls: Mutex<usize>,
}

fn block_at(addr: usize) -> NonNull<u8> {
    NonNull::new(std::ptr::with_exposed_provenance_mut(addr)).unwrap()
}

/// Builds the resource above `Retry<Limiting<Simulated>>` with `make`, fills it with blocks of
/// `block` bytes until its upstream is out, then asks for one more: the callback frees every
/// kept block through the resource and calls `trim` on it. Returns the last request's outcome
/// and the callback's calls; panics if that takes 20 seconds (a deadlock).
fn reenter<R, T: 'static>(
    block: usize,
    make: impl FnOnce(Below) -> R + Send + 'static,
    trim: fn(&R) -> T,
) -> (Result<(), AllocError>, usize)
where
    R: MemoryResource + Send + Sync + 'static,
{
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let shared: Arc<Shared<R>> = Arc::new(Shared {
            above: OnceLock::new(),
            cache: Mutex::new(Vec::new()),
            calls: Mutex::new(0),
        });
        let weak: Weak<Shared<R>> = Arc::downgrade(&shared);
        let on_failure: RetryCallback = Box::new(move |_, attempt| {
            let Some(shared) = weak.upgrade() else {
                return false;
            };
            *shared.calls.lock().unwrap() += 1;
            if let Some(above) = shared.above.get() {
                for (p, size) in shared.cache.lock().unwrap().drain(..) {
                    // SAFETY: allocated from `above` with this size and alignment 256.
                    unsafe { above.deallocate(block_at(p), size, 256, StreamRef::DEFAULT) };
                }
                // What the trim gave back, if it says, is not this test's question.
                let _ = trim(above);
            }
            attempt < 2
        });
        let below = Retry::new(Limiting::new(Simulated::new(1 << 30), LIMIT), on_failure);
        let above = shared.above.get_or_init(|| make(below));
        // Up to twice the limit: the upstream runs out before.
        for _ in 0..2 * LIMIT / block {
            match above.allocate(block, 256, StreamRef::DEFAULT) {
                Ok(p) => shared
                    .cache
                    .lock()
                    .unwrap()
                    .push((p.as_ptr() as usize, block)),
                Err(_) => break,
            }
        }
        let last = above.allocate(block, 256, StreamRef::DEFAULT).map(|p| {
            // SAFETY: just allocated with this size and alignment.
            unsafe { above.deallocate(p, block, 256, StreamRef::DEFAULT) }
        });
        for (p, size) in shared.cache.lock().unwrap().drain(..) {
            // SAFETY: as in the callback.
            unsafe { above.deallocate(block_at(p), size, 256, StreamRef::DEFAULT) };
        }
        let calls = *shared.calls.lock().unwrap();
        let _ = tx.send((last, calls));
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the callback's call into the resource above deadlocked")
}

/// Checks that the upstream ran out (so the callback ran) and that the chunks the callback freed
/// and released served the request after.
#[track_caller]
fn made_room((last, calls): (Result<(), AllocError>, usize)) {
    assert!(calls >= 1, "the upstream never ran out");
    last.expect("the freed and released chunks serve the request");
}

/// Each suballocator that keeps whole chunks gives them back when trimmed.
#[test]
fn a_callback_that_frees_into_a_pool_a_tlsf_or_thread_heaps_and_trims_it_makes_room() {
    let (block, max) = (1 << 20, 64 << 20);
    let pool = move |b| Pool::new(b, PoolConfig { initial: 0, max });
    let tlsf = move |b| Tlsf::new(b, TlsfConfig { initial: 0, max });
    let heaps = move |b| ThreadHeaps::new(b, ThreadHeapsConfig { max });
    made_room(reenter(block, pool, Pool::release));
    made_room(reenter(block, tlsf, Tlsf::release));
    made_room(reenter(block, heaps, ThreadHeaps::release));
}

#[test]
fn a_callback_that_frees_into_a_fixed_size_does_not_deadlock() {
    let config = FixedSizeConfig {
        block_size: 1 << 20,
        blocks_to_preallocate: 1,
    };
    let (last, calls) = reenter(1 << 20, move |below| FixedSize::new(below, config), |_| {});
    assert!(calls >= 1, "the upstream never ran out");
    // The callback ran in the fill's last request; the blocks it freed serve the next one.
    last.expect("a block the callback freed serves the request");
}

/// The suballocators that keep no chunks to trim: the callback only frees blocks into them.
#[test]
fn a_callback_that_frees_into_a_binning_or_an_arena_does_not_deadlock() {
    let (min, max) = (256, 64 << 10);
    let (size, superblock) = (64 << 20, 1 << 20);
    let binning = move |b| Binning::new(b, BinningConfig { min, max });
    let arena = move |b| Arena::new(b, ArenaConfig { size, superblock });
    let (_, calls) = reenter(64 << 10, binning, |_| {});
    assert!(calls >= 1, "the upstream never ran out");
    let (_, calls) = reenter(128 << 10, arena, |_| {});
    assert!(calls >= 1, "the upstream never ran out");
}

/// An upstream whose `allocate` takes 50 ms, so that threads needing memory at once find
/// another thread's growth under way (with the suballocator's lock let go).
struct Slow(Simulated);

// SAFETY: forwards everything to Simulated unchanged, after a sleep.
unsafe impl MemoryResource for Slow {
    claims! { as Simulated }
    fn allocate(&self, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>, AllocError> {
        std::thread::sleep(Duration::from_millis(50));
        self.0.allocate(size, align, s)
    }
    deallocate_to!(0);
    streams!(to 0);
}

/// `threads` threads each ask `mr` for `block` bytes at once; every one must be served.
fn all_served_at_once(mr: &(impl MemoryResource + Sync), threads: usize, block: usize) {
    let barrier = std::sync::Barrier::new(threads);
    let got: Vec<Result<usize, AllocError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    mr.allocate(block, 256, StreamRef::DEFAULT)
                        .map(|p| p.as_ptr() as usize)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, g) in got.iter().enumerate() {
        assert!(g.is_ok(), "thread {i}: {g:?}");
    }
    for p in got.into_iter().flatten() {
        // SAFETY: allocated above with this size.
        unsafe { mr.deallocate(block_at(p), block, 256, StreamRef::DEFAULT) };
    }
}

#[test]
fn threads_that_need_room_while_another_grows_to_the_cap_wait_for_it() {
    // Near its cap a growth takes all that is left: the others find no room, and must wait for
    // that growth (whose chunk serves them) rather than fail.
    let pool = resource_stack![Slow(Simulated::new(1 << 30)), Pool { initial: 0, max: 4 MiB }];
    all_served_at_once(&pool, 4, 1 << 20);
    let tlsf = resource_stack![Slow(Simulated::new(1 << 30)), Tlsf { initial: 0, max: 4 MiB }];
    all_served_at_once(&tlsf, 4, 1 << 20);
    let arena = resource_stack![
        Slow(Simulated::new(1 << 30)),
        Arena { size: 16 MiB, superblock: 1 MiB },
    ];
    // Small requests (local arenas) and large ones (the global arena) at once.
    all_served_at_once(&arena, 4, 64 << 10);
    let arena = resource_stack![
        Slow(Simulated::new(1 << 30)),
        Arena { size: 16 MiB, superblock: 1 MiB },
    ];
    all_served_at_once(&arena, 4, 2 << 20);
}

#[test]
fn growths_at_once_take_one_chunk_and_serve_every_thread() {
    // With the lock let go, threads growing at once would each take a chunk (sixteen threads:
    // 64 GiB held for 64 KiB), and one whose upstream another's chunk had spent would fail
    // although that chunk had room. One growth at a time, as if the lock were held.
    let pool = Pool::new(Slow(Simulated::new(2 << 20)), PoolConfig::default());
    all_served_at_once(&pool, 16, 4096);
    assert_eq!(pool.usage().held, 2 << 20);
    let tlsf = Tlsf::new(Slow(Simulated::new(2 << 20)), TlsfConfig::default());
    all_served_at_once(&tlsf, 16, 4096);
    assert_eq!(tlsf.usage().held, 2 << 20);
    let fixed = resource_stack![
        Slow(Simulated::new(4 << 20)),
        FixedSize { block_size: 1 MiB, blocks_to_preallocate: 2 },
    ];
    all_served_at_once(&fixed, 4, 1 << 20);
    for size in [4096, 2 << 20] {
        let arena = resource_stack![
            Slow(Simulated::new(8 << 20)),
            Arena { size: 16 MiB, superblock: 1 MiB },
        ];
        all_served_at_once(&arena, 2, size);
        assert_eq!(
            arena.usage().held,
            8 << 20,
            "one chunk, halved to what the upstream has"
        );
    }
}
