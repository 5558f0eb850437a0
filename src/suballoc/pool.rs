//! `Pool`: a coalescing best-fit pool with free lists per stream.

use super::growth::{self, Request, GRANULE};
use super::pool_state::State;
use super::usage::Usage;
use crate::resource::{
    align_up, check_request, forward_upstream, AllocError, AllocErrorKind, MemoryResource, Result,
};
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::StreamRef;
use std::ptr::NonNull;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use typenum::U256;

const NAME: &str = "Pool";

/// The configuration of a [`Pool`]; `resource_stack!` builds one from `Pool { initial: 1 GiB, max: 8 GiB }`.
///
/// Defaults: `initial: 0` (take nothing until the first allocation: RMM's default of half the free
/// device memory is too greedy for tests and for processes that share a GPU) and `max: usize::MAX`
/// (no cap but the upstream's).
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Bytes to take from the upstream when the pool is built (rounded up to 256 bytes, at most `max`).
    pub initial: usize,
    /// The most bytes the pool holds from its upstream at once; `usize::MAX` for no cap.
    pub max: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            initial: 0,
            max: usize::MAX,
        }
    }
}

layer_by_new!(PoolConfig => Pool);

/// A coalescing best-fit pool over an upstream resource `U`.
///
/// It takes memory from its upstream in large chunks, up to a maximum ([`PoolConfig::max`]), and
/// carves it into blocks. Free blocks are kept per stream, indexed twice: by `(size, address)` for
/// best fit and by address for coalescing with their neighbours. An allocation takes the smallest
/// free block that fits, splits off what it does not need and keeps the rest free; a deallocation
/// merges the block with the free blocks right before and after it, when they were freed on the
/// same stream and lie in the same upstream chunk (two upstream allocations are never one block,
/// even when adjacent). When no block fits, the pool grows by a new chunk: doubling (at least
/// 2 MiB) without a maximum, and near the maximum by exactly what is still allowed, so that a pool
/// whose maximum is barely above the peak of live bytes still serves the workload; an upstream
/// short of memory is asked for half as much, down to the request, as RMM does. Every chunk goes
/// back to the upstream when the pool is dropped, but one with a block still allocated (its owner
/// leaked with `mem::forget`: device work may still use it), which is leaked;
/// [`release`](Self::release) gives back the chunks that are wholly free before that. `Sync` when
/// `U` is.
///
/// # Cost
///
/// Allocation and deallocation are a handful of B-tree (and hash-map) operations under one mutex:
/// O(log n) in the number of free blocks, no scan, whatever the number of streams (a request
/// that takes another stream's blocks finds that stream in an index of each stream's largest free
/// block: O(log n) amortized). Sizes are rounded up to 256 bytes. Upstream
/// calls happen only when the pool grows, releases, or is dropped, and `order_after` when a
/// request takes blocks freed on another stream.
///
/// # Streams
///
/// Like RMM, a block freed on stream `S` is handed out again at once to work on `S`. Another
/// stream `T` may take it only after `upstream.order_after(T, S)` (CUDA leaves record an event on
/// `S` and make `T` wait on it); the pool then moves all of `S`'s free blocks to `T`, since the one
/// wait orders all of them, so a second request on `T` needs no second wait. The initial
/// reservation belongs to the default stream, as in RMM; a chunk grown for a request belongs to
/// the request's stream, and is given back on it (by `release` or on drop) after `order_after`
/// that stream behind the streams that freed blocks inside it. The pool keeps alive every stream it
/// keys a free list or a chunk by (it holds the cudarc stream's `Arc`) as long as it does: a
/// stream whose owner dropped it is still there to order reuse after, and its handle cannot be
/// given to a new stream meanwhile. A stream with no free block and no chunk left in the pool is
/// forgotten (its `Arc` dropped), so the per-stream state is bounded by the streams that hold
/// something, not by the streams ever seen. `synchronize` and `order_after` are forwarded to the upstream.
///
/// # Upstream
///
/// Any [`MemoryResource`] that honours a 256-byte alignment request (every CUDA leaf guarantees
/// it, `System` and `Simulated` honour it). The pool gives the upstream's properties and
/// guarantees 256-byte alignment; larger alignments are honoured by carving an aligned block out of
/// a larger free one.
/// Its lock is let go while the upstream allocates a chunk, which may run your code (a
/// [`Retry`](crate::adaptor::Retry) callback that frees through this resource or trims it); one
/// growth runs at a time, and a thread that needs to grow meanwhile waits for it.
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
///
/// let sim = Simulated::new(1 << 30);
/// let pool = resource_stack![&sim, Pool { initial: 1 MiB, max: 64 MiB }];
/// let a = pool.allocate(1000, 256, StreamRef::DEFAULT).unwrap();
/// assert_eq!(pool.usage().held, 1 << 20); // taken from the upstream once
/// // SAFETY: `a` came from this pool with this size and alignment.
/// unsafe { pool.deallocate(a, 1000, 256, StreamRef::DEFAULT) };
/// let b = pool.allocate(1000, 256, StreamRef::DEFAULT).unwrap();
/// assert_eq!(a, b); // the same block, no upstream call
/// # unsafe { pool.deallocate(b, 1000, 256, StreamRef::DEFAULT) };
/// drop(pool);
/// assert_eq!(sim.in_use(), 0); // everything went back
/// ```
#[derive(Debug)]
pub struct Pool<U: MemoryResource> {
    upstream: U,
    /// The cap on `pool_size`, rounded down to the granule.
    max: usize,
    /// The first reservation asked for (rounded up to the granule, at most `max`): for the
    /// pool's description.
    initial: usize,
    state: Mutex<State>,
    /// Signalled when a growth (with the lock let go) ends.
    grown: Condvar,
}

