//! Host tests over every adaptor: a stack of every host adaptor against a model, and every
//! adaptor forwarding `synchronize` and `order_after` to its upstream (`Prefetch` included; its
//! prefetching needs a GPU: tests/gpu/adaptors.rs).

use crate::adaptor_support::claims;
use mrstack::adaptor::RetryCallback;
use mrstack::prelude::*;
use mrstack::stream::StreamId;
use mrstack::{
    adaptor::{Aligned, Limiting, Logging, Prefetch, Retry, Statistics, Tracking},
    erased::{AnyResource, ResourceRef},
    resource::AllocErrorKind,
    suballoc::{Arena, Binning, FixedSize, Pool},
};
use proptest::prelude::*;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use typenum::{B0, B1, U1024, U256, U4096};

use crate::adaptor_support::{counter, fill, holds, ops, stream, Op, Refusing, S};

/// What the five-adaptor stack below builds.
type FiveStack<'a> =
    Logging<Retry<Statistics<Tracking<Limiting<Aligned<U4096, &'a Simulated>>>>, RetryCallback>>;

#[test]
fn five_adaptors_in_one_stack() {
    let sim = Simulated::new(1 << 30);
    let retries = Arc::new(AtomicUsize::new(0));
    let seen = retries.clone();
    let mr = resource_stack![
        &sim,
        Aligned<U4096>,
        Limiting { limit: 64 KiB },
        Tracking,
        Statistics,
        Retry {
            on_failure: Box::new(move |_, _| {
                seen.fetch_add(1, Ordering::Relaxed);
                false
            })
        },
        Logging { to: Box::new(std::io::sink()) },
    ];
    // The type is the stack, outermost first.
    let _: &FiveStack<'_> = &mr;
    assert_eq!(alignment(&mr), 4096);

    let a = mr.allocate(10_000, 8, S).unwrap();
    let b = mr.allocate(20_000, 8, stream(2)).unwrap();
    assert_eq!(a.as_ptr() as usize % 4096, 0);
    assert_eq!(b.as_ptr() as usize % 4096, 0);
    let err = mr.allocate(40_000, 8, S).unwrap_err();
    assert!(matches!(
        err.kind,
        AllocErrorKind::LimitExceeded {
            limit: 65536,
            in_use: 30_000
        }
    ));
    assert_eq!(retries.load(Ordering::Relaxed), 1);

    let stats = mr.upstream().upstream();
    assert_eq!(stats.bytes(), counter(30_000, 30_000, 30_000));
    let tracking = stats.upstream();
    assert_eq!(tracking.outstanding_bytes(), 30_000);
    assert_eq!(tracking.upstream().in_use(), 30_000);

    // SAFETY: each came from mr with this size, alignment and stream.
    unsafe {
        mr.deallocate(a, 10_000, 8, S);
        mr.deallocate(b, 20_000, 8, stream(2));
    }
    assert_eq!(stats.bytes(), counter(0, 30_000, 30_000));
    assert_eq!(tracking.outstanding_count(), 0);
    assert_eq!(sim.in_use(), 0);
    mr.flush().unwrap();
}

/// A resource's guaranteed alignment, read from a value whose type is long to write.
fn alignment<R: MemoryResource>(_: &R) -> usize {
    mrstack::property::alignment_of::<R>()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A stack of every host adaptor over real memory (an upstream that refuses large
    /// alignments, so Aligned over-allocates): every block aligned, no two overlapping (each
    /// keeps its pattern), the counters agree, and everything goes back.
    #[test]
    fn host_stack_matches_a_model(ops in ops()) {
        let up = Refusing::default();
        let mr = resource_stack![
            &up,
            Aligned<U1024>,
            Tracking,
            Limiting { limit: 64 KiB },
            Statistics,
        ];
        let mut live: Vec<(NonNull<u8>, usize, u8)> = Vec::new();
        let mut in_use = 0usize;
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Alloc(size) => match mr.allocate(size, 16, S) {
                    Ok(p) => {
                        prop_assert_eq!(p.as_ptr() as usize % 1024, 0);
                        if size > 0 {
                            let tag = i as u8;
                            fill(p, size, tag);
                            live.push((p, size, tag));
                            in_use += size;
                        }
                    }
                    Err(e) => {
                        prop_assert!(in_use + size > 64 << 10, "{}", e);
                        let over = matches!(e.kind, AllocErrorKind::LimitExceeded { limit: 65536, .. });
                        prop_assert!(over);
                    }
                },
                Op::Free(i) if !live.is_empty() => {
                    let (p, size, tag) = live.swap_remove(i % live.len());
                    prop_assert!(holds(p, size, tag));
                    // SAFETY: p came from mr with this size and alignment.
                    unsafe { mr.deallocate(p, size, 16, S) };
                    in_use -= size;
                }
                Op::Free(_) => {}
            }
            prop_assert_eq!(mr.bytes().current as usize, in_use);
            prop_assert_eq!(mr.upstream().in_use(), in_use);
            prop_assert_eq!(mr.upstream().upstream().outstanding_bytes(), in_use);
            prop_assert_eq!(mr.allocations().current as usize, live.len());
        }
        for (p, size, tag) in live {
            prop_assert!(holds(p, size, tag));
            // SAFETY: p came from mr with this size and alignment.
            unsafe { mr.deallocate(p, size, 16, S) };
        }
        prop_assert!(up.live.lock().unwrap().is_empty());
    }
}

