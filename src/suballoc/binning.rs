//! `Binning`: power-of-two bins of fixed-size blocks, larger requests from the upstream.

use super::free_list::{BinLock, Growth, Upstream, GRANULE};
use super::usage::{Meter, Usage};
use crate::erased::DynResource;
use crate::resource::{
    check_request, forward_upstream, AllocError, AllocErrorKind, MemoryResource, Result,
};
use crate::shard;
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::{StreamHandle, StreamRef};
use std::ptr::NonNull;
use typenum::U256;

/// The most blocks a bin takes from the upstream at once.
const MAX_GROWTH: usize = 128;
const NAME: &str = "Binning";
/// A thread cache keeps at most this many bytes of one bin's blocks (and at least
/// [`CACHE_MIN_BLOCKS`], at most [`CACHE_MAX_BLOCKS`] blocks).
const CACHE_BIN_BYTES: usize = 8 << 20;
const CACHE_MIN_BLOCKS: usize = 2;
const CACHE_MAX_BLOCKS: usize = 64;

/// One thread's blocks, freed by it on one stream, per bin: what it takes again with no bin lock.
/// Every block here is free on `stream`; a call on another stream gives them back to the bins
/// first (bins keep free blocks per stream).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Cache {
    /// Keeps the stream alive while blocks freed on it wait here.
    stream: Option<StreamHandle>,
    /// Per bin, smallest first (allocated on first use).
    blocks: Vec<Vec<usize>>,
}

impl Cache {
    fn holds(&self, stream: StreamRef) -> bool {
        self.stream.as_ref().is_some_and(|s| s.id() == stream.id())
    }
}

/// The configuration of a [`Binning`]; `resource_stack!` builds one from
/// `Binning { min: 256 KiB, max: 4 MiB }`.
///
/// Both bounds are rounded up to powers of two, and `min` to at least 256 bytes. Defaults: `min:
/// 256` bytes and `max: 1 MiB`, so that every request of at most 1 MiB is a free-list operation.
/// `min` above `max` is an error for [`Binning::try_new`] (and so for a text configuration);
/// [`Binning::new`], which cannot fail, builds no bin from it, as RMM does: every request goes
/// to the upstream.
#[derive(Debug, Clone)]
pub struct BinningConfig {
    /// The smallest bin's block size: smaller requests take a block of this size.
    pub min: usize,
    /// The largest bin's block size: larger requests go to the upstream.
    pub max: usize,
}

impl Default for BinningConfig {
    fn default() -> Self {
        BinningConfig {
            min: GRANULE,
            max: 1 << 20,
        }
    }
}

layer_by_new!(BinningConfig => Binning);

