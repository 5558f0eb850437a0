//! `Tlsf`: a coalescing good-fit pool in O(1) (two-level segregated fit), with free blocks per stream.

use super::growth::{self, Request, GRANULE};
use super::tlsf_index::TlsfIndex;
use super::usage::Usage;
use crate::resource::{
    align_up, check_request, forward_upstream, AllocError, AllocErrorKind, MemoryResource, Result,
};
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::StreamRef;
use std::ptr::NonNull;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use typenum::U256;

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
    fn default() -> Self {
        TlsfConfig {
            initial: 0,
            max: usize::MAX,
        }
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
    upstream: U,
    /// The cap on the bytes held, rounded down to the granule.
    max: usize,
    /// The first reservation asked for, for the description.
    initial: usize,
    state: Mutex<TlsfIndex>,
    /// Signalled when a growth (with the lock let go) ends.
    grown: Condvar,
}

impl<U: MemoryResource> Tlsf<U> {
    /// A pool over `upstream`. It takes `config.initial` bytes at once if the upstream has them,
    /// and starts empty otherwise (use [`try_new`](Self::try_new) to learn whether it did); an
    /// `initial` above `max` takes `max` bytes.
    pub fn new(upstream: U, config: TlsfConfig) -> Self {
        let pool = Self::empty(upstream, &config);
        let _ = pool.reserve(config.initial);
        pool
    }

    /// A pool over `upstream` that takes `config.initial` bytes at once, or the upstream's error
    /// when it cannot; `initial > max` is an invalid argument.
    pub fn try_new(upstream: U, config: TlsfConfig) -> Result<Self, AllocError> {
        if config.initial > config.max {
            return Err(AllocError::new(
                AllocErrorKind::InvalidArgument("Tlsf's `initial` is above its `max`"),
                config.initial,
                GRANULE,
                NAME,
            ));
        }
        let pool = Self::empty(upstream, &config);
        pool.reserve(config.initial)?;
        Ok(pool)
    }

    fn empty(upstream: U, config: &TlsfConfig) -> Self {
        let max = config.max & !(GRANULE - 1);
        Tlsf {
            upstream,
            max,
            initial: align_up(config.initial, GRANULE)
                .unwrap_or(usize::MAX)
                .min(max),
            state: Mutex::new(TlsfIndex::address_ordered()),
            grown: Condvar::new(),
        }
    }

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
            held: st.size,
            peak_held: st.peak,
            allocated: st.allocated,
            free_blocks: st.free_blocks(),
            chunks: st.chunks.len(),
        }
    }

    /// The per-stream free lists and the streams kept alive (the default stream always counts),
    /// read at one instant. For tests of the bound on per-stream state.
    #[doc(hidden)]
    pub fn tracked_streams(&self) -> (usize, usize) {
        let st = self.lock();
        (st.lists(), st.streams.held())
    }

    /// The resource the pool takes its chunks from.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// Gives every wholly free chunk back to the upstream; returns the bytes given back. A chunk
    /// whose blocks were freed on other streams than its own is given back after `order_after`
    /// its stream behind them; a chunk whose ordering fails is kept.
    pub fn release(&self) -> usize {
        let mut st = self.lock();
        self.release_locked(&mut st)
    }

    fn release_locked(&self, st: &mut TlsfIndex) -> usize {
        growth::release(&self.upstream, st)
    }

    /// Frees the block at `ptr` on `stream` if this pool handed it out and it is live; false
    /// (nothing done) otherwise: `deallocate`, and [`ThreadHeaps`](crate::suballoc::ThreadHeaps)'s
    /// free, which asks the calling thread's own heap first.
    pub(crate) fn free_if_owned(&self, ptr: NonNull<u8>, stream: StreamRef) -> bool {
        self.lock().free(ptr.as_ptr() as usize, stream).is_some()
    }

    fn locks(&self) -> growth::Locks<'_, TlsfIndex> {
        growth::Locks {
            state: &self.state,
            grown: &self.grown,
            in_flight: growth::Chunks::in_flight_mut,
        }
    }

    fn lock(&self) -> MutexGuard<'_, TlsfIndex> {
        // Every update of the index completes before the next upstream call, which is the only
        // thing that may panic inside the lock, so the index behind a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

// SAFETY: blocks are disjoint pieces of live upstream chunks (the blocks of a chunk tile it and
// each is either free or handed out once), each at least `size` bytes, aligned to
// max(align, 256) (chunks are 256-aligned and blocks are carved at `align` multiples); a block
// freed on one stream goes to another only after `order_after`. The memory is the upstream's.
unsafe impl<U: MemoryResource> MemoryResource for Tlsf<U> {
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
            let stolen = st.take_or_steal(stream, block, align, |after| {
                self.upstream.order_after(stream, after)
            })?;
            if let Some(addr) = stolen {
                break addr;
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
        drop(st);
        NonNull::new(std::ptr::with_exposed_provenance_mut(addr))
            .ok_or(AllocError::out_of_memory(size, align, NAME))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, _align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        // The index knows the block's size; an address it never handed out is ignored.
        self.free_if_owned(ptr, stream);
    }

    fn name(&self) -> &'static str {
        NAME
    }

    /// `tlsf(initial=…, max=…)`, leaving out what the defaults give.
    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut item = ItemWriter::over(f, &self.upstream, "tlsf");
        if self.initial > 0 {
            item = item.size("initial", self.initial);
        }
        if self.max != TlsfConfig::default().max & !(GRANULE - 1) {
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
        let mut st = self.lock();
        let Some((old, new)) = st.growth(addr, size, new_size) else {
            return Ok(false);
        };
        Ok(new == old || st.grow_in_place(addr, new, stream))
    }
}

has_upstream!(impl<U> for Tlsf<U> where U: MemoryResource);

impl<U: MemoryResource> Drop for Tlsf<U> {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        growth::drop_chunks(&self.upstream, st);
    }
}

static_assertions::assert_impl_all!(
    Tlsf<crate::leaf::Cuda>: Send,
    Sync,
    crate::property::Accessible<crate::property::DeviceAccessible>
);
static_assertions::assert_not_impl_any!(Tlsf<crate::leaf::Cuda>: crate::property::Accessible<crate::property::HostAccessible>);
static_assertions::assert_impl_all!(
    Tlsf<crate::leaf::Pinned>: crate::property::Accessible<(crate::property::HostAccessible, crate::property::DeviceAccessible)>
);
static_assertions::assert_impl_all!(Tlsf<crate::leaf::System>: Send, Sync, crate::property::Accessible<crate::property::HostAccessible>);
static_assertions::assert_not_impl_any!(Tlsf<crate::leaf::System>: crate::property::Accessible<crate::property::DeviceAccessible>);
const _: () = assert!(crate::property::alignment_of::<Tlsf<crate::leaf::System>>() == 256);
static_assertions::assert_impl_all!(Tlsf<crate::leaf::System>: crate::property::Accessible<crate::property::Pageable>);
static_assertions::assert_not_impl_any!(Tlsf<crate::leaf::Cuda>: crate::property::Accessible<crate::property::Pageable>);
