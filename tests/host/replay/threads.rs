//! Workloads of many threads: the threaded replayer, what threads can hold at once, and the
//! meter that counts what reaches the upstream from them.

use super::{alloc, free, HEADER};
use crate::adaptor_support::{claims, deallocate_to, streams};
use mrstack::prelude::*;
use mrstack::replay::rmm_log;
use mrstack::replay::{self, measure, ReplayError, Workload, WorkloadError};
use mrstack::stack::AnyLayer;
use std::ptr::NonNull;
use std::sync::Arc;

// ---------------------------------------------------------------- threads

#[test]
fn workload_threads_are_one_per_op() {
    let w = Workload::new("w", vec![alloc(0, 8), free(0)]).unwrap();
    assert_eq!((w.thread_count(), w.op_threads()), (1, None));
    assert_eq!(
        w.clone().with_threads(vec![0]).unwrap_err(),
        WorkloadError::ThreadCount { ops: 2, threads: 1 }
    );
    let one = w.clone().with_threads(vec![0, 0]).unwrap();
    assert_eq!((one.thread_count(), one.op_threads()), (1, None));
    let two = w.with_threads(vec![1, 0]).unwrap();
    assert_eq!(two.thread_count(), 2);
    assert_eq!(two.op_threads(), Some(&[1, 0][..]));
}

/// A log of `threads` threads making `n` allocations, each freed by a thread picked by a simple
/// generator (often another one), a few steps after it was made, with some left live at the end.
fn threaded_log(threads: u64, n: usize) -> String {
    let mut s = String::from(HEADER);
    let mut live: Vec<(u64, usize)> = Vec::new();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..n {
        let thread = next() % threads;
        let ptr = 0x7f00_0000_0000u64 + (i as u64) * 0x10_0000;
        let size = 256 + (next() % 4096) as usize;
        s += &format!("{thread},{i},allocate,{ptr:#x},{size},0\n");
        live.push((ptr, size));
        if live.len() > 8 {
            let (ptr, size) = live.swap_remove((next() % live.len() as u64) as usize);
            let thread = next() % threads;
            s += &format!("{thread},{i},free,{ptr:#x},{size},0\n");
        }
    }
    s
}

#[test]
fn threaded_replay_runs_each_thread_and_waits_for_cross_thread_frees() {
    let t = rmm_log::parse(threaded_log(4, 2000).as_bytes(), "threads").unwrap();
    let w = &t.workload;
    assert_eq!(w.thread_count(), 4);
    assert_eq!(w.unfreed(), 8);
    let sim = Simulated::new(1 << 30);
    let mut r = replay::ThreadedReplayer::new(&sim, w, w.default_streams()).unwrap();
    for _ in 0..3 {
        // Simulated panics on a free of a pointer not live: a free that ran before its
        // allocation, or twice, would fail the test here.
        r.pass().unwrap();
        assert_eq!((sim.in_use(), sim.live()), (0, 0));
    }
    assert_eq!(sim.allocation_count(), 3 * 2000);
    // Threads interleave: the peak can differ from the log's, never exceed what all blocks take.
    assert!(sim.peak() > 0);

    let mut r = replay::stacks::<Arc<Simulated>>()[0]
        .threaded_replayer(Arc::new(Simulated::new(1 << 30)), 0, w, w.default_streams())
        .unwrap();
    let timing = measure(r.as_mut(), 2).unwrap();
    assert_eq!(timing.ops, w.ops().len());
}

