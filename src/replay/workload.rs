//! The op model: [`Op`]s, checked into a [`Workload`].

use crate::stream::StreamHandle;

/// The most OS threads a replay with threads runs ([`ThreadedReplayer`](super::ThreadedReplayer)):
/// a log of more threads replays thread `t` on OS thread `t % MAX_REPLAY_THREADS`, which runs the
/// ops of its log threads in log order, so each keeps its order and no log of any number of
/// threads starts more OS threads than this.
pub const MAX_REPLAY_THREADS: usize = 256;

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
/// A workload is produced once, before anything is timed ([`random`](super::random), a log read
/// by [`rmm_log`](super::rmm_log)), so that generating or parsing it costs nothing in a
/// measurement, and replaying it walks a flat `Vec<Op>` with live blocks in a `Vec` indexed by
/// allocation id: no hashing, no allocation of the driver's own inside the timed loop.
///
/// Blocks still live at the end are allowed (traces of programs that exit holding memory); a
/// replay frees them after its timed part.
///
/// A workload runs on one thread unless [`with_threads`](Self::with_threads) says which thread
/// runs each op, as a many-threaded log does. The op order is then the log's order: a replay in
/// that order ([`Replayer`](super::Replayer)) is deterministic, one with threads
/// ([`ThreadedReplayer`](super::ThreadedReplayer)) keeps each thread's order.
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
    /// The most bytes a replay with threads can hold at once: see [`Workload::threaded_peak`].
    threaded_peak: usize,
    /// Frees on another thread than the allocation's: see [`Workload::cross_thread_frees`].
    cross_thread_frees: usize,
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
            threaded_peak: peak_live,
            cross_thread_frees: 0,
        })
    }

    /// The same workload with op `i` run by thread index `threads[i]` (indices from 0, as a log's
    /// threads in order of first appearance). One index per op; a list naming one thread only
    /// leaves the workload single-threaded.
    ///
    /// ```
    /// use mrstack::replay::{Op, Workload};
    ///
    /// let ops = vec![Op::Alloc { id: 0, size: 64, stream: 0 }, Op::Free { id: 0 }];
    /// let w = Workload::new("handed over", ops)?.with_threads(vec![0, 1])?;
    /// assert_eq!(w.thread_count(), 2);
    /// assert_eq!(w.op_threads(), Some(&[0, 1][..]));
    /// # Ok::<(), mrstack::replay::WorkloadError>(())
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
            self.threaded_peak = self.lane_peaks();
            self.cross_thread_frees = self.count_cross_thread_frees();
        } else {
            self.threads = Vec::new();
            self.thread_count = 1;
            self.threaded_peak = self.peak_live;
            self.cross_thread_frees = 0;
        }
        Ok(self)
    }

    /// Frees whose thread is not the allocation's.
    fn count_cross_thread_frees(&self) -> usize {
        let mut owner = Vec::with_capacity(self.allocations);
        let mut crossing = 0;
        for (&op, &thread) in self.ops.iter().zip(&self.threads) {
            match op {
                Op::Alloc { .. } => owner.push(thread),
                Op::Free { id } => crossing += usize::from(owner.get(id) != Some(&thread)),
            }
        }
        crossing
    }

    /// Frees on another thread than the one that allocated the block: a program's threads that
    /// hand blocks to each other (PyTorch's autograd thread allocates gradients, its main thread
    /// frees them) are ordered by that hand-over, so the log's interleaving is the one they keep,
    /// and [`threaded_peak`](Self::threaded_peak), which lets every thread run on alone, says
    /// little of what the program needs. 0 for a workload on one thread.
    ///
    /// ```
    /// use mrstack::replay::{Op, Workload};
    ///
    /// // Thread 1 frees what thread 0 allocated, then frees its own.
    /// let ops = vec![
    ///     Op::Alloc { id: 0, size: 64, stream: 0 },
    ///     Op::Alloc { id: 1, size: 64, stream: 0 },
    ///     Op::Free { id: 0 },
    ///     Op::Free { id: 1 },
    /// ];
    /// let w = Workload::new("handed over", ops)?.with_threads(vec![0, 1, 1, 1])?;
    /// assert_eq!(w.cross_thread_frees(), 1);
    /// // Their hand-over keeps them in the log's order: a capacity covers its peak.
    /// assert_eq!(w.capacity_peak(), w.peak_live());
    /// # Ok::<(), mrstack::replay::WorkloadError>(())
    /// ```
    pub fn cross_thread_frees(&self) -> usize {
        self.cross_thread_frees
    }

    /// The bytes a capacity for this workload's program must cover:
    /// [`threaded_peak`](Self::threaded_peak), unless its threads hand blocks to each other
    /// ([`cross_thread_frees`](Self::cross_thread_frees)), which keeps them in the log's order:
    /// then [`peak_live`](Self::peak_live). The replay tool's recommendation and the RMM
    /// benchmark size capacities by it.
    pub fn capacity_peak(&self) -> usize {
        if self.cross_thread_frees > 0 {
            self.peak_live
        } else {
            self.threaded_peak
        }
    }

    /// The sum over the OS threads of a replay with threads of the most bytes each can hold:
    /// the bytes it allocated less those it freed, at its worst point. However the threads
    /// interleave, the bytes live are the sum of each one's, so this bounds them.
    fn lane_peaks(&self) -> usize {
        let lanes = self.thread_count.min(MAX_REPLAY_THREADS);
        // Signed: a thread that frees what others allocated goes below zero.
        let (mut now, mut most) = (vec![0i128; lanes], vec![0i128; lanes]);
        let mut sizes = Vec::with_capacity(self.allocations);
        for (&op, &thread) in self.ops.iter().zip(&self.threads) {
            let lane = thread % MAX_REPLAY_THREADS;
            match op {
                Op::Alloc { size, .. } => {
                    sizes.push(size);
                    now[lane] += size as i128;
                    most[lane] = most[lane].max(now[lane]);
                }
                Op::Free { id } => now[lane] -= sizes.get(id).copied().unwrap_or(0) as i128,
            }
        }
        let sum: i128 = most.iter().sum();
        usize::try_from(sum).unwrap_or(usize::MAX)
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

    /// The most bytes a replay with threads ([`ThreadedReplayer`](super::ThreadedReplayer)) can
    /// hold at once, in any interleaving of its threads: each of its OS threads, keeping its order,
    /// holds at worst the most it allocated less what it freed at any point, and they may all be
    /// at their worst at once. [`peak_live`](Self::peak_live) for a workload on one thread; for
    /// many, at least that, and up to the sum of their peaks (a thread that frees what another
    /// allocates lets the other run ahead).
    ///
    /// ```
    /// use mrstack::replay::{Op, Workload};
    ///
    /// // Two threads, one after the other in the log: 100 bytes live at once in log order, but
    /// // run at once they may hold 200.
    /// let ops = vec![
    ///     Op::Alloc { id: 0, size: 100, stream: 0 },
    ///     Op::Free { id: 0 },
    ///     Op::Alloc { id: 1, size: 100, stream: 0 },
    ///     Op::Free { id: 1 },
    /// ];
    /// let w = Workload::new("two", ops)?.with_threads(vec![0, 0, 1, 1])?;
    /// assert_eq!((w.peak_live(), w.threaded_peak()), (100, 200));
    /// # Ok::<(), mrstack::replay::WorkloadError>(())
    /// ```
    pub fn threaded_peak(&self) -> usize {
        self.threaded_peak
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