/// Power-of-two bins over an upstream resource `U`.
///
/// Bins of block sizes `min, 2·min, 4·min, …, max` ([`BinningConfig`]) each work as a
/// [`FixedSize`](crate::suballoc::FixedSize) resource: a request of at most `max` bytes (aligned to
/// at most 256) takes one block of the smallest bin that holds it; a larger request, or one aligned
/// beyond 256 bytes, goes to the upstream directly. The bins are not resources of their own but
/// free lists that `Binning` refills from the upstream it owns, so that the bins and the large
/// requests share one upstream (typically a [`Pool`](crate::suballoc::Pool)) with no `Arc` or
/// borrow between them. A bin grows geometrically: each refill doubles the blocks it holds, up to
/// 128 blocks at a time (RMM's `fixed_size_memory_resource` step), so a little-used bin holds
/// little memory; the bins start empty. Every chunk goes back to the upstream when the resource is
/// dropped.
///
/// # Cost
///
/// For a binned request: a bit scan to pick the bin, then a pop or a push on the calling thread's
/// own cache (a vector per bin under a lock that only that thread takes but when memory runs out,
/// one compare-and-swap: the first 64 live threads get a cache each, later ones share one). A
/// thread's cache keeps the blocks it freed on its current stream, up to 8 MiB per bin (2 to 64
/// blocks: bins of more than 4 MiB keep 2); when
/// it runs dry it takes up to half that from the bin at once, and when full gives half back, both
/// under the bin's mutex; an upstream call only when the bin's free list runs dry too. A call on
/// another stream than the cache's gives the cached blocks back to their bins first (so a thread
/// that alternates streams on every call pays a bin lock each time). When the upstream is out of
/// memory every cache is emptied into the bins and the request tried again. Other requests cost
/// what the upstream costs. Blocks waste up to half their size to rounding; blocks waiting in
/// caches serve only their thread: at most 8 MiB per bin per thread (with the default bins, about
/// 40 MiB for a thread that frees blocks of every size), given back when the upstream runs out.
///
/// # Streams
///
/// Each bin keeps free blocks per stream, as `FixedSize` does: reuse on the same stream is
/// immediate, and taking blocks freed on another stream `S` costs one
/// `upstream.order_after(T, S)`, which moves all of `S`'s free blocks in that bin to `T`. A chunk
/// grown for a request belongs to the request's stream. Each bin keeps alive the streams it keys a
/// free list or a chunk by, as long as it does (a stream with no free block and no chunk left in a
/// bin is forgotten there, so per-stream state is bounded by the streams that hold something); on drop each chunk goes back on its own
/// stream, ordered after every stream holding free blocks. Requests passed to the upstream keep
/// their stream; `synchronize` and `order_after` are forwarded to the upstream and to every bin's
/// own resource ([`with_bin`](Self::with_bin)).
///
/// # Upstream
///
/// Any [`MemoryResource`] that honours a 256-byte alignment request: bins' chunks and large
/// requests are asked for at least 256-byte alignment, which is what `Binning` guarantees. It gives
/// the upstream's properties.
/// Its lock is let go (each bin's) while the upstream allocates a chunk, which may run your code (a
/// [`Retry`](crate::adaptor::Retry) callback that frees through this resource or trims it); one
/// growth runs at a time, and a thread that needs to grow meanwhile waits for it.
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
///
/// let sim = Simulated::new(1 << 30);
/// let mr = resource_stack![
///     &sim,
///     Pool { max: 512 MiB },
///     Binning { min: 256 KiB, max: 4 MiB },
/// ];
/// let small = mr.allocate(1000, 256, StreamRef::DEFAULT).unwrap(); // a 256 KiB block
/// let large = mr.allocate(64 << 20, 256, StreamRef::DEFAULT).unwrap(); // from the pool
/// assert_eq!(mr.bin_sizes().first(), Some(&(256 << 10)));
/// # unsafe {
/// #     mr.deallocate(small, 1000, 256, StreamRef::DEFAULT);
/// #     mr.deallocate(large, 64 << 20, 256, StreamRef::DEFAULT);
/// # }
/// ```
#[derive(Debug)]
pub struct Binning<U: MemoryResource> {
    upstream: U,
    /// log2 of the smallest bin's block size.
    min_shift: u32,
    /// The largest bin's block size: requests above it go to the upstream.
    max_block: usize,
    /// The configured `max`, rounded up to a power of two (above `min` when there is no bin):
    /// for the description.
    max: usize,
    bins: Box<[BinLock]>,
    /// One per thread slot ([`shard::SLOTS`]), and the shared one.
    caches: Box<[shard::SlotLock<Cache>]>,
    meter: Meter,
    /// The bins served by a resource of the user's ([`with_bin`](Binning::with_bin)), by bin
    /// index, up to the highest such bin (empty where there is none: a binned call then pays one
    /// length test).
    own: Vec<Option<OwnBin>>,
}

/// A resource serving one bin in place of its free list, erased: any `MemoryResource` with the
/// upstream's properties. It holds blocks of its own, so it hears every `synchronize` and
/// `order_after` the binning hears.
struct OwnBin(Box<dyn DynResource + Send + Sync>);

impl std::fmt::Debug for OwnBin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.describe_to(f)
    }
}

