//! `FixedSize`: blocks of one size, carved from upstream chunks and kept on a free list.
//!
//! **What it does.** The resource takes chunks of `blocks_to_preallocate` blocks from its upstream
//! (one chunk when built, then one more each time the free list runs dry, as RMM's
//! `fixed_size_memory_resource` does) and serves every request of at most `block_size` bytes with
//! one whole block. Blocks are never split or merged, so there is no fragmentation to manage, only
//! the rounding up of each request to the block size. Chunks go back to the upstream when the
//! resource is dropped.
//!
//! **Streams.** Free blocks are kept per stream: a block freed on stream `S` is handed out again at
//! once to `S`; another stream `T` takes `S`'s blocks only after `upstream.order_after(T, S)`, and
//! then takes all of them, since one wait orders them all. The resource keeps alive
//! every stream it keys a free list or a chunk by (it holds the cudarc stream's `Arc`) until it is
//! dropped: a stream whose owner dropped it is still there to order reuse after, and its handle
//! cannot be given to a new stream meanwhile.
//!
//! **What it costs.** A pop or a push on a vector under a mutex; an upstream call only when the
//! free list runs dry.
//!
//! **What it requires of its upstream.** Any [`MemoryResource`] that honours a 256-byte alignment
//! request. Block sizes are rounded up to 256 bytes, so every block is 256-byte aligned; a request
//! larger than a block or aligned beyond 256 bytes is refused with an error.

use crate::config::{ConfigError, FromItem, ItemSpec};
use crate::resource::{
    align_up, check_request, forward_upstream, AllocError, AllocErrorKind, Layer, MemoryResource,
};
use crate::stream::{Held, StreamId, StreamKeeper, StreamRef};
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard, PoisonError};
use typenum::U256;

/// Block sizes are multiples of this, which is also the alignment every block meets.
const GRANULE: usize = 256;
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

impl<U: MemoryResource> Layer<U> for FixedSizeConfig {
    type Resource = FixedSize<U>;
    fn layer(self, upstream: U) -> FixedSize<U> {
        FixedSize::new(upstream, self)
    }
}

/// Blocks of one size over an upstream resource `U`.
///
/// Takes chunks of [`FixedSizeConfig::blocks_to_preallocate`] blocks from the upstream (one when
/// built, one more whenever the free list runs dry) and serves each request of at most
/// [`block_size`](Self::block_size) bytes with a whole block: a pop or push on a free list under
/// a mutex. Blocks are 256-byte aligned; larger or over-aligned requests are refused. Free blocks
/// are kept per stream; another stream takes them only after `upstream.order_after`. Chunks go
/// back to the upstream on drop.
///
/// ```
/// use mrstack::prelude::*;
///
/// let sim = Simulated::new(1 << 30);
/// let mr = resource_stack![&sim, FixedSize { block_size: 64 KiB, blocks_to_preallocate: 16 }];
/// assert_eq!(sim.in_use(), 16 << 16); // one chunk of 16 blocks
/// let p = mr.allocate(1000, 256, StreamRef::DEFAULT).unwrap(); // takes a whole block
/// assert_eq!(mr.free_blocks(), 15);
/// # unsafe { mr.deallocate(p, 1000, 256, StreamRef::DEFAULT) };
/// assert!(mr.allocate(100 << 10, 256, StreamRef::DEFAULT).is_err()); // larger than a block
/// ```
#[derive(Debug)]
pub struct FixedSize<U: MemoryResource> {
    upstream: U,
    grow_by: usize,
    bin: Mutex<Bin>,
}

