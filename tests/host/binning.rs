//! Host tests of `Binning`: routing by size and alignment, bins over a pool or their own
//! resources, usage under threads, per-thread caches, a retry callback that frees through it,
//! and its text description.

use mrstack::prelude::*;
use mrstack::suballoc::{BinningConfig, FixedSizeConfig, PoolConfig};
use mrstack::testing::Recorder;
use mrstack::{
    adaptor::{Limiting, Retry, Statistics},
    suballoc::{Binning, FixedSize, Pool},
};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::suballoc_support::{free_per_bin, hammer, nn, stream};

#[test]
fn binning_routes_by_size_and_alignment() {
    let sim = Simulated::new(1 << 30);
    let mr = resource_stack![&sim, Binning { min: 1 KiB, max: 8 KiB }];
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

#[test]
fn binning_takes_back_blocks_other_threads_cache_when_the_upstream_is_out() {
    // Four 256 KiB blocks in all: one thread takes them and frees them into its own cache; another
    // thread then gets every one of them (the caches are emptied when the upstream is out).
    let sim = Simulated::new(1 << 20);
    let mr = resource_stack![&sim, Binning { min: 256 KiB, max: 256 KiB }];
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
