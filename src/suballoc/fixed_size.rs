//! `FixedSize`: blocks of one size, carved from upstream chunks and kept on free lists per stream.

use super::free_list::{Bin, BinLock, Growth, Upstream, GRANULE};
use super::usage::{Meter, Usage};
use crate::resource::{
    align_up, check_request, forward_upstream, AllocError, AllocErrorKind, MemoryResource, Result,
};
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::StreamRef;
use std::ptr::NonNull;
use std::sync::MutexGuard;
use typenum::U256;

const NAME: &str = "FixedSize";

/// The configuration of a [`FixedSize`]; `resource_stack!` builds one from
/// `FixedSize { block_size: 1 MiB, blocks_to_preallocate: 128 }`.
///
/// Defaults as RMM's: 1 MiB blocks, 128 of them taken when built and 128 more at each growth.
#[derive(Debug, Clone)]
pub struct FixedSizeConfig {
    /// The size of every block, rounded up to 256 bytes (0 counts as 256).
    pub block_size: usize,
    /// Blocks taken from the upstream in one chunk when built and at each growth (0: none when
    /// built, one at a time after).
    pub blocks_to_preallocate: usize,
}

impl Default for FixedSizeConfig {
    fn default() -> Self {
        FixedSizeConfig {
            block_size: 1 << 20,
            blocks_to_preallocate: 128,
        }
    }
}

layer_by_new!(FixedSizeConfig => FixedSize);

/// Blocks of one size over an upstream resource `U`.
///
/// The resource takes chunks of [`FixedSizeConfig::blocks_to_preallocate`] blocks from its upstream
/// (one chunk when built, then one more each time the free list runs dry, as RMM's
/// `fixed_size_memory_resource` does) and serves every request of at most
/// [`block_size`](Self::block_size) bytes with one whole block. Blocks are never split or merged,
/// so there is no fragmentation to manage, only the rounding up of each request to the block size.
/// When the upstream is short of memory for a growth, it is asked for half as many blocks, down to
/// one. Chunks go back to the upstream when the resource is dropped.
///
/// # Cost
///
/// A pop or a push on a vector under a mutex; an upstream call only when the free list runs dry
/// (and when the resource is dropped). Memory: one address per block freed and not handed out
/// again, and one record per chunk (the blocks of a fresh chunk are a range until handed out,
/// so a preallocation of any count costs the host nothing per block); each request is rounded up
/// to the block size.
///
/// # Streams
///
/// Free blocks are kept per stream: a block freed on stream `S` is handed out again at once to
/// `S`; another stream `T` takes `S`'s blocks only after `upstream.order_after(T, S)`, and then
/// takes all of them, since one wait orders them all. A chunk grown for a request belongs to the
/// request's stream (the first one to the default stream). The resource keeps alive every stream
/// it keys a free list or a chunk by (it holds the cudarc stream's `Arc`) as long as it does: a
/// stream whose owner dropped it is still there to order reuse after, and its handle cannot be
/// given to a new stream meanwhile. A stream with no free block and no chunk left is forgotten,
/// so the per-stream state is bounded by the streams that hold something, and finding a stream's
/// list (or another stream with free blocks) is O(1), whatever the number of streams. On drop each chunk goes back on its own stream, ordered by
/// `upstream.order_after` after every stream holding free blocks (or after
/// `upstream.synchronize` of that stream where ordering fails). `synchronize` and `order_after`
/// are forwarded to the upstream.
///
/// # Upstream
///
/// Any [`MemoryResource`] that honours a 256-byte alignment request. Block sizes are rounded up to
/// 256 bytes, so every block is 256-byte aligned; a request larger than a block or aligned beyond
/// 256 bytes is refused with an error. It gives the upstream's properties.
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
/// let mr = resource_stack![&sim, FixedSize { block_size: 64 KiB, blocks_to_preallocate: 16 }];
/// assert_eq!(sim.in_use(), 16 << 16); // one chunk of 16 blocks
/// let p = mr.allocate(1000, 256, StreamRef::DEFAULT).unwrap(); // takes a whole block
/// assert_eq!(mr.usage().free_blocks, 15);
/// # unsafe { mr.deallocate(p, 1000, 256, StreamRef::DEFAULT) };
/// assert!(mr.allocate(100 << 10, 256, StreamRef::DEFAULT).is_err()); // larger than a block
/// ```
#[derive(Debug)]
pub struct FixedSize<U: MemoryResource> {
    upstream: U,
    grow_by: usize,
    /// The configured `blocks_to_preallocate` (0 included, which `grow_by` counts as 1): for the
    /// description.
    preallocate: usize,
    bin: BinLock,
    meter: Meter,
}