impl<U: MemoryResource> FixedSize<U> {
    /// A resource over `upstream` that takes its first chunk at once if the upstream has it, and
    /// starts empty otherwise, growing on demand (a [`Layer`] cannot fail; use
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
            bin: Mutex::new(Bin::new(block)),
        };
        (mr, config.blocks_to_preallocate)
    }

    fn reserve(&self, count: usize) -> Result<(), AllocError> {
        if count == 0 {
            return Ok(());
        }
        let mut bin = self.lock();
        let block = bin.block;
        bin.grow(
            &self.upstream,
            count,
            false,
            StreamRef::DEFAULT,
            block,
            GRANULE,
            NAME,
        )
    }

    /// The size of every block.
    pub fn block_size(&self) -> usize {
        self.lock().block
    }

    /// Free blocks, over all streams.
    pub fn free_blocks(&self) -> usize {
        self.lock().free_blocks()
    }

    /// Bytes held from the upstream.
    pub fn pool_size(&self) -> usize {
        self.lock().held
    }

    /// The resource the blocks come from.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    fn lock(&self) -> MutexGuard<'_, Bin> {
        // Bin's updates complete before any upstream call (the only thing that may panic inside
        // the lock), so the state behind a poisoned lock is consistent.
        self.bin.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

// SAFETY: every block is a distinct `block`-sized piece of a live upstream chunk, at a multiple of
// `block` (a multiple of 256) from the chunk's 256-aligned start; requests above the block size or
// aligned beyond 256 are refused; a block goes to another stream only after `order_after`.
unsafe impl<U: MemoryResource> MemoryResource for FixedSize<U> {
    forward_upstream!(U, upstream);
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
        let mut bin = self.lock();
        if size > bin.block {
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
        let addr = bin.pop(
            &self.upstream,
            stream,
            Growth::Fixed(self.grow_by),
            size,
            align,
            NAME,
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

    fn name(&self) -> &'static str {
        NAME
    }
}

impl<U: MemoryResource> Drop for FixedSize<U> {
    fn drop(&mut self) {
        let bin = self.bin.get_mut().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: the resource is being dropped, so it hands out no block any more.
        unsafe { bin.release_all(&self.upstream) };
    }
}

/// How a [`Bin`] with no free block grows: decided in the slow path, off the hot one.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Growth {
    /// By this many blocks (FixedSize's `blocks_to_preallocate`).
    Fixed(usize),
    /// By as many blocks as the bin holds, between 1 and this many (Binning's geometric refill).
    Double(usize),
}

/// The state of one block size: free lists per stream and the chunks they were carved from. It
/// does not own its upstream, so that [`Binning`](crate::adaptor::Binning) can keep one per bin
/// over the upstream it owns, and passes the upstream to every call that needs it.
#[derive(Debug)]
pub(crate) struct Bin {
    block: usize,
    /// Free block addresses per stream; the stream used last is usually first.
    lists: Vec<(Held, Vec<usize>)>,
    /// The identity of `lists[0]`'s stream, for the fast path's one comparison.
    first: StreamId,
    chunks: Vec<BinChunk>,
    /// Bytes held from the upstream.
    held: usize,
    /// Keeps alive every stream a `Held` above names (declared last: dropped after them).
    streams: StreamKeeper,
}

#[derive(Debug, Clone, Copy)]
struct BinChunk {
    addr: usize,
    size: usize,
    stream: Held,
}

impl Bin {
    /// An empty bin of `block`-byte blocks (`block` a positive multiple of 256).
    pub(crate) fn new(block: usize) -> Self {
        Bin {
            block,
            lists: Vec::new(),
            chunks: Vec::new(),
            held: 0,
            first: StreamId::DEFAULT,
            streams: StreamKeeper::default(),
        }
    }

    /// Bytes held from the upstream.
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// Blocks carved so far.
    pub(crate) fn free_blocks(&self) -> usize {
        self.lists.iter().map(|(_, l)| l.len()).sum()
    }

    /// A free block for work on `stream`: one freed on `stream`, else one freed on another stream
    /// once `stream` is ordered after it, else one from a new chunk that `growth` sizes (fewer
    /// blocks if the upstream is short of memory). `size`/`align`/`name` only label errors.
    #[inline]
    pub(crate) fn pop<U: MemoryResource>(
        &mut self,
        upstream: &U,
        stream: StreamRef,
        growth: Growth,
        size: usize,
        align: usize,
        name: &'static str,
    ) -> Result<usize, AllocError> {
        if let Some((_, list)) = self.lists.first_mut() {
            if self.first == stream.id() {
                if let Some(addr) = list.pop() {
                    return Ok(addr);
                }
            }
        }
        self.pop_slow(upstream, stream, growth, size, align, name)
    }