impl<U: MemoryResource> Binning<U> {
    /// Bins from `config.min` to `config.max` over `upstream`. The bins start empty and take memory
    /// when first used. A `min` above `max` (after rounding both up to powers of two, `min` to at
    /// least 256 bytes) gives no bin, as in RMM: every request goes to the upstream. Use
    /// [`try_new`](Self::try_new) to refuse such a configuration instead.
    pub fn new(upstream: U, config: BinningConfig) -> Self {
        let pow2 = |n: usize| {
            n.checked_next_power_of_two()
                .unwrap_or(1 << (usize::BITS - 1))
        };
        let min = pow2(config.min.max(GRANULE));
        let max = pow2(config.max);
        let bins: Box<[BinLock]> = std::iter::successors(Some(min), |&b| b.checked_mul(2))
            .take_while(|&b| b <= max)
            .map(BinLock::new)
            .collect();
        Binning {
            upstream,
            min_shift: min.trailing_zeros(),
            max_block: if bins.is_empty() { 0 } else { max },
            max,
            bins,
            caches: (0..=shard::SLOTS)
                .map(|_| shard::SlotLock::default())
                .collect(),
            meter: Meter::default(),
            own: Vec::new(),
        }
    }

    /// This binning with the bin of block size `size` served by `resource` instead of its free
    /// list (RMM's `add_bin(size, resource)`): every request that bin would take (of at most
    /// `size` bytes, above the bin below it, aligned to at most 256) goes to `resource` as asked
    /// (its alignment raised to 256), and comes back to it. `resource` must claim exactly the
    /// upstream's property bits (`Pageable` too), so that what the binning's type claims from its
    /// upstream holds for every block, whichever resource it came from; it is dropped with the
    /// binning. Every `synchronize` and `order_after` the binning hears goes to the upstream and
    /// to each bin's resource, since each holds blocks the binning handed out.
    ///
    /// It consumes the binning, so no container's block of that bin can be out when the bin
    /// changes hands (a container over the binning borrows or owns it); a block taken with raw
    /// `allocate` before must not be freed after (it would go to `resource`). `InvalidArgument`
    /// where `size` is not one of [`bin_sizes`](Self::bin_sizes).
    ///
    /// ```
    /// use mrstack::prelude::*;
    /// use mrstack::suballoc::{Binning, FixedSize};
    /// use mrstack::suballoc::{BinningConfig, FixedSizeConfig};
    ///
    /// let sim = Simulated::new(1 << 30);
    /// let slabs = std::sync::Arc::new(Simulated::new(64 << 20));
    /// // 64 KiB requests from a fixed-size pool of their own, over memory of their own.
    /// let config = FixedSizeConfig { block_size: 64 << 10, ..Default::default() };
    /// let slab = FixedSize::new(slabs.clone(), config);
    /// let mr = Binning::new(&sim, BinningConfig::default()).with_bin(64 << 10, slab)?;
    /// let p = mr.allocate(40_000, 256, StreamRef::DEFAULT)?;
    /// assert!(slabs.in_use() > 0);
    /// // SAFETY: p came from mr with this size and alignment.
    /// unsafe { mr.deallocate(p, 40_000, 256, StreamRef::DEFAULT) };
    /// # Ok::<(), AllocError>(())
    /// ```
    pub fn with_bin<B>(mut self, size: usize, resource: B) -> Result<Self, AllocError>
    where
        B: crate::property::SameProperties<U> + Send + Sync + 'static,
    {
        let i = match self.bin(size, GRANULE) {
            Some(i) if size.is_power_of_two() && 1 << (self.min_shift + i as u32) == size => i,
            _ => {
                return Err(AllocError::new(
                    AllocErrorKind::InvalidArgument(
                        "Binning::with_bin: the size is not one of the bins' block sizes",
                    ),
                    size,
                    GRANULE,
                    NAME,
                ))
            }
        };
        if self.own.len() <= i {
            self.own.resize_with(i + 1, || None);
        }
        self.own[i] = Some(OwnBin(Box::new(resource)));
        Ok(self)
    }

    /// The resource serving bin `i`, if it has one of its own.
    #[inline]
    fn own_bin(&self, i: usize) -> Option<&(dyn DynResource + Send + Sync)> {
        self.own.get(i)?.as_ref().map(|b| &*b.0)
    }

