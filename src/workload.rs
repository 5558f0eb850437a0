//! Workloads for measuring resource stacks: an op list ([`Op`], checked into a [`Workload`]), the
//! built-in *random* workload ([`random`]), replay drivers ([`Replayer`] in op order on one thread,
//! [`ThreadedReplayer`] with each thread of a many-threaded log on its own OS thread), steady-state
//! timing ([`measure`]) and the minimum-capacity search ([`min_capacity`]).
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

use crate::leaf::Simulated;
use crate::resource::{AllocError, MemoryResource};
use crate::stream::{StreamHandle, StreamRef};
use rand::{RngExt, SeedableRng};
use std::ptr::{null_mut, NonNull};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
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
    /// [`Workload::with_threads`] was given a thread list of another length than the ops.
    #[error("{threads} thread indices for {ops} ops (one per op expected)")]
    ThreadCount {
        /// Ops in the workload.
        ops: usize,
        /// Thread indices given.
        threads: usize,
    },
}

/// A checked op list: every free names a live allocation, ids number allocations in order.
///
/// Blocks still live at the end are allowed (traces of programs that exit holding memory); a
/// replay frees them after its timed part.
///
/// A workload runs on one thread unless [`with_threads`](Self::with_threads) says which thread
/// runs each op, as a many-threaded log does. The op order is then the log's order: a replay in
/// that order ([`Replayer`]) is deterministic, one with threads ([`ThreadedReplayer`]) keeps each
/// thread's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    name: String,
    ops: Vec<Op>,
    allocations: usize,
    streams: usize,
    peak_live: usize,
    unfreed: usize,
    /// The thread index of each op; empty when every op runs on thread 0.
    threads: Vec<usize>,
    thread_count: usize,
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
            threads: Vec::new(),
            thread_count: 1,
        })
    }

    /// The same workload with op `i` run by thread index `threads[i]` (indices from 0, as a log's
    /// threads in order of first appearance). One index per op; a list naming one thread only
    /// leaves the workload single-threaded.
    ///
    /// ```
    /// use mrstack::workload::{Op, Workload};
    ///
    /// let ops = vec![Op::Alloc { id: 0, size: 64, stream: 0 }, Op::Free { id: 0 }];
    /// let w = Workload::new("handed over", ops)?.with_threads(vec![0, 1])?;
    /// assert_eq!(w.thread_count(), 2);
    /// assert_eq!(w.op_threads(), Some(&[0, 1][..]));
    /// # Ok::<(), mrstack::workload::WorkloadError>(())
    /// ```
    pub fn with_threads(mut self, threads: Vec<usize>) -> Result<Self, WorkloadError> {
        if threads.len() != self.ops.len() {
            return Err(WorkloadError::ThreadCount {
                ops: self.ops.len(),
                threads: threads.len(),
            });
        }
        let count = threads.iter().max().map_or(1, |&t| t.saturating_add(1));
        if count > 1 {
            self.threads = threads;
            self.thread_count = count;
        } else {
            self.threads = Vec::new();
            self.thread_count = 1;
        }
        Ok(self)
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

    /// The number of threads the ops run on (at least 1): the largest thread index plus one.
    pub fn thread_count(&self) -> usize {
        self.thread_count
    }

    /// The thread index of each op, or `None` when every op runs on one thread.
    pub fn op_threads(&self) -> Option<&[usize]> {
        (self.thread_count > 1).then_some(&self.threads[..])
    }

    /// The most bytes live at once in op order, counting requested sizes.
    pub fn peak_live(&self) -> usize {
        self.peak_live
    }

    /// Allocations the ops never free.
    pub fn unfreed(&self) -> usize {
        self.unfreed
    }

    /// The default stream for every stream index: right for workloads on one stream, and for
    /// resources that ignore streams.
    pub fn default_streams(&self) -> Vec<StreamHandle> {
        vec![StreamHandle::DEFAULT; self.streams]
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
        threads: Vec::new(),
        thread_count: 1,
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
    /// An OS thread for a many-threaded replay could not be started.
    #[error("starting the OS thread for replay thread {thread}: {message}")]
    Thread {
        /// The workload's thread index.
        thread: usize,
        /// The operating system's reason.
        message: String,
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
    /// The index of its stream in the replay's streams.
    stream: usize,
}

/// Replays a [`Workload`] through a resource, pass after pass, on the same resource.
#[derive(Debug)]
pub struct Replayer<'w, R> {
    resource: R,
    workload: &'w Workload,
    streams: Vec<StreamHandle>,
    live: Vec<Option<Block>>,
}

impl<'w, R: MemoryResource> Replayer<'w, R> {
    /// A replay of `workload` through `resource`, stream index `i` mapping to `streams[i]`.
    pub fn new(
        resource: R,
        workload: &'w Workload,
        streams: Vec<StreamHandle>,
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
                    match self
                        .resource
                        .allocate(size, ALIGN, self.streams[stream].as_ref())
                    {
                        Ok(ptr) => self.live[id] = Some(Block { ptr, size, stream }),
                        Err(error) => return Err(ReplayError::Alloc { op, size, error }),
                    }
                }
                Op::Free { id } => {
                    if let Some(b) = self.live[id].take() {
                        // SAFETY: b.ptr came from allocate on this resource with b.size and ALIGN;
                        // take() empties the slot, so it is freed once.
                        unsafe {
                            self.resource.deallocate(
                                b.ptr,
                                b.size,
                                ALIGN,
                                self.streams[b.stream].as_ref(),
                            )
                        };
                    }
                }
            }
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<(), ReplayError> {
        synchronize_streams(&self.resource, self.workload, &self.streams)
    }

    fn release(&mut self) {
        for slot in &mut self.live {
            if let Some(b) = slot.take() {
                // SAFETY: as in run_ops: a live block of this resource, freed once.
                unsafe {
                    self.resource
                        .deallocate(b.ptr, b.size, ALIGN, self.streams[b.stream].as_ref())
                };
            }
        }
    }
}

