//! Host tests of `Statistics`: counts after a known sequence, nested scopes as in RMM, exact
//! counts across threads, huge sizes and wrapping thread counts, and a model-based property
//! test.

use mrstack::adaptor::Statistics;
use mrstack::adaptor::Stats;
use mrstack::prelude::*;
use proptest::prelude::*;
use std::ptr::NonNull;

use crate::adaptor_support::{counter, fill, hand_over, holds, ops, Op, S};

#[test]
fn statistics_after_a_known_sequence() {
    let sim = Simulated::new(1 << 20);
    let mr = resource_stack![&sim, Statistics];
    let a = mr.allocate(100, 8, S).unwrap();
    let b = mr.allocate(200, 8, S).unwrap();
    // SAFETY: a came from mr with this size and alignment.
    unsafe { mr.deallocate(a, 100, 8, S) };
    let c = mr.allocate(50, 8, S).unwrap();
    assert_eq!(mr.bytes(), counter(250, 300, 350));
    assert_eq!(mr.allocations(), counter(2, 2, 3));

    mr.reset_peak();
    assert_eq!(mr.bytes(), counter(250, 250, 350));
    assert_eq!(mr.allocations(), counter(2, 2, 3));
    let d = mr.allocate(10, 8, S).unwrap();
    assert_eq!(mr.bytes(), counter(260, 260, 360));

    // Zero-size requests and failures take no memory and are not counted.
    let z = mr.allocate(0, 8, S).unwrap();
    assert!(mr.allocate(1 << 21, 8, S).is_err());
    assert!(mr.allocate(8, 3, S).is_err());
    assert_eq!(mr.allocations(), counter(3, 3, 4));
    // SAFETY: each came from mr with this size and alignment.
    unsafe {
        mr.deallocate(z, 0, 8, S);
        mr.deallocate(b, 200, 8, S);
        mr.deallocate(c, 50, 8, S);
        mr.deallocate(d, 10, 8, S);
    }
    assert_eq!(
        mr.stats(),
        Stats {
            bytes: counter(0, 260, 360),
            allocations: counter(0, 3, 4)
        }
    );
    assert_eq!(sim.in_use(), 0);
    assert_eq!(mr.name(), "Statistics");
}

#[test]
fn statistics_scopes_nest_as_rmm() {
    let mr = resource_stack![Simulated::new(1 << 20), Statistics];
    let before = mr.allocate(1000, 8, S).unwrap();
    assert_eq!(mr.scope_stats(), None);
    assert_eq!(mr.pop_scope(), None);

    mr.push_scope();
    let a = mr.allocate(100, 8, S).unwrap();
    // SAFETY: before came from mr with this size and alignment.
    unsafe { mr.deallocate(before, 1000, 8, S) }; // freed inside, allocated outside: goes negative
    assert_eq!(mr.scope_stats().unwrap().bytes, counter(-900, 100, 100));

    mr.push_scope();
    assert_eq!(mr.scope_depth(), 2);
    let b = mr.allocate(300, 8, S).unwrap();
    crate::support::serve_one(&mr, 200, 8, S);
    let inner = mr.pop_scope().unwrap();
    assert_eq!(inner.bytes, counter(300, 500, 500));
    assert_eq!(inner.allocations, counter(1, 2, 2));

    // The outer scope absorbed the inner one: peak = max(100, -900 + 500).
    let outer = mr.pop_scope().unwrap();
    assert_eq!(outer.bytes, counter(-600, 100, 600));
    assert_eq!(outer.allocations, counter(1, 2, 3));
    // A scope that freed more than it allocated shows its bytes below zero.
    assert_eq!(
        outer.to_string(),
        "bytes -600 B (peak 100 B, total 600 B), allocations 1 (peak 2, total 3)"
    );
    assert_eq!(mr.scope_depth(), 0);

    // The lifetime counters saw everything.
    assert_eq!(mr.bytes(), counter(400, 1100, 1600));
    assert_eq!(
        mr.stats().to_string(),
        "bytes 400 B (peak 1.07 KiB, total 1.56 KiB), allocations 2 (peak 3, total 4)"
    );
    let negative_kib = Stats {
        bytes: counter(-3 << 29, 0, 0),
        ..Stats::default()
    };
    assert!(
        negative_kib
            .to_string()
            .starts_with("bytes -1.50 GiB (peak 0 B"),
        "{negative_kib}"
    );
    // SAFETY: each came from mr with this size and alignment.
    unsafe {
        mr.deallocate(a, 100, 8, S);
        mr.deallocate(b, 300, 8, S);
    }
    assert_eq!(mr.bytes().current, 0);
}

