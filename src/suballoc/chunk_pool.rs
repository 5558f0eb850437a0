//! The stream-ordered chunk shell of the coalescing suballocators (`Pool`, `Tlsf`): chunks taken
//! from the upstream under a cap, growth with the lock let go, allocation that grows on a miss,
//! release, usage, description, and the chunks given back on drop, written once around a
//! free-block index ([`FreeIndex`]) that each resource supplies.

use super::growth::{self, Chunks, Request, GRANULE};
use super::usage::Usage;
use crate::resource::{align_up, AllocError, AllocErrorKind, MemoryResource, Result};
use crate::stack::ItemWriter;
use crate::stream::{Held, StreamRef};
use std::fmt::{self, Debug};
use std::ptr::NonNull;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// The free-block index of a [`ChunkPool`]: the free and allocated blocks of its chunks, with the
/// free ones per stream, and the chunks themselves ([`Chunks`], for growth, release and drop).
///
/// Every update completes before the next upstream call, which is the only thing that may panic
/// while the shell holds the index's lock: the index behind a poisoned lock is consistent.
pub(super) trait FreeIndex: Chunks + Debug + Send {
    /// The name of the resource built on the index, for its errors.
    const NAME: &'static str;
    /// The item that describes the resource (`pool(…)`).
    const ITEM: &'static str;
    /// The refusal of a configuration whose `initial` is above its `max`.
    const INITIAL_ABOVE_MAX: &'static str;

    /// An index with no chunk.
    fn empty() -> Self;

    /// Carves a block of `size` bytes (a granule multiple) at `align` (a power of two, at least
    /// a granule) out of a free block of `stream`'s own, counted allocated; its address.
    fn take_own(&mut self, stream: StreamRef, size: usize, align: usize) -> Option<usize>;

    /// A stream other than `stream` with a free block of at least `need` bytes, when `stream`
    /// has none.
    fn stream_with_fit(&mut self, stream: StreamRef, need: usize) -> Option<Held>;

    /// Moves every free block of `from` to `to`, merging each with its free neighbours there;
    /// the caller ordered `to` after `from`.
    fn move_all(&mut self, from: Held, to: StreamRef);

