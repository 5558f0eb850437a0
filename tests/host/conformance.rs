//! The conformance battery (`mrstack::testing`) over every resource that runs on the host: the
//! host leaves, every suballocator and every host adaptor over a recording upstream, the erased
//! handles, `&R`, `Arc<R>` and stacks of several layers. What each must give back is checked by
//! the battery through the recorder; the leaves without one are checked here.

// resource_stack! always adds `..Default::default()`, which clippy flags for a configuration whose
// every field is given.
#![allow(clippy::needless_update)]

use crate::adaptor_support::claims;
use mrstack::prelude::*;
use mrstack::suballoc::{BinningConfig, PoolConfig, TlsfConfig};
use mrstack::testing::{conformance, DeviceStandIn, Options, Recorder, Report};
use mrstack::{
    adaptor::{Aligned, Limiting, Logging, Retry, Statistics, Tracking},
    erased::{AnyResource, ResourceRef},
    leaf::{VirtualMemory, VirtualMemoryConfig},
    suballoc::{Binning, Pool, Tlsf},
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use typenum::U4096;

const MIB: usize = 1 << 20;

/// The default options, with `rec` as the upstream to check.
fn over<U>(rec: &Recorder<U>) -> Options<'_> {
    Options {
        upstream: Some(rec.record()),
        ..Options::default()
    }
}

/// A recording upstream of real host memory, so that the battery's patterns are real bytes.
fn system() -> Recorder<System> {
    Recorder::new(System::new())
}

/// A report of a resource that served every alignment asked.
fn refused_none(report: Report) {
    assert!(report.allocations > 0);
    assert_eq!(report.refused_alignments, [] as [usize; 0]);
}

// ------------------------------------------------------------------------------------ leaves

#[test]
fn system_leaf() {
    // Alignments up to 64 KiB: std::alloc honours any.
    let options = Options {
        max_align: 1 << 16,
        ..Options::default()
    };
    refused_none(conformance(System::new(), &options));
}

#[test]
fn simulated_leaf() {
    let sim = Simulated::new(1 << 30);
    refused_none(conformance(&sim, &Options::default()));
    assert_eq!((sim.in_use(), sim.live()), (0, 0));
}

#[test]
fn callback_leaf_over_host_functions() {
    let mr = crate::callback::heap();
    refused_none(conformance(&mr, &Options::default()));
    let heap = mr.context();
    assert!(heap.live.lock().unwrap().is_empty());
    assert_eq!(
        heap.calls.load(Ordering::Relaxed),
        heap.frees.load(Ordering::Relaxed)
    );
}

#[test]
fn device_stand_in_leaf() {
    // Device memory to the types, checked for overlap only (nothing may write it).
    let device = DeviceStandIn::new();
    let options = Options {
        max_align: 1 << 16,
        ..Options::default()
    };
    refused_none(conformance(&device, &options));
    assert_eq!((device.in_use(), device.live()), (0, 0));
    assert!(device.allocation_count() > 0);
}

// ----------------------------------------------------------------------------- suballocators

#[test]
fn pool_over_system() {
    let rec = system();
    refused_none(conformance(
        Pool::new(&rec, PoolConfig::default()),
        &over(&rec),
    ));
}

#[test]
fn pool_over_simulated_with_an_initial_chunk() {
    let rec = Recorder::new(Simulated::new(1 << 30));
    let pool = resource_stack![
        &rec,
        Pool {
            initial: 4 * MIB,
            max: 512 * MIB
        }
    ];
    refused_none(conformance(pool, &over(&rec)));
}

#[test]
fn tlsf_over_system() {
    let rec = system();
    refused_none(conformance(
        Tlsf::new(&rec, TlsfConfig::default()),
        &over(&rec),
    ));
}

#[test]
fn tlsf_over_simulated_with_an_initial_chunk() {
    let rec = Recorder::new(Simulated::new(1 << 30));
    let tlsf = resource_stack![
        &rec,
        Tlsf {
            initial: 4 * MIB,
            max: 512 * MIB
        }
    ];
    refused_none(conformance(tlsf, &over(&rec)));
}

#[test]
fn thread_heaps_over_system_and_over_simulated() {
    use mrstack::suballoc::{ThreadHeaps, ThreadHeapsConfig};
    let rec = system();
    refused_none(conformance(
        ThreadHeaps::new(&rec, ThreadHeapsConfig::default()),
        &over(&rec),
    ));
    let rec = Recorder::new(Simulated::new(1 << 30));
    let heaps = ThreadHeaps::new(&rec, ThreadHeapsConfig { max: 512 * MIB });
    refused_none(conformance(heaps, &over(&rec)));
}