impl<U: MemoryResource> FixedSize<U> {
    /// A resource over `upstream` that takes its first chunk at once if the upstream has it, and
    /// starts empty otherwise, growing on demand (a [`Layer`](crate::resource::Layer) cannot fail; use
    /// [`try_new`](Self::try_new) to learn whether the reservation succeeded).
    pub fn new(upstream: U, config: FixedSizeConfig) -> Self {
        let (mr, count) = Self::empty(upstream, &config);
        let _ = mr.reserve(count);
        mr
    }

    /// A resource over `upstream` that takes its first chunk of `blocks_to_preallocate` blocks at
    /// once, or the upstream's error when it cannot.
    pub fn try_new(upstream: U, config: FixedSizeConfig) -> Result<Self, AllocError> {
        let (mr, count) = Self::empty(upstream, &config);
        mr.reserve(count)?;
        Ok(mr)
    }

    fn empty(upstream: U, config: &FixedSizeConfig) -> (Self, usize) {
        let block =
            align_up(config.block_size.max(1), GRANULE).unwrap_or(usize::MAX & !(GRANULE - 1));
        let mr = FixedSize {
            upstream,
            grow_by: config.blocks_to_preallocate.max(1),
            preallocate: config.blocks_to_preallocate,
            bin: BinLock::new(block),
            meter: Meter::default(),
        };
        (mr, config.blocks_to_preallocate)
    }

    fn reserve(&self, count: usize) -> Result<(), AllocError> {
        if count == 0 {
            return Ok(());
        }
        self.bin.grow(self.from(), count, StreamRef::DEFAULT)
    }

    /// The size of every block.
    pub fn block_size(&self) -> usize {
        self.bin.block()
    }

    /// What the resource holds, read at one instant.
    pub fn usage(&self) -> Usage {
        Usage {
            peak_held: self.meter.peak(),
            ..self.lock().usage()
        }
    }

    /// The per-stream free lists and the streams kept alive (the default stream always counts):
    /// bounded by the streams that have free blocks or chunks here now. For tests of that bound.
    #[doc(hidden)]
    pub fn tracked_streams(&self) -> (usize, usize) {
        self.lock().tracked()
    }

    fn from(&self) -> Upstream<'_, U> {
        Upstream {
            upstream: &self.upstream,
            meter: &self.meter,
            name: NAME,
        }
    }

    /// The resource the blocks come from.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    fn lock(&self) -> MutexGuard<'_, Bin> {
        self.bin.lock()
    }
}

// SAFETY: every block is a distinct `block`-sized piece of a live upstream chunk, at a multiple of
// `block` (a multiple of 256) from the chunk's 256-aligned start; requests above the block size or
// aligned beyond 256 are refused; a block goes to another stream only after `order_after`.
unsafe impl<U: MemoryResource> MemoryResource for FixedSize<U> {
    forward_upstream!(U, upstream, Alignment = U256);

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(p) = check_request::<Self>(size, align, NAME)? {
            return Ok(p);
        }
        if size > self.block_size() {
            return Err(AllocError::new(
                AllocErrorKind::InvalidArgument("request larger than FixedSize's block size"),
                size,
                align,
                NAME,
            ));
        }
        if align > GRANULE {
            return Err(AllocError::new(
                AllocErrorKind::Unsupported("FixedSize aligns blocks to 256 bytes, no more"),
                size,
                align,
                NAME,
            ));
        }
        let (addr, bin) = self.bin.pop(
            self.from(),
            stream,
            Growth::Fixed(self.grow_by),
            size,
            align,
        )?;
        drop(bin);
        NonNull::new(std::ptr::with_exposed_provenance_mut(addr))
            .ok_or(AllocError::out_of_memory(size, align, NAME))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, _align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        self.lock().push(ptr.as_ptr() as usize, stream);
    }

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        ItemWriter::over(f, &self.upstream, "fixed_size")
            .size("block_size", self.block_size())
            .number("blocks_to_preallocate", self.preallocate)
            .finish()
    }

    forward_upstream!(layer over upstream, name = NAME);
}

has_upstream!(impl<U> for FixedSize<U> where U: MemoryResource);

impl<U: MemoryResource> Drop for FixedSize<U> {
    fn drop(&mut self) {
        let from = Upstream {
            upstream: &self.upstream,
            meter: &self.meter,
            name: NAME,
        };
        let bin = self.bin.get_mut();
        // SAFETY: the resource is being dropped, so it hands out no block any more.
        unsafe { bin.release_all(from) };
    }
}

crate::property::assert_keeps_properties!(FixedSize);
const _: () = assert!(crate::property::alignment_of::<FixedSize<crate::leaf::System>>() == 256);