    /// When no one stream has a fit: a block carved from free blocks of several streams, taken
    /// only after `order_after` each of them. `Ok(None)` (the caller grows) by default.
    fn take_run(
        &mut self,
        _stream: StreamRef,
        _size: usize,
        _align: usize,
        _order_after: impl FnMut(StreamRef<'static>) -> Result<(), AllocError>,
    ) -> Result<Option<usize>, AllocError> {
        Ok(None)
    }

    /// [`take_own`](Self::take_own), else from another stream with a fit, after
    /// `order_after(that stream)` orders `stream` behind it (an error of that call is the
    /// caller's), else [`take_run`](Self::take_run). `Ok(None)` when nothing fits: the caller
    /// grows.
    fn take_any(
        &mut self,
        stream: StreamRef,
        size: usize,
        align: usize,
        mut order_after: impl FnMut(StreamRef<'static>) -> Result<(), AllocError>,
    ) -> Result<Option<usize>, AllocError> {
        if let Some(addr) = self.take_own(stream, size, align) {
            return Ok(Some(addr));
        }
        // Blocks start at granule multiples, so `align - GRANULE` bytes of slack always suffice
        // to place an aligned block.
        let need = size.saturating_add(align - GRANULE);
        if let Some(other) = self.stream_with_fit(stream, need) {
            order_after(self.streams().get(other))?;
            // The one wait orders all of `other`'s free blocks: they all go to `stream`, so
            // that a second request on `stream` needs no second wait.
            self.move_all(other, stream);
            return Ok(self.take_own(stream, size, align));
        }
        self.take_run(stream, size, align, order_after)
    }

    /// Frees the block at `addr` of `size` bytes (the request's size rounded up to the granule)
    /// on `stream`, merged with its free neighbours of the same stream and chunk; an address the
    /// index never handed out is ignored where the index can tell.
    fn free_block(&mut self, addr: usize, size: usize, stream: StreamRef);

    /// What the index holds, read at one instant.
    fn usage(&self) -> Usage;

    /// The streams with free blocks and the streams kept alive (the default stream always counts).
    fn tracked_streams(&self) -> (usize, usize);
}

/// The public methods of a suballocator `$T<U>` that is a thin type over a [`ChunkPool`] in its
/// field `shell`, built from its configuration `$Config` (fields `initial` and `max`): `new`,
/// `try_new`, and the shell's reports and release. `Pool` and `Tlsf` are such types.
macro_rules! shell_methods {
    ($T:ident, $Config:ident) => {
        impl<U: $crate::resource::MemoryResource> $T<U> {
            /// A pool over `upstream`. It takes `config.initial` bytes at once if the upstream
            /// has them, and starts empty otherwise, growing on demand (a
            /// [`Layer`](crate::resource::Layer) cannot fail; use [`try_new`](Self::try_new) to learn
            /// whether the reservation succeeded). A configuration that contradicts itself is
            /// clamped: an `initial` above `max` takes `max` bytes.
            pub fn new(upstream: U, config: $Config) -> Self {
                let shell = $crate::suballoc::chunk_pool::ChunkPool::new(
                    upstream,
                    config.initial,
                    config.max,
                );
                $T { shell }
            }

            /// A pool over `upstream` that takes `config.initial` bytes at once, or the
            /// upstream's error when it cannot; `initial > max` is an invalid argument, and an
            /// `initial` above `isize::MAX` is out of memory.
            pub fn try_new(
                upstream: U,
                config: $Config,
            ) -> ::core::result::Result<Self, $crate::resource::AllocError> {
                let shell = $crate::suballoc::chunk_pool::ChunkPool::try_new(
                    upstream,
                    config.initial,
                    config.max,
                )?;
                Ok($T { shell })
            }

            /// The cap on the bytes held from the upstream (the configured maximum rounded down
            /// to 256 bytes).
            pub fn max_size(&self) -> usize {
                self.shell.max_size()
            }

            /// What the pool holds, read at one instant.
            pub fn usage(&self) -> $crate::suballoc::Usage {
                self.shell.usage()
            }

            /// The per-stream free lists and the streams kept alive (the default stream always
            /// counts), read at one instant: both are bounded by the streams that have free
            /// blocks or chunks in the pool now, not by the streams ever seen. For tests of that
            /// bound.
            #[doc(hidden)]
            pub fn tracked_streams(&self) -> (usize, usize) {
                self.shell.tracked_streams()
            }

            /// The resource the pool takes its chunks from.
            pub fn upstream(&self) -> &U {
                self.shell.upstream()
            }

            /// Gives every wholly free chunk back to the upstream; returns the bytes given back.
            ///
            /// A chunk whose free blocks were freed on several streams is given back on the
            /// stream it was allocated on, after `order_after` that stream behind the others; a
            /// chunk whose ordering fails is kept.
            pub fn release(&self) -> usize {
                self.shell.release()
            }
        }

        $crate::stack::has_upstream!(impl<U> for $T<U>, through shell, where U: $crate::resource::MemoryResource);
    };
}
pub(super) use shell_methods;

/// The items of `MemoryResource` for a thin type over a [`ChunkPool`] in its field `shell`, named
/// `$name`: the request checked, then served by the shell; 256-byte alignment; the upstream's
/// properties, streams and description below the shell's. For the type's `unsafe impl`, whose
/// `// SAFETY:` argues the claim.
macro_rules! shell_resource {
    ($name:expr) => {
        $crate::resource::forward_upstream!(U, shell, Alignment = ::typenum::U256);

        fn allocate(
            &self,
            size: usize,
            align: usize,
            stream: $crate::stream::StreamRef,
        ) -> $crate::resource::Result<::core::ptr::NonNull<u8>> {
            match $crate::resource::check_request::<Self>(size, align, $name)? {
                Some(p) => Ok(p),
                None => self.shell.allocate(size, align, stream),
            }
        }

        unsafe fn deallocate(
            &self,
            ptr: ::core::ptr::NonNull<u8>,
            size: usize,
            _align: usize,
            stream: $crate::stream::StreamRef,
        ) {
            self.shell.deallocate(ptr, size, stream);
        }

        fn name(&self) -> &'static str {
            $name
        }

        fn describe_to(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
            self.shell.describe_to(f)
        }

        fn upstream_layer(&self) -> Option<&dyn $crate::stack::AnyLayer>
        where
            Self: 'static,
        {
            Some(self.shell.upstream())
        }
    };
}
pub(super) use shell_resource;

/// A coalescing suballocator over the upstream `U`, with its free blocks in `I`: the resource
/// behind `Pool` and `Tlsf`, which are thin types over it.
///
/// It takes memory from `upstream` in chunks, holding at most `max` bytes at once, and carves
/// them into blocks. Its lock is let go while the upstream allocates a chunk (which may run code
/// that calls back in): one growth runs at a time, and a thread that needs to grow meanwhile
/// waits for it on `grown`. Every chunk goes back to the upstream on drop, but one with a block
/// still allocated, which is leaked.
#[derive(Debug)]
pub(super) struct ChunkPool<U: MemoryResource, I: FreeIndex> {
    upstream: U,
    /// The cap on the bytes held, rounded down to the granule.
    max: usize,
    /// The first reservation asked for (rounded up to the granule, at most `max`): for the
    /// description.
    initial: usize,
    state: Mutex<I>,
    /// Signalled when a growth (with the lock let go) ends.
    grown: Condvar,
}

impl<U: MemoryResource, I: FreeIndex> ChunkPool<U, I> {
    /// A shell over `upstream` that takes `initial` bytes at once if the upstream has them, and
    /// starts empty otherwise; an `initial` above `max` takes `max` bytes.
    pub(super) fn new(upstream: U, initial: usize, max: usize) -> Self {
        let pool = Self::empty(upstream, initial, max);
        let _ = pool.reserve(initial);
        pool
    }

