//! `Pool`: a coalescing best-fit suballocator that takes memory from its upstream in large chunks,
//! up to a maximum, and carves it into blocks.
//!
//! **What it does.** Free blocks are kept per stream, indexed twice: by `(size, address)` for best
//! fit and by address for coalescing with their neighbours. An allocation takes the smallest free
//! block that fits, splits off what it does not need and keeps the rest free; a deallocation merges
//! the block with the free blocks right before and after it, when they were freed on the same stream
//! and lie in the same upstream chunk (two upstream allocations are never one block, even when
//! adjacent). When no block fits, the pool grows by a new chunk: doubling without a maximum, and
//! near the maximum by exactly what is still allowed, so that a pool whose maximum is barely above
//! the peak of live bytes still serves the workload. Every chunk goes back to the upstream when the
//! pool is dropped; [`Pool::release`] gives back the chunks that are wholly free before that.
//!
//! **Streams.** Like RMM, a block freed on stream `S` is handed out again at once to work on `S`.
//! Another stream `T` may take it only after `upstream.order_after(T, S)` (CUDA leaves record an event
//! on `S` and make `T` wait on it); the pool then moves all of `S`'s free blocks to `T`, since the one
//! wait orders all of them, so a second request on `T` needs no second wait.
//!
//! **What it costs.** Allocation and deallocation are a handful of B-tree operations under one
//! mutex: O(log n) in the number of free blocks, no scan. Sizes are rounded up to 256 bytes.
//! Upstream calls happen only when the pool grows, releases, or is dropped.
//!
//! **What it requires of its upstream.** Any [`MemoryResource`] that honours a 256-byte alignment
//! request (every CUDA leaf guarantees it, `System` and `Simulated` honour it). The pool gives
//! the upstream's properties and guarantees 256-byte alignment; larger alignments are honoured by
//! carving an aligned block out of a larger free one.

use crate::resource::{align_up, check_request, AllocError, AllocErrorKind, Layer, MemoryResource};
use crate::stream::StreamRef;
use std::collections::{BTreeMap, BTreeSet};
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard, PoisonError};
use typenum::U256;

/// Every block's size and offset in its chunk is a multiple of this.
const GRANULE: usize = 256;
/// The smallest chunk a pool without a maximum takes from its upstream: the page size the CUDA
/// driver maps device memory in, so that smaller chunks would waste address space.
const MIN_GROWTH: usize = 2 << 20;
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

impl<U: MemoryResource> Layer<U> for PoolConfig {
    type Resource = Pool<U>;
    fn layer(self, upstream: U) -> Pool<U> {
        Pool::new(upstream, self)
    }
}

/// A coalescing best-fit pool over an upstream resource `U`.
///
/// Best fit and coalescing in O(log n) per operation (B-trees of free blocks by size and by
/// address, per stream); grows from the upstream in chunks up to [`PoolConfig::max`], doubling,
/// and near the maximum by exactly what is left; never merges blocks of two upstream chunks.
/// Blocks freed on one stream go to another only after `upstream.order_after`. Guarantees 256-byte
/// alignment and honours larger requested ones. Every chunk goes back to the upstream on drop, or
/// earlier through [`release`](Self::release) once wholly free. `Sync` when `U` is.
///
/// ```
/// use mrstack::prelude::*;
///
/// let sim = Simulated::new(1 << 30);
/// let pool = resource_stack![&sim, Pool { initial: 1 MiB, max: 64 MiB }];
/// let a = pool.allocate(1000, 256, StreamRef::DEFAULT).unwrap();
/// assert_eq!(pool.pool_size(), 1 << 20); // taken from the upstream once
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
    state: Mutex<State>,
}

/// What a [`Pool`] holds, as [`Pool::stats`] reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes held from the upstream.
    pub pool_size: usize,
    /// Bytes in live blocks (each request's size rounded up to 256 bytes).
    pub allocated: usize,
    /// Free blocks, over all streams.
    pub free_blocks: usize,
    /// Upstream allocations (chunks) held.
    pub chunks: usize,
}

