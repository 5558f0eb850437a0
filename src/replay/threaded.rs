//! [`ThreadedReplayer`]: a many-threaded workload replayed with each of its threads on an OS thread of its own (up to [`MAX_REPLAY_THREADS`]).

use super::metered::Count;
use super::replayer::synchronize_streams;
use super::{Op, Replay, ReplayError, Workload, ALIGN, MAX_REPLAY_THREADS};
use crate::resource::MemoryResource;
use crate::stream::StreamHandle;
use std::ptr::{null_mut, NonNull};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// Replays a many-threaded [`Workload`] through a shared resource, each of its threads on an OS
/// thread of its own, each keeping its ops in log order, pass after pass.
///
/// At most [`MAX_REPLAY_THREADS`] OS threads run: beyond that, log thread `t` shares OS thread
/// `t % MAX_REPLAY_THREADS` with others, which runs their ops merged in log order (each still in
/// its order). The bytes live at once can exceed the log's
/// [`peak_live`](Workload::peak_live), up to [`Workload::threaded_peak`].
///
/// A free waits until the allocation it names is made, which matters only where another thread
/// makes it: one atomic load when it is already there; otherwise a short spin, then yielding the
/// core, then parking until the allocating thread wakes it (there may be more threads than
/// cores). Waits cannot deadlock: the op earliest in the log among those not done yet can always
/// run. The lanes of ops, each allocation's size and stream, and the slots that hand pointers
/// between threads are laid out before any pass, so a pass does no work of its own but an atomic
/// store and load per allocation and per free; where another thread frees the block, the
/// allocation's are sequentially consistent (a locked instruction on x86), to wake a waiter.
///
/// The time of a pass is wall time, from the moment every thread is started and waiting until the
/// last one finishes, plus synchronizing the streams: ns per op is then the inverse of throughput.
/// Starting the threads is not timed.
#[derive(Debug)]
pub struct ThreadedReplayer<'w, R> {
    resource: R,
    workload: &'w Workload,
    streams: Vec<StreamHandle>,
    /// Each thread's ops in order, each with what it needs at hand: a pass reads its lane in
    /// order and touches nothing else but its slots and the resource (tables by allocation id,
    /// their entries dealt round-robin to threads, would have every thread read lines all over
    /// them at every op, more of the caches than the replay of one thread takes).
    lanes: Vec<Vec<Step>>,
    /// Each lane's ops' indices in the workload, for errors.
    op_index: Vec<Vec<usize>>,
    /// The hand-over slots, each lane's side by side: allocation ids dealt round-robin to
    /// threads would otherwise put every thread's slots on each cache line, and a pass would
    /// measure the line bouncing between cores.
    live: Vec<Slot>,
    /// The bytes the threads hold (allocated, not yet freed), once
    /// [`count_held`](Self::count_held) asked for them.
    held: Option<Box<crate::shard::Line<Count>>>,
}

