//! `Tlsf`: a coalescing good-fit pool in O(1) (two-level segregated fit), with free blocks per stream.

use super::chunk_pool::{shell_methods, shell_resource, ChunkPool, FreeIndex};
use super::pool::PoolConfig;
use super::tlsf_index::TlsfIndex;
use super::usage::Usage;
use crate::resource::{AllocError, MemoryResource, Result};
use crate::stream::{Held, StreamRef};
use std::ptr::NonNull;

const NAME: &str = "Tlsf";

/// The configuration of a [`Tlsf`]; `resource_stack!` builds one from `Tlsf { initial: 1 GiB, max: 8 GiB }`.
///
/// The same fields and defaults as [`PoolConfig`](crate::suballoc::PoolConfig): `initial: 0`, `max: usize::MAX`.
#[derive(Debug, Clone)]
pub struct TlsfConfig {
    /// Bytes to take from the upstream when the pool is built (rounded up to 256 bytes, at most `max`).
    pub initial: usize,
    /// The most bytes held from the upstream at once; `usize::MAX` for no cap.
    pub max: usize,
}

impl Default for TlsfConfig {
    /// [`PoolConfig`]'s defaults.
    fn default() -> Self {
        let PoolConfig { initial, max } = PoolConfig::default();
        TlsfConfig { initial, max }
    }
}

layer_by_new!(TlsfConfig => Tlsf);

/// A coalescing pool over an upstream `U` that finds a block in constant time: two-level
/// segregated fit (TLSF, as in Masmano et al. and Sebastian Aaltonen's offset-allocator).
///
/// Like [`Pool`](crate::suballoc::Pool) it takes chunks from its upstream (same growth rule: doubling from
/// 2 MiB, exactly what is left near [`TlsfConfig::max`], half as much from an upstream short of
/// memory), carves blocks out of them and merges a freed block at once with its free neighbours of
/// the same stream and chunk. It differs in how it finds a block: free blocks are listed by size
/// class — sizes below 8 KiB one class per 256 bytes, above that 32 classes per power of two —
/// with a bitmap of the non-empty classes, so a search is two bit scans whatever the number of
/// free blocks. It first tries up to 8 blocks of the request's own class for the closest fit,
/// then takes any block of the lowest class whose blocks all fit (at most ~3% above the request;
/// the rest of the block stays free). Blocks are carved from the front of a free block, so the
/// high end of a chunk stays free the longest.
///
/// # Cost
///
/// O(1) per allocation and deallocation under one mutex: a few bit scans, list links, and one
/// hash-map operation (a freed block's address to its record). No B-tree, no scan, whatever the
/// number of free blocks; a request that finds no block on its own stream looks at each other
/// stream with free blocks (O(streams)). Upstream calls happen only when the pool grows,
/// releases, or is dropped, and `order_after` when a request takes a block freed on another
/// stream. Tightness: within a few percent of `Pool`'s best fit on the project's traces (see the
/// README's footprint table).
///
/// # Streams
///
/// As [`Pool`](crate::suballoc::Pool): a block freed on stream `S` is handed out again at once to work on
/// `S`; another stream `T` takes it only after `upstream.order_after(T, S)`, and then takes all of
/// `S`'s free blocks (the one wait orders them all; O(blocks moved), no search), so that free
/// blocks do not stay split among streams that no longer allocate. When no one stream has a block
/// that fits but neighbouring blocks freed on several streams do together, `T` is ordered after
/// each of those streams and takes just those blocks, merged (before growing; O(blocks) to find
/// them). Chunks belong to the stream of
/// the request they were grown for, and go back on it after it is ordered behind the streams that
/// freed blocks inside them. Every stream a free block or chunk names is kept alive, and forgotten
/// when nothing names it.
///
/// # Upstream
///
/// Any [`MemoryResource`] that honours a 256-byte alignment request. The pool gives the
/// upstream's properties and guarantees 256-byte alignment; larger alignments are honoured by
/// carving an aligned block out of a larger free one.
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
/// let tlsf = resource_stack![&sim, Tlsf { initial: 1 MiB, max: 64 MiB }];
/// let a = tlsf.allocate(1000, 256, StreamRef::DEFAULT).unwrap();
/// // SAFETY: `a` came from this pool with this size and alignment.
/// unsafe { tlsf.deallocate(a, 1000, 256, StreamRef::DEFAULT) };
/// let b = tlsf.allocate(1000, 256, StreamRef::DEFAULT).unwrap();
/// assert_eq!(a, b); // the same block, no upstream call
/// # unsafe { tlsf.deallocate(b, 1000, 256, StreamRef::DEFAULT) };
/// drop(tlsf);
/// assert_eq!(sim.in_use(), 0); // everything went back
/// ```
#[derive(Debug)]
pub struct Tlsf<U: MemoryResource> {
    shell: ChunkPool<U, TlsfIndex>,
}

