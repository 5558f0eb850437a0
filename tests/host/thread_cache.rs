//! Host tests of `ThreadCache`: reuse within a size class and stream, pass-through of large
//! requests, the budget, blocks given back on out of memory and by exiting threads, stream
//! switches, the shared lists, its text config, and a model-based property test.

use mrstack::prelude::*;
use proptest::prelude::*;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::adaptor_support::{ops, stream, Op, S};

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
                crate::support::serve_one(&mr, 64 << 10, 256, stream(1));
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
        crate::support::serve_one(&mr, 64 << 10, 256, stream(1));
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
    crate::support::serve_one(&mr, 256, 256, stream(1000));
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
        crate::support::serve_one(&mr, 256, 256, stream(k as usize));
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