/// Replays a many-threaded [`Workload`] through a shared resource, each of its threads on an OS
/// thread of its own, each keeping its ops in log order, pass after pass.
///
/// A free waits until the allocation it names is made, which matters only where another thread
/// makes it: one atomic load when it is already there; otherwise a short spin, then yielding the
/// core, then parking until the allocating thread wakes it (there may be more threads than
/// cores). Waits cannot deadlock: the op earliest in the log among those not done yet can always
/// run. The lanes of ops, each allocation's size and stream, and the slots that hand pointers
/// between threads are laid out before any pass, so a pass does no work of its own but two atomic
/// operations per allocation and two per free that finds its block made.
///
/// The time of a pass is wall time, from the moment every thread is started and waiting until the
/// last one finishes, plus synchronizing the streams: ns per op is then the inverse of throughput.
/// Starting the threads is not timed.
#[derive(Debug)]
pub struct ThreadedReplayer<'w, R> {
    resource: R,
    workload: &'w Workload,
    streams: Vec<StreamHandle>,
    /// Each thread's ops in order, with their index in the workload.
    lanes: Vec<Vec<(usize, Op)>>,
    /// Each allocation's size and stream, for its free.
    /// Each allocation's size and stream index.
    blocks: Vec<(usize, usize)>,
    /// Each allocation's hand-over slot.
    live: Vec<Slot>,
}

/// Where a pointer passes from the thread that allocates a block to the one that frees it.
#[derive(Debug, Default)]
struct Slot {
    /// The pointer while the block is live; null before it is made and after it is freed.
    ptr: AtomicPtr<u8>,
    /// 1 + the lane of the thread parked waiting for `ptr`, or 0.
    waiter: AtomicUsize,
}

/// What the threads of one pass share.
struct PassState {
    /// Set when a thread failed: the others stop at their next wait.
    abort: AtomicBool,
    /// Each lane's thread, to wake it; set before any op runs.
    threads: Vec<std::sync::OnceLock<std::thread::Thread>>,
}