#[derive(Debug, Clone, Copy)]
struct Free {
    size: usize,
    stream: StreamRef,
}

#[derive(Debug, Clone, Copy)]
struct Chunk {
    size: usize,
    /// The stream the chunk was allocated on, which it is given back on.
    stream: StreamRef,
}

/// The free blocks last freed on one stream, by `(size, address)`: the best fit for `n` bytes is
/// the first entry at or after `(n, 0)`.
#[derive(Debug)]
struct StreamFree {
    stream: StreamRef,
    by_size: BTreeSet<(usize, usize)>,
}

#[derive(Debug, Default)]
struct State {
    /// Every free block by address, with the stream it belongs to: the neighbour index.
    by_addr: BTreeMap<usize, Free>,
    /// One best-fit index per stream that has free blocks; few streams, so a short vector.
    lists: Vec<StreamFree>,
    /// Upstream allocations by address: coalescing stops at their starts.
    chunks: BTreeMap<usize, Chunk>,
    pool_size: usize,
    allocated: usize,
}

impl State {
    fn list_index(&mut self, stream: StreamRef) -> usize {
        match self.lists.iter().position(|l| l.stream == stream) {
            Some(i) => i,
            None => {
                self.lists.push(StreamFree {
                    stream,
                    by_size: BTreeSet::new(),
                });
                self.lists.len() - 1
            }
        }
    }

    /// Adds a chunk taken from the upstream as one free block on `stream`.
    fn add_chunk(&mut self, addr: usize, size: usize, stream: StreamRef) {
        self.chunks.insert(addr, Chunk { size, stream });
        self.pool_size += size;
        let li = self.list_index(stream);
        self.by_addr.insert(addr, Free { size, stream });
        self.lists[li].by_size.insert((size, addr));
    }

    /// Makes `[addr, addr + size)` free on `stream`, merged with same-stream free neighbours in its chunk.
    fn free(&mut self, addr: usize, mut size: usize, stream: StreamRef) {
        let li = self.list_index(stream);
        let by_size = &mut self.lists[li].by_size;
        let end = addr + size;
        if let Some(next) = self.by_addr.get(&end).copied() {
            if next.stream == stream && !self.chunks.contains_key(&end) {
                self.by_addr.remove(&end);
                by_size.remove(&(next.size, end));
                size += next.size;
            }
        }
        if let Some((&prev_addr, prev)) = self.by_addr.range_mut(..addr).next_back() {
            if prev_addr + prev.size == addr
                && prev.stream == stream
                && !self.chunks.contains_key(&addr)
            {
                by_size.remove(&(prev.size, prev_addr));
                prev.size += size;
                by_size.insert((prev.size, prev_addr));
                return;
            }
        }
        self.by_addr.insert(addr, Free { size, stream });
        by_size.insert((size, addr));
    }

    /// Takes the best-fitting free block of list `li` for `size` bytes (a granule multiple) at
    /// `align` (at least a granule), carving the block from its end so that the remainder keeps its
    /// address and needs one index update, not a removal and an insertion.
    fn take(&mut self, li: usize, size: usize, align: usize) -> Option<usize> {
        // Free blocks start at granule multiples, so `align - GRANULE` bytes of slack always
        // suffice to place an aligned block.
        let need = size + (align - GRANULE);
        let list = &mut self.lists[li];
        let &(free_size, addr) = list.by_size.range((need, 0)..).next()?;
        list.by_size.remove(&(free_size, addr));
        let end = addr + free_size;
        let start = (end - size) & !(align - 1);
        let before = start - addr;
        let after = end - (start + size);
        if before == 0 {
            self.by_addr.remove(&addr);
        } else {
            if let Some(f) = self.by_addr.get_mut(&addr) {
                f.size = before;
            }
            list.by_size.insert((before, addr));
        }
        if after > 0 {
            // The block's successor is not a same-stream free block of this chunk (it would have
            // been merged), so the slack behind the carved block needs no coalescing.
            let stream = list.stream;
            list.by_size.insert((after, start + size));
            self.by_addr.insert(
                start + size,
                Free {
                    size: after,
                    stream,
                },
            );
        }
        Some(start)
    }

