//! Workloads for measuring resource stacks: an op list ([`Op`], checked into a [`Workload`]), the
//! built-in *random* workload ([`random`]), a replay driver ([`Replayer`]), steady-state timing
//! ([`measure`]) and the minimum-capacity search ([`min_capacity`]).
//!
//! Traces of real programs become workloads through [`crate::trace`]. A workload is produced once,
//! before anything is timed, so that generating or parsing it costs nothing in a measurement, and
//! replaying it walks a flat `Vec<Op>` with live blocks in a `Vec` indexed by allocation id: no
//! hashing, no allocation of the driver's own inside the timed loop.
//!
//! Stacks are named factories ([`stack`]) building a resource from an upstream and a capacity
//! (pool maximum, arena size); [`stacks`] is the table of presets that the benchmarks and the
//! replay tool iterate. A factory returns a type-erased [`Replay`], so the table holds stacks of
//! different types while each replay loop stays monomorphic: one virtual call per pass, none per op.
//!
//! ```
//! use mrstack::workload::{self, Op, Workload};
//! use std::sync::Arc;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ops = vec![
//!     Op::Alloc { id: 0, size: 100, stream: 0 },
//!     Op::Alloc { id: 1, size: 200, stream: 0 },
//!     Op::Free { id: 0 },
//!     Op::Free { id: 1 },
//! ];
//! let w = Workload::new("tiny", ops)?;
//! assert_eq!(w.peak_live(), 300);
//! let raw = &workload::stacks::<Arc<mrstack::Simulated>>()[0];
//! let cap = workload::min_capacity(raw.as_ref(), &w, 0.001)?;
//! assert_eq!(cap.capacity, 300); // the raw upstream wastes nothing
//! # Ok(()) }
//! ```

use crate::resource::{AllocError, MemoryResource};
use crate::stream::StreamRef;
use crate::upstream::Simulated;
use rand::{RngExt, SeedableRng};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The alignment every replayed allocation asks for: CUDA's 256 bytes, as RMM's resources use.
pub const ALIGN: usize = 256;

/// One step of a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Allocate `size` bytes on stream number `stream` (an index into the streams a replay is
    /// given; 0 is the first). `id` numbers allocations from 0 in the order they are made.
    Alloc {
        /// The allocation's number: the n-th `Alloc` of a workload has id n.
        id: usize,
        /// Bytes requested.
        size: usize,
        /// Index of the stream to allocate (and later free) on.
        stream: usize,
    },
    /// Free allocation `id`, on the stream it was allocated on.
    Free {
        /// The id of an earlier `Alloc` not freed yet.
        id: usize,
    },
}

/// What is wrong with an op list given to [`Workload::new`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WorkloadError {
    /// Allocation ids must count allocations from 0.
    #[error(
        "op {op}: allocation id {id}, expected {expected} (ids number allocations from 0 in order)"
    )]
    IdOutOfOrder {
        /// Index of the offending op.
        op: usize,
        /// The id it has.
        id: usize,
        /// The id it should have.
        expected: usize,
    },
    /// A free names an id no earlier op allocated.
    #[error("op {op}: free of allocation {id}, which no earlier op allocated")]
    UnknownId {
        /// Index of the offending op.
        op: usize,
        /// The id freed.
        id: usize,
    },
    /// A free names an allocation already freed.
    #[error("op {op}: allocation {id} is freed twice")]
    DoubleFree {
        /// Index of the offending op.
        op: usize,
        /// The id freed.
        id: usize,
    },
    /// The live bytes overflow `usize`.
    #[error("op {op}: live bytes overflow usize")]
    Overflow {
        /// Index of the offending op.
        op: usize,
    },
}

/// A checked op list: every free names a live allocation, ids number allocations in order.
///
/// Blocks still live at the end are allowed (traces of programs that exit holding memory); a
/// replay frees them after its timed part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    name: String,
    ops: Vec<Op>,
    allocations: usize,
    streams: usize,
    peak_live: usize,
    unfreed: usize,
}