/// Stops the other threads of a pass when the one that holds it panics (a resource that panics
/// on a broken contract), so that none waits forever for an allocation that will not come.
struct FailOnPanic<'a>(&'a PassState);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail();
        }
    }
}

impl PassState {
    fn wake(&self, lane: usize) {
        if let Some(t) = self.threads.get(lane).and_then(|t| t.get()) {
            t.unpark();
        }
    }

    fn fail(&self) {
        self.abort.store(true, Ordering::SeqCst);
        for lane in 0..self.threads.len() {
            self.wake(lane);
        }
    }
}

impl<'w, R: MemoryResource + Sync> ThreadedReplayer<'w, R> {
    /// A replay of `workload` through `resource` with one OS thread per workload thread, stream
    /// index `i` mapping to `streams[i]`.
    pub fn new(
        resource: R,
        workload: &'w Workload,
        streams: Vec<StreamHandle>,
    ) -> Result<Self, ReplayError> {
        if streams.len() < workload.stream_count() {
            return Err(ReplayError::Streams {
                needed: workload.stream_count(),
                given: streams.len(),
            });
        }
        let mut lanes = vec![Vec::new(); workload.thread_count()];
        let mut blocks = Vec::with_capacity(workload.allocations());
        for (op, &o) in workload.ops().iter().enumerate() {
            let thread = workload.op_threads().map_or(0, |t| t[op]);
            lanes[thread].push((op, o));
            if let Op::Alloc { size, stream, .. } = o {
                blocks.push((size, stream));
            }
        }
        Ok(ThreadedReplayer {
            resource,
            workload,
            streams,
            lanes,
            blocks,
            live: (0..workload.allocations())
                .map(|_| Slot::default())
                .collect(),
        })
    }

    /// The resource replayed through.
    pub fn resource(&self) -> &R {
        &self.resource
    }

