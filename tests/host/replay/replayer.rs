//! Workloads, the replayer of one thread, timing, and the minimum-capacity search.

use super::{alloc, free, HEADER};
use crate::adaptor_support::{claims, streams};
use mrstack::prelude::*;
use mrstack::replay::rmm_log;
use mrstack::replay::{
    self, measure, min_capacity, random, simulated_streams, stack, Op, RandomConfig, ReplayError,
    Replayer, Workload, WorkloadError,
};
use mrstack::resource::{check_request, AllocErrorKind};
use mrstack::stream::StreamHandle;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

// ---------------------------------------------------------------- workloads

#[test]
fn workload_checks_its_ops() {
    assert_eq!(
        Workload::new("w", vec![alloc(1, 8)]).unwrap_err(),
        WorkloadError::IdOutOfOrder {
            op: 0,
            id: 1,
            expected: 0
        }
    );
    assert_eq!(
        Workload::new("w", vec![alloc(0, 8), free(1)]).unwrap_err(),
        WorkloadError::UnknownId { op: 1, id: 1 }
    );
    assert_eq!(
        Workload::new("w", vec![alloc(0, 8), free(0), free(0)]).unwrap_err(),
        WorkloadError::DoubleFree { op: 2, id: 0 }
    );
    let w = Workload::new("w", vec![alloc(0, 8), alloc(1, 4), free(0), alloc(2, 16)]).unwrap();
    assert_eq!((w.peak_live(), w.allocations(), w.unfreed()), (20, 3, 2));
}

#[test]
fn random_workload_invariants() {
    let w = random(&RandomConfig::default());
    assert_eq!(w.name(), "random");
    let allocs = w
        .ops()
        .iter()
        .filter(|o| matches!(o, Op::Alloc { .. }))
        .count();
    assert_eq!(allocs, 10_000);
    assert_eq!(w.allocations(), 10_000);
    assert_eq!(w.ops().len(), 20_000, "every allocation freed exactly once");
    // Workload::new checks that each free names a live allocation, once, and recomputes the peak.
    let checked = Workload::new("again", w.ops().to_vec()).unwrap();
    assert_eq!(checked.unfreed(), 0);
    assert_eq!(checked.peak_live(), w.peak_live());

    let mut sizes = vec![0usize; 10_000];
    let (mut live, mut peak) = (0usize, 0usize);
    for op in w.ops() {
        match *op {
            Op::Alloc { id, size, stream } => {
                assert!((1..=1 << 20).contains(&size));
                assert_eq!(stream, 0);
                sizes[id] = size;
                live += size;
                peak = peak.max(live);
                assert!(live <= 8 << 30);
            }
            Op::Free { id } => live -= sizes[id],
        }
    }
    assert_eq!((live, peak), (0, w.peak_live()));

    assert_eq!(random(&RandomConfig::default()), w, "deterministic");
    let other = random(&RandomConfig {
        seed: 1,
        ..Default::default()
    });
    assert_ne!(other.ops(), w.ops());
}

#[test]
fn random_workload_respects_the_live_cap() {
    let w = random(&RandomConfig {
        allocations: 2000,
        max_size: 1000,
        alloc_percent: 90,
        max_live: 50_000,
        seed: 3,
    });
    assert_eq!(w.allocations(), 2000);
    assert!(w.peak_live() <= 50_000);
    // At 90% the cap binds: the peak comes within one block of it.
    assert!(w.peak_live() > 49_000, "{}", w.peak_live());
}

// ---------------------------------------------------------------- replay