    /// Bins from `config.min` to `config.max` over `upstream`, as [`new`](Self::new) builds
    /// them (the bins take memory when first used), or an
    /// [`InvalidArgument`](crate::resource::AllocErrorKind::InvalidArgument) error where no bin would be
    /// left: `min` above `max` (the error's size is `min`), or `max` below 256 bytes, the
    /// smallest bin (the error's size is `max`).
    pub fn try_new(upstream: U, config: BinningConfig) -> Result<Self, AllocError> {
        if config.min > config.max {
            return Err(AllocError::new(
                AllocErrorKind::InvalidArgument("Binning's `min` is above its `max`"),
                config.min,
                GRANULE,
                NAME,
            ));
        }
        let max = config.max;
        let binning = Self::new(upstream, config);
        if binning.bins.is_empty() {
            // A `max` below the smallest bin (256 bytes), whose description (`min=256 B`, the
            // `max` given) would not build again.
            return Err(AllocError::new(
                AllocErrorKind::InvalidArgument(
                    "Binning's `max` is below its smallest bin (256 bytes): no bin",
                ),
                max,
                GRANULE,
                NAME,
            ));
        }
        Ok(binning)
    }

    /// The block size of each bin, smallest first.
    pub fn bin_sizes(&self) -> Vec<usize> {
        (0..self.bins.len())
            .map(|i| 1 << (self.min_shift + i as u32))
            .collect()
    }

    /// What the bins hold, over all bins (requests passed to the upstream are not counted), read
    /// at one instant (see [`bin_usage`](Self::bin_usage)).
    pub fn usage(&self) -> Usage {
        let mut total = Usage {
            peak_held: self.meter.peak(),
            ..Usage::default()
        };
        for u in self.bin_usage() {
            total.held += u.held;
            total.allocated += u.allocated;
            total.free_blocks += u.free_blocks;
            total.chunks += u.chunks;
        }
        total
    }

    /// What each bin holds, smallest bin first (`peak_held` is 0 there: the peak is the whole
    /// resource's, in [`usage`](Self::usage)). Blocks waiting in threads' caches count as free.
    /// Read at one instant: every cache is locked (blocks move between a cache and a bin only
    /// under both locks) while the bins are read.
    pub fn bin_usage(&self) -> Vec<Usage> {
        let caches: Vec<_> = self.caches.iter().map(|c| c.lock()).collect();
        let mut cached = vec![0usize; self.bins.len()];
        for cache in &caches {
            for (n, blocks) in cached.iter_mut().zip(&cache.blocks) {
                *n += blocks.len();
            }
        }
        let usage = self
            .bins
            .iter()
            .zip(cached)
            .map(|(b, n)| {
                let bin = b.lock();
                let mut u = bin.usage();
                u.free_blocks += n;
                u.allocated -= n * bin.block();
                u
            })
            .collect();
        drop(caches);
        usage
    }

    /// The per-stream free lists and the streams kept alive, summed over the bins (each bin
    /// counts the default stream): bounded by the streams that have free blocks or chunks in a
    /// bin now. For tests of that bound.
    #[doc(hidden)]
    pub fn tracked_streams(&self) -> (usize, usize) {
        self.bins
            .iter()
            .map(|b| b.lock().tracked())
            .chain(
                // A cache keeps its stream alive (a list's worth, in each bin's terms).
                self.caches
                    .iter()
                    .filter(|c| c.lock().stream.is_some())
                    .map(|_| (0, 1)),
            )
            .fold((0, 0), |(l, s), (bl, bs)| (l + bl, s + bs))
    }

    /// The resource the bins and the large requests take memory from.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// The bin serving a request, or `None` for the upstream.
    #[inline]
    fn bin(&self, size: usize, align: usize) -> Option<usize> {
        if size > self.max_block || align > GRANULE {
            return None;
        }
        // The smallest power of two holding `size`, at least the smallest bin's (`with_bin`
        // asks for any size, 0 included, as `bins="0 = system"` does: none may overflow the shift).
        let shift = (usize::BITS - size.saturating_sub(1).leading_zeros()).max(self.min_shift);
        let i = (shift - self.min_shift) as usize;
        (i < self.bins.len()).then_some(i)
    }