    /// Another stream's list holding a block of at least `need` bytes.
    fn other_with_fit(&self, stream: StreamRef, need: usize) -> Option<usize> {
        self.lists
            .iter()
            .position(|l| l.stream != stream && l.by_size.last().is_some_and(|&(s, _)| s >= need))
    }

    /// Moves every free block of list `from` to `to`, coalescing them with `to`'s.
    fn merge(&mut self, from: usize, to: StreamRef) {
        let list = self.lists.swap_remove(from);
        for (size, addr) in list.by_size {
            self.by_addr.remove(&addr);
            self.free(addr, size, to);
        }
    }

    /// The starts of the chunks that are wholly free (blocks never straddle chunks, so a chunk is
    /// wholly free when the free blocks inside it add up to its size).
    fn free_chunks(&self) -> Vec<usize> {
        self.chunks
            .iter()
            .filter(|&(&start, c)| {
                self.by_addr
                    .range(start..start + c.size)
                    .map(|(_, f)| f.size)
                    .sum::<usize>()
                    == c.size
            })
            .map(|(&start, _)| start)
            .collect()
    }

    /// The streams of the free blocks inside chunk `start`, each once.
    fn streams_in(&self, start: usize) -> Vec<StreamRef> {
        let size = self.chunks.get(&start).map_or(0, |c| c.size);
        let mut streams: Vec<StreamRef> = Vec::new();
        for (_, f) in self.by_addr.range(start..start + size) {
            if !streams.contains(&f.stream) {
                streams.push(f.stream);
            }
        }
        streams
    }

    /// Forgets chunk `start` and the free blocks inside it.
    fn remove_chunk(&mut self, start: usize) -> Option<Chunk> {
        let chunk = self.chunks.remove(&start)?;
        let inside: Vec<(usize, Free)> = self
            .by_addr
            .range(start..start + chunk.size)
            .map(|(&a, &f)| (a, f))
            .collect();
        for (addr, f) in inside {
            self.by_addr.remove(&addr);
            if let Some(l) = self.lists.iter_mut().find(|l| l.stream == f.stream) {
                l.by_size.remove(&(f.size, addr));
            }
        }
        self.lists.retain(|l| !l.by_size.is_empty());
        self.pool_size -= chunk.size;
        Some(chunk)
    }
}

impl<U: MemoryResource> Pool<U> {
    /// A pool over `upstream`. It takes `config.initial` bytes at once if the upstream has them,
    /// and starts empty otherwise, growing on demand (a [`Layer`] cannot fail; use
    /// [`try_new`](Self::try_new) to learn whether the reservation succeeded).
    pub fn new(upstream: U, config: PoolConfig) -> Self {
        let pool = Self::empty(upstream, config.max);
        let _ = pool.reserve(config.initial);
        pool
    }

    /// A pool over `upstream` that takes `config.initial` bytes at once, or the upstream's error
    /// when it cannot; `initial > max` is an invalid argument.
    pub fn try_new(upstream: U, config: PoolConfig) -> Result<Self, AllocError> {
        if config.initial > config.max {
            return Err(AllocError::new(
                AllocErrorKind::InvalidArgument("Pool's initial size is above its maximum"),
                config.initial,
                GRANULE,
                NAME,
            ));
        }
        let pool = Self::empty(upstream, config.max);
        pool.reserve(config.initial)?;
        Ok(pool)
    }