impl Workload {
    /// Checks `ops` and computes the workload's peak live bytes.
    pub fn new(name: impl Into<String>, ops: Vec<Op>) -> Result<Self, WorkloadError> {
        // The size of each allocation while it is live; None once freed.
        let mut sizes: Vec<Option<usize>> = Vec::new();
        let (mut live, mut peak_live, mut streams) = (0usize, 0usize, 0usize);
        for (op, &o) in ops.iter().enumerate() {
            match o {
                Op::Alloc { id, size, stream } => {
                    if id != sizes.len() {
                        return Err(WorkloadError::IdOutOfOrder {
                            op,
                            id,
                            expected: sizes.len(),
                        });
                    }
                    sizes.push(Some(size));
                    live = live
                        .checked_add(size)
                        .ok_or(WorkloadError::Overflow { op })?;
                    peak_live = peak_live.max(live);
                    streams = streams.max(stream.saturating_add(1));
                }
                Op::Free { id } => match sizes.get_mut(id) {
                    None => return Err(WorkloadError::UnknownId { op, id }),
                    Some(slot) => match slot.take() {
                        None => return Err(WorkloadError::DoubleFree { op, id }),
                        Some(size) => live -= size,
                    },
                },
            }
        }
        Ok(Workload {
            name: name.into(),
            allocations: sizes.len(),
            unfreed: sizes.iter().filter(|s| s.is_some()).count(),
            ops,
            streams: streams.max(1),
            peak_live,
        })
    }

    /// The workload's name (`"random"`, a trace's file name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ops, in order.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// The number of allocations (`Alloc` ops).
    pub fn allocations(&self) -> usize {
        self.allocations
    }

    /// The number of streams a replay needs: the largest stream index plus one (at least 1).
    pub fn stream_count(&self) -> usize {
        self.streams
    }

    /// The most bytes live at once, counting requested sizes.
    pub fn peak_live(&self) -> usize {
        self.peak_live
    }

    /// Allocations the ops never free.
    pub fn unfreed(&self) -> usize {
        self.unfreed
    }

    /// The default stream for every stream index: right for workloads on one stream, and for
    /// resources that ignore streams.
    pub fn default_streams(&self) -> Vec<StreamRef> {
        vec![StreamRef::DEFAULT; self.streams]
    }
}

/// The parameters of the *random* workload; [`Default`] gives the benchmark's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RandomConfig {
    /// Allocations to make (10,000).
    pub allocations: usize,
    /// Largest allocation: sizes are uniform in `[1, max_size]` (1 MiB).
    pub max_size: usize,
    /// Chance in percent that a step allocates rather than frees (73, as RMM's benchmark).
    pub alloc_percent: u32,
    /// Live bytes never exceed this (8 GiB): a step that would frees instead.
    pub max_live: usize,
    /// Seed of the generator (xoshiro256++, reproducible across platforms).
    pub seed: u64,
}

impl Default for RandomConfig {
    fn default() -> Self {
        RandomConfig {
            allocations: 10_000,
            max_size: 1 << 20,
            alloc_percent: 73,
            max_live: 8 << 30,
            seed: 0x6d72_7374_6163_6b00,
        }
    }
}

/// The *random* workload: `config.allocations` allocations with sizes uniform in
/// `[1, config.max_size]`, on stream 0. At each step a size is drawn, then the step allocates with
/// probability `alloc_percent`% while fewer than `allocations` were made and the block fits under
/// `max_live`, and otherwise frees a live block picked uniformly (it always allocates when nothing is
/// live). The blocks live at the end are freed in the order they are held. The same config always
/// gives the same ops.
///
/// Sizes are capped at `max_live` so that every step can make progress.
pub fn random(config: &RandomConfig) -> Workload {
    let mut rng = rand::rngs::Xoshiro256PlusPlus::seed_from_u64(config.seed);
    let max_size = config.max_size.min(config.max_live).max(1);
    let percent = config.alloc_percent.min(100);
    let mut ops = Vec::with_capacity(config.allocations.saturating_mul(2));
    let mut live: Vec<(usize, usize)> = Vec::new();
    let (mut live_bytes, mut peak_live, mut made) = (0usize, 0usize, 0usize);
    while made < config.allocations {
        let size = rng.random_range(1..=max_size);
        let allocate = live.is_empty()
            || (rng.random_ratio(percent, 100)
                && live_bytes
                    .checked_add(size)
                    .is_some_and(|n| n <= config.max_live));
        if allocate {
            ops.push(Op::Alloc {
                id: made,
                size,
                stream: 0,
            });
            live.push((made, size));
            live_bytes += size;
            peak_live = peak_live.max(live_bytes);
            made += 1;
        } else {
            let (id, size) = live.swap_remove(rng.random_range(0..live.len()));
            ops.push(Op::Free { id });
            live_bytes -= size;
        }
    }
    ops.extend(live.iter().map(|&(id, _)| Op::Free { id }));
    // Built directly: the generator upholds every rule `Workload::new` checks (tests check it).
    Workload {
        name: "random".into(),
        ops,
        allocations: made,
        streams: 1,
        peak_live,
        unfreed: 0,
    }
}