    /// How many blocks of bin `i` a thread cache keeps at most.
    fn cache_cap(&self, i: usize) -> usize {
        (CACHE_BIN_BYTES >> (self.min_shift as usize + i)).clamp(CACHE_MIN_BLOCKS, CACHE_MAX_BLOCKS)
    }

    /// The calling thread's cache.
    #[inline]
    fn cache(&self) -> shard::SlotGuard<'_, Cache> {
        self.caches[shard::slot()].lock()
    }

    /// Gives every block in `cache` back to its bin, on the cache's stream, and lets the stream go.
    fn empty_cache(&self, cache: &mut Cache) {
        let Some(stream) = cache.stream.take() else {
            return;
        };
        for (bin, blocks) in self.bins.iter().zip(cache.blocks.iter_mut()) {
            if !blocks.is_empty() {
                bin.lock().push_all(blocks.drain(..), stream.as_ref());
            }
        }
    }

    /// Makes `cache` one of `stream`'s, emptying it first if it held another stream's blocks.
    fn switch_cache(&self, cache: &mut Cache, stream: StreamRef) {
        if !cache.holds(stream) {
            self.empty_cache(cache);
            cache.stream = Some(stream.to_handle());
        }
        if cache.blocks.len() < self.bins.len() {
            cache.blocks.resize_with(self.bins.len(), Vec::new);
        }
    }

    /// A block of bin `i` for `stream` when the calling thread's cache has none: from the bin,
    /// with up to half a cache's worth more for the cache. No cache lock is held while the bin
    /// calls the upstream, nor the bin's (`Bin::pop` lets it go): the upstream may run the user's
    /// code (a `Retry` callback that frees blocks through this resource), which must find both
    /// free. The refill moves blocks from the bin to the cache under both locks, so that
    /// [`bin_usage`](Self::bin_usage) never finds them in neither or in both.
    #[cold]
    fn refill(&self, i: usize, size: usize, align: usize, stream: StreamRef) -> Result<usize> {
        let from = Upstream {
            upstream: &self.upstream,
            meter: &self.meter,
            name: NAME,
        };
        let growth = Growth::Double(MAX_GROWTH);
        let (addr, bin) = self.bins[i].pop(from, stream, growth, size, align)?;
        drop(bin);
        let mut cache = self.cache();
        self.switch_cache(&mut cache, stream);
        // (Nothing, if another stream's use made its list the bin's current one meanwhile.)
        self.bins[i]
            .lock()
            .pop_more(stream, self.cache_cap(i) / 2, &mut cache.blocks[i]);
        Ok(addr)
    }

    /// Empties every thread's cache into the bins: what an upstream out of memory calls for.
    #[cold]
    fn empty_caches(&self) {
        for cache in self.caches.iter() {
            self.empty_cache(&mut cache.lock());
        }
    }
}

// SAFETY: a binned request gets a whole block of its bin (block ≥ size, 256-aligned, distinct, see
// `FixedSize`), handed to another stream only after `order_after`; other requests are the
// upstream's, asked for at least 256-byte alignment, which the upstream honours or refuses. A bin
// of its own resource is the upstream's or that resource's: `with_bin` takes only a resource
// whose property bits are the upstream's, so the bits claimed from the upstream hold for every
// block, and `synchronize`/`order_after` reach the upstream and every bin's resource.
unsafe impl<U: MemoryResource> MemoryResource for Binning<U> {
    forward_upstream!(properties of U);
    type Alignment = U256;

    /// Waits for `stream` in the upstream and in every bin's own resource, each of which may hold
    /// blocks freed on it; the first error, once all were asked.
    fn synchronize(&self, stream: StreamRef) -> Result<()> {
        let mut result = self.upstream.synchronize(stream);
        for own in self.own.iter().flatten() {
            let r = own.0.synchronize(stream);
            result = result.and(r);
        }
        result
    }

    /// Orders `stream` after `after` in the upstream and in every bin's own resource: a block
    /// freed on `after` may have come from any of them. The first error, once all were asked.
    fn order_after(&self, stream: StreamRef, after: StreamRef) -> Result<()> {
        let mut result = self.upstream.order_after(stream, after);
        for own in self.own.iter().flatten() {
            let r = own.0.order_after(stream, after);
            result = result.and(r);
        }
        result
    }