    #[cold]
    fn pop_slow<U: MemoryResource>(
        &mut self,
        upstream: &U,
        stream: StreamRef,
        growth: Growth,
        size: usize,
        align: usize,
        name: &'static str,
    ) -> Result<usize, AllocError> {
        // Streams whose free blocks are all in use keep empty lists; drop them here, off the hot
        // path, so that short-lived streams do not lengthen the list scan.
        let streams = &self.streams;
        self.lists
            .retain(|(s, l)| streams.is(*s, stream) || !l.is_empty());
        self.sync_first();
        let li = self.list_index(stream);
        if let Some(addr) = self.lists[li].1.pop() {
            return Ok(addr);
        }
        if let Some(other) = self
            .lists
            .iter()
            .position(|(s, l)| !self.streams.is(*s, stream) && !l.is_empty())
        {
            upstream.order_after(stream, self.streams.get(self.lists[other].0))?;
            let (_, blocks) = self.lists.swap_remove(other);
            self.sync_first();
            let li = self.list_index(stream);
            self.lists[li].1.extend(blocks);
        } else {
            let count = match growth {
                Growth::Fixed(n) => n,
                Growth::Double(max) => (self.held / self.block).clamp(1, max),
            };
            self.grow(upstream, count, true, stream, size, align, name)?;
        }
        let li = self.list_index(stream);
        self.lists[li]
            .1
            .pop()
            .ok_or(AllocError::out_of_memory(size, align, name))
    }

    /// Makes `addr` free on `stream`.
    #[inline]
    pub(crate) fn push(&mut self, addr: usize, stream: StreamRef) {
        if let Some((_, list)) = self.lists.first_mut() {
            if self.first == stream.id() {
                list.push(addr);
                return;
            }
        }
        let li = self.list_index(stream);
        self.lists[li].1.push(addr);
    }

    /// The list of `stream`, created if missing, moved to the front so that the next call on the
    /// same stream finds it first.
    fn list_index(&mut self, stream: StreamRef) -> usize {
        let id = stream.id();
        match self
            .lists
            .iter()
            .position(|(s, _)| self.streams.id(*s) == id)
        {
            Some(i) => {
                self.lists.swap(0, i);
            }
            None => {
                let held = self.streams.hold(stream);
                self.lists.push((held, Vec::new()));
                let last = self.lists.len() - 1;
                self.lists.swap(0, last);
            }
        }
        self.first = id;
        0
    }

    /// Sets `first` to `lists[0]`'s identity after the lists were reordered: the fast paths pop
    /// from and push to `lists[0]` on that comparison alone, so it must never be stale.
    fn sync_first(&mut self) {
        if let Some(&(held, _)) = self.lists.first() {
            self.first = self.streams.id(held);
        }
    }

