//! Host tests of `Retry`: the callback called until it says stop, success once it frees memory,
//! other errors left alone, and a retry over a limit through `resource_stack!`.

use mrstack::prelude::*;
use mrstack::{adaptor::Retry, resource::AllocErrorKind};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::adaptor_support::{Refusing, S};

#[test]
fn retry_calls_back_until_told_to_stop() {
    let calls = AtomicUsize::new(0);
    let attempts = Mutex::new(Vec::new());
    let mr = Retry::new(Simulated::new(1000), |e: &AllocError, attempt| {
        calls.fetch_add(1, Ordering::Relaxed);
        attempts.lock().unwrap().push((e.kind, attempt));
        attempt < 4
    });
    let err = mr.allocate(5000, 1, S).unwrap_err();
    assert_eq!(err.kind, AllocErrorKind::OutOfMemory);
    assert_eq!(calls.load(Ordering::Relaxed), 4);
    assert_eq!(
        *attempts.lock().unwrap(),
        (1..=4)
            .map(|n| (AllocErrorKind::OutOfMemory, n))
            .collect::<Vec<_>>()
    );
}

#[test]
fn retry_succeeds_once_the_callback_frees_memory() {
    let sim = Simulated::new(10_000);
    // A "cache" holding memory that the callback releases.
    let cache: Mutex<Vec<NonNull<u8>>> = Mutex::new(
        (0..3)
            .map(|_| sim.allocate(3000, 256, S).unwrap())
            .collect(),
    );
    let calls = AtomicUsize::new(0);
    let mr = Retry::new(&sim, |_: &AllocError, _| {
        calls.fetch_add(1, Ordering::Relaxed);
        match cache.lock().unwrap().pop() {
            Some(p) => {
                // SAFETY: p came from sim with this size and alignment and is released once.
                unsafe { sim.deallocate(p, 3000, 256, S) };
                true
            }
            None => false,
        }
    });
    // 1000 free: needs two blocks released from the cache.
    let p = mr.allocate(6000, 256, S).unwrap();
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    assert_eq!(cache.lock().unwrap().len(), 1);
    // SAFETY: p came from mr with this size and alignment.
    unsafe { mr.deallocate(p, 6000, 256, S) };
    // A success costs no call.
    let q = mr.allocate(10, 1, S).unwrap();
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    // SAFETY: q came from mr with this size and alignment.
    unsafe { mr.deallocate(q, 10, 1, S) };
    let last = cache.lock().unwrap().pop().unwrap();
    // SAFETY: last came from sim with this size and alignment.
    unsafe { sim.deallocate(last, 3000, 256, S) };
    assert_eq!(sim.in_use(), 0);
}

#[test]
fn retry_leaves_other_errors_alone() {
    let calls = AtomicUsize::new(0);
    let up = Refusing::default();
    let mr = Retry::new(&up, |_: &AllocError, _| {
        calls.fetch_add(1, Ordering::Relaxed);
        true
    });
    let err = mr.allocate(64, 4096, S).unwrap_err();
    assert!(matches!(err.kind, AllocErrorKind::Unsupported(_)));
    assert!(mr.allocate(64, 3, S).is_err());
    assert_eq!(calls.load(Ordering::Relaxed), 0);
}

#[test]
fn retry_through_resource_stack_over_a_limit() {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let mr = resource_stack![
        Simulated::new(1 << 30),
        Limiting { limit: 1 KiB },
        Retry {
            on_failure: Box::new(move |e, attempt| {
                seen.fetch_add(1, Ordering::Relaxed);
                assert!(matches!(e.kind, AllocErrorKind::LimitExceeded { limit: 1024, .. }));
                attempt < 2
            })
        },
    ];
    assert!(mr.allocate(2048, 1, S).is_err());
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    // The default configuration never retries.
    let plain = resource_stack![Simulated::new(100), Retry];
    assert!(plain.allocate(200, 1, S).is_err());
}