impl<U: MemoryResource> Pool<U> {
    /// A pool over `upstream`. It takes `config.initial` bytes at once if the upstream has them,
    /// and starts empty otherwise, growing on demand (a [`Layer`](crate::resource::Layer) cannot fail; use
    /// [`try_new`](Self::try_new) to learn whether the reservation succeeded). A configuration
    /// that contradicts itself is clamped: an `initial` above `max` takes `max` bytes.
    pub fn new(upstream: U, config: PoolConfig) -> Self {
        let pool = Self::empty(upstream, &config);
        let _ = pool.reserve(config.initial);
        pool
    }

    /// A pool over `upstream` that takes `config.initial` bytes at once, or the upstream's error
    /// when it cannot; `initial > max` is an invalid argument, and an `initial` above
    /// `isize::MAX` is out of memory.
    pub fn try_new(upstream: U, config: PoolConfig) -> Result<Self, AllocError> {
        if config.initial > config.max {
            return Err(AllocError::new(
                AllocErrorKind::InvalidArgument("Pool's `initial` is above its `max`"),
                config.initial,
                GRANULE,
                NAME,
            ));
        }
        let pool = Self::empty(upstream, &config);
        pool.reserve(config.initial)?;
        Ok(pool)
    }

    fn empty(upstream: U, config: &PoolConfig) -> Self {
        let max = config.max & !(GRANULE - 1);
        Pool {
            upstream,
            max,
            initial: align_up(config.initial, GRANULE)
                .unwrap_or(usize::MAX)
                .min(max),
            state: Mutex::new(State::default()),
            grown: Condvar::new(),
        }
    }

    /// Takes one chunk of `bytes` (rounded up to the granule, capped at `max`) from the upstream.
    fn reserve(&self, bytes: usize) -> Result<(), AllocError> {
        growth::reserve(&self.upstream, &mut *self.lock(), bytes, self.max, NAME)
    }

    /// The cap on the bytes held from the upstream (the configured maximum rounded down to 256
    /// bytes).
    pub fn max_size(&self) -> usize {
        self.max
    }

    /// What the pool holds, read at one instant.
    pub fn usage(&self) -> Usage {
        let st = self.lock();
        Usage {
            held: st.pool_size,
            peak_held: st.peak,
            allocated: st.allocated,
            free_blocks: st.starts.len(),
            chunks: st.chunks.len(),
        }
    }

    /// The per-stream free lists and the streams kept alive (the default stream always counts),
    /// read at one instant: both are bounded by the streams that have free blocks or chunks in
    /// the pool now, not by the streams ever seen. For tests of that bound.
    #[doc(hidden)]
    pub fn tracked_streams(&self) -> (usize, usize) {
        let st = self.lock();
        (st.lists.iter().flatten().count(), st.streams.held())
    }