#[test]
fn statistics_are_exact_across_threads() {
    let mr = resource_stack![System::new(), Statistics];
    let threads = 4;
    let rounds = 500;
    std::thread::scope(|s| {
        for t in 0..threads {
            let mr = &mr;
            s.spawn(move || {
                for i in 0..rounds {
                    let size = 1 + (i * 7 + t) % 300;
                    let p = mr.allocate(size, 16, S).unwrap();
                    fill(p, size, t as u8);
                    assert!(holds(p, size, t as u8));
                    // SAFETY: p came from mr with this size and alignment.
                    unsafe { mr.deallocate(p, size, 16, S) };
                }
            });
        }
    });
    let total: i128 = (0..threads)
        .flat_map(|t| (0..rounds).map(move |i| (1 + (i * 7 + t) % 300) as i128))
        .sum();
    let s = mr.stats();
    assert_eq!((s.bytes.current, s.bytes.total), (0, total));
    assert_eq!(
        (s.allocations.current, s.allocations.total),
        (0, (threads * rounds) as i128)
    );
    // Each thread holds at most one block at a time; with several threads the peak may read high
    // by what the other threads hold reserved: two chunks (32 allocations, 2 MiB) each.
    assert!(s.allocations.peak >= 1);
    assert!(s.allocations.peak <= threads as i128 + 32 * (threads as i128 - 1));
    assert!(s.bytes.peak <= threads as i128 * 300 + (2 << 20) * (threads as i128 - 1));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Statistics agree with a model that sums sizes, whatever the sequence.
    #[test]
    fn statistics_match_a_model(ops in ops()) {
        let sim = Simulated::new(1 << 24);
        let mr = resource_stack![&sim, Statistics];
        let mut live: Vec<(NonNull<u8>, usize)> = Vec::new();
        let (mut cur, mut peak, mut total, mut n, mut npeak, mut ntotal) = (0i128, 0i128, 0i128, 0i128, 0i128, 0i128);
        for op in ops {
            match op {
                Op::Alloc(size) => {
                    let p = mr.allocate(size, 64, S).unwrap();
                    if size > 0 {
                        live.push((p, size));
                        cur += size as i128; total += size as i128; peak = peak.max(cur);
                        n += 1; ntotal += 1; npeak = npeak.max(n);
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let (p, size) = live.swap_remove(i % live.len());
                    // SAFETY: p came from mr with this size and alignment.
                    unsafe { mr.deallocate(p, size, 64, S) };
                    cur -= size as i128; n -= 1;
                }
                Op::Free(_) => {}
            }
            prop_assert_eq!(mr.bytes(), counter(cur, peak, total));
            prop_assert_eq!(mr.allocations(), counter(n, npeak, ntotal));
            prop_assert_eq!(sim.in_use() as i128, cur);
        }
        for (p, size) in live {
            // SAFETY: p came from mr with this size and alignment.
            unsafe { mr.deallocate(p, size, 64, S) };
        }
        prop_assert_eq!(sim.in_use(), 0);
    }
}

/// Statistics counts sizes up to `isize::MAX` and any traffic between threads without a panic:
/// an overflow after the upstream gave the block would panic, and a thread's exit then abort the
/// process.
#[test]
fn statistics_count_huge_sizes_and_wrapping_thread_counts() {
    let sim = Simulated::new(usize::MAX);
    let mr = Statistics::new(&sim);
    let small = mr.allocate(100, 256, S).unwrap();
    let huge = (1usize << 63) - 256;
    let p = mr.allocate(huge, 256, S).unwrap();
    assert_eq!(mr.bytes().current, 100 + huge as i128);
    // SAFETY: both came from mr with these sizes and alignments.
    unsafe {
        mr.deallocate(p, huge, 256, S);
        mr.deallocate(small, 100, 256, S);
    }
    hand_over(&mr, 1 << 61, 8);
    assert_eq!((mr.bytes().current, sim.in_use()), (0, 0));
    assert_eq!(mr.allocations().total, 10);
}

#[test]
fn statistics_count_huge_allocations_without_overflow() {
    // Two allocations of more than 2^62 bytes each: more than i64 can hold, live at once.
    let sim = Simulated::new(usize::MAX);
    let mr = Statistics::new(&sim);
    let huge = (1usize << 62) + 4096;
    let a = mr.allocate(huge, 256, S).unwrap();
    let b = mr.allocate(huge, 256, S).unwrap();
    assert_eq!(mr.bytes().current, 2 * huge as i128);
    assert_eq!(mr.bytes().total, 2 * huge as i128);
    // SAFETY: a and b came from mr with these sizes and alignments.
    unsafe {
        mr.deallocate(a, huge, 256, S);
        mr.deallocate(b, huge, 256, S);
    }
    assert_eq!(mr.bytes().current, 0);
    assert_eq!(mr.allocations().total, 2);
}