    /// Replays every op once, each thread's on its own OS thread, then synchronizes every stream,
    /// and returns the time that took. As [`Replayer::pass`], blocks left live are freed
    /// afterwards, untimed, and on a failure every block is freed before the error returns; the
    /// failure reported is the one earliest in the log.
    pub fn pass(&mut self) -> Result<Duration, ReplayError> {
        let state = PassState {
            abort: AtomicBool::new(false),
            threads: (0..self.lanes.len())
                .map(|_| std::sync::OnceLock::new())
                .collect(),
        };
        let ready = AtomicUsize::new(0);
        // Held for writing until every thread is started and waiting to read it.
        let gate = RwLock::new(());
        let this = &*self;
        let outcome = std::thread::scope(|scope| {
            let held = gate.write().unwrap_or_else(|p| p.into_inner());
            let mut handles = Vec::with_capacity(this.lanes.len());
            let mut spawn_error = None;
            for (thread, lane) in this.lanes.iter().enumerate() {
                let (gate, ready, state) = (&gate, &ready, &state);
                let spawned = std::thread::Builder::new()
                    .name(format!("replay-{thread}"))
                    .spawn_scoped(scope, move || {
                        let _failing = FailOnPanic(state);
                        let _ = state.threads[thread].set(std::thread::current());
                        ready.fetch_add(1, Ordering::Release);
                        drop(gate.read().unwrap_or_else(|p| p.into_inner()));
                        this.run_lane(thread, lane, state)
                    });
                match spawned {
                    Ok(h) => handles.push(h),
                    Err(e) => {
                        state.fail();
                        spawn_error = Some(ReplayError::Thread {
                            thread,
                            message: e.to_string(),
                        });
                        break;
                    }
                }
            }
            while ready.load(Ordering::Acquire) < handles.len() {
                std::thread::yield_now();
            }
            let start = Instant::now();
            drop(held);
            let mut end = start;
            let mut failure: Option<(usize, ReplayError)> = None;
            for h in handles {
                match h.join() {
                    Ok(Ok(done)) => end = end.max(done),
                    Ok(Err((op, e))) => {
                        if failure.as_ref().is_none_or(|(first, _)| op < *first) {
                            failure = Some((op, e));
                        }
                    }
                    // A resource that panics (Simulated on a broken free) keeps panicking here.
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            match (spawn_error, failure) {
                (Some(e), _) | (None, Some((_, e))) => Err(e),
                (None, None) => Ok(end - start),
            }
        });
        let outcome = outcome.and_then(|ran| {
            let sync_start = Instant::now();
            synchronize_streams(&self.resource, self.workload, &self.streams)?;
            Ok(ran + sync_start.elapsed())
        });
        self.release();
        outcome
    }

    /// Runs the ops of lane `me`; returns when it finished, or the op that failed and why. Stops
    /// early, with `Ok`, once another thread has failed.
    fn run_lane(
        &self,
        me: usize,
        lane: &[(usize, Op)],
        state: &PassState,
    ) -> Result<Instant, (usize, ReplayError)> {
        if state.abort.load(Ordering::Relaxed) {
            return Ok(Instant::now());
        }
        for &(op, o) in lane {
            match o {
                Op::Alloc { id, size, stream } => {
                    match self
                        .resource
                        .allocate(size, ALIGN, self.streams[stream].as_ref())
                    {
                        Ok(ptr) => {
                            let slot = &self.live[id];
                            // SeqCst with the waiter's store of `waiter` then load of `ptr`: either
                            // it sees the pointer, or this sees it waiting and wakes it.
                            slot.ptr.store(ptr.as_ptr(), Ordering::SeqCst);
                            let waiter = slot.waiter.load(Ordering::SeqCst);
                            if waiter != 0 {
                                state.wake(waiter - 1);
                            }
                        }
                        Err(error) => {
                            state.fail();
                            return Err((op, ReplayError::Alloc { op, size, error }));
                        }
                    }
                }
                Op::Free { id } => {
                    let Some(ptr) = self.wait_for(id, me, state) else {
                        return Ok(Instant::now());
                    };
                    let (size, stream) = self.blocks[id];
                    // SAFETY: ptr came from allocate on this resource with this size and ALIGN
                    // (blocks[id] is allocation id's); the slot was emptied by this thread, the one
                    // thread that frees id, so it is freed once.
                    unsafe {
                        self.resource
                            .deallocate(ptr, size, ALIGN, self.streams[stream].as_ref())
                    };
                }
            }
        }
        Ok(Instant::now())
    }

    /// Takes allocation `id`'s pointer once its thread has made it, waiting as lane `me`; None if
    /// the replay aborts.
    fn wait_for(&self, id: usize, me: usize, state: &PassState) -> Option<NonNull<u8>> {
        /// Spins that catch a hand-over in flight, then yields that let a thread on this core
        /// make the allocation, before parking.
        const SPINS: u32 = 16;
        const YIELDS: u32 = 4;
        let slot = &self.live[id];
        // Only this thread frees `id`, so no one else writes the slot once the pointer is in.
        let take = |ptr| {
            slot.ptr.store(null_mut(), Ordering::Relaxed);
            Some(ptr)
        };
        for i in 0..SPINS + YIELDS {
            if let Some(ptr) = NonNull::new(slot.ptr.load(Ordering::Acquire)) {
                return take(ptr);
            }
            if state.abort.load(Ordering::Relaxed) {
                return None;
            }
            if i < SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        slot.waiter.store(me + 1, Ordering::SeqCst);
        loop {
            if let Some(ptr) = NonNull::new(slot.ptr.load(Ordering::SeqCst)) {
                slot.waiter.store(0, Ordering::Relaxed);
                return take(ptr);
            }
            if state.abort.load(Ordering::SeqCst) {
                return None;
            }
            // Woken by the allocation, by a failure, or spuriously: the loop looks again.
            std::thread::park();
        }
    }

    fn release(&mut self) {
        for (slot, &(size, stream)) in self.live.iter_mut().zip(&self.blocks) {
            *slot.waiter.get_mut() = 0;
            if let Some(ptr) = NonNull::new(std::mem::replace(slot.ptr.get_mut(), null_mut())) {
                // SAFETY: a live block of this resource with its size and ALIGN; the slot is
                // emptied, so it is freed once, and every replay thread has finished.
                unsafe {
                    self.resource
                        .deallocate(ptr, size, ALIGN, self.streams[stream].as_ref())
                };
            }
        }
    }
}

/// Synchronizes each distinct stream the workload uses, once.
fn synchronize_streams<R: MemoryResource>(
    resource: &R,
    workload: &Workload,
    streams: &[StreamHandle],
) -> Result<(), ReplayError> {
    let used = &streams[..workload.stream_count()];
    for (i, s) in used.iter().enumerate() {
        if !used[..i].iter().any(|u| u.id() == s.id()) {
            resource
                .synchronize(s.as_ref())
                .map_err(ReplayError::Synchronize)?;
        }
    }
    Ok(())
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

impl<R: MemoryResource + Sync> Replay for ThreadedReplayer<'_, R> {
    fn pass(&mut self) -> Result<Duration, ReplayError> {
        ThreadedReplayer::pass(self)
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

/// A named way to build a resource stack over an upstream `U` with a capacity (pool maximum,
/// arena size; ignored by stacks without one), ready to replay a workload.
pub trait StackFactory<U> {
    /// The stack's name in tables (`"pool"`, `"binning+pool"`).
    fn name(&self) -> &str;

    /// Builds the stack over `upstream` and a replay of `workload` through it, in op order on
    /// the calling thread ([`Replayer`]), whatever threads the workload names.
    fn replayer<'w>(
        &self,
        upstream: U,
        capacity: usize,
        workload: &'w Workload,
        streams: Vec<StreamHandle>,
    ) -> Result<Box<dyn Replay + 'w>, ReplayError>;

    /// Builds the stack over `upstream` and a replay of `workload` that runs each of its threads
    /// on an OS thread of its own ([`ThreadedReplayer`]); for a one-thread workload, the same as
    /// [`replayer`](Self::replayer).
    fn threaded_replayer<'w>(
        &self,
        upstream: U,
        capacity: usize,
        workload: &'w Workload,
        streams: Vec<StreamHandle>,
    ) -> Result<Box<dyn Replay + 'w>, ReplayError>;
}

struct Stack<F> {
    name: &'static str,
    factory: F,
}

impl<U, R, F> StackFactory<U> for Stack<F>
where
    F: Fn(U, usize) -> Result<R, AllocError>,
    R: MemoryResource + Sync + 'static,
{
    fn name(&self) -> &str {
        self.name
    }

    fn replayer<'w>(
        &self,
        upstream: U,
        capacity: usize,
        workload: &'w Workload,
        streams: Vec<StreamHandle>,
    ) -> Result<Box<dyn Replay + 'w>, ReplayError> {
        let resource = (self.factory)(upstream, capacity).map_err(ReplayError::Build)?;
        Ok(Box::new(Replayer::new(resource, workload, streams)?))
    }

    fn threaded_replayer<'w>(
        &self,
        upstream: U,
        capacity: usize,
        workload: &'w Workload,
        streams: Vec<StreamHandle>,
    ) -> Result<Box<dyn Replay + 'w>, ReplayError> {
        if workload.thread_count() == 1 {
            return self.replayer(upstream, capacity, workload, streams);
        }
        let resource = (self.factory)(upstream, capacity).map_err(ReplayError::Build)?;
        Ok(Box::new(ThreadedReplayer::new(
            resource, workload, streams,
        )?))
    }
}