    /// Takes a chunk of `count` blocks from the upstream on `stream` and frees them there. With
    /// `shrink`, an upstream short of memory is asked for half as many, down to one block.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn grow<U: MemoryResource>(
        &mut self,
        upstream: &U,
        mut count: usize,
        shrink: bool,
        stream: StreamRef,
        size: usize,
        align: usize,
        name: &'static str,
    ) -> Result<(), AllocError> {
        let too_big = AllocError::new(
            AllocErrorKind::InvalidArgument("block size times block count overflows"),
            size,
            align,
            name,
        );
        // A chunk no allocation could hold (over isize::MAX) is asked as the largest one that fits.
        count = count.min(((isize::MAX as usize - GRANULE) / self.block).max(1));
        loop {
            let bytes = count.checked_mul(self.block).ok_or(too_big)?;
            match upstream.allocate(bytes, GRANULE, stream) {
                Ok(ptr) => {
                    let addr = ptr.as_ptr() as usize;
                    let li = self.list_index(stream);
                    // One address per block: a count the host cannot list is out of memory, and
                    // the chunk goes straight back (never an abort on a huge preallocation).
                    if self.lists[li].1.try_reserve(count).is_err() {
                        // SAFETY: the chunk was just allocated with these arguments, unused.
                        unsafe { upstream.deallocate(ptr, bytes, GRANULE, stream) };
                        if shrink && count > 1 {
                            count /= 2;
                            continue;
                        }
                        return Err(AllocError::out_of_memory(bytes, align, name));
                    }
                    let held = self.streams.hold(stream);
                    self.chunks.push(BinChunk {
                        addr,
                        size: bytes,
                        stream: held,
                    });
                    self.held += bytes;
                    let list = &mut self.lists[li].1;
                    // Highest address first, so that pops hand out the chunk from its start.
                    list.extend((0..count).rev().map(|i| addr + i * self.block));
                    return Ok(());
                }
                Err(e) if shrink && e.is_out_of_memory() && count > 1 => count /= 2,
                Err(e) => return Err(e),
            }
        }
    }

    /// Gives every chunk back to the upstream, each on its own stream after ordering that stream
    /// behind every stream holding free blocks.
    ///
    /// # Safety
    ///
    /// No block of this bin is in use or will be handed out again.
    pub(crate) unsafe fn release_all<U: MemoryResource>(&mut self, upstream: &U) {
        let streams: Vec<Held> = self
            .lists
            .iter()
            .filter(|(_, l)| !l.is_empty())
            .map(|&(s, _)| s)
            .collect();
        self.lists.clear();
        for chunk in std::mem::take(&mut self.chunks) {
            for &s in &streams {
                if s != chunk.stream
                    && upstream
                        .order_after(self.streams.get(chunk.stream), self.streams.get(s))
                        .is_err()
                {
                    // No event: wait for the stream instead; a failure here leaves nothing
                    // better to do than give the memory back.
                    let _ = upstream.synchronize(self.streams.get(s));
                }
            }
            self.held -= chunk.size;
            if let Some(ptr) = NonNull::new(std::ptr::with_exposed_provenance_mut(chunk.addr)) {
                // SAFETY: the chunk came from `upstream.allocate(chunk.size, GRANULE, chunk.stream)`
                // and was taken out of `chunks`, so it is given back once; the caller promises none
                // of its blocks is in use, and its stream is ordered after every stream that freed
                // one.
                unsafe {
                    upstream.deallocate(ptr, chunk.size, GRANULE, self.streams.get(chunk.stream))
                };
            }
        }
    }
}

impl FromItem for FixedSizeConfig {
    /// `fixed_size(block_size=…, blocks_to_preallocate=…)`.
    fn from_item(item: &ItemSpec) -> Result<Self, ConfigError> {
        item.check_fields(&["block_size", "blocks_to_preallocate"])?;
        let default = Self::default();
        Ok(FixedSizeConfig {
            block_size: item.size_or("block_size", default.block_size)?,
            blocks_to_preallocate: item
                .number("blocks_to_preallocate")?
                .unwrap_or(default.blocks_to_preallocate),
        })
    }
}

static_assertions::assert_impl_all!(
    FixedSize<crate::Cuda>: Send,
    Sync,
    crate::Accessible<crate::DeviceAccessible>
);
static_assertions::assert_not_impl_any!(FixedSize<crate::Cuda>: crate::Accessible<crate::HostAccessible>);
static_assertions::assert_impl_all!(FixedSize<crate::System>: Send, Sync, crate::Accessible<crate::HostAccessible>);
static_assertions::assert_not_impl_any!(FixedSize<crate::System>: crate::Accessible<crate::DeviceAccessible>);
const _: () = assert!(crate::property::alignment_of::<FixedSize<crate::System>>() == 256);