#[test]
fn replay_returns_everything_and_reports_failures() {
    let w = Workload::new(
        "w",
        vec![
            alloc(0, 100),
            alloc(1, 200),
            free(0),
            alloc(2, 50),
            alloc(3, 1000),
        ],
    )
    .unwrap();
    let sim = Simulated::new(1 << 20);
    let mut r = Replayer::new(&sim, &w, w.default_streams()).unwrap();
    r.pass().unwrap();
    r.pass().unwrap();
    // Blocks the workload leaves live are freed after each pass.
    assert_eq!((sim.in_use(), sim.live(), sim.peak()), (0, 0, 1250));
    assert_eq!(sim.allocation_count(), 8);

    let small = Simulated::new(1000);
    let mut r = Replayer::new(&small, &w, w.default_streams()).unwrap();
    match r.pass() {
        Err(ReplayError::Alloc {
            op: 4,
            size: 1000,
            error,
        }) => {
            assert!(error.is_out_of_memory())
        }
        other => panic!("expected op 4 to fail, got {other:?}"),
    }
    assert_eq!(small.in_use(), 0, "a failed pass frees what it holds");

    let two = Workload::new(
        "two",
        vec![Op::Alloc {
            id: 0,
            size: 8,
            stream: 1,
        }],
    )
    .unwrap();
    assert!(matches!(
        Replayer::new(&sim, &two, vec![StreamHandle::DEFAULT]),
        Err(ReplayError::Streams {
            needed: 2,
            given: 1
        })
    ));
    // SAFETY: the streams go to Simulated only.
    let mut r = Replayer::new(&sim, &two, simulated_streams(2)).unwrap();
    r.pass().unwrap();
}

#[test]
fn measure_runs_warm_up_and_the_passes_asked() {
    let w = random(&RandomConfig {
        allocations: 500,
        ..Default::default()
    });
    let sim = Simulated::new(8 << 30);
    let mut r = Replayer::new(&sim, &w, w.default_streams()).unwrap();
    let t = measure(&mut r, 5).unwrap();
    assert_eq!((t.passes.len(), t.ops), (5, 1000));
    assert!(t.passes.contains(&t.ns_per_op));
    assert_eq!(sim.allocation_count(), 6 * 500);
    assert_eq!(sim.in_use(), 0);
}

// ---------------------------------------------------------------- capacity search

/// A test stack that never reuses memory: freed blocks stay taken from the upstream until it is
/// dropped. Its minimum capacity is the sum of all allocations.
struct NoReuse<U: MemoryResource> {
    upstream: U,
    freed: Mutex<Vec<(usize, usize)>>,
}

// SAFETY: every block comes from the upstream and goes back to it, once, on drop.
unsafe impl<U: MemoryResource> MemoryResource for NoReuse<U> {
    claims! { as U }