    /// A shell over `upstream` that takes `initial` bytes at once, or the upstream's error when
    /// it cannot; `initial > max` is an invalid argument, and an `initial` above `isize::MAX` is
    /// out of memory.
    pub(super) fn try_new(upstream: U, initial: usize, max: usize) -> Result<Self, AllocError> {
        if initial > max {
            return Err(AllocError::new(
                AllocErrorKind::InvalidArgument(I::INITIAL_ABOVE_MAX),
                initial,
                GRANULE,
                I::NAME,
            ));
        }
        let pool = Self::empty(upstream, initial, max);
        pool.reserve(initial)?;
        Ok(pool)
    }

    fn empty(upstream: U, initial: usize, max: usize) -> Self {
        let max = max & !(GRANULE - 1);
        ChunkPool {
            upstream,
            max,
            initial: align_up(initial, GRANULE).unwrap_or(usize::MAX).min(max),
            state: Mutex::new(I::empty()),
            grown: Condvar::new(),
        }
    }

    /// Takes one chunk of `bytes` (rounded up to the granule, capped at `max`) from the upstream.
    fn reserve(&self, bytes: usize) -> Result<(), AllocError> {
        growth::reserve(&self.upstream, &mut *self.lock(), bytes, self.max, I::NAME)
    }

    /// The cap on the bytes held from the upstream.
    pub(super) fn max_size(&self) -> usize {
        self.max
    }

    /// What the shell holds, read at one instant.
    pub(super) fn usage(&self) -> Usage {
        self.lock().usage()
    }

    /// The per-stream free lists and the streams kept alive, read at one instant.
    pub(super) fn tracked_streams(&self) -> (usize, usize) {
        self.lock().tracked_streams()
    }

    /// The resource the chunks come from.
    pub(super) fn upstream(&self) -> &U {
        &self.upstream
    }

    /// Gives every wholly free chunk back to the upstream, each on its stream after
    /// `order_after` that stream behind the streams that freed blocks inside it (a chunk whose
    /// ordering fails is kept); returns the bytes given back.
    pub(super) fn release(&self) -> usize {
        growth::release(&self.upstream, &mut *self.lock())
    }

    fn locks(&self) -> growth::Locks<'_, I> {
        growth::Locks {
            state: &self.state,
            grown: &self.grown,
            in_flight: Chunks::in_flight_mut,
        }
    }

    /// The index, locked.
    pub(super) fn lock(&self) -> MutexGuard<'_, I> {
        // The index is consistent across every call that may panic ([`FreeIndex`]).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A block for a request that `check_request` accepted and that is not of zero size: from
    /// `stream`'s free blocks, else another stream's after ordering `stream` behind it, else
    /// from a chunk grown for it.
    pub(super) fn allocate(
        &self,
        size: usize,
        align: usize,
        stream: StreamRef,
    ) -> Result<NonNull<u8>> {
        let (align, block, need) = growth::block_of(size, align);
        let oom = || AllocError::out_of_memory(size, align, I::NAME);
        let req = Request {
            need,
            stream,
            size,
            align,
            name: I::NAME,
        };
        let mut st = self.lock();
        let addr = loop {
            let found = st.take_any(stream, block, align, |after| {
                self.upstream.order_after(stream, after)
            })?;
            if let Some(addr) = found {
                break addr;
            }
            let (locked, added) =
                growth::grow(&self.upstream, st, &self.locks(), self.max, req, |st| {
                    growth::release(&self.upstream, st)
                })?;
            st = locked;
            if added {
                break st.take_own(stream, block, align).ok_or_else(oom)?;
            }
            // It waited for another thread's growth: look again.
        };
        drop(st);
        NonNull::new(std::ptr::with_exposed_provenance_mut(addr)).ok_or_else(oom)
    }

    /// Frees a block this shell handed out for `size` bytes, on `stream`.
    pub(super) fn deallocate(&self, ptr: NonNull<u8>, size: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        // The size was accepted by `allocate`, so rounding it up does not overflow.
        let block = align_up(size, GRANULE).unwrap_or(usize::MAX);
        self.lock().free_block(ptr.as_ptr() as usize, block, stream);
    }

    /// Forwarded to the upstream: the blocks are the upstream's memory.
    pub(super) fn synchronize(&self, stream: StreamRef) -> Result<(), AllocError> {
        self.upstream.synchronize(stream)
    }

    /// Forwarded to the upstream.
    pub(super) fn order_after(
        &self,
        stream: StreamRef,
        after: StreamRef,
    ) -> Result<(), AllocError> {
        self.upstream.order_after(stream, after)
    }

    /// `item(initial=…, max=…)` over the upstream's description, leaving out what the defaults
    /// give (no reservation, no cap).
    pub(super) fn describe_to(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut item = ItemWriter::over(f, &self.upstream, I::ITEM);
        if self.initial > 0 {
            item = item.size("initial", self.initial);
        }
        // The default `max`, `usize::MAX`, rounded down to the granule.
        if self.max != usize::MAX & !(GRANULE - 1) {
            item = item.size("max", self.max);
        }
        item.finish()
    }
}

impl<U: MemoryResource, I: FreeIndex> Drop for ChunkPool<U, I> {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        growth::drop_chunks(&self.upstream, st);
    }
}
