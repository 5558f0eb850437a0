//! Host tests of `HostAllocator`: allocator-api2 collections over mrstack resources, checked
//! against `std::vec::Vec` and against the resource's own accounting.

use crate::adaptor_support::{claims, streams};
use allocator_api2::boxed::Box as ABox;
use allocator_api2::vec::Vec as AVec;
use mrstack::prelude::*;
use mrstack::property::Pageable;
use mrstack::stream::StreamId;
use mrstack::{
    adaptor::ThreadCache,
    container::HostAllocator,
    erased::AnyResource,
    suballoc::{Binning, Pool, ThreadHeaps, Tlsf},
};
use proptest::prelude::*;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// System memory, recording each live block with the stream it was ordered on, and counting
/// synchronizations.
#[derive(Default)]
struct Ledger {
    live: Mutex<HashMap<usize, (usize, usize, StreamId)>>,
    allocations: AtomicUsize,
    syncs: AtomicUsize,
}

// SAFETY: allocation and deallocation go to System unchanged, whose memory the driver knows
// nothing of (pageable); the ledger only records them.
unsafe impl MemoryResource for Ledger {
    claims! { Host = typenum::B1, Device = typenum::B0, Migratable = typenum::B0, Pageable = typenum::B1, Alignment = typenum::U16 }

    fn allocate(&self, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>, AllocError> {
        let p = System.allocate(size, align, s)?;
        if size > 0 {
            self.allocations.fetch_add(1, Ordering::Relaxed);
            let old = self
                .live
                .lock()
                .unwrap()
                .insert(p.as_ptr() as usize, (size, align, s.id()));
            assert!(old.is_none(), "a live block handed out twice");
        }
        Ok(p)
    }
    unsafe fn deallocate(&self, p: NonNull<u8>, size: usize, align: usize, s: StreamRef) {
        if size > 0 {
            let rec = self.live.lock().unwrap().remove(&(p.as_ptr() as usize));
            assert_eq!(
                rec,
                Some((size, align, s.id())),
                "freed with another size, align or stream"
            );
        }
        // SAFETY: forwarded from the caller.
        unsafe { System.deallocate(p, size, align, s) }
    }
    fn synchronize(&self, _: StreamRef) -> Result<(), AllocError> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn order_after(&self, _: StreamRef, _: StreamRef) -> Result<(), AllocError> {
        Ok(())
    }
}

#[test]
fn a_vec_grows_keeps_its_values_and_gives_everything_back() {
    let ledger = Ledger::default();
    {
        let mut v = AVec::new_in(HostAllocator::new(&ledger));
        for i in 0..100_000u64 {
            v.push(i * 3);
        }
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64 * 3));
        v.truncate(10);
        v.shrink_to_fit();
        assert_eq!(v.iter().sum::<u64>(), 135);
        assert_eq!(ledger.live.lock().unwrap().len(), 1);
    }
    assert!(ledger.live.lock().unwrap().is_empty());
    // Each allocation waited for the stream before the host could write.
    assert_eq!(
        ledger.syncs.load(Ordering::Relaxed),
        ledger.allocations.load(Ordering::Relaxed)
    );
}

#[test]
fn the_allocators_stream_orders_every_block() {
    let ledger = Ledger::default();
    let stream = StreamRef::simulated(42);
    let alloc = HostAllocator::on_stream(&ledger, stream);
    assert_eq!(alloc.stream(), stream);
    let mut v = AVec::with_capacity_in(4, alloc);
    v.extend_from_slice(&[1u8, 2, 3, 4, 5]);
    assert!(ledger
        .live
        .lock()
        .unwrap()
        .values()
        .all(|&(_, _, s)| s == StreamRef::simulated(42).id()));
    drop(v);
    assert!(ledger.live.lock().unwrap().is_empty());
}