    fn empty(upstream: U, max: usize) -> Self {
        Pool {
            upstream,
            max: max & !(GRANULE - 1),
            state: Mutex::new(State::default()),
        }
    }

    /// Takes one chunk of `bytes` (rounded up to the granule, capped at `max`) from the upstream.
    fn reserve(&self, bytes: usize) -> Result<(), AllocError> {
        let size = align_up(bytes, GRANULE).unwrap_or(usize::MAX).min(self.max);
        if size == 0 {
            return Ok(());
        }
        let ptr = self.upstream.allocate(size, GRANULE, StreamRef::DEFAULT)?;
        self.lock()
            .add_chunk(ptr.as_ptr() as usize, size, StreamRef::DEFAULT);
        Ok(())
    }

    /// Bytes currently held from the upstream.
    pub fn pool_size(&self) -> usize {
        self.lock().pool_size
    }

    /// The cap on [`pool_size`](Self::pool_size) (the configured maximum rounded down to 256 bytes).
    pub fn max_size(&self) -> usize {
        self.max
    }

    /// Sizes and counts, read at one instant.
    pub fn stats(&self) -> PoolStats {
        let st = self.lock();
        PoolStats {
            pool_size: st.pool_size,
            allocated: st.allocated,
            free_blocks: st.by_addr.len(),
            chunks: st.chunks.len(),
        }
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
        let mut released = 0;
        for start in st.free_chunks() {
            let Some(&chunk) = st.chunks.get(&start) else {
                continue;
            };
            let ordered = st
                .streams_in(start)
                .into_iter()
                .filter(|&s| s != chunk.stream)
                .try_for_each(|s| self.upstream.order_after(chunk.stream, s));
            if ordered.is_err() {
                continue;
            }
            st.remove_chunk(start);
            released += chunk.size;
            // SAFETY: the chunk came from `upstream.allocate(chunk.size, GRANULE, chunk.stream)`,
            // is wholly free (no live block inside it), and was just forgotten, so it is given
            // back once; its stream is ordered after every stream that freed a block inside it.
            unsafe { self.give_back(start, chunk) };
        }
        released
    }

    /// # Safety
    ///
    /// `start`/`chunk` describe an upstream allocation that nothing uses any more.
    unsafe fn give_back(&self, start: usize, chunk: Chunk) {
        if let Some(ptr) = NonNull::new(std::ptr::without_provenance_mut(start)) {
            // SAFETY: forwarded from the caller: a live upstream allocation of this size.
            unsafe {
                self.upstream
                    .deallocate(ptr, chunk.size, GRANULE, chunk.stream)
            };
        }
    }