#[test]
fn virtual_memory_over_simulated_pages() {
    let sim = Simulated::with_page_size(1 << 30, 64 << 10);
    let vm = VirtualMemory::new(&sim, VirtualMemoryConfig::default()).unwrap();
    let options = Options {
        max_align: 1 << 16,
        ..Options::default()
    };
    refused_none(conformance(&vm, &options));
    assert_eq!(vm.usage().allocated, 0);
    drop(vm);
    assert_eq!((sim.in_use(), sim.reservations()), (0, 0));
}

#[test]
fn paged_heaps_over_simulated_pages() {
    use mrstack::leaf::{PagedHeaps, PagedHeapsConfig};
    let sim = Simulated::with_page_size(1 << 30, 64 << 10);
    let heaps = PagedHeaps::new(&sim, PagedHeapsConfig::default());
    let options = Options {
        max_align: 1 << 16,
        ..Options::default()
    };
    refused_none(conformance(&heaps, &options));
    assert_eq!(heaps.usage().allocated, 0);
    drop(heaps);
    assert_eq!((sim.in_use(), sim.reservations()), (0, 0));
}

#[test]
fn fixed_size_serves_its_block_size() {
    let rec = system();
    let block = 64 << 10;
    let fixed = resource_stack![
        &rec,
        FixedSize {
            block_size: block,
            blocks_to_preallocate: 16
        }
    ];
    let report = conformance(
        fixed,
        &Options {
            max_size: block,
            ..over(&rec)
        },
    );
    assert_eq!(report.refused_alignments, [512, 1024, 2048, 4096]);
}

#[test]
fn binning_with_bins_and_the_upstream() {
    let rec = system();
    // Requests up to 16 KiB go to bins, larger ones (up to the battery's 64 KiB) to the upstream.
    let bins = resource_stack![&rec, Binning { min: 256 B, max: 16 KiB }];
    refused_none(conformance(bins, &over(&rec)));
}

#[test]
fn binning_with_a_bin_of_its_own_resource() {
    let rec = system();
    let own = Arc::new(Recorder::new(System::new()));
    // The 4 KiB bin's requests (2 KiB < size <= 4 KiB) go to a Pool over a recorder of its own.
    let pool = Pool::new(own.clone(), PoolConfig::default());
    let bins = Binning::new(
        &rec,
        BinningConfig {
            min: 256,
            max: 16 << 10,
        },
    )
    .with_bin(4 << 10, pool)
    .unwrap();
    refused_none(conformance(bins, &over(&rec)));
    assert!(
        own.record().allocations() > 0,
        "the bin's own resource served requests"
    );
    assert_eq!(own.record().in_use(), 0, "and got everything back");
}

#[test]
fn thread_cache_over_system_and_over_tlsf() {
    use mrstack::adaptor::{ThreadCache, ThreadCacheConfig};
    let rec = system();
    // A budget of 256 KiB: the battery's threads fill it, so blocks also spill and pass through.
    let config = ThreadCacheConfig {
        bytes: 256 << 10,
        max_block: 32 << 10,
    };
    refused_none(conformance(ThreadCache::new(&rec, config), &over(&rec)));
    let rec = system();
    let tlsf = mrstack::suballoc::Tlsf::new(&rec, TlsfConfig::default());
    refused_none(conformance(ThreadCache::new(tlsf, config), &over(&rec)));
}

#[test]
fn graph_pools_outside_captures() {
    let rec = system();
    // No stream here captures: every call is the upstream's.
    let mr = mrstack::adaptor::GraphPools::new(&rec);
    refused_none(conformance(mr, &over(&rec)));
    let text = mrstack::config::build::<()>("simulated(capacity=1 GiB) > graph_pools").unwrap();
    assert_eq!(
        text.describe().to_string(),
        "simulated(capacity=1 GiB) > graph_pools"
    );
}

#[test]
fn arena_with_local_and_global_requests() {
    let rec = system();
    let arena = resource_stack![
        &rec,
        Arena {
            size: 256 * MIB,
            superblock: MIB
        }
    ];
    // Up to a quarter of a superblock is served by the thread arenas, larger by the global one.
    let options = Options {
        max_size: 512 << 10,
        ..over(&rec)
    };
    refused_none(conformance(arena, &options));
}

#[test]
fn arena_over_simulated_taking_pieces() {
    // An upstream too small for the whole arena: it takes pieces on demand.
    let rec = Recorder::new(Simulated::new(48 * MIB));
    let arena = resource_stack![
        &rec,
        Arena {
            size: 64 * MIB,
            superblock: MIB
        }
    ];
    refused_none(conformance(arena, &over(&rec)));
}