/// What went wrong in a replay or a capacity search.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// An allocation failed.
    #[error("op {op} (allocate {size} bytes): {error}")]
    Alloc {
        /// Index of the op in the workload.
        op: usize,
        /// Bytes it asked for.
        size: usize,
        /// Why it failed.
        error: AllocError,
    },
    /// Synchronizing a stream at the end of a pass failed.
    #[error("synchronizing after the pass: {0}")]
    Synchronize(AllocError),
    /// The stack could not be built.
    #[error("building the stack: {0}")]
    Build(AllocError),
    /// The replay was given fewer streams than the workload uses.
    #[error("the workload uses {needed} streams but the replay was given {given}")]
    Streams {
        /// Streams the workload uses.
        needed: usize,
        /// Streams given.
        given: usize,
    },
    /// The capacity search found no capacity, up to a limit, with which the workload completes.
    #[error("does not complete even with a capacity of {capacity} bytes; there: {last}")]
    NeverCompletes {
        /// The largest capacity tried.
        capacity: usize,
        /// How the replay failed at that capacity.
        last: Box<ReplayError>,
    },
}

impl ReplayError {
    /// True when the failure is running out of room: a larger capacity could cure it.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            ReplayError::Alloc { error, .. } | ReplayError::Build(error) => {
                error.is_out_of_memory()
            }
            _ => false,
        }
    }
}

/// A live block of a replay.
#[derive(Debug, Clone, Copy)]
struct Block {
    ptr: NonNull<u8>,
    size: usize,
    stream: StreamRef,
}

/// Replays a [`Workload`] through a resource, pass after pass, on the same resource.
#[derive(Debug)]
pub struct Replayer<'w, R> {
    resource: R,
    workload: &'w Workload,
    streams: Vec<StreamRef>,
    live: Vec<Option<Block>>,
}

impl<'w, R: MemoryResource> Replayer<'w, R> {
    /// A replay of `workload` through `resource`, stream index `i` mapping to `streams[i]`.
    pub fn new(
        resource: R,
        workload: &'w Workload,
        streams: Vec<StreamRef>,
    ) -> Result<Self, ReplayError> {
        if streams.len() < workload.stream_count() {
            return Err(ReplayError::Streams {
                needed: workload.stream_count(),
                given: streams.len(),
            });
        }
        Ok(Replayer {
            resource,
            workload,
            streams,
            live: vec![None; workload.allocations()],
        })
    }

    /// The resource replayed through.
    pub fn resource(&self) -> &R {
        &self.resource
    }

    /// Replays every op once, then synchronizes every stream, and returns the time that took.
    /// Blocks the workload leaves live are freed afterwards, untimed, so each pass starts empty;
    /// on a failure every block is freed before the error returns.
    pub fn pass(&mut self) -> Result<Duration, ReplayError> {
        let start = Instant::now();
        let ran = self.run_ops();
        let synced = self.synchronize();
        let elapsed = start.elapsed();
        self.release();
        ran?;
        synced?;
        Ok(elapsed)
    }