#[test]
fn threaded_replay_counts_what_its_threads_held_at_once_when_asked() {
    // Thread 1 frees thread 0's block, then makes and frees a larger one: 300 bytes at most.
    let log = format!(
        "{HEADER}0,1,allocate,0x100,100,0\n1,2,free,0x100,100,0\n1,3,allocate,0x200,300,0\n\
         1,4,free,0x200,300,0\n"
    );
    let t = rmm_log::parse(log.as_bytes(), "held").unwrap();
    let w = &t.workload;
    let sim = Simulated::new(1 << 20);
    let mut r = replay::ThreadedReplayer::new(&sim, w, w.default_streams()).unwrap();
    r.pass().unwrap();
    assert_eq!(r.held_peak(), None);
    r.count_held();
    for _ in 0..3 {
        r.pass().unwrap();
        assert_eq!(r.held_peak(), Some(300));
    }

    // Many threads: never more than the upstream saw, nor than all their blocks at once.
    let t = rmm_log::parse(threaded_log(4, 2000).as_bytes(), "threads").unwrap();
    let w = &t.workload;
    let sim = Simulated::new(1 << 30);
    let mut r = replay::ThreadedReplayer::new(&sim, w, w.default_streams()).unwrap();
    r.count_held();
    r.pass().unwrap();
    let held = r.held_peak().unwrap();
    assert!(
        held > 0 && held <= sim.peak() && held <= w.threaded_peak(),
        "{held}"
    );
    // Asked again, it keeps counting: the peak stays.
    r.count_held();
    assert_eq!(r.held_peak(), Some(held));

    // Passes that fail midway, their blocks freed untimed: what they left is counted out, so the
    // count never drifts above what the upstream can hold.
    let log = format!(
        "{HEADER}0,1,allocate,0x100,600,0\n1,2,free,0x100,600,0\n0,3,allocate,0x200,900,0\n\
         1,4,allocate,0x300,100,0\n1,5,free,0x200,900,0\n"
    );
    let t = rmm_log::parse(log.as_bytes(), "fails").unwrap();
    let tight = Simulated::new(950);
    let mut r =
        replay::ThreadedReplayer::new(&tight, &t.workload, t.workload.default_streams()).unwrap();
    r.count_held();
    for _ in 0..20 {
        assert!(r.pass().is_err());
        assert!(r.held_peak().unwrap() <= 950, "{:?}", r.held_peak());
    }

    // Through the trait, as the replay tool asks: a replay in log order counts nothing.
    let mut in_order = replay::Replayer::new(&sim, w, w.default_streams()).unwrap();
    replay::Replay::count_held(&mut in_order);
    in_order.pass().unwrap();
    assert_eq!(replay::Replay::held_peak(&in_order), None);
}

#[test]
fn a_replay_of_ones_own_counts_nothing_held_and_measures_as_any() {
    // A caller's own replay, with only the methods it must write: the defaults count nothing.
    struct Own(usize);
    impl replay::Replay for Own {
        fn pass(&mut self) -> Result<std::time::Duration, ReplayError> {
            self.0 += 1;
            Ok(std::time::Duration::from_micros(1))
        }
        fn ops(&self) -> usize {
            10
        }
    }
    let mut own = Own(0);
    replay::Replay::count_held(&mut own);
    let timing = measure(&mut own, 3).unwrap();
    assert_eq!((own.0, timing.ops), (4, 10));
    assert_eq!(replay::Replay::held_peak(&own), None);
}

#[test]
fn threaded_replay_failure_stops_every_thread_and_frees_everything() {
    // Thread 1 frees what thread 0 allocates. Blocks 1 (900 bytes) and 2 (100, never freed) never
    // fit together in 950 bytes, so op 2 or op 3 fails, whichever comes second; when op 2 fails,
    // thread 1 waits for block 1 to free it, and that wait must end with the failure, not hang.
    let log = format!(
        "{HEADER}0,1,allocate,0x100,600,0\n1,2,free,0x100,600,0\n0,3,allocate,0x200,900,0\n\
         1,4,allocate,0x300,100,0\n1,5,free,0x200,900,0\n"
    );
    let t = rmm_log::parse(log.as_bytes(), "fails").unwrap();
    let w = &t.workload;
    assert_eq!(w.thread_count(), 2);
    let sim = Simulated::new(950);
    let mut r = replay::ThreadedReplayer::new(&sim, w, w.default_streams()).unwrap();
    for _ in 0..20 {
        match r.pass() {
            Err(ReplayError::Alloc { op, error, .. }) => {
                assert!(op == 2 || op == 3, "op {op}");
                assert!(error.is_out_of_memory());
            }
            other => panic!("expected op 2 or 3 to fail, got {other:?}"),
        }
        assert_eq!((sim.in_use(), sim.live()), (0, 0));
    }

    let tiny = Simulated::new(500);
    let mut r = replay::ThreadedReplayer::new(&tiny, w, w.default_streams()).unwrap();
    match r.pass() {
        Err(ReplayError::Alloc {
            op: 0, size: 600, ..
        }) => {}
        other => panic!("expected op 0 to fail, got {other:?}"),
    }
    assert_eq!(tiny.in_use(), 0);
}

