//! Steady-state timing of replays ([`measure`], [`measure_threads`]) and the minimum-capacity search ([`min_capacity`]).

use super::{simulated_streams, Replay, ReplayError, Replayer, StackFactory, Workload};
use crate::leaf::Simulated;
use crate::resource::MemoryResource;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Steady-state time per op: see [`measure`].
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    /// The median over the timed passes, in nanoseconds per op.
    pub ns_per_op: f64,
    /// Each timed pass, in nanoseconds per op, in the order run.
    pub passes: Vec<f64>,
    /// Ops in one pass.
    pub ops: usize,
}

/// Runs one warm-up pass, then `passes` timed passes (at least 1), all on the same resource, and
/// returns the median time per op.
pub fn measure(replay: &mut dyn Replay, passes: usize) -> Result<Timing, ReplayError> {
    replay.pass()?;
    let ops = replay.ops();
    let per_op = |d: Duration| d.as_nanos() as f64 / ops.max(1) as f64;
    let times = (0..passes.max(1))
        .map(|_| replay.pass().map(per_op))
        .collect::<Result<Vec<_>, _>>()?;
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    let median = if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    };
    Ok(Timing {
        ns_per_op: median,
        passes: times,
        ops,
    })
}

/// Throughput with threads: each workload replays on its own thread through the one shared
/// `resource` (on the default stream, as a multi-threaded host program would): one warm-up pass,
/// then `passes` timed passes, each started on all threads at once. Returns the aggregate time per
/// op of the median pass: its wall time over all ops of all threads, so perfect scaling divides
/// it by the number of threads.
pub fn measure_threads<R>(
    resource: &R,
    workloads: &[Workload],
    passes: usize,
) -> Result<f64, ReplayError>
where
    R: MemoryResource + Sync,
{
    let passes = passes.max(1);
    let start = std::sync::Barrier::new(workloads.len() + 1);
    let end = std::sync::Barrier::new(workloads.len() + 1);
    let (mut walls, results) = std::thread::scope(|s| {
        let handles: Vec<_> = workloads
            .iter()
            .map(|w| {
                let (start, end) = (&start, &end);
                s.spawn(move || {
                    // Every thread reaches every barrier whatever happens, so none waits forever;
                    // after an error it stops replaying and keeps the first error.
                    let mut replay = Replayer::new(resource, w, w.default_streams());
                    let mut result = match &mut replay {
                        Ok(r) => r.pass().map(drop),
                        Err(e) => Err(e.clone()),
                    };
                    for _ in 0..passes {
                        start.wait();
                        if let (Ok(()), Ok(r)) = (&result, &mut replay) {
                            result = r.pass().map(drop);
                        }
                        end.wait();
                    }
                    result
                })
            })
            .collect();
        let walls: Vec<Duration> = (0..passes)
            .map(|_| {
                start.wait();
                let t0 = Instant::now();
                end.wait();
                t0.elapsed()
            })
            .collect();
        let results: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("replay threads do not panic"))
            .collect();
        (walls, results)
    });
    results.into_iter().collect::<Result<Vec<()>, _>>()?;
    walls.sort();
    let ops: usize = workloads.iter().map(|w| w.ops().len()).sum();
    Ok(walls[walls.len() / 2].as_nanos() as f64 / ops.max(1) as f64)
}

/// The result of [`min_capacity`].
#[derive(Debug, Clone, PartialEq)]
pub struct Capacity {
    /// The smallest capacity found with which the workload completes.
    pub capacity: usize,
    /// The workload's peak live bytes.
    pub peak_live: usize,
    /// `capacity / peak_live` (1.0 for a workload that allocates nothing).
    pub ratio: f64,
    /// The most bytes the stack took from its upstream at once, at that capacity.
    pub upstream_peak: usize,
    /// Replays the search ran.
    pub probes: usize,
}

/// How far above the peak live bytes [`min_capacity`] looks before giving up (or up to
/// [`MIN_CAPACITY_LIMIT`], if more: a stack that maps whole pages needs one even for a few bytes).
pub const MAX_CAPACITY_FACTOR: usize = 1024;

