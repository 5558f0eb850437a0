//! Host tests of `Tracking`: outstanding blocks and leaks, double and foreign frees, backtraces,
//! and a drop with leaks.

use mrstack::adaptor::BadFreeKind;
use mrstack::prelude::*;
use mrstack::resource::dangling;

use crate::adaptor_support::{stream, S};

#[test]
fn tracking_lists_outstanding_and_reports_leaks() {
    let sim = Simulated::new(1 << 30);
    let mr = resource_stack![&sim, Tracking];
    assert!(!mr.captures_backtraces());
    assert_eq!(mr.leak_report(), "");
    let a = mr.allocate(4096, 256, stream(7)).unwrap();
    let b = mr.allocate(12345, 512, S).unwrap();
    let z = mr.allocate(0, 1, S).unwrap();
    assert_eq!(
        (mr.outstanding_count(), mr.outstanding_bytes()),
        (2, 4096 + 12345)
    );
    let list = mr.outstanding();
    assert_eq!(list.len(), 2);
    let (la, lb) = (&list[0], &list[1]);
    assert_eq!(
        (la.address, la.size, la.align, la.stream),
        (a.as_ptr() as usize, 4096, 256, stream(7).id())
    );
    assert_eq!(
        (lb.address, lb.size, lb.align, lb.stream),
        (b.as_ptr() as usize, 12345, 512, S.id())
    );
    assert!(la.backtrace.is_none());

    // SAFETY: a came from mr with this size, alignment and stream.
    unsafe { mr.deallocate(a, 4096, 256, stream(7)) };
    // SAFETY: a zero-size block is a no-op.
    unsafe { mr.deallocate(z, 0, 1, S) };
    let report = mr.leak_report();
    assert_eq!(
        report,
        format!(
            "Tracking: 1 allocation(s) still live, 12345 bytes:\n  {:#x}: 12345 bytes, align 512, stream 0x0\n",
            b.as_ptr() as usize
        )
    );
    // SAFETY: b came from mr with this size and alignment.
    unsafe { mr.deallocate(b, 12345, 512, S) };
    assert_eq!(mr.leak_report(), "");
    assert_eq!(mr.bad_free_count(), 0);
    assert_eq!(sim.in_use(), 0);
}

#[test]
fn tracking_refuses_double_and_foreign_frees() {
    // Simulated panics on a double free: reaching it would fail the test.
    let sim = Simulated::new(1 << 30);
    let mr = resource_stack![&sim, Tracking];
    let a = mr.allocate(64, 8, S).unwrap();
    // SAFETY: a came from mr with this size and alignment.
    unsafe { mr.deallocate(a, 64, 8, S) };
    // SAFETY: deliberately broken (a double free): Tracking must refuse it before the upstream.
    unsafe { mr.deallocate(a, 64, 8, S) };
    let foreign = dangling(4096);
    // SAFETY: deliberately broken (never allocated here): Tracking must refuse it.
    unsafe { mr.deallocate(foreign, 32, 8, stream(3)) };
    let b = mr.allocate(100, 8, S).unwrap();
    // SAFETY: deliberately broken (wrong size): Tracking must refuse it and keep b live.
    unsafe { mr.deallocate(b, 99, 8, S) };
    assert_eq!(mr.outstanding_count(), 1);
    assert_eq!(mr.bad_free_count(), 3);
    let bad = mr.bad_frees();
    assert_eq!(bad[0].kind, BadFreeKind::NotLive);
    assert_eq!((bad[0].address, bad[0].size), (a.as_ptr() as usize, 64));
    assert_eq!(bad[1].kind, BadFreeKind::NotLive);
    assert_eq!((bad[1].address, bad[1].stream), (4096, stream(3).id()));
    assert_eq!(
        bad[2].kind,
        BadFreeKind::Mismatch {
            size: 100,
            align: 8
        }
    );
    assert!(bad[0].to_string().contains("not a live allocation"));
    // SAFETY: b came from mr with this size and alignment.
    unsafe { mr.deallocate(b, 100, 8, S) };
    assert_eq!((mr.outstanding_count(), sim.in_use()), (0, 0));
}

#[test]
fn tracking_captures_backtraces_when_asked() {
    let mr = resource_stack![Simulated::new(1 << 20), Tracking { backtraces: true }];
    assert!(mr.captures_backtraces());
    let p = mr.allocate(777, 8, S).unwrap();
    let list = mr.outstanding();
    assert!(list[0].backtrace.is_some());
    let report = mr.leak_report();
    assert!(report.contains("777 bytes"), "{report}");
    assert!(report.contains("allocated at:"), "{report}");
    // SAFETY: p came from mr with this size and alignment.
    unsafe { mr.deallocate(p, 777, 8, S) };
}

#[test]
fn tracking_drop_with_leaks_does_not_free_them() {
    let sim = Simulated::new(1 << 20);
    {
        let mr = resource_stack![&sim, Tracking];
        mr.allocate(321, 8, S).unwrap();
        // Dropped here with one live allocation: reported on stderr, left to its owner.
    }
    assert_eq!(sim.in_use(), 321);
}