    /// Takes a chunk that can hold a block of `need` bytes from the upstream, on `stream`.
    fn grow(
        &self,
        st: &mut State,
        need: usize,
        stream: StreamRef,
        size: usize,
        align: usize,
    ) -> Result<(), AllocError> {
        let mut released = false;
        if need > self.max - st.pool_size {
            // Wholly free chunks too small for this request still count against the maximum:
            // give them back to make room for one that fits.
            released = true;
            if self.release_locked(st) == 0 || need > self.max - st.pool_size {
                return Err(AllocError::out_of_memory(size, align, NAME));
            }
        }
        let mut want = Self::growth(st.pool_size, need, self.max - st.pool_size);
        loop {
            match self.upstream.allocate(want, GRANULE, stream) {
                Ok(ptr) => {
                    st.add_chunk(ptr.as_ptr() as usize, want, stream);
                    return Ok(());
                }
                // Like RMM: an upstream short of memory may still have a smaller chunk.
                Err(e) if e.is_out_of_memory() && want > need => {
                    want = ((want / 2) & !(GRANULE - 1)).max(need);
                }
                Err(e) if e.is_out_of_memory() && !released && self.release_locked(st) > 0 => {
                    released = true;
                    want = need;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// How much to take from the upstream for a block of `need` bytes, when the pool holds
    /// `pool_size` and may take `remaining` more (`need <= remaining`).
    fn growth(pool_size: usize, need: usize, remaining: usize) -> usize {
        // Doubling keeps the number of chunks (and upstream calls) logarithmic in the peak.
        let want = need.max(pool_size).max(MIN_GROWTH).min(remaining);
        // Near the cap, a chunk that left less than itself behind would strand the rest in a
        // piece too small for the next growth: take everything that is still allowed instead.
        if remaining - want < want {
            remaining
        } else {
            want
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
    type Host = U::Host;
    type Device = U::Device;
    type Managed = U::Managed;
    type Alignment = U256;

    fn allocate(
        &self,
        size: usize,
        align: usize,
        stream: StreamRef,
    ) -> Result<NonNull<u8>, AllocError> {
        if let Some(p) = check_request::<Self>(size, align, NAME)? {
            return Ok(p);
        }
        // check_request bounds size by isize::MAX - align, so neither sum overflows.
        let align = align.max(GRANULE);
        let block = align_up(size, GRANULE).unwrap_or(usize::MAX);
        let need = block + (align - GRANULE);
        let mut st = self.lock();
        let li = st.list_index(stream);
        let addr = match st.take(li, block, align) {
            Some(addr) => addr,
            None => {
                if let Some(other) = st.other_with_fit(stream, need) {
                    self.upstream.order_after(stream, st.lists[other].stream)?;
                    st.merge(other, stream);
                } else {
                    self.grow(&mut st, need, stream, size, align)?;
                }
                let li = st.list_index(stream);
                st.take(li, block, align)
                    .ok_or(AllocError::out_of_memory(size, align, NAME))?
            }
        };
        st.allocated += block;
        drop(st);
        NonNull::new(std::ptr::without_provenance_mut(addr))
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

    fn synchronize(&self, stream: StreamRef) -> Result<(), AllocError> {
        self.upstream.synchronize(stream)
    }

    fn order_after(&self, stream: StreamRef, after: StreamRef) -> Result<(), AllocError> {
        self.upstream.order_after(stream, after)
    }

    fn name(&self) -> &'static str {
        NAME
    }
}

impl<U: MemoryResource> Drop for Pool<U> {
    fn drop(&mut self) {
        let mut st = std::mem::take(self.state.get_mut().unwrap_or_else(PoisonError::into_inner));
        let chunks: Vec<(usize, Chunk)> = st.chunks.iter().map(|(&a, &c)| (a, c)).collect();
        for (start, chunk) in chunks {
            for s in st.streams_in(start) {
                if s != chunk.stream && self.upstream.order_after(chunk.stream, s).is_err() {
                    // No event: wait for the stream instead; a failure here leaves nothing
                    // better to do than give the memory back.
                    let _ = self.upstream.synchronize(s);
                }
            }
            st.remove_chunk(start);
            // SAFETY: the chunk came from the upstream with this size, and the pool, being
            // dropped, hands out none of it any more; it is forgotten before being given back,
            // so once. Its stream is ordered after every stream that freed a block inside it.
            unsafe { self.give_back(start, chunk) };
        }
    }
}

static_assertions::assert_impl_all!(
    Pool<crate::Cuda>: Send,
    Sync,
    crate::Accessible<crate::DeviceAccessible>
);
static_assertions::assert_not_impl_any!(Pool<crate::Cuda>: crate::Accessible<crate::HostAccessible>);
static_assertions::assert_impl_all!(
    Pool<crate::Pinned>: crate::Accessible<(crate::HostAccessible, crate::DeviceAccessible)>
);
static_assertions::assert_impl_all!(Pool<crate::System>: Send, Sync, crate::Accessible<crate::HostAccessible>);
static_assertions::assert_not_impl_any!(Pool<crate::System>: crate::Accessible<crate::DeviceAccessible>);
const _: () = assert!(crate::property::alignment_of::<Pool<crate::System>>() == 256);
