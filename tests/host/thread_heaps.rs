//! Host tests of `ThreadHeaps`: heaps outliving their threads, blocks going back to their own
//! heap, the cap, a panicking upstream, and a 16-thread stress test.

use mrstack::prelude::*;
use mrstack::suballoc::ThreadHeaps;
use mrstack::suballoc::ThreadHeapsConfig;
use mrstack::testing::Recorder;

use crate::suballoc_support::{nn, on_workers, sixteen_threads, stream, Job, Live, PanicsOnce};

#[test]
fn thread_heaps_sixteen_threads_nothing_overlaps_nothing_is_lost() {
    let rec = Recorder::new(System::new());
    let heaps = ThreadHeaps::new(&rec, ThreadHeapsConfig { max: 1 << 30 });
    sixteen_threads(&heaps, &rec, 0x6A09_E667_F3BC_C908);
    assert!(heaps.heaps() >= 2, "the threads had heaps of their own");
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
        // Two heaps, or one where other tests' threads hold every thread slot at the moment
        // (both threads then share the overflow heap): the block goes back either way.
        assert!((1..=2).contains(&heaps.heaps()), "{}", heaps.heaps());
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
    crate::support::serve_one(&heaps, 4 << 20, 256, StreamRef::DEFAULT);
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
    crate::support::serve_one(&heaps, 8 << 20, 256, StreamRef::DEFAULT);
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
