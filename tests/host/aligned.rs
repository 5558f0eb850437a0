//! Host tests of `Aligned`: over an upstream that honours the alignment, over-allocation when it
//! refuses, errors passed through, and the alignment its types compute.

use mrstack::prelude::*;
use mrstack::{adaptor::Aligned, resource::AllocErrorKind};
use std::ptr::NonNull;
use typenum::{U1024, U16, U4096, U64};

use crate::adaptor_support::{fill, holds, Refusing, S};

#[test]
fn aligned_over_an_upstream_that_honours_the_alignment() {
    let mr = resource_stack![System::new(), Aligned<U4096>];
    let blocks: Vec<(NonNull<u8>, usize)> = (1..20)
        .map(|i| {
            let size = i * 300;
            let p = mr.allocate(size, 1, S).unwrap();
            assert_eq!(p.as_ptr() as usize % 4096, 0);
            fill(p, size, i as u8);
            (p, size)
        })
        .collect();
    for (i, &(p, size)) in blocks.iter().enumerate() {
        assert!(holds(p, size, i as u8 + 1));
        // SAFETY: p came from mr with this size and alignment.
        unsafe { mr.deallocate(p, size, 1, S) };
    }
    assert_eq!(mr.over_allocated(), 0);
    // A larger alignment than A in the request still wins.
    let p = mr.allocate(10, 1 << 14, S).unwrap();
    assert_eq!(p.as_ptr() as usize % (1 << 14), 0);
    // SAFETY: p came from mr with this size and alignment.
    unsafe { mr.deallocate(p, 10, 1 << 14, S) };
    // A zero-size request gets a dangling pointer with the type's alignment.
    assert_eq!(mr.allocate(0, 1, S).unwrap().as_ptr() as usize % 4096, 0);
}

#[test]
fn aligned_over_allocates_when_the_upstream_refuses() {
    let up = Refusing::default();
    let mr = resource_stack![&up, Aligned<U4096>];
    assert_eq!(
        mrstack::property::alignment_of::<Aligned<U4096, &Refusing>>(),
        4096
    );
    let mut blocks = Vec::new();
    for i in 1..30usize {
        let size = i * 1000;
        let p = mr.allocate(size, 64, S).unwrap();
        assert_eq!(p.as_ptr() as usize % 4096, 0);
        fill(p, size, i as u8);
        blocks.push((p, size, i as u8));
    }
    assert_eq!(mr.over_allocated(), 29);
    // Each block sits inside an upstream block of size + 4096 - 256 bytes.
    let live = up.live.lock().unwrap().clone();
    for &(p, size, _) in &blocks {
        let addr = p.as_ptr() as usize;
        let (&raw, &raw_size) = live
            .iter()
            .find(|(&raw, &raw_size)| raw <= addr && addr + size <= raw + raw_size)
            .expect("block inside an upstream block");
        assert_eq!(raw_size, size + 4096 - 256);
        assert!(addr - raw < 4096);
    }
    for &(p, size, tag) in &blocks {
        assert!(holds(p, size, tag));
        // SAFETY: p came from mr with this size and alignment.
        unsafe { mr.deallocate(p, size, 64, S) };
    }
    assert_eq!(mr.over_allocated(), 0);
    assert!(up.live.lock().unwrap().is_empty());
    // Requests the upstream's own alignment covers go straight through.
    let p = mr.allocate(100, 128, S).unwrap();
    assert_eq!(p.as_ptr() as usize % 4096, 0);
    // SAFETY: p came from mr with this size and alignment.
    unsafe { mr.deallocate(p, 100, 128, S) };
    assert!(up.live.lock().unwrap().is_empty());
}

#[test]
fn aligned_passes_errors_through_and_keeps_nothing() {
    let up = Refusing::default();
    let mr = Aligned::<U4096, _>::new(&up);
    let err = mr.allocate(isize::MAX as usize - 5000, 1, S).unwrap_err();
    assert_eq!(err.kind, AllocErrorKind::OutOfMemory);
    let err = mr.allocate(64, 6, S).unwrap_err();
    assert!(
        matches!(err.kind, AllocErrorKind::InvalidArgument(_)),
        "{err}"
    );
    assert_eq!(mr.over_allocated(), 0);
    assert!(up.live.lock().unwrap().is_empty());
}

#[test]
fn aligned_types_compute_the_maximum() {
    use mrstack::property::alignment_of;
    assert_eq!(alignment_of::<Aligned<U64, Simulated>>(), 256);
    assert_eq!(alignment_of::<Aligned<U1024, Simulated>>(), 1024);
    assert_eq!(alignment_of::<Aligned<U16, System>>(), 16);
    // Zero bytes for the alignment itself: the same size whatever A.
    assert_eq!(
        std::mem::size_of::<Aligned<U4096, System>>(),
        std::mem::size_of::<Aligned<U16, System>>()
    );
}