/// `threads` threads one after the other in the log, each allocating `blocks` blocks of 4 KiB
/// and then freeing them: little live at once in log order, much with the threads at once.
fn sequential_threads_log(threads: usize, blocks: usize) -> String {
    let mut s = String::from(HEADER);
    for t in 0..threads {
        for b in 0..blocks {
            s += &format!(
                "{t},0,allocate,{:#x},4096,0\n",
                (t * blocks + b + 1) * 0x1000
            );
        }
        for b in 0..blocks {
            s += &format!("{t},0,free,{:#x},4096,0\n", (t * blocks + b + 1) * 0x1000);
        }
    }
    s
}

#[test]
fn threaded_peak_bounds_what_threads_hold_at_once() {
    let t = rmm_log::parse(sequential_threads_log(64, 8).as_bytes(), "seq").unwrap();
    let w = &t.workload;
    assert_eq!(w.thread_count(), 64);
    assert_eq!(
        (w.peak_live(), w.threaded_peak()),
        (8 * 4096, 64 * 8 * 4096)
    );
    // However the threads interleave, they never hold more than the bound: a replay through an
    // upstream of exactly that much never runs out, run after run.
    let sim = Simulated::new(w.threaded_peak());
    let mut r = replay::ThreadedReplayer::new(&sim, w, w.default_streams()).unwrap();
    for _ in 0..20 {
        r.pass().unwrap();
        assert!(sim.peak() <= w.threaded_peak());
    }
    // A thread that frees what another allocates lets the other run ahead: the bound counts the
    // allocating thread's bytes in full.
    let handed = "0,1,allocate,0x100,100,0\n1,2,free,0x100,100,0\n0,3,allocate,0x200,100,0\n\
                  1,4,free,0x200,100,0\n";
    let t = rmm_log::parse(format!("{HEADER}{handed}").as_bytes(), "handed").unwrap();
    assert_eq!(
        (t.workload.peak_live(), t.workload.threaded_peak()),
        (100, 200)
    );
    let one = Workload::new("one", vec![alloc(0, 8), free(0)]).unwrap();
    assert_eq!(one.threaded_peak(), one.peak_live());
}

#[test]
fn a_log_of_many_more_threads_than_the_replay_runs_completes() {
    // 100,000 threads, each allocating one block that the next thread frees: OS threads share
    // log threads beyond MAX_REPLAY_THREADS, and frees across them still find their blocks.
    let threads = 100_000usize;
    let mut s = String::from(HEADER);
    for t in 0..threads {
        s += &format!("{t},0,allocate,{:#x},256,0\n", (t + 1) * 0x100);
        if t > 0 {
            s += &format!("{t},0,free,{:#x},256,0\n", t * 0x100);
        }
    }
    let t = rmm_log::parse(s.as_bytes(), "many").unwrap();
    let w = &t.workload;
    assert_eq!(w.thread_count(), threads);
    assert!(replay::MAX_REPLAY_THREADS < threads);
    let sim = Simulated::new(usize::MAX);
    let mut r = replay::ThreadedReplayer::new(&sim, w, w.default_streams()).unwrap();
    r.pass().unwrap();
    assert_eq!((sim.in_use(), sim.allocation_count()), (0, threads));
}

/// Threads taking the whole upstream in turn: the meter's peak is at most what the upstream ever
/// handed out at once. A free is counted out before the upstream has the bytes back, or another
/// thread could count them first and the peak read three times the capacity.
#[test]
fn metered_peak_never_exceeds_what_the_upstream_handed_out() {
    const CAP: usize = 1 << 20;
    let sim = Simulated::new(CAP);
    let meter = replay::Metered::new(&sim);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..20_000 {
                    if let Ok(p) = meter.allocate(CAP, 256, StreamRef::DEFAULT) {
                        // SAFETY: p came from meter with this size and alignment.
                        unsafe { meter.deallocate(p, CAP, 256, StreamRef::DEFAULT) };
                    }
                }
            });
        }
    });
    assert_eq!(meter.in_use(), 0);
    assert_eq!((meter.peak(), sim.peak()), (CAP, CAP));
}