/// A table entry: `factory(upstream, capacity)` builds the stack, typically with
/// `resource_stack!`. The stack must be `Sync`, so that a many-threaded log can replay through it
/// from its threads.
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
    R: MemoryResource + Sync + 'static,
{
    Box::new(Stack { name, factory })
}

/// The preset stacks over any upstream `U`, the first being the upstream itself (`"upstream"`).
/// Leaves that are not built over an upstream (`CudaAsync`) are added by their callers.
pub fn stacks<U: MemoryResource + Send + Sync + 'static>() -> Vec<Box<dyn StackFactory<U>>> {
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

/// Streams for replaying a many-stream workload where no GPU is: index 0 is the default stream,
/// index `i` the simulated stream `i` ([`StreamRef::simulated`]), distinct from the others. Safe
/// for any stack: CUDA resources refuse to allocate on a simulated stream, and have nothing to wait
/// for on one.
pub fn simulated_streams(n: usize) -> Vec<StreamHandle> {
    (0..n.max(1))
        .map(|i| StreamRef::simulated(u32::try_from(i).unwrap_or(u32::MAX)).to_handle())
        .collect()
}

/// Counts the bytes a stack takes from its upstream: what a replay reports as the stack's upstream
/// peak where the upstream keeps no count of its own (`Cuda`; `Simulated` has
/// [`peak`](Simulated::peak)). Two relaxed atomic operations per call that reaches it, which for a
/// suballocator is only when it grows or shrinks; the `Statistics` adaptor counts more.
///
/// Share it behind an `Arc` to read it after the stack that holds it is built:
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::workload::Metered;
/// use std::sync::Arc;
///
/// let meter = Arc::new(Metered::new(Simulated::new(1 << 20)));
/// let mr = resource_stack![meter.clone()];
/// let p = mr.allocate(1000, 256, StreamRef::DEFAULT)?;
/// // SAFETY: p came from mr with this size and alignment.
/// unsafe { mr.deallocate(p, 1000, 256, StreamRef::DEFAULT) };
/// assert_eq!((meter.in_use(), meter.peak()), (0, 1000));
/// # Ok::<(), AllocError>(())
/// ```
#[derive(Debug)]
pub struct Metered<U> {
    upstream: U,
    in_use: AtomicUsize,
    peak: AtomicUsize,
}

