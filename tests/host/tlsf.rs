//! Host tests of `Tlsf`: stream ordering, fitting within a size class, its maximum, growing a
//! block in place, and a 16-thread stress test.

use mrstack::prelude::*;
use mrstack::resource::GrowInPlace;
use mrstack::suballoc::TlsfConfig;
use mrstack::testing::Recorder;
use mrstack::{resource::AllocErrorKind, suballoc::Tlsf};

use crate::suballoc_support::{sixteen_threads, stream};

#[test]
fn tlsf_sixteen_threads_nothing_overlaps_nothing_is_lost() {
    let rec = Recorder::new(System::new());
    let config = TlsfConfig {
        initial: 0,
        max: 1 << 30,
    };
    sixteen_threads(Tlsf::new(&rec, config), &rec, 0x2545_F491_4F6C_DD1D);
}

#[test]
fn tlsf_orders_a_stream_before_each_block_it_takes_across() {
    let rec = Recorder::new(Simulated::new(1 << 30));
    let tlsf = Tlsf::new(&rec, TlsfConfig::default());
    let (s, t) = (stream(1), stream(2));
    let a = tlsf.allocate(1000, 256, s).unwrap();
    let keep = tlsf.allocate(1000, 256, s).unwrap();
    // SAFETY: live with this size.
    unsafe { tlsf.deallocate(a, 1000, 256, s) };
    let b = tlsf.allocate(1000, 256, s).unwrap();
    assert_eq!(b, a, "same-stream reuse is immediate");
    assert!(rec.record().ordered().is_empty(), "and needs no ordering");
    // SAFETY: live with this size.
    unsafe { tlsf.deallocate(b, 1000, 256, s) };
    // t has no block of its own: it takes one of s's, once ordered after s.
    let c = tlsf.allocate(1000, 256, t).unwrap();
    assert_eq!(rec.record().ordered(), [(t.id(), s.id())]);
    // SAFETY: live with these sizes.
    unsafe {
        tlsf.deallocate(c, 1000, 256, t);
        tlsf.deallocate(keep, 1000, 256, s);
    }
    // c's block is t's now: t reuses it without ordering again.
    let d = tlsf.allocate(1000, 256, t).unwrap();
    assert_eq!(d, c);
    assert_eq!(rec.record().ordered().len(), 1);
    // SAFETY: live with this size.
    unsafe { tlsf.deallocate(d, 1000, 256, t) };
    let held = tlsf.usage().held;
    assert_eq!(tlsf.release(), held);
    drop(tlsf);
    assert_eq!(rec.record().in_use(), 0);
}

#[test]
fn tlsf_fits_a_request_within_its_class_and_splits_the_rest() {
    let sim = Simulated::new(1 << 30);
    let tlsf = resource_stack![&sim, Tlsf { initial: 4 MiB, max: 4 MiB }];
    // Holes of 96 KiB, 64 KiB and 72 KiB, kept apart by live blocks.
    let sizes = [96 << 10, 4096, 64 << 10, 4096, 72 << 10, 4096];
    let blocks: Vec<_> = sizes
        .iter()
        .map(|&n| tlsf.allocate(n, 256, StreamRef::DEFAULT).unwrap())
        .collect();
    for i in [0, 2, 4] {
        // SAFETY: live with this size.
        unsafe { tlsf.deallocate(blocks[i], sizes[i], 256, StreamRef::DEFAULT) };
    }
    // 70 KiB: the 72 KiB hole (the closest in its own class), not the first or the largest.
    let p = tlsf.allocate(70 << 10, 256, StreamRef::DEFAULT).unwrap();
    assert_eq!(p, blocks[4]);
    // 64 KiB exactly: the 64 KiB hole.
    let q = tlsf.allocate(64 << 10, 256, StreamRef::DEFAULT).unwrap();
    assert_eq!(q, blocks[2]);
    // SAFETY: live with these sizes.
    unsafe {
        tlsf.deallocate(p, 70 << 10, 256, StreamRef::DEFAULT);
        tlsf.deallocate(q, 64 << 10, 256, StreamRef::DEFAULT);
        for i in [1, 3, 5] {
            tlsf.deallocate(blocks[i], sizes[i], 256, StreamRef::DEFAULT);
        }
    }
    let u = tlsf.usage();
    assert_eq!((u.allocated, u.free_blocks, u.chunks), (0, 1, 1), "{u:?}");
}