/// One op of a lane: an allocation or a free of `size` bytes on stream index `stream`, its
/// pointer in slot `slot` of the hand-over slots.
#[derive(Debug, Clone, Copy)]
struct Step {
    size: usize,
    slot: usize,
    stream: usize,
    kind: StepKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepKind {
    /// An allocation that the same lane frees.
    Alloc,
    /// An allocation that another lane frees: its pointer is handed over.
    AllocHanded,
    Free,
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
    /// A replay of `workload` through `resource` with one OS thread per workload thread (up to
    /// [`MAX_REPLAY_THREADS`]), stream index `i` mapping to `streams[i]`.
    pub fn new(
        resource: R,
        workload: &'w Workload,
        streams: Vec<StreamHandle>,
    ) -> Result<Self, ReplayError> {
        ReplayError::check_streams(workload, &streams)?;
        let mut op_index = vec![Vec::new(); workload.thread_count().min(MAX_REPLAY_THREADS)];
        let mut blocks = Vec::with_capacity(workload.allocations());
        for (op, &o) in workload.ops().iter().enumerate() {
            let thread = workload.op_threads().map_or(0, |t| t[op]);
            // Lanes take ops in log order: a lane of several log threads runs them merged in log
            // order, and the op earliest in the log among those not done can still always run.
            op_index[thread % MAX_REPLAY_THREADS].push(op);
            if let Op::Alloc { size, stream, .. } = o {
                blocks.push((size, stream));
            }
        }
        let ops = workload.ops();
        let mut slot_of = vec![0; workload.allocations()];
        let mut lane_of = vec![0; workload.allocations()];
        let mut handed = vec![false; workload.allocations()];
        let mut next = 0;
        for (l, lane) in op_index.iter().enumerate() {
            for &op in lane {
                if let Op::Alloc { id, .. } = ops[op] {
                    slot_of[id] = next;
                    lane_of[id] = l;
                    next += 1;
                }
            }
        }
        for (l, lane) in op_index.iter().enumerate() {
            for &op in lane {
                if let Op::Free { id } = ops[op] {
                    handed[id] = lane_of[id] != l;
                }
            }
        }
        let step = |op: usize| match ops[op] {
            Op::Alloc { id, size, stream } => Step {
                size,
                slot: slot_of[id],
                stream,
                kind: if handed[id] {
                    StepKind::AllocHanded
                } else {
                    StepKind::Alloc
                },
            },
            Op::Free { id } => Step {
                size: blocks[id].0,
                slot: slot_of[id],
                stream: blocks[id].1,
                kind: StepKind::Free,
            },
        };
        let lanes = (op_index.iter())
            .map(|lane| lane.iter().map(|&op| step(op)).collect())
            .collect();
        Ok(ThreadedReplayer {
            resource,
            workload,
            streams,
            lanes,
            op_index,
            live: (0..workload.allocations())
                .map(|_| Slot::default())
                .collect(),
            held: None,
        })
    }

    /// Counts, from the next pass on, the bytes the threads hold at once (allocated and not yet
    /// freed): what the resource was asked to hold in this run's interleaving, which a stack's
    /// upstream peak can be set against. The count is one atomic add after each allocation and
    /// one before each free on a line all threads share, so the passes timed with it take that
    /// much longer.
    pub fn count_held(&mut self) {
        self.held
            .get_or_insert_with(|| Box::new(crate::shard::Line(Count::default())));
    }

    /// The most bytes the threads held at once over the passes since
    /// [`count_held`](Self::count_held); None before it.
    pub fn held_peak(&self) -> Option<usize> {
        self.held.as_ref().map(|h| h.peak())
    }

    /// The resource replayed through.
    pub fn resource(&self) -> &R {
        &self.resource
    }

    /// Replays every op once, each thread's on its own OS thread, then synchronizes every stream,
    /// and returns the time that took. As [`Replayer::pass`](super::Replayer::pass), blocks left
    /// live are freed afterwards, untimed, and on a failure every block is freed before the error
    /// returns; the failure reported is the one earliest in the log.
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
                        this.run_lane(thread, lane, &this.op_index[thread], state)
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

    /// Runs the ops of lane `me` (`ops`: their indices in the workload); returns when it
    /// finished, or the op that failed and why. Stops early, with `Ok`, once another thread has
    /// failed.
    fn run_lane(
        &self,
        me: usize,
        lane: &[Step],
        ops: &[usize],
        state: &PassState,
    ) -> Result<Instant, (usize, ReplayError)> {
        if state.abort.load(Ordering::Relaxed) {
            return Ok(Instant::now());
        }
        for (i, step) in lane.iter().enumerate() {
            let stream = self.streams[step.stream].as_ref();
            if step.kind == StepKind::Free {
                let Some(ptr) = self.wait_for(step.slot, me, state) else {
                    return Ok(Instant::now());
                };
                if let Some(held) = &self.held {
                    held.sub(step.size);
                }
                // SAFETY: ptr came from allocate on this resource with this size and ALIGN (the
                // step of a free carries its allocation's); the slot was emptied by this thread,
                // the one thread that frees it, so it is freed once.
                unsafe { self.resource.deallocate(ptr, step.size, ALIGN, stream) };
                continue;
            }
            let made = self.resource.allocate(step.size, ALIGN, stream);
            if let (Some(held), Ok(_)) = (&self.held, &made) {
                held.add(step.size);
            }
            let slot = &self.live[step.slot];
            match made {
                Ok(ptr) if step.kind == StepKind::Alloc => {
                    // Only this thread frees it: no one waits on the slot (what `release` reads
                    // after the threads are joined, the join orders).
                    slot.ptr.store(ptr.as_ptr(), Ordering::Relaxed);
                }
                Ok(ptr) => {
                    // SeqCst with the waiter's store of `waiter` then load of `ptr`: either it
                    // sees the pointer, or this sees it waiting and wakes it.
                    slot.ptr.store(ptr.as_ptr(), Ordering::SeqCst);
                    let waiter = slot.waiter.load(Ordering::SeqCst);
                    if waiter != 0 {
                        state.wake(waiter - 1);
                    }
                }
                Err(error) => {
                    state.fail();
                    let op = ops[i];
                    let size = step.size;
                    return Err((op, ReplayError::Alloc { op, size, error }));
                }
            }
        }
        Ok(Instant::now())
    }

    /// Takes the pointer of slot `at` once its thread has made the allocation, waiting as lane
    /// `me`; None if the replay aborts.
    fn wait_for(&self, at: usize, me: usize, state: &PassState) -> Option<NonNull<u8>> {
        /// Spins that catch a hand-over in flight, then yields that let a thread on this core
        /// make the allocation, before parking.
        const SPINS: u32 = 16;
        const YIELDS: u32 = 4;
        let slot = &self.live[at];
        // Only this thread frees the block, so no one else writes the slot once the pointer is in.
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
        let allocations = (self.lanes.iter().flatten()).filter(|s| s.kind != StepKind::Free);
        for &Step {
            size, slot, stream, ..
        } in allocations
        {
            let slot = &mut self.live[slot];
            *slot.waiter.get_mut() = 0;
            if let Some(ptr) = NonNull::new(std::mem::replace(slot.ptr.get_mut(), null_mut())) {
                if let Some(held) = &self.held {
                    held.sub(size);
                }
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

impl<R: MemoryResource + Sync> Replay for ThreadedReplayer<'_, R> {
    fn pass(&mut self) -> Result<Duration, ReplayError> {
        ThreadedReplayer::pass(self)
    }
    fn ops(&self) -> usize {
        self.workload.ops().len()
    }
    fn count_held(&mut self) {
        ThreadedReplayer::count_held(self);
    }
    fn held_peak(&self) -> Option<usize> {
        ThreadedReplayer::held_peak(self)
    }
}

static_assertions::assert_impl_all!(
    ThreadedReplayer<'static, std::sync::Arc<crate::leaf::Simulated>>: Send, Sync
);