shell_methods!(Tlsf, TlsfConfig);

impl<U: MemoryResource> Tlsf<U> {
    /// Frees the block at `ptr` on `stream` if this pool handed it out and it is live; false
    /// (nothing done) otherwise: `deallocate`, and [`ThreadHeaps`](crate::suballoc::ThreadHeaps)'s
    /// free, which asks the calling thread's own heap first.
    pub(crate) fn free_if_owned(&self, ptr: NonNull<u8>, stream: StreamRef) -> bool {
        self.shell
            .lock()
            .free(ptr.as_ptr() as usize, stream)
            .is_some()
    }
}

/// The TLSF index, taking the lowest-addressed fit of a larger class. The index knows each live
/// block's size: a free is by address alone, and an address it never handed out is ignored.
impl FreeIndex for TlsfIndex {
    const NAME: &'static str = NAME;
    const ITEM: &'static str = "tlsf";
    const INITIAL_ABOVE_MAX: &'static str = "Tlsf's `initial` is above its `max`";

    fn empty() -> Self {
        TlsfIndex::address_ordered()
    }

    #[inline]
    fn take_own(&mut self, stream: StreamRef, size: usize, align: usize) -> Option<usize> {
        self.take(stream, size, align)
    }

    fn stream_with_fit(&mut self, stream: StreamRef, need: usize) -> Option<Held> {
        self.other_with_fit(stream, need)
    }

    fn move_all(&mut self, from: Held, to: StreamRef) {
        self.merge(from, to);
    }

    fn take_run(
        &mut self,
        stream: StreamRef,
        size: usize,
        align: usize,
        order_after: impl FnMut(StreamRef<'static>) -> Result<(), AllocError>,
    ) -> Result<Option<usize>, AllocError> {
        self.steal_run(stream, size, align, order_after)
    }

    #[inline]
    fn free_block(&mut self, addr: usize, _size: usize, stream: StreamRef) {
        self.free(addr, stream);
    }

    fn usage(&self) -> Usage {
        Usage {
            held: self.size,
            peak_held: self.peak,
            allocated: self.allocated,
            free_blocks: self.free_blocks(),
            chunks: self.chunks.len(),
        }
    }

    fn tracked_streams(&self) -> (usize, usize) {
        (self.lists(), self.streams.held())
    }
}

// SAFETY: blocks are disjoint pieces of live upstream chunks (the blocks of a chunk tile it and
// each is either free or handed out once), each at least `size` bytes, aligned to
// max(align, 256) (chunks are 256-aligned and blocks are carved at `align` multiples); a block
// freed on one stream goes to another only after `order_after`. The memory is the upstream's.
unsafe impl<U: MemoryResource> MemoryResource for Tlsf<U> {
    shell_resource!(NAME);
}

// SAFETY: a block grows only into the free block right after it in its chunk, on `stream`'s own
// list (so no work of another stream may still use those bytes), which leaves the free lists; the
// index then records the block's new size, which `deallocate` frees whatever size it is passed.
unsafe impl<U: MemoryResource> crate::resource::GrowInPlace for Tlsf<U> {
    unsafe fn grow_in_place(
        &self,
        ptr: NonNull<u8>,
        size: usize,
        _align: usize,
        new_size: usize,
        stream: StreamRef,
    ) -> Result<bool> {
        let addr = ptr.as_ptr() as usize;
        let mut st = self.shell.lock();
        let Some((old, new)) = st.growth(addr, size, new_size) else {
            return Ok(false);
        };
        Ok(new == old || st.grow_in_place(addr, new, stream))
    }
}

crate::property::assert_keeps_properties!(Tlsf);
static_assertions::assert_impl_all!(
    Tlsf<crate::leaf::Pinned>: crate::property::Accessible<(crate::property::HostAccessible, crate::property::DeviceAccessible)>
);
static_assertions::assert_not_impl_any!(Tlsf<crate::leaf::Pinned>: crate::property::Accessible<crate::property::Pageable>);
const _: () = assert!(crate::property::alignment_of::<Tlsf<crate::leaf::System>>() == 256);