// ---------------------------------------------------------------------------------- adaptors

#[test]
fn statistics() {
    let rec = system();
    refused_none(conformance(Statistics::new(&rec), &over(&rec)));
}

#[test]
fn tracking() {
    let rec = system();
    refused_none(conformance(Tracking::new(&rec), &over(&rec)));
}

#[test]
fn logging_to_a_vec() {
    let rec = system();
    refused_none(conformance(Logging::new(&rec, Vec::new()), &over(&rec)));
}

#[test]
fn logging_to_a_sink() {
    let rec = system();
    refused_none(conformance(
        Logging::new(&rec, std::io::sink()),
        &over(&rec),
    ));
}

#[test]
fn limiting() {
    let rec = system();
    refused_none(conformance(Limiting::new(&rec, 64 * MIB), &over(&rec)));
}

#[test]
fn aligned() {
    let rec = system();
    refused_none(conformance(Aligned::<U4096, _>::new(&rec), &over(&rec)));
}

#[test]
fn retry() {
    let rec = system();
    let retry = Retry::new(&rec, |_: &AllocError, _| false);
    refused_none(conformance(retry, &over(&rec)));
}

#[test]
fn metered() {
    let rec = system();
    refused_none(conformance(
        mrstack::replay::Metered::new(&rec),
        &over(&rec),
    ));
}

// ---------------------------------------------------------------- erased handles and pointers

#[test]
fn any_resource_over_a_pool() {
    let rec = Arc::new(system());
    let any = AnyResource::<HostAccessible>::new(Pool::new(rec.clone(), PoolConfig::default()));
    refused_none(conformance(any, &over(&rec)));
}

#[test]
fn resource_ref_over_tracking() {
    let rec = system();
    let tracking = Tracking::new(&rec);
    refused_none(conformance(
        ResourceRef::<HostAccessible>::new(&tracking),
        &over(&rec),
    ));
    assert_eq!(tracking.outstanding_count(), 0);
}

#[test]
fn a_reference_to_limiting() {
    let rec = system();
    let limiting = Limiting::new(&rec, 64 * MIB);
    refused_none(conformance(&limiting, &over(&rec)));
    assert_eq!(limiting.in_use(), 0);
}

#[test]
fn an_arc_of_binning() {
    let rec = system();
    let bins = Arc::new(Binning::new(&rec, BinningConfig::default()));
    refused_none(conformance(bins, &over(&rec)));
}

// -------------------------------------------------------------------------------------- stacks

#[test]
fn a_stack_of_seven_layers() {
    let rec = system();
    let mr = resource_stack![
        &rec,
        Pool,
        Binning { max: 16 KiB },
        Aligned<U4096>,
        Limiting { limit: 256 MiB },
        Tracking,
        Statistics,
        Logging { to: Box::new(std::io::sink()) },
    ];
    refused_none(conformance(mr, &over(&rec)));
}

#[test]
fn aligned_over_a_suballocator_that_refuses_it() {
    // FixedSize refuses alignments above 256: Aligned over-allocates inside a block instead.
    let rec = system();
    let fixed = resource_stack![&rec, FixedSize { block_size: 64 KiB, blocks_to_preallocate: 16 }];
    let options = Options {
        max_size: 32 << 10,
        ..over(&rec)
    };
    refused_none(conformance(Aligned::<U4096, _>::new(fixed), &options));
}

#[test]
fn an_erased_stack_over_simulated() {
    let rec = Arc::new(Recorder::new(Simulated::new(1 << 30)));
    let mr = resource_stack![rec.clone(), Arena { size: 64 MiB }, Statistics];
    let any = AnyResource::<()>::new(mr);
    refused_none(conformance(any, &over(&rec)));
}

#[test]
fn a_device_stack_over_the_stand_in() {
    // What a library over device memory would be handed: a stack that is DeviceAccessible by its
    // type, erased, on a host without a GPU.
    let rec = Arc::new(Recorder::new(DeviceStandIn::with_capacity(1 << 30)));
    let mr = resource_stack![rec.clone(), Pool { max: 256 MiB }, Binning, Statistics];
    let any = AnyResource::<DeviceAccessible>::new(mr);
    refused_none(conformance(any, &over(&rec)));
    assert_eq!(rec.inner().in_use(), 0);
}

// ------------------------------------------------------------------- the battery catches bugs