impl<U> Metered<U> {
    const NAME: &'static str = "Metered";

    /// Counts what goes through to `upstream`.
    pub fn new(upstream: U) -> Self {
        Metered {
            upstream,
            in_use: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Bytes allocated through this resource and not freed yet.
    pub fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Relaxed)
    }

    /// The most bytes allocated through this resource at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }
}

// SAFETY: every allocation is the upstream's, returned unchanged; counting touches no memory.
unsafe impl<U: MemoryResource> MemoryResource for Metered<U> {
    type Host = U::Host;
    type Device = U::Device;
    type Managed = U::Managed;
    type Alignment = U::Alignment;

    fn allocate(
        &self,
        size: usize,
        align: usize,
        stream: StreamRef,
    ) -> Result<NonNull<u8>, AllocError> {
        if let Some(empty) = crate::resource::check_request::<Self>(size, align, Self::NAME)? {
            return Ok(empty);
        }
        let ptr = self.upstream.allocate(size, align, stream)?;
        // The counter's updates form one sequence, so the largest value any allocation leaves in
        // it is the exact peak.
        let now = self.in_use.fetch_add(size, Ordering::Relaxed) + size;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.upstream.deallocate(ptr, size, align, stream) };
        self.in_use.fetch_sub(size, Ordering::Relaxed);
    }

    fn synchronize(&self, stream: StreamRef) -> Result<(), AllocError> {
        self.upstream.synchronize(stream)
    }

    fn order_after(&self, stream: StreamRef, after: StreamRef) -> Result<(), AllocError> {
        self.upstream.order_after(stream, after)
    }

    fn name(&self) -> &'static str {
        Self::NAME
    }
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

static_assertions::assert_impl_all!(Metered<Simulated>: Send, Sync);
static_assertions::assert_impl_all!(Metered<crate::Cuda>: Send, Sync, crate::Accessible<crate::DeviceAccessible>);
static_assertions::assert_impl_all!(ThreadedReplayer<'static, Arc<Simulated>>: Send, Sync);