    /// The resource the pool takes its chunks from.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// Gives every wholly free chunk back to the upstream; returns the bytes given back.
    ///
    /// A chunk whose free blocks were freed on several streams is given back on the stream it was
    /// allocated on, after `order_after` that stream behind the others; a chunk whose ordering
    /// fails is kept.
    pub fn release(&self) -> usize {
        let mut st = self.lock();
        self.release_locked(&mut st)
    }

    fn release_locked(&self, st: &mut State) -> usize {
        growth::release(&self.upstream, st)
    }

    fn locks(&self) -> growth::Locks<'_, State> {
        growth::Locks {
            state: &self.state,
            grown: &self.grown,
            in_flight: growth::Chunks::in_flight_mut,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update of State completes before the next upstream call, which is the only thing
        // that may panic inside the lock (a test upstream catching a broken contract), so the state
        // behind a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

// SAFETY: blocks are disjoint pieces of live upstream chunks (the free and allocated blocks of a
// chunk tile it), each at least `size` bytes, aligned to max(align, 256) (chunks are 256-aligned
// and blocks are carved at `align` multiples); a block goes to another stream only after
// `order_after`. The memory is the upstream's, with its properties.
unsafe impl<U: MemoryResource> MemoryResource for Pool<U> {
    forward_upstream!(U, upstream, Alignment = U256);

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(p) = check_request::<Self>(size, align, NAME)? {
            return Ok(p);
        }
        let (align, block, need) = growth::block_of(size, align);
        let oom = || AllocError::out_of_memory(size, align, NAME);
        let req = Request {
            need,
            stream,
            size,
            align,
            name: NAME,
        };
        let mut st = self.lock();
        let addr = loop {
            if let Some(addr) = st.take(stream, block, align) {
                break addr;
            }
            if let Some(other) = st.other_with_fit(stream, need) {
                self.upstream.order_after(stream, st.streams.get(other))?;
                st.merge(other, stream);
                break st.take(stream, block, align).ok_or_else(oom)?;
            }
            let (locked, added) =
                growth::grow(&self.upstream, st, &self.locks(), self.max, req, |st| {
                    self.release_locked(st)
                })?;
            st = locked;
            if added {
                break st.take(stream, block, align).ok_or_else(oom)?;
            }
            // It waited for another thread's growth: look again.
        };
        st.allocated += block;
        drop(st);
        NonNull::new(std::ptr::with_exposed_provenance_mut(addr))
            .ok_or(AllocError::out_of_memory(size, align, NAME))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, _align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        // The size was accepted by `allocate`, so rounding it up does not overflow.
        let block = align_up(size, GRANULE).unwrap_or(usize::MAX);
        let mut st = self.lock();
        st.allocated -= block;
        st.free(ptr.as_ptr() as usize, block, stream);
    }

    fn name(&self) -> &'static str {
        NAME
    }

    /// `pool(initial=…, max=…)`, leaving out what the defaults give (no reservation, no cap).
    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut item = ItemWriter::over(f, &self.upstream, "pool");
        if self.initial > 0 {
            item = item.size("initial", self.initial);
        }
        if self.max != PoolConfig::default().max & !(GRANULE - 1) {
            item = item.size("max", self.max);
        }
        item.finish()
    }

    fn upstream_layer(&self) -> Option<&dyn crate::stack::AnyLayer>
    where
        Self: 'static,
    {
        Some(&self.upstream)
    }
}

has_upstream!(impl<U> for Pool<U> where U: MemoryResource);

impl<U: MemoryResource> Drop for Pool<U> {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        growth::drop_chunks(&self.upstream, st);
    }
}

static_assertions::assert_impl_all!(
    Pool<crate::leaf::Cuda>: Send,
    Sync,
    crate::property::Accessible<crate::property::DeviceAccessible>
);
static_assertions::assert_not_impl_any!(Pool<crate::leaf::Cuda>: crate::property::Accessible<crate::property::HostAccessible>);
static_assertions::assert_impl_all!(
    Pool<crate::leaf::Pinned>: crate::property::Accessible<(crate::property::HostAccessible, crate::property::DeviceAccessible)>
);
static_assertions::assert_impl_all!(Pool<crate::leaf::System>: Send, Sync, crate::property::Accessible<crate::property::HostAccessible>);
static_assertions::assert_not_impl_any!(Pool<crate::leaf::System>: crate::property::Accessible<crate::property::DeviceAccessible>);
const _: () = assert!(crate::property::alignment_of::<Pool<crate::leaf::System>>() == 256);