/// The bugs [`Broken`] has, one at a time.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Bug {
    /// Asks the upstream for the alignment it guarantees, whatever was asked.
    IgnoresAlignment,
    /// Returns `Ok` from `order_after` without a word to the upstream.
    ForgetsOrderAfter,
    /// Never gives anything back.
    Leaks,
    /// Passes zero-size requests to the upstream.
    ForwardsZeroSize,
    /// Hands out twice the bytes it asks the upstream for.
    Overlaps,
    /// Accepts a size that overflows once aligned, as a one-byte request.
    AcceptsOverflow,
}

/// An adaptor over `Simulated` with one bug: memory no one may dereference, so that no bug can
/// do harm.
#[derive(Debug)]
struct Broken<'a> {
    upstream: &'a Recorder<Simulated>,
    bug: Bug,
}

// SAFETY: broken on purpose, as the tests below say; the memory is `Simulated`'s, which claims no
// access property, so nothing dereferences it and none of the bugs can cause harm.
unsafe impl MemoryResource for Broken<'_> {
    claims! { Host = typenum::B0, Device = typenum::B0, Migratable = typenum::B0, Pageable = typenum::B0, Alignment = typenum::U256 }

    fn allocate(
        &self,
        size: usize,
        align: usize,
        s: StreamRef,
    ) -> Result<std::ptr::NonNull<u8>, AllocError> {
        match self.bug {
            Bug::ForwardsZeroSize => {}
            Bug::AcceptsOverflow if size > isize::MAX as usize / 2 => {
                return self.upstream.allocate(1, align, s)
            }
            _ => {
                if let Some(p) = mrstack::resource::check_request::<Self>(size, align, "Broken")? {
                    return Ok(p);
                }
            }
        }
        match self.bug {
            Bug::IgnoresAlignment => self.upstream.allocate(size, 256, s),
            Bug::Overlaps => self.upstream.allocate(size.div_ceil(2), align, s),
            _ => self.upstream.allocate(size, align, s),
        }
    }
    unsafe fn deallocate(&self, p: std::ptr::NonNull<u8>, size: usize, align: usize, s: StreamRef) {
        match self.bug {
            Bug::Leaks => {}
            Bug::Overlaps if size > 0 => {
                // SAFETY: `p` came from the upstream with half the size.
                unsafe { self.upstream.deallocate(p, size.div_ceil(2), align, s) }
            }
            Bug::ForwardsZeroSize => {
                // SAFETY: forwarded from the caller.
                unsafe { self.upstream.deallocate(p, size, align, s) }
            }
            _ if size == 0 => {}
            // SAFETY: forwarded from the caller.
            _ => unsafe { self.upstream.deallocate(p, size, align, s) },
        }
    }
    fn synchronize(&self, s: StreamRef) -> Result<(), AllocError> {
        self.upstream.synchronize(s)
    }
    fn order_after(&self, s: StreamRef, after: StreamRef) -> Result<(), AllocError> {
        if self.bug == Bug::ForgetsOrderAfter {
            return Ok(());
        }
        self.upstream.order_after(s, after)
    }
}

fn run_broken(bug: Bug) {
    let rec = Recorder::new(Simulated::new(1 << 30));
    conformance(
        Broken {
            upstream: &rec,
            bug,
        },
        &over(&rec),
    );
}

#[test]
#[should_panic(expected = "not aligned to 512")]
fn the_battery_catches_an_ignored_alignment() {
    run_broken(Bug::IgnoresAlignment);
}

#[test]
#[should_panic(
    expected = "order_after(StreamRef(0x0), StreamRef(sim1)) did not reach the upstream"
)]
fn the_battery_catches_a_forgotten_order_after() {
    run_broken(Bug::ForgetsOrderAfter);
}

#[test]
#[should_panic(expected = "once dropped, the upstream still has")]
fn the_battery_catches_a_leak() {
    run_broken(Bug::Leaks);
}

#[test]
#[should_panic(expected = "request reached the upstream")]
fn the_battery_catches_zero_size_requests_upstream() {
    run_broken(Bug::ForwardsZeroSize);
}

#[test]
#[should_panic(expected = "overlaps the live")]
fn the_battery_catches_overlapping_blocks() {
    run_broken(Bug::Overlaps);
}

#[test]
#[should_panic(expected = ", not an error")]
fn the_battery_catches_an_accepted_overflow() {
    run_broken(Bug::AcceptsOverflow);
}

/// The largest alignment a `usize` holds ends the battery's walk over alignments with the
/// resource's own answer, not with an overflow of the walk.
#[test]
#[should_panic(expected = "Simulated: allocate(")]
fn an_alignment_of_two_to_the_63_is_asked_not_overflowed() {
    let sim = Simulated::new(usize::MAX);
    let options = Options {
        max_align: 1 << 63,
        ..Options::default()
    };
    conformance(&sim, &options);
}
