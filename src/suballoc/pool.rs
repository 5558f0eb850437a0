//! `Pool`: a coalescing best-fit pool with free lists per stream.

use super::chunk_pool::{shell_methods, shell_resource, ChunkPool, FreeIndex};
use super::pool_state::State;
use super::usage::Usage;
use crate::resource::MemoryResource;
use crate::stream::{Held, StreamRef};

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
    shell: ChunkPool<U, State>,
}

shell_methods!(Pool, PoolConfig);

/// The best-fit index: the block taken is the smallest free one of the stream that fits, carved
/// from its end; another stream's blocks are taken all at once, after one `order_after`.
impl FreeIndex for State {
    const NAME: &'static str = NAME;
    const ITEM: &'static str = "pool";
    const INITIAL_ABOVE_MAX: &'static str = "Pool's `initial` is above its `max`";

    fn empty() -> Self {
        State::default()
    }

    #[inline]
    fn take_own(&mut self, stream: StreamRef, size: usize, align: usize) -> Option<usize> {
        let addr = self.take(stream, size, align)?;
        self.allocated += size;
        Some(addr)
    }

    fn stream_with_fit(&mut self, stream: StreamRef, need: usize) -> Option<Held> {
        self.other_with_fit(stream, need)
    }

    fn move_all(&mut self, from: Held, to: StreamRef) {
        self.merge(from, to);
    }

    #[inline]
    fn free_block(&mut self, addr: usize, size: usize, stream: StreamRef) {
        self.allocated -= size;
        self.free(addr, size, stream);
    }

    fn usage(&self) -> Usage {
        Usage {
            held: self.pool_size,
            peak_held: self.peak,
            allocated: self.allocated,
            free_blocks: self.starts.len(),
            chunks: self.chunks.len(),
        }
    }

    fn tracked_streams(&self) -> (usize, usize) {
        (self.lists.iter().flatten().count(), self.streams.held())
    }
}

// SAFETY: blocks are disjoint pieces of live upstream chunks (the free and allocated blocks of a
// chunk tile it), each at least `size` bytes, aligned to max(align, 256) (chunks are 256-aligned
// and blocks are carved at `align` multiples); a block goes to another stream only after
// `order_after`. The memory is the upstream's, with its properties.
unsafe impl<U: MemoryResource> MemoryResource for Pool<U> {
    shell_resource!(NAME);
}

static_assertions::assert_impl_all!(
    Pool<crate::leaf::Pinned>: crate::property::Accessible<(crate::property::HostAccessible, crate::property::DeviceAccessible)>
);
crate::property::assert_keeps_properties!(Pool);
const _: () = assert!(crate::property::alignment_of::<Pool<crate::leaf::System>>() == 256);