    fn run_ops(&mut self) -> Result<(), ReplayError> {
        for (op, &o) in self.workload.ops().iter().enumerate() {
            match o {
                Op::Alloc { id, size, stream } => {
                    let stream = self.streams[stream];
                    match self.resource.allocate(size, ALIGN, stream) {
                        Ok(ptr) => self.live[id] = Some(Block { ptr, size, stream }),
                        Err(error) => return Err(ReplayError::Alloc { op, size, error }),
                    }
                }
                Op::Free { id } => {
                    if let Some(b) = self.live[id].take() {
                        // SAFETY: b.ptr came from allocate on this resource with b.size and ALIGN;
                        // take() empties the slot, so it is freed once.
                        unsafe { self.resource.deallocate(b.ptr, b.size, ALIGN, b.stream) };
                    }
                }
            }
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<(), ReplayError> {
        let used = &self.streams[..self.workload.stream_count()];
        for (i, &s) in used.iter().enumerate() {
            if !used[..i].contains(&s) {
                self.resource
                    .synchronize(s)
                    .map_err(ReplayError::Synchronize)?;
            }
        }
        Ok(())
    }

    fn release(&mut self) {
        for slot in &mut self.live {
            if let Some(b) = slot.take() {
                // SAFETY: as in run_ops: a live block of this resource, freed once.
                unsafe { self.resource.deallocate(b.ptr, b.size, ALIGN, b.stream) };
            }
        }
    }
}

/// A replay behind a trait object, so a table can hold stacks of different types.
pub trait Replay {
    /// One timed pass: see [`Replayer::pass`].
    fn pass(&mut self) -> Result<Duration, ReplayError>;
    /// The number of ops in a pass.
    fn ops(&self) -> usize;
}

impl<R: MemoryResource> Replay for Replayer<'_, R> {
    fn pass(&mut self) -> Result<Duration, ReplayError> {
        Replayer::pass(self)
    }
    fn ops(&self) -> usize {
        self.workload.ops().len()
    }
}

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
/// `resource` (on the default stream, as a multi-threaded host program would), one warm-up pass,
/// then `passes` timed passes started together. Returns the aggregate time per op: wall time over
/// all ops of all threads, so perfect scaling divides it by the number of threads.
pub fn measure_threads<R>(
    resource: &R,
    workloads: &[Workload],
    passes: usize,
) -> Result<f64, ReplayError>
where
    R: MemoryResource + Sync,
{
    let start = std::sync::Barrier::new(workloads.len() + 1);
    let end = std::sync::Barrier::new(workloads.len() + 1);
    let passes = passes.max(1);
    let (wall, results) = std::thread::scope(|s| {
        let handles: Vec<_> = workloads
            .iter()
            .map(|w| {
                let (start, end) = (&start, &end);
                s.spawn(move || {
                    // Every thread reaches both barriers whatever happens, so none waits forever.
                    let mut replay = Replayer::new(resource, w, w.default_streams());
                    let warm = match &mut replay {
                        Ok(r) => r.pass().map(drop),
                        Err(e) => Err(e.clone()),
                    };
                    start.wait();
                    let timed = warm.and_then(|()| match &mut replay {
                        Ok(r) => (0..passes).try_for_each(|_| r.pass().map(drop)),
                        Err(e) => Err(e.clone()),
                    });
                    end.wait();
                    timed
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        end.wait();
        let wall = t0.elapsed();
        let results: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("replay threads do not panic"))
            .collect();
        (wall, results)
    });
    results.into_iter().collect::<Result<Vec<()>, _>>()?;
    let ops: usize = workloads.iter().map(|w| w.ops().len()).sum();
    Ok(wall.as_nanos() as f64 / (ops * passes).max(1) as f64)
}

/// A named way to build a resource stack over an upstream `U` with a capacity (pool maximum,
/// arena size; ignored by stacks without one), ready to replay a workload.
pub trait StackFactory<U> {
    /// The stack's name in tables (`"pool"`, `"binning+pool"`).
    fn name(&self) -> &str;

    /// Builds the stack over `upstream` and a replay of `workload` through it.
    fn replayer<'w>(
        &self,
        upstream: U,
        capacity: usize,
        workload: &'w Workload,
        streams: Vec<StreamRef>,
    ) -> Result<Box<dyn Replay + 'w>, ReplayError>;
}

struct Stack<F> {
    name: &'static str,
    factory: F,
}

impl<U, R, F> StackFactory<U> for Stack<F>
where
    F: Fn(U, usize) -> Result<R, AllocError>,
    R: MemoryResource + 'static,
{
    fn name(&self) -> &str {
        self.name
    }

    fn replayer<'w>(
        &self,
        upstream: U,
        capacity: usize,
        workload: &'w Workload,
        streams: Vec<StreamRef>,
    ) -> Result<Box<dyn Replay + 'w>, ReplayError> {
        let resource = (self.factory)(upstream, capacity).map_err(ReplayError::Build)?;
        Ok(Box::new(Replayer::new(resource, workload, streams)?))
    }
}

/// A table entry: `factory(upstream, capacity)` builds the stack, typically with
/// `resource_stack!`.
///
/// ```
/// use mrstack::workload::{stack, StackFactory};
/// use mrstack::Simulated;
/// use std::sync::Arc;
///
/// let raw: Box<dyn StackFactory<Arc<Simulated>>> = stack("raw", |upstream, _capacity| Ok(upstream));
/// assert_eq!(raw.name(), "raw");
/// ```
pub fn stack<U, R, F>(name: &'static str, factory: F) -> Box<dyn StackFactory<U>>
where
    F: Fn(U, usize) -> Result<R, AllocError> + 'static,
    R: MemoryResource + 'static,
{
    Box::new(Stack { name, factory })
}

/// The preset stacks over any upstream `U`, the first being the upstream itself (`"upstream"`).
/// Leaves that are not built over an upstream (`CudaAsync`) are added by their callers.
pub fn stacks<U: MemoryResource + 'static>() -> Vec<Box<dyn StackFactory<U>>> {
    vec![
        stack("upstream", |upstream: U, _capacity| Ok(upstream)),
        stack("pool", |up: U, cap| {
            Ok(crate::resource_stack![
                up,
                Pool {
                    initial: cap,
                    max: cap
                }
            ])
        }),
        stack("binning", |up: U, cap| {
            Ok(crate::resource_stack![
                up,
                Pool {
                    initial: cap,
                    max: cap
                },
                Binning
            ])
        }),
        stack("arena", |up: U, cap| {
            Ok(crate::resource_stack![up, Arena { size: cap }])
        }),
    ]
}

/// The capacity to time a workload with: twice its peak live bytes (at least 1 MiB), room enough
/// for any sensible stack's overhead, so that a timing measures speed rather than a squeeze.
pub fn timing_capacity(workload: &Workload) -> usize {
    workload.peak_live().saturating_mul(2).max(1 << 20)
}

/// Streams for replaying a many-stream workload over `Simulated`: index 0 is the default stream,
/// index `i` a made-up handle `i`, distinct from the others.
///
/// # Safety
///
/// The handles are not CUDA streams: give them only to stacks that never pass streams to the
/// driver (stacks over `Simulated` or `System`).
pub unsafe fn fake_streams(n: usize) -> Vec<StreamRef> {
    (0..n.max(1))
        // SAFETY: the caller promises the handles never reach the driver.
        .map(|i| unsafe { StreamRef::from_raw(std::ptr::without_provenance_mut(i)) })
        .collect()
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

/// How far above the peak live bytes [`min_capacity`] looks before giving up.
pub const MAX_CAPACITY_FACTOR: usize = 1024;

/// The smallest capacity with which one pass of `workload` completes on `stack`, to a relative
/// `precision` (0.001 for 0.1%), by binary search.
///
/// Each probe builds the stack afresh over `Simulated::new(capacity)` with the same capacity as
/// its own (pool maximum, arena size), so the capacity bounds what the whole stack may take, and
/// replays the workload once. Nothing can complete below the peak live bytes; the search doubles
/// from there until a capacity completes (up to [`MAX_CAPACITY_FACTOR`] × peak), then bisects.
/// It assumes that a capacity that completes is followed by larger ones that do, which holds for
/// deterministic stacks whose layout does not depend on the room left upstream. A failure other than
/// running out of memory stops the search with that error.
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
        // SAFETY: the stack sits over Simulated, which never passes streams to the driver.
        let streams = unsafe { fake_streams(workload.stream_count()) };
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
    let limit = peak_live.saturating_mul(MAX_CAPACITY_FACTOR);
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