/// Records the `synchronize` and `order_after` calls it gets. It never hands out memory (every
/// allocation fails), so it may claim every property: a claim about no memory is true.
#[derive(Default)]
struct StreamRecorder {
    syncs: Mutex<Vec<StreamId>>,
    orders: Mutex<Vec<(StreamId, StreamId)>>,
}

// SAFETY: `allocate` always fails, so no memory is ever handed out and every property holds of
// none; the stream calls only record.
unsafe impl MemoryResource for StreamRecorder {
    claims! { Host = B1, Device = B1, Migratable = B1, Pageable = B0, Alignment = U256 }
    fn allocate(&self, size: usize, align: usize, _: StreamRef) -> Result<NonNull<u8>, AllocError> {
        Err(AllocError::out_of_memory(size, align, "StreamRecorder"))
    }
    unsafe fn deallocate(&self, _: NonNull<u8>, _: usize, _: usize, _: StreamRef) {}
    fn synchronize(&self, s: StreamRef) -> Result<(), AllocError> {
        self.syncs.lock().unwrap().push(s.id());
        Ok(())
    }
    fn order_after(&self, s: StreamRef, after: StreamRef) -> Result<(), AllocError> {
        self.orders.lock().unwrap().push((s.id(), after.id()));
        Ok(())
    }
}

/// Calls `synchronize(3)` and `order_after(1, 2)` on `mr` and checks that `rec` saw exactly them.
fn check_forwarding<R: MemoryResource>(name: &str, mr: &R, rec: &StreamRecorder) {
    rec.syncs.lock().unwrap().clear();
    rec.orders.lock().unwrap().clear();
    mr.synchronize(stream(3)).unwrap();
    mr.order_after(stream(1), stream(2)).unwrap();
    assert_eq!(
        *rec.syncs.lock().unwrap(),
        [stream(3).id()],
        "{name}: synchronize did not reach the upstream"
    );
    assert_eq!(
        *rec.orders.lock().unwrap(),
        [(stream(1).id(), stream(2).id())],
        "{name}: order_after did not reach the upstream"
    );
}

#[test]
fn every_adaptor_forwards_synchronize_and_order_after() {
    use mrstack::suballoc::{ArenaConfig, BinningConfig, FixedSizeConfig, PoolConfig};
    let rec = StreamRecorder::default();
    let r = &rec;
    check_forwarding("&R", &r, r);
    check_forwarding("Arc<R>", &Arc::new(r), r);
    check_forwarding("Statistics", &Statistics::new(r), r);
    check_forwarding("Tracking", &Tracking::new(r), r);
    check_forwarding("Logging", &Logging::new(r, Vec::new()), r);
    check_forwarding("Limiting", &Limiting::new(r, 1 << 20), r);
    check_forwarding("Aligned", &Aligned::<U4096, _>::new(r), r);
    check_forwarding("Retry", &Retry::new(r, |_: &AllocError, _| false), r);
    check_forwarding("Prefetch", &Prefetch::new(r, 0), r);
    check_forwarding("Pool", &Pool::new(r, PoolConfig::default()), r);
    check_forwarding(
        "FixedSize",
        &FixedSize::new(r, FixedSizeConfig::default()),
        r,
    );
    check_forwarding("Binning", &Binning::new(r, BinningConfig::default()), r);
    check_forwarding("Arena", &Arena::new(r, ArenaConfig::default()), r);
    check_forwarding("Metered", &mrstack::replay::Metered::new(r), r);
    // AnyResource needs a 'static resource: a recorder of its own.
    let erased = Arc::new(StreamRecorder::default());
    let any =
        AnyResource::<(HostAccessible, DeviceAccessible, Migratable)>::from_arc(erased.clone());
    check_forwarding("AnyResource", &any, &erased);
    check_forwarding("ResourceRef", &ResourceRef::<DeviceAccessible>::new(r), r);
}