/// The least capacity [`min_capacity`] tries before giving up: 1 GiB.
pub const MIN_CAPACITY_LIMIT: usize = 1 << 30;

/// The smallest capacity with which one pass of `workload` completes on `stack`, to a relative
/// `precision` (0.001 for 0.1%), by binary search.
///
/// Each probe builds the stack afresh over `Simulated::new(capacity)` with the same capacity as
/// its own (pool maximum, arena size), so the capacity bounds what the whole stack may take, and
/// replays the workload once. Nothing can complete below the peak live bytes; the search doubles
/// from there until a capacity completes (up to [`MAX_CAPACITY_FACTOR`] × peak, or
/// [`MIN_CAPACITY_LIMIT`] if more), then bisects.
/// It assumes that a capacity that completes is followed by larger ones that do, which holds for
/// deterministic stacks whose layout does not depend on the room left upstream. A failure other than
/// running out of memory stops the search with that error.
///
/// ```
/// use mrstack::replay::{self, Op, Workload};
/// use std::sync::Arc;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ops = vec![
///     Op::Alloc { id: 0, size: 100, stream: 0 },
///     Op::Alloc { id: 1, size: 200, stream: 0 },
///     Op::Free { id: 0 },
///     Op::Free { id: 1 },
/// ];
/// let w = Workload::new("tiny", ops)?;
/// assert_eq!(w.peak_live(), 300);
/// let raw = &replay::stacks::<Arc<mrstack::leaf::Simulated>>()[0];
/// let cap = replay::min_capacity(raw.as_ref(), &w, 0.001)?;
/// assert_eq!(cap.capacity, 300); // the raw upstream wastes nothing
/// # Ok(()) }
/// ```
pub fn min_capacity(
    stack: &dyn StackFactory<Arc<Simulated>>,
    workload: &Workload,
    precision: f64,
) -> Result<Capacity, ReplayError> {
    let mut probes = 0;
    // Ok(upstream peak) when the workload completes with this capacity, Ok(Err) when it runs
    // out of memory, Err for any other failure.
    let mut probe = |capacity: usize| -> Result<Result<usize, ReplayError>, ReplayError> {
        probes += 1;
        let upstream = Arc::new(Simulated::new(capacity));
        let streams = simulated_streams(workload.stream_count());
        let outcome = stack
            .replayer(upstream.clone(), capacity, workload, streams)
            .and_then(|mut r| r.pass().map(drop));
        match outcome {
            Ok(()) => Ok(Ok(upstream.peak())),
            Err(e) if e.is_out_of_memory() => Ok(Err(e)),
            Err(e) => Err(e),
        }
    };

    let peak_live = workload.peak_live();
    let limit = peak_live
        .saturating_mul(MAX_CAPACITY_FACTOR)
        .max(MIN_CAPACITY_LIMIT);
    // `lo` fails (or is below the peak, where nothing can complete), `hi` completes.
    let (mut lo, mut hi, mut upstream_peak) = match probe(peak_live)? {
        Ok(p) => (peak_live, peak_live, p),
        Err(mut last) => {
            let mut lo = peak_live;
            loop {
                if lo >= limit {
                    return Err(ReplayError::NeverCompletes {
                        capacity: lo,
                        last: Box::new(last),
                    });
                }
                let next = lo.saturating_mul(2).min(limit);
                match probe(next)? {
                    Ok(p) => break (lo, next, p),
                    Err(e) => (lo, last) = (next, e),
                }
            }
        }
    };
    let precision = precision.max(0.0);
    while hi - lo > ((hi as f64 * precision) as usize).max(1) {
        let mid = lo + (hi - lo) / 2;
        match probe(mid)? {
            Ok(p) => (hi, upstream_peak) = (mid, p),
            Err(_) => lo = mid,
        }
    }
    Ok(Capacity {
        capacity: hi,
        peak_live,
        ratio: if peak_live == 0 {
            1.0
        } else {
            hi as f64 / peak_live as f64
        },
        upstream_peak,
        probes,
    })
}