    fn allocate(&self, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>, AllocError> {
        if let Some(p) = check_request::<Self>(size, align, "NoReuse")? {
            return Ok(p);
        }
        self.upstream.allocate(size, align, s)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, _: usize, _: StreamRef) {
        if size > 0 {
            self.freed
                .lock()
                .unwrap()
                .push((ptr.as_ptr() as usize, size));
        }
    }

    streams!(to upstream);
}

impl<U: MemoryResource> Drop for NoReuse<U> {
    fn drop(&mut self) {
        for &(addr, size) in self.freed.get_mut().unwrap().iter() {
            let ptr = NonNull::new(addr as *mut u8).unwrap();
            // SAFETY: each entry is a block from the upstream with this size, freed here once.
            unsafe {
                self.upstream
                    .deallocate(ptr, size, replay::ALIGN, StreamRef::DEFAULT)
            };
        }
    }
}

#[test]
fn capacity_search_finds_the_known_answer() {
    // Peak live 300 (blocks 0 and 1); 350 bytes allocated in all.
    let w = Workload::new(
        "tiny",
        vec![
            alloc(0, 100),
            alloc(1, 200),
            free(0),
            alloc(2, 50),
            free(1),
            free(2),
        ],
    )
    .unwrap();
    assert_eq!(w.peak_live(), 300);

    let raw = &replay::stacks::<Arc<Simulated>>()[0];
    assert_eq!(raw.name(), "upstream");
    let cap = min_capacity(raw.as_ref(), &w, 0.001).unwrap();
    assert_eq!(
        (cap.capacity, cap.peak_live, cap.ratio, cap.upstream_peak),
        (300, 300, 1.0, 300)
    );
    assert_eq!(cap.probes, 1);

    let no_reuse = stack("no-reuse", |upstream: Arc<Simulated>, _| {
        Ok(NoReuse {
            upstream,
            freed: Mutex::new(Vec::new()),
        })
    });
    let cap = min_capacity(no_reuse.as_ref(), &w, 0.0).unwrap();
    assert_eq!((cap.capacity, cap.upstream_peak), (350, 350));
    assert!((cap.ratio - 350.0 / 300.0).abs() < 1e-12);

    // At 10% precision the answer may be up to 10% high, never low.
    let coarse = min_capacity(no_reuse.as_ref(), &w, 0.1).unwrap();
    assert!((350..=385).contains(&coarse.capacity), "{coarse:?}");
    assert!(coarse.probes < cap.probes);
}

#[test]
fn capacity_search_reports_stacks_that_never_fit_or_fail_otherwise() {
    let w = Workload::new("w", vec![alloc(0, 100), free(0)]).unwrap();
    let never = stack("never", |_: Arc<Simulated>, cap| {
        Err::<Simulated, _>(AllocError::out_of_memory(cap, 1, "never"))
    });
    match min_capacity(never.as_ref(), &w, 0.001) {
        Err(ReplayError::NeverCompletes { capacity, last }) => {
            assert_eq!(
                capacity,
                (100 * replay::MAX_CAPACITY_FACTOR).max(replay::MIN_CAPACITY_LIMIT)
            );
            assert!(last.is_out_of_memory());
        }
        other => panic!("expected NeverCompletes, got {other:?}"),
    }

    let broken = stack("broken", |_: Arc<Simulated>, _| {
        Err::<Simulated, _>(AllocError::new(
            AllocErrorKind::Unsupported("test"),
            0,
            0,
            "broken",
        ))
    });
    let e = min_capacity(broken.as_ref(), &w, 0.001).unwrap_err();
    assert!(matches!(e, ReplayError::Build(_)), "{e}");
}

#[test]
fn raw_upstream_needs_exactly_the_peak_of_the_random_workload() {
    let w = random(&RandomConfig::default());
    let raw = &replay::stacks::<Arc<Simulated>>()[0];
    let cap = min_capacity(raw.as_ref(), &w, 0.001).unwrap();
    assert_eq!((cap.capacity, cap.ratio), (w.peak_live(), 1.0));
}

// ---------------------------------------------------------------- public paths

#[test]
fn former_paths_name_the_same_items() {
    let ops = vec![alloc(0, 64), free(0)];
    let w: Workload = mrstack::replay::Workload::new("former", ops).unwrap();
    let raw = &mrstack::replay::stacks::<Arc<Simulated>>()[0];
    assert_eq!(
        replay::min_capacity(raw.as_ref(), &w, 0.01)
            .unwrap()
            .capacity,
        64
    );
    let log = format!("{HEADER}0,1,allocate,0x1000,64,0\n");
    let t: rmm_log::Trace = mrstack::replay::rmm_log::parse(log.as_bytes(), "former").unwrap();
    assert_eq!(t.workload.allocations(), 1);
    assert_eq!(mrstack::replay::rmm_log::HEADER, rmm_log::HEADER);
}

#[test]
fn a_log_of_many_streams_replays_in_time_linear_in_its_ops() {
    // 50,000 streams, each allocating and freeing one block: the replay's per-stream work (its
    // synchronization of every stream after a pass) must not compare every stream with every
    // other one (2.5·10⁹ comparisons would make this test hang, not fail).
    let n = 50_000;
    let mut ops = Vec::with_capacity(2 * n);
    for id in 0..n {
        ops.push(Op::Alloc {
            id,
            size: 256,
            stream: id,
        });
        ops.push(Op::Free { id });
    }
    let w = Workload::new("streams", ops).unwrap();
    assert_eq!(w.stream_count(), n);
    let sim = Simulated::new(1 << 30);
    let mut r = Replayer::new(&sim, &w, mrstack::replay::simulated_streams(n)).unwrap();
    r.pass().unwrap();
    assert_eq!((sim.in_use(), sim.live()), (0, 0));
    assert_eq!(sim.peak(), 256);
}