#[test]
fn boxes_zero_sized_values_and_empty_vecs_cost_nothing_or_one_block() {
    let ledger = Ledger::default();
    let b = ABox::new_in([7u64; 33], HostAllocator::new(&ledger));
    assert_eq!(b.iter().sum::<u64>(), 231);
    let unit = ABox::new_in((), HostAllocator::new(&ledger));
    let empty: AVec<u128, _> = AVec::new_in(HostAllocator::new(&ledger));
    let zsts: AVec<(), _> = {
        let mut v = AVec::new_in(HostAllocator::new(&ledger));
        v.resize(1000, ());
        v
    };
    assert_eq!((empty.len(), zsts.len()), (0, 1000));
    assert_eq!(
        ledger.allocations.load(Ordering::Relaxed),
        1,
        "only the [u64; 33] took memory"
    );
    drop((b, unit, empty, zsts));
    assert!(ledger.live.lock().unwrap().is_empty());
}

#[test]
fn alignment_of_the_element_type_is_honoured() {
    #[repr(align(256))]
    #[derive(Clone, Copy)]
    struct Wide(#[allow(dead_code)] u8);
    let mut v = AVec::new_in(HostAllocator::new(System::new()));
    v.extend((0..10).map(Wide));
    assert_eq!(v.as_ptr() as usize % 256, 0);
}

#[test]
fn a_failed_allocation_is_an_error_not_a_panic() {
    let any = AnyResource::<Pageable>::new(System::new());
    let mut v: AVec<u8, _> = AVec::new_in(HostAllocator::new(any));
    assert!(v.try_reserve(usize::MAX / 2).is_err());
    v.try_reserve(1000).unwrap();
    v.extend(std::iter::repeat_n(9u8, 1000));
    assert!(v.iter().all(|&b| b == 9));
}

#[test]
fn clones_share_the_resource_and_free_each_others_blocks() {
    let ledger = Arc::new(Ledger::default());
    let a = HostAllocator::new(ledger.clone());
    let mut v = AVec::new_in(a.clone());
    v.extend(0..1000u32);
    let w = v.clone(); // allocated by a clone of the allocator
    drop(v);
    assert_eq!(w.iter().copied().sum::<u32>(), 499_500);
    drop(w);
    drop(a);
    assert!(ledger.live.lock().unwrap().is_empty());
    let any = HostAllocator::new(AnyResource::<Pageable>::new(System::new()));
    let mut x = AVec::new_in(any.clone());
    x.push(1u8);
    assert!(any.resource().ptr_eq(x.allocator().resource()));
}

#[derive(Debug, Clone)]
enum Op {
    Push(u32),
    Pop,
    Extend(Vec<u32>),
    Truncate(usize),
    Shrink,
    Insert(usize, u32),
    Remove(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any::<u32>().prop_map(Op::Push),
        1 => Just(Op::Pop),
        2 => proptest::collection::vec(any::<u32>(), 0..300).prop_map(Op::Extend),
        1 => any::<usize>().prop_map(Op::Truncate),
        1 => Just(Op::Shrink),
        1 => (any::<usize>(), any::<u32>()).prop_map(|(i, x)| Op::Insert(i, x)),
        1 => any::<usize>().prop_map(Op::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A Vec on HostAllocator holds exactly what a std Vec holds after the same operations, and
    /// its memory goes back to the resource.
    #[test]
    fn vec_matches_std_vec(ops in proptest::collection::vec(op(), 1..100)) {
        let ledger = Ledger::default();
        {
            let mut v = AVec::new_in(HostAllocator::new(&ledger));
            let mut model = Vec::new();
            for op in ops {
                match op {
                    Op::Push(x) => { v.push(x); model.push(x); }
                    Op::Pop => prop_assert_eq!(v.pop(), model.pop()),
                    Op::Extend(xs) => { v.extend_from_slice(&xs); model.extend_from_slice(&xs); }
                    Op::Truncate(n) => {
                        let n = n % (model.len() + 1);
                        v.truncate(n);
                        model.truncate(n);
                    }
                    Op::Shrink => { v.shrink_to_fit(); model.shrink_to_fit(); }
                    Op::Insert(i, x) => {
                        let i = i % (model.len() + 1);
                        v.insert(i, x);
                        model.insert(i, x);
                    }
                    Op::Remove(i) if !model.is_empty() => {
                        let i = i % model.len();
                        prop_assert_eq!(v.remove(i), model.remove(i));
                    }
                    Op::Remove(_) => {}
                }
                prop_assert_eq!(&v[..], &model[..]);
                prop_assert!(ledger.live.lock().unwrap().len() <= 1);
            }
        }
        prop_assert!(ledger.live.lock().unwrap().is_empty());
    }
}

#[test]
fn pageable_is_granted_at_run_time_only_from_the_type_bit() {
    use mrstack::property::Properties;
    // A run-time check reads the erased resource's own type bits: System claims Pageable, a
    // simulated device does not, and a host resource of unknown kind (the type's bit unset) is
    // refused, alone or in a tuple.
    assert!(AnyResource::<Pageable>::try_new(System::new()).is_ok());
    assert!(AnyResource::<(Pageable, HostAccessible)>::try_new(System::new()).is_ok());
    assert!(AnyResource::<Pageable>::try_new(Simulated::new(1 << 20)).is_err());
    assert!(AnyResource::<Pageable>::try_new(HostOfUnknownKind).is_err());
    assert!(Properties::of_set::<(HostAccessible, Pageable)>().pageable);
    let host = AnyResource::<HostAccessible>::new(HostOfUnknownKind);
    assert!(host.try_cast::<Pageable>().is_err());
    let any = AnyResource::<HostAccessible>::new(System::new())
        .try_cast::<Pageable>()
        .unwrap();
    let mut v = AVec::new_in(HostAllocator::new(any));
    v.push(7u64);
    assert_eq!(v[0], 7);
}

/// Host memory that does not claim to be pageable (it could be pinned, for all its type says).
struct HostOfUnknownKind;

// SAFETY: System's memory, claimed as host memory alone.
unsafe impl MemoryResource for HostOfUnknownKind {
    claims! { Host = typenum::B1, Device = typenum::B0, Migratable = typenum::B0, Pageable = typenum::B0, Alignment = typenum::U16 }
    fn allocate(&self, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>, AllocError> {
        System.allocate(size, align, s)
    }
    unsafe fn deallocate(&self, p: NonNull<u8>, size: usize, align: usize, s: StreamRef) {
        // SAFETY: forwarded from the caller.
        unsafe { System.deallocate(p, size, align, s) }
    }
    streams!(none);
}

#[test]
fn suballocators_over_system_carry_its_pageable_claim_to_host_allocator() {
    use mrstack::{
        adaptor::ThreadCacheConfig,
        suballoc::{ThreadHeapsConfig, TlsfConfig},
    };
    fn fill<R: MemoryResource + Accessible<Pageable>>(mr: R) {
        let mut v = AVec::new_in(HostAllocator::new(mr));
        v.extend(0..10_000u32);
        assert_eq!(v.iter().map(|&x| x as u64).sum::<u64>(), 49_995_000);
    }
    fill(Tlsf::new(System::new(), TlsfConfig::default()));
    fill(ThreadHeaps::new(
        System::new(),
        ThreadHeapsConfig::default(),
    ));
    fill(ThreadCache::new(
        System::new(),
        ThreadCacheConfig::default(),
    ));
    fill(Pool::new(
        System::new(),
        mrstack::suballoc::PoolConfig::default(),
    ));
    fill(Binning::new(
        System::new(),
        mrstack::suballoc::BinningConfig::default(),
    ));
    fill(AnyResource::<Pageable>::new(Tlsf::new(
        System::new(),
        TlsfConfig::default(),
    )));
}
