//! Host tests of `Limiting`: the cap, the reservation given back when the upstream fails or
//! panics, and the cap under concurrency and wrapping thread counts.

use crate::adaptor_support::{deallocate_to, streams};
use mrstack::prelude::*;
use mrstack::{adaptor::Limiting, resource::AllocErrorKind};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use typenum::{B0, B1};

use crate::adaptor_support::{hand_over, S};

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

/// An upstream that panics once, on its first allocation, handing out nothing.
struct PanicsOnce(System, std::sync::atomic::AtomicBool);

// SAFETY: every call goes to System, or panics before reaching it.
unsafe impl MemoryResource for PanicsOnce {
    type Host = B1;
    type Device = B0;
    type Migratable = B0;
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
    deallocate_to!(0);
    streams!(to 0);
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
    crate::support::serve_one(&mr, 768 << 10, 8, S);
    assert_eq!(mr.in_use(), 0);
}