/// A meter changes nothing a text says: a metered stack describes itself as the stack below,
/// the text builds again, and `find` reaches through it.
#[test]
fn a_metered_stack_describes_and_finds_what_is_below() {
    let mr = resource_stack![
        replay::Metered::new(Simulated::new(1 << 30)),
        Pool { max: 64 MiB }
    ];
    let text = mr.describe().to_string();
    assert_eq!(text, "simulated(capacity=1 GiB) > pool(max=64 MiB)");
    let built = mrstack::config::build::<()>(&text).unwrap();
    assert_eq!(built.describe().to_string(), text);
    assert_eq!(mr.find::<Simulated>().map(|s| s.capacity()), Some(1 << 30));
}

#[test]
fn metered_counts_what_reaches_its_upstream_from_many_threads() {
    let meter = replay::Metered::new(Simulated::new(1 << 30));
    std::thread::scope(|s| {
        for t in 0..4 {
            let meter = &meter;
            s.spawn(move || {
                for i in 0..200 {
                    let size = 256 * (1 + (i + t) % 7);
                    crate::support::serve_one(&meter, size, 256, StreamRef::DEFAULT);
                }
            });
        }
    });
    assert_eq!(meter.in_use(), 0);
    // At least the largest block; at most one block per thread, each at most 7 × 256 bytes.
    assert!(
        (7 * 256..=4 * 7 * 256).contains(&meter.peak()),
        "{}",
        meter.peak()
    );
    assert_eq!(meter.allocate(0, 8, StreamRef::DEFAULT).map(|_| ()), Ok(()));
    assert!(meter.allocate(8, 3, StreamRef::DEFAULT).is_err());
    assert_eq!(meter.upstream().allocation_count(), 800);
}

/// Panics on a request of 999 bytes: a stand-in for a resource that catches a broken contract.
struct PanicsOn999(Simulated);

// SAFETY: every call goes to the Simulated inside, unchanged, or panics before reaching it.
unsafe impl MemoryResource for PanicsOn999 {
    claims! { as Simulated }

    fn allocate(&self, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>, AllocError> {
        assert_ne!(size, 999, "PanicsOn999 was asked for 999 bytes");
        self.0.allocate(size, align, s)
    }

    deallocate_to!(0);
    streams!(to 0);
}

#[test]
fn a_panic_in_one_replay_thread_reaches_the_caller_without_a_hang() {
    // Thread 1 waits to free what thread 0 never makes: thread 0 panics first.
    let log =
        format!("{HEADER}1,1,allocate,0x100,8,0\n0,2,allocate,0x200,999,0\n1,3,free,0x200,999,0\n");
    let t = rmm_log::parse(log.as_bytes(), "panics").unwrap();
    let resource = PanicsOn999(Simulated::new(1 << 20));
    let w = &t.workload;
    let mut r = replay::ThreadedReplayer::new(&resource, w, w.default_streams()).unwrap();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| r.pass()));
    let panic = outcome.unwrap_err();
    let msg = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .unwrap_or("");
    assert!(msg.contains("999 bytes"), "{msg}");
}

#[test]
fn threads_share_one_stack_and_failures_come_back() {
    use mrstack::replay::{measure_threads, Op, Workload};
    let w = |size| {
        Workload::new(
            "two",
            vec![
                Op::Alloc {
                    id: 0,
                    size,
                    stream: 0,
                },
                Op::Alloc {
                    id: 1,
                    size,
                    stream: 0,
                },
                Op::Free { id: 0 },
                Op::Free { id: 1 },
            ],
        )
        .unwrap()
    };
    let sim = mrstack::leaf::Simulated::new(1 << 20);
    let ns = measure_threads(&sim, &[w(1000), w(2000), w(3000)], 3).unwrap();
    assert!(ns.is_finite() && ns > 0.0);
    assert_eq!((sim.in_use(), sim.allocation_count()), (0, 3 * 2 * 4));
    // One thread's workload does not fit: its error comes back, and no thread is left waiting.
    let e = measure_threads(&sim, &[w(1000), w(1 << 20)], 1).unwrap_err();
    assert!(e.to_string().contains("out of memory"), "{e}");
    assert_eq!(sim.in_use(), 0);
}