#[test]
fn tlsf_at_its_maximum_is_out_of_memory_and_recovers() {
    let sim = Simulated::new(1 << 30);
    let tlsf = resource_stack![&sim, Tlsf { initial: 0, max: 4 MiB }];
    let a = tlsf.allocate(3 << 20, 256, StreamRef::DEFAULT).unwrap();
    let err = tlsf.allocate(2 << 20, 256, StreamRef::DEFAULT).unwrap_err();
    assert!(err.is_out_of_memory());
    assert!(err.to_string().contains("Tlsf: out of memory"), "{err}");
    // SAFETY: live with this size.
    unsafe { tlsf.deallocate(a, 3 << 20, 256, StreamRef::DEFAULT) };
    crate::support::serve_one(&tlsf, 4 << 20, 256, StreamRef::DEFAULT);
    assert!(tlsf
        .allocate(1 << 40, 256, StreamRef::DEFAULT)
        .unwrap_err()
        .is_out_of_memory());
    let bad = tlsf.allocate(64, 3, StreamRef::DEFAULT).unwrap_err();
    assert!(
        matches!(bad.kind, AllocErrorKind::InvalidArgument(_)),
        "{bad}"
    );
    drop(tlsf);
    assert_eq!(sim.in_use(), 0);
}

#[test]
fn tlsf_grows_a_block_in_place_into_the_free_block_after_it() {
    let mr = resource_stack![System, Tlsf { initial: 1 MiB, max: 1 MiB }];
    let s = StreamRef::DEFAULT;
    let a = mr.allocate(1000, 8, s).unwrap();
    // Every call below passes `a` live, with the size it has then.
    let grow = |size, new, stream| {
        // SAFETY: as said above.
        unsafe { mr.grow_in_place(a, size, 8, new, stream) }.unwrap()
    };
    let b = mr.allocate(4096, 8, s).unwrap();
    // SAFETY: live host allocations of these sizes.
    unsafe {
        std::ptr::write_bytes(a.as_ptr(), 0xA5, 1000);
        std::ptr::write_bytes(b.as_ptr(), 0x5A, 4096);
    }
    assert!(!grow(1000, 2000, s), "b is in the way");
    assert!(grow(1000, 1024, s), "within its granule");
    // SAFETY: b is live, of this size.
    unsafe { mr.deallocate(b, 4096, 8, s) };
    assert!(
        !grow(1024, 8192, StreamRef::simulated(3)),
        "the bytes after it are free on another stream"
    );
    assert!(grow(1024, 8192, s));
    assert_eq!(mr.usage().allocated, 8192);
    // SAFETY: `a` is 8192 bytes now.
    unsafe {
        std::ptr::write_bytes(a.as_ptr().add(1024), 0x3C, 8192 - 1024);
        let bytes = std::slice::from_raw_parts(a.as_ptr(), 8192);
        assert!(
            bytes[..1000].iter().all(|&x| x == 0xA5),
            "the old bytes stayed"
        );
        assert!(bytes[1024..].iter().all(|&x| x == 0x3C));
    }
    let c = mr.allocate(256, 8, s).unwrap();
    assert!(
        c.as_ptr() as usize >= a.as_ptr() as usize + 8192,
        "the grown block is not handed out again"
    );
    assert!(!grow(8192, 2 << 20, s), "beyond the chunk");
    assert!(!grow(8192, 4096, s), "no shrinking");
    assert!(
        !grow(8192, 8191, s),
        "no shrinking, even to a size of the same block"
    );
    // SAFETY: live; either size frees a grown block.
    unsafe {
        mr.deallocate(c, 256, 8, s);
        mr.deallocate(a, 1000, 8, s);
    }
    assert_eq!(mr.usage().allocated, 0);
}