    #[inline]
    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(p) = check_request::<Self>(size, align, NAME)? {
            return Ok(p);
        }
        let Some(i) = self.bin(size, align) else {
            return self.upstream.allocate(size, align.max(GRANULE), stream);
        };
        if let Some(own) = self.own_bin(i) {
            return own.allocate(size, align.max(GRANULE), stream);
        }
        let cached = {
            let mut cache = self.cache();
            // Blocks of another stream go back to their bins, where this stream can take them
            // once ordered after theirs.
            self.switch_cache(&mut cache, stream);
            cache.blocks[i].pop()
        };
        let addr = match cached {
            Some(addr) => addr,
            None => match self.refill(i, size, align, stream) {
                Ok(addr) => addr,
                Err(e) if e.is_out_of_memory() => {
                    // Blocks waiting in other threads' caches may be what is missing.
                    self.empty_caches();
                    self.refill(i, size, align, stream)?
                }
                Err(e) => return Err(e),
            },
        };
        NonNull::new(std::ptr::with_exposed_provenance_mut(addr))
            .ok_or(AllocError::out_of_memory(size, align, NAME))
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        match self.bin(size, align).map(|i| (i, self.own_bin(i))) {
            // SAFETY: the same routing sent this request to this resource, with this size and
            // the alignment raised alike.
            Some((_, Some(own))) => unsafe {
                own.deallocate(ptr, size, align.max(GRANULE), stream)
            },
            Some((i, None)) => {
                let mut cache = self.cache();
                self.switch_cache(&mut cache, stream);
                let blocks = &mut cache.blocks[i];
                blocks.push(ptr.as_ptr() as usize);
                let cap = self.cache_cap(i);
                if blocks.len() > cap {
                    // The oldest half goes back: the newest are the likeliest still in cache.
                    self.bins[i]
                        .lock()
                        .push_all(blocks.drain(..(cap / 2).max(1)), stream);
                }
            }
            // SAFETY: requests that no bin serves were passed to the upstream with this size and
            // alignment (the same routing decides both ways).
            None => unsafe {
                self.upstream
                    .deallocate(ptr, size, align.max(GRANULE), stream)
            },
        }
    }

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let item = ItemWriter::over(f, &self.upstream, "binning")
            .size("min", 1 << self.min_shift)
            .size("max", self.max);
        if self.own.is_empty() {
            return item.finish();
        }
        // `bins="64 KiB = cuda_async(device=0); …"`: each bin's size and its resource's own
        // description, which text builds back (a resource text cannot name fails there, naming
        // itself).
        let bins: Vec<String> = self
            .own
            .iter()
            .enumerate()
            .filter_map(|(i, own)| {
                let size = crate::units::ExactBytes::from(1usize << (self.min_shift + i as u32));
                own.as_ref().map(|own| format!("{size} = {own:?}"))
            })
            .collect();
        item.text("bins", &bins.join("; ")).finish()
    }

    forward_upstream!(layer over upstream, name = NAME);
}

has_upstream!(impl<U> for Binning<U> where U: MemoryResource);

impl<U: MemoryResource> Drop for Binning<U> {
    fn drop(&mut self) {
        let from = Upstream {
            upstream: &self.upstream,
            meter: &self.meter,
            name: NAME,
        };
        self.empty_caches();
        // A bin whose upstream panics does not keep the other bins' chunks from going back.
        let mut panicked = super::growth::FirstPanic::default();
        for bin in self.bins.iter_mut() {
            let bin = bin.get_mut();
            // SAFETY: the resource is being dropped, so it hands out no block any more.
            panicked.catch(|| unsafe { bin.release_all(from) });
        }
        panicked.resume();
    }
}

static_assertions::assert_impl_all!(
    Binning<crate::suballoc::Pool<crate::leaf::Cuda>>: Send,
    Sync,
    crate::property::Accessible<crate::property::DeviceAccessible>
);
crate::property::assert_keeps_properties!(Binning);
const _: () = assert!(crate::property::alignment_of::<Binning<crate::leaf::System>>() == 256);
