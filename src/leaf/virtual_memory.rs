//! `VirtualMemory`: blocks carved from a reserved virtual range, with physical pages mapped only where live blocks are.

use super::pages::PhysicalPages;
use crate::resource::{check_request, AllocError, MemoryResource, Result};
use crate::stack::ItemWriter;
use crate::stream::{Held, StreamRef};
use crate::suballoc::tlsf_index::{TlsfIndex, ALL_STREAMS, GRANULE};
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard, PoisonError};
use typenum::U256;

const NAME: &str = "VirtualMemory";

/// The configuration of a [`VirtualMemory`].
#[derive(Debug, Clone)]
pub struct VirtualMemoryConfig {
    /// Virtual bytes to reserve at a time (0: the page source's default, twice the device's
    /// memory). A request that no free range fits reserves another range.
    pub reservation: usize,
    /// The most physical bytes mapped at once; `usize::MAX` for no cap but the device's.
    pub max: usize,
    /// Physical bytes of wholly free pages kept mapped for reuse, so that a workload that frees
    /// and allocates again maps nothing; above it, free pages are unmapped (the highest first)
    /// down to half of it. Under memory pressure (a map refused, or `max` reached) every cached
    /// page goes first, and [`VirtualMemory::release`] unmaps them all.
    ///
    /// Default: no bound but that pressure (`usize::MAX`), as PyTorch's expandable segments keep
    /// their pages. A bound gives pages back to the device's other users sooner, at the price of
    /// mapping them again (38 µs map + 27 µs unmap per 2 MiB page on an H100) when the working
    /// set comes back: PyTorch's ResNet-50 training on a 64 MiB cache took 800 ms a step against
    /// 41 ms unbounded.
    pub cache: usize,
}

impl Default for VirtualMemoryConfig {
    fn default() -> Self {
        VirtualMemoryConfig {
            reservation: 0,
            max: usize::MAX,
            cache: usize::MAX,
        }
    }
}

/// What a [`VirtualMemory`] holds, read at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VmUsage {
    /// Physical bytes mapped now: pages with a live block, and cached free pages.
    pub mapped: usize,
    /// The most `mapped` has been.
    pub peak_mapped: usize,
    /// Physical bytes of cached pages (mapped, wholly free).
    pub cached: usize,
    /// Bytes in allocated blocks (sizes rounded up to 256 bytes).
    pub allocated: usize,
    /// Virtual bytes reserved.
    pub reserved: usize,
    /// Free blocks (of address space).
    pub free_blocks: usize,
}

/// A set of pages, a bit each.
#[derive(Debug, Default)]
struct Bits(Vec<u64>);

impl Bits {
    /// Makes room for pages below `n`.
    fn grow(&mut self, n: usize) {
        let words = n.div_ceil(64);
        if self.0.len() < words {
            self.0.resize(words, 0);
        }
    }

    #[inline]
    fn get(&self, p: usize) -> bool {
        self.0[p / 64] & (1 << (p % 64)) != 0
    }

    /// Calls `f(word index, mask)` for the words of pages `lo..hi` (`lo < hi`).
    #[inline]
    fn words(lo: usize, hi: usize, mut f: impl FnMut(usize, u64)) {
        let (first, last) = (lo / 64, (hi - 1) / 64);
        if first == last {
            // Most blocks lie on a page or two: one word, no loop.
            f(first, (u64::MAX >> (64 - (hi - lo))) << (lo % 64));
            return;
        }
        for w in first..=last {
            let from = if w == first { lo % 64 } else { 0 };
            let to = if w == last { (hi - 1) % 64 + 1 } else { 64 };
            let mask = (u64::MAX >> (64 - (to - from))) << from;
            f(w, mask);
        }
    }

    /// Sets pages `lo..hi`; returns how many were clear.
    #[inline]
    fn set(&mut self, lo: usize, hi: usize) -> usize {
        let mut n = 0;
        if lo < hi {
            Self::words(lo, hi, |w, m| {
                n += (!self.0[w] & m).count_ones() as usize;
                self.0[w] |= m;
            });
        }
        n
    }

    /// How many pages of `lo..hi` are clear.
    #[inline]
    fn count_clear(&self, lo: usize, hi: usize) -> usize {
        let mut n = 0;
        if lo < hi {
            Self::words(lo, hi, |w, m| n += (!self.0[w] & m).count_ones() as usize);
        }
        n
    }

    /// Clears pages `lo..hi`; returns how many were set.
    #[inline]
    fn clear(&mut self, lo: usize, hi: usize) -> usize {
        let mut n = 0;
        if lo < hi {
            Self::words(lo, hi, |w, m| {
                n += (self.0[w] & m).count_ones() as usize;
                self.0[w] &= !m;
            });
        }
        n
    }
}

#[derive(Debug)]
struct Region<H> {
    base: usize,
    size: usize,
    /// Per page, up to the highest page ever used (grown on demand: a reservation of the
    /// device's whole memory costs nothing until used): the live blocks that overlap the page
    /// without covering it (a page covered wholly by a block can overlap no other, so it needs
    /// no count: it is live exactly while that block is).
    partial: Vec<u32>,
    /// The physical memory mapped at each page.
    handles: Vec<Option<H>>,
    /// Pages mapped, and pages in the cache (mapped, no live block).
    mapped: Bits,
    cached: Bits,
}

impl<H> Region<H> {
    /// Page `p` goes from being overlapped `from` to `to` by one block (its other blocks
    /// unchanged); returns 1 when that takes it out of the cache (live again) or puts it in (no
    /// live block left), 0 otherwise.
    #[inline]
    fn touch(&mut self, p: usize, from: Overlap, to: Overlap) -> usize {
        let was_live = self.partial[p] > 0 || from == Overlap::Whole;
        if from == Overlap::Partial {
            self.partial[p] -= 1;
        }
        if to == Overlap::Partial {
            self.partial[p] += 1;
        }
        let live = self.partial[p] > 0 || to == Overlap::Whole;
        match (was_live, live) {
            (false, true) => self.cached.clear(p, p + 1),
            (true, false) if self.mapped.get(p) => self.cached.set(p, p + 1),
            _ => 0,
        }
    }

    /// Puts the mapped pages of `lo..hi`, which no live block is on any more, in the cache;
    /// returns how many.
    fn cache_mapped(&mut self, lo: usize, hi: usize) -> usize {
        let mut n = 0;
        if lo < hi {
            let (mapped, cached) = (&self.mapped.0, &mut self.cached.0);
            Bits::words(lo, hi, |w, m| {
                let newly = mapped[w] & m & !cached[w];
                n += newly.count_ones() as usize;
                cached[w] |= newly;
            });
        }
        n
    }

    fn grow(&mut self, pages: usize) {
        if self.partial.len() < pages {
            self.partial.resize(pages, 0);
            self.handles.resize_with(pages, || None);
            self.mapped.grow(pages);
            self.cached.grow(pages);
        }
    }
}

/// How a block lies on a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Overlap {
    None,
    /// Part of the page: other blocks may share it (the page's `partial` count).
    Partial,
    /// All of the page: no other block can be on it.
    Whole,
}

impl Overlap {
    /// How a block with `page_span` `span` lies on page `p`.
    fn of((first, last, lo, hi): (usize, usize, usize, usize), p: usize) -> Overlap {
        if p >= lo && p < hi {
            Overlap::Whole
        } else if p >= first && p < last {
            Overlap::Partial
        } else {
            Overlap::None
        }
    }
}

/// The end pages of a block with `page_span` `(first, last, lo, hi)` that it does not cover
/// wholly, each once.
fn ends(first: usize, last: usize, lo: usize, hi: usize) -> impl Iterator<Item = usize> {
    let one = first + 1 == last;
    [first, last - 1]
        .into_iter()
        .enumerate()
        .filter(move |&(i, p)| !(one && i == 1) && (p < lo || p >= hi))
        .map(|(_, p)| p)
}

#[derive(Debug)]
struct State<H> {
    index: TlsfIndex,
    /// The reserved ranges, by base.
    regions: Vec<Region<H>>,
    mapped: usize,
    peak_mapped: usize,
    /// Pages in the cache.
    cached: usize,
}

/// The pages of `[addr, addr + len)` in a region at `base`: `(first, last)` touched (end
/// exclusive) and `(lo, hi)` covered wholly.
#[inline]
fn page_span(base: usize, addr: usize, len: usize, shift: u32) -> (usize, usize, usize, usize) {
    // Shifts, not divisions: this runs twice per allocation and free.
    let (start, end) = (addr - base, addr - base + len);
    let (first, last) = (start >> shift, ((end - 1) >> shift) + 1);
    let partial_first = usize::from(start & ((1 << shift) - 1) != 0);
    let (lo, hi) = (first + partial_first, end >> shift);
    (first, last, lo, hi.max(lo))
}

/// A resource that carves blocks out of reserved virtual address space and backs them with
/// physical pages only where live blocks are (PyTorch's expandable segments; GMLake's stitching
/// of physical pages into one virtual range).
///
/// It reserves a large virtual range from its page source `P` ([`DevicePages`](crate::leaf::DevicePages)
/// on a GPU, [`Simulated`](crate::leaf::Simulated) anywhere) and keeps the free ranges in a two-level
/// segregated fit index per stream, as [`Tlsf`](crate::suballoc::Tlsf) does. An allocation maps the pages
/// under its block that are not mapped yet; a deallocation leaves a page whose last live block
/// went in a bounded cache of free pages ([`VirtualMemoryConfig::cache`]), and unmaps the oldest
/// beyond it. So the physical memory held is the pages live blocks touch plus the cache, whatever
/// the holes between blocks: a large request never fails for want of a contiguous range while
/// physical pages remain, and a freed hole gives its pages back to any size of request. Physical
/// bytes are capped by [`VirtualMemoryConfig::max`].
///
/// # Cost
///
/// An allocation or deallocation that maps nothing costs what [`Tlsf`](crate::suballoc::Tlsf)'s
/// does, plus a counter on each of the block's two end pages (the only pages it can share) and
/// bitmap operations over the pages it covers wholly (64 pages a word). A page mapped costs
/// `cuMemCreate` + `cuMemMap` (and one `cuMemSetAccess` per run of pages), a page unmapped
/// `cuMemUnmap` + `cuMemRelease`: microseconds each (see the README's footprint section), which
/// the cache keeps off the path of a workload whose working set repeats. Pages are trimmed in
/// batches (down to half the cache), so the synchronizations before them are paid once per batch.
///
/// # Streams
///
/// As [`Tlsf`](crate::suballoc::Tlsf): a block freed on stream `S` is reused at once on `S`, and by another
/// stream `T` only after `order_after(T, S)`. Before pages are unmapped, every stream with free
/// blocks is synchronized on the host (unmapping does not wait for device work; each byte of a
/// wholly free page is in a free block, whose stream is ordered after every use of it). Every
/// stream a free block names is kept alive.
///
/// # Upstream
///
/// None: a leaf over a [`PhysicalPages`] source, whose properties it gives (device memory of one
/// GPU for `DevicePages`: `DeviceAccessible`, not host, not managed). 256-byte alignment; larger
/// alignments are carved out of larger free ranges.
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::{leaf::VirtualMemory, leaf::VirtualMemoryConfig};
///
/// let sim = Simulated::new(64 << 20); // 2 MiB pages, 64 MiB of "physical" memory
/// let vm = VirtualMemory::new(&sim, VirtualMemoryConfig { cache: 0, ..Default::default() })?;
/// let a = vm.allocate(3 << 20, 256, StreamRef::DEFAULT)?;
/// assert_eq!(sim.mapped(), 4 << 20); // the two pages under the block
/// // SAFETY: `a` came from `vm` with this size and alignment.
/// unsafe { vm.deallocate(a, 3 << 20, 256, StreamRef::DEFAULT) };
/// assert_eq!(sim.mapped(), 0); // no cache: the pages went back at once
/// # Ok::<(), AllocError>(())
/// ```
pub struct VirtualMemory<P: PhysicalPages> {
    pages: P,
    page: usize,
    /// `page`'s log2.
    shift: u32,
    config: VirtualMemoryConfig,
    state: Mutex<State<P::Page>>,
}

impl<P: PhysicalPages> std::fmt::Debug for VirtualMemory<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtualMemory")
            .field("page", &self.page)
            .field("config", &self.config)
            .field("usage", &self.usage())
            .finish()
    }
}

impl<P: PhysicalPages> VirtualMemory<P> {
    /// A resource over `pages`; it reserves its first range at once, and says so when it cannot.
    /// `InvalidArgument` for a page size that is not a power of two (the sources give powers of
    /// two on every GPU: [`DevicePages::with_page_size`](crate::leaf::DevicePages::with_page_size)
    /// rounds up to one).
    pub fn new(pages: P, config: VirtualMemoryConfig) -> Result<Self> {
        let page = pages.page_size();
        if !page.is_power_of_two() {
            return Err(AllocError::new(
                crate::resource::AllocErrorKind::InvalidArgument(
                    "the page source's page size is not a power of two",
                ),
                page,
                0,
                NAME,
            ));
        }
        let vm = VirtualMemory {
            pages,
            page,
            shift: page.trailing_zeros(),
            config,
            state: Mutex::new(State {
                index: TlsfIndex::default(),
                regions: Vec::new(),
                mapped: 0,
                peak_mapped: 0,
                cached: 0,
            }),
        };
        let mut st = vm.lock();
        vm.reserve(&mut st, 0, StreamRef::DEFAULT)?;
        drop(st);
        Ok(vm)
    }

    /// The page source.
    pub fn pages(&self) -> &P {
        &self.pages
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &VirtualMemoryConfig {
        &self.config
    }

    /// What it holds, read at one instant.
    pub fn usage(&self) -> VmUsage {
        let st = self.lock();
        VmUsage {
            mapped: st.mapped,
            peak_mapped: st.peak_mapped,
            cached: st.cached * self.page,
            allocated: st.index.allocated,
            reserved: st.index.size,
            free_blocks: st.index.free_blocks(),
        }
    }

    /// Unmaps every cached page (after synchronizing the streams with free blocks); returns the
    /// physical bytes given back.
    pub fn release(&self) -> usize {
        let mut st = self.lock();
        let before = st.mapped;
        self.trim(&mut st, 0);
        before - st.mapped
    }

    fn lock(&self) -> MutexGuard<'_, State<P::Page>> {
        // Every update completes before the next call to the page source, the only thing that may
        // panic inside the lock (a test source catching a broken contract): the state behind a
        // poisoned lock is consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reserves a range of at least `need` bytes (the configured reservation, or more) as one
    /// free block on `stream`.
    fn reserve(&self, st: &mut State<P::Page>, need: usize, stream: StreamRef) -> Result<()> {
        let wanted = match self.config.reservation {
            0 => self.pages.default_reservation(),
            n => n,
        };
        // At least a page: a source of no capacity (a simulated one of 0 bytes) has a default
        // reservation of 0, which no source reserves.
        let size = wanted
            .max(need)
            .max(self.page)
            .checked_next_multiple_of(self.page)
            .filter(|&s| s <= isize::MAX as usize)
            .ok_or(AllocError::out_of_memory(need, GRANULE, NAME))?;
        let base = self.pages.reserve(size)?;
        if !st.index.add_chunk(base, size, stream) {
            // SAFETY: just reserved with this size; nothing is mapped in it.
            unsafe { self.pages.unreserve(base, size) };
            return Err(AllocError::out_of_memory(need, GRANULE, NAME));
        }
        let at = st.regions.partition_point(|r| r.base < base);
        st.regions.insert(
            at,
            Region {
                base,
                size,
                partial: Vec::new(),
                handles: Vec::new(),
                mapped: Bits::default(),
                cached: Bits::default(),
            },
        );
        Ok(())
    }

    /// Makes the pages of the block `[addr, addr + len)` of region `r` live: out of the cache,
    /// and mapped where they are not. On failure nothing has changed (but the cache may have been
    /// emptied).
    fn commit(&self, st: &mut State<P::Page>, r: usize, addr: usize, len: usize) -> Result<()> {
        let (first, last, lo, hi) = page_span(st.regions[r].base, addr, len, self.shift);
        let region = &mut st.regions[r];
        region.grow(last);
        // The pages it covers are live through it alone; the end pages it shares are counted.
        let covered_cached = region.cached.clear(lo, hi);
        let mut uncached = covered_cached;
        // The usual case maps nothing: a covered page was free, so it is mapped exactly when it
        // was cached, and an end page is looked up (one bit each) instead of counting the span.
        let mut all_mapped = covered_cached == hi - lo;
        for p in ends(first, last, lo, hi) {
            uncached += region.touch(p, Overlap::None, Overlap::Partial);
            all_mapped &= region.mapped.get(p);
        }
        st.cached -= uncached;
        if all_mapped {
            return Ok(());
        }
        let result = self.map_range(st, r, first, last);
        if result.is_err() {
            self.uncommit(st, r, addr, len, false);
            // The pages mapped for the request went to the cache: keep it within its bound.
            if st.cached * self.page > self.config.cache {
                self.trim(st, self.config.cache);
            }
        }
        result
    }

    /// Maps the unmapped pages of `first..last` of region `r` (all live), emptying the cache
    /// first where the cap or the source says there is no room.
    fn map_range(
        &self,
        st: &mut State<P::Page>,
        r: usize,
        first: usize,
        last: usize,
    ) -> Result<()> {
        let missing = st.regions[r].mapped.count_clear(first, last);
        if missing == 0 {
            return Ok(());
        }
        let bytes = missing * self.page;
        if bytes > self.config.max.saturating_sub(st.mapped) {
            self.trim(st, 0);
            if bytes > self.config.max.saturating_sub(st.mapped) {
                return Err(AllocError::out_of_memory(bytes, self.page, NAME));
            }
        }
        let base = st.regions[r].base;
        let mut run: Option<usize> = None;
        for p in first..=last {
            let unmapped = p < last && !st.regions[r].mapped.get(p);
            if unmapped {
                let addr = base + p * self.page;
                // SAFETY: one page of a reservation of this source, not mapped (its bit is
                // clear, and nothing but this resource maps in its reservations).
                let mapped = match unsafe { self.pages.map(addr, self.page) } {
                    Err(e) if e.is_out_of_memory() && st.cached > 0 => {
                        self.trim(st, 0);
                        // SAFETY: as above; the trim unmapped only cached pages.
                        unsafe { self.pages.map(addr, self.page) }
                    }
                    other => other,
                };
                let page = match mapped {
                    Ok(page) => page,
                    Err(e) => {
                        // The pages of this run were never enabled: no one may use them.
                        if let Some(start) = run {
                            for q in start..p {
                                self.unmap_page(st, r, q);
                            }
                        }
                        return Err(e);
                    }
                };
                let region = &mut st.regions[r];
                region.handles[p] = Some(page);
                region.mapped.set(p, p + 1);
                st.mapped += self.page;
                st.peak_mapped = st.peak_mapped.max(st.mapped);
                run.get_or_insert(p);
            } else if let Some(start) = run.take() {
                // SAFETY: pages `start..p` were just mapped by this source, in one of its
                // reservations.
                let enabled = unsafe {
                    self.pages
                        .enable(base + start * self.page, (p - start) * self.page)
                };
                if let Err(e) = enabled {
                    // Pages no one may access: unmap them (nothing used them).
                    for q in start..p {
                        self.unmap_page(st, r, q);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Gives up the pages of the block `[addr, addr + len)` of region `r`: those left with no
    /// live block go in the cache, and the cache is trimmed to its bound if `trim`.
    fn uncommit(&self, st: &mut State<P::Page>, r: usize, addr: usize, len: usize, trim: bool) {
        let (first, last, lo, hi) = page_span(st.regions[r].base, addr, len, self.shift);
        let region = &mut st.regions[r];
        // The pages the block covered wholly are free now; they are mapped, unless the block is
        // being given up because mapping them failed.
        let mut freed = region.cache_mapped(lo, hi);
        for p in ends(first, last, lo, hi) {
            freed += region.touch(p, Overlap::Partial, Overlap::None);
        }
        st.cached += freed;
        if trim && st.cached * self.page > self.config.cache {
            self.trim(st, self.config.cache / 2);
        }
    }

    /// Grows the live block `[addr, addr + old)` of region `r` to `new` bytes, page by page: the
    /// pages it now touches leave the cache or are mapped. On failure the pages are as before.
    fn extend(
        &self,
        st: &mut State<P::Page>,
        r: usize,
        addr: usize,
        old: usize,
        new: usize,
    ) -> Result<()> {
        let base = st.regions[r].base;
        let before = page_span(base, addr, old, self.shift);
        let after = page_span(base, addr, new, self.shift);
        // The old block's last page is the only one it shares with the grown one's new pages.
        let shared = before.1 - 1;
        let (lo, hi) = (after.2.max(shared + 1), after.3.max(shared + 1));
        let region = &mut st.regions[r];
        region.grow(after.1);
        let mut uncached = region.touch(
            shared,
            Overlap::of(before, shared),
            Overlap::of(after, shared),
        );
        uncached += region.cached.clear(lo, hi);
        for p in ends(after.0, after.1, after.2, after.3).filter(|&p| p > shared) {
            uncached += region.touch(p, Overlap::None, Overlap::Partial);
        }
        st.cached -= uncached;
        let result = self.map_range(st, r, shared, after.1);
        if result.is_err() {
            // The same steps backwards: what the grown block alone held goes to the cache.
            let region = &mut st.regions[r];
            let mut freed = region.cache_mapped(lo, hi);
            for p in ends(after.0, after.1, after.2, after.3).filter(|&p| p > shared) {
                freed += region.touch(p, Overlap::Partial, Overlap::None);
            }
            freed += region.touch(
                shared,
                Overlap::of(after, shared),
                Overlap::of(before, shared),
            );
            st.cached += freed;
            if st.cached * self.page > self.config.cache {
                self.trim(st, self.config.cache);
            }
        }
        result
    }

    /// Unmaps page `p` of region `r`, out of the cache, that no work uses: no live block is on
    /// it and the streams that freed blocks on it were synchronized, or it was never enabled.
    fn unmap_page(&self, st: &mut State<P::Page>, r: usize, p: usize) {
        let region = &mut st.regions[r];
        let addr = region.base + p * self.page;
        region.mapped.clear(p, p + 1);
        if let Some(page) = region.handles[p].take() {
            st.mapped -= self.page;
            // SAFETY: a mapping this source made for this page, with no live block on it, whose
            // last users the caller synchronized (or that nothing ever used).
            unsafe { self.pages.unmap(addr, self.page, page) };
        }
    }

    /// Synchronizes the streams whose lists got free bytes since the last time
    /// ([`TlsfIndex::take_listed`]); if one fails, they are all waited for again next time.
    ///
    /// Why that suffices before unmapping a page with no live block: each of its bytes is in a
    /// free block, on the list of some stream `Y`. Either the bytes reached `Y`'s list since the
    /// last synchronization, and `Y` is among the streams waited for now, or before it, and `Y`
    /// was waited for then (no work uses freed bytes after their free). A stale bit only adds a
    /// synchronization.
    fn synchronize_freed(&self, st: &mut State<P::Page>) -> Result<()> {
        let bits = st.index.take_listed();
        let keeper = &st.index.streams;
        let synced = if bits & (1 << ALL_STREAMS) != 0 {
            keeper.each().try_for_each(|s| self.pages.synchronize(s))
        } else {
            (0..ALL_STREAMS)
                .filter(|b| bits & (1 << b) != 0)
                .try_for_each(|b| self.pages.synchronize(keeper.get(Held::at(b))))
        };
        if synced.is_err() {
            // Waited for or not, these streams must be waited for before the next unmapping.
            st.index.relist(bits);
        }
        synced
    }

    /// Unmaps cached pages, the highest first (blocks are carved from the low end of free
    /// ranges, so low pages are the likeliest to serve again), until at most `target` bytes are
    /// cached, after synchronizing the streams that freed blocks since the last trim
    /// ([`synchronize_freed`](Self::synchronize_freed)); keeps them if a synchronization fails.
    /// O(pages reserved / 64) on top of the unmapping: trims are batched, off the hot path.
    fn trim(&self, st: &mut State<P::Page>, target: usize) {
        let target = target / self.page;
        if st.cached <= target {
            return;
        }
        if self.synchronize_freed(st).is_err() {
            return;
        }
        for r in (0..st.regions.len()).rev() {
            for w in (0..st.regions[r].cached.0.len()).rev() {
                while st.cached > target && st.regions[r].cached.0[w] != 0 {
                    let bits = st.regions[r].cached.0[w];
                    let p = w * 64 + (63 - bits.leading_zeros() as usize);
                    st.regions[r].cached.clear(p, p + 1);
                    st.cached -= 1;
                    self.unmap_page(st, r, p);
                }
                if st.cached <= target {
                    return;
                }
            }
        }
    }
}

impl<H> State<H> {
    /// The region holding `addr`, if one does.
    #[inline]
    fn region_of(&self, addr: usize) -> Option<usize> {
        let r = self
            .regions
            .partition_point(|r| r.base <= addr)
            .checked_sub(1)?;
        let region = &self.regions[r];
        (addr - region.base < region.size).then_some(r)
    }
}

// SAFETY: blocks are disjoint pieces of reserved ranges (the blocks of a range tile it, each free
// or handed out once), at least `size` bytes, aligned to max(align, 256) (ranges are page-aligned
// and blocks carved at `align` multiples); before `allocate` returns, every page under the block
// is mapped and enabled (`commit`), and a page is unmapped only when no live block overlaps it,
// after the streams that freed blocks on it are synchronized. A block freed on one stream goes to
// another only after `order_after`. The memory has the page source's properties.
unsafe impl<P: PhysicalPages> MemoryResource for VirtualMemory<P> {
    type Host = P::Host;
    type Device = P::Device;
    type Managed = P::Managed;
    type Pageable = typenum::B0;
    type Alignment = U256;

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(p) = check_request::<Self>(size, align, NAME)? {
            return Ok(p);
        }
        let (align, block, need) = crate::suballoc::growth::block_of(size, align);
        let oom = || AllocError::out_of_memory(size, align, NAME);
        // More than could ever be mapped, or a placement further into a range than twice that
        // (a huge alignment): refused before a range or a page table is sized for it, so the
        // page tables stay within twice the source's capacity in pages.
        let most = self.config.max.min(self.pages.capacity());
        if block > most || need > most.saturating_mul(2) {
            return Err(oom());
        }
        let mut st = self.lock();
        let st = &mut *st;
        let stolen = st.index.take_or_steal(stream, block, align, |after| {
            self.pages.order_after(stream, after)
        })?;
        let addr = match stolen {
            Some(addr) => addr,
            None => {
                self.reserve(st, need, stream)?;
                st.index.take(stream, block, align).ok_or_else(oom)?
            }
        };
        let r = st.region_of(addr).ok_or_else(oom)?;
        if let Err(e) = self.commit(st, r, addr, block) {
            // Back to the free ranges, on this stream (ordered after any other already).
            let _ = st.index.free(addr, stream);
            return Err(e);
        }
        NonNull::new(std::ptr::with_exposed_provenance_mut(addr)).ok_or_else(oom)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, _align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        let addr = ptr.as_ptr() as usize;
        let mut st = self.lock();
        // The index knows the block's size; an address it never handed out is ignored.
        let Some(r) = st.region_of(addr) else {
            return;
        };
        let Some(block) = st.index.free(addr, stream) else {
            return;
        };
        self.uncommit(&mut st, r, addr, block, true);
    }

    fn synchronize(&self, stream: StreamRef) -> Result<()> {
        self.pages.synchronize(stream)
    }

    fn order_after(&self, stream: StreamRef, after: StreamRef) -> Result<()> {
        self.pages.order_after(stream, after)
    }

    fn name(&self) -> &'static str {
        NAME
    }

    /// `vmm(device=0, …)` (or `vmm(simulated=…, …)`), leaving out what the defaults give.
    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let default = VirtualMemoryConfig::default();
        let mut item = self.pages.describe_fields(ItemWriter::leaf(f, "vmm"));
        if self.config.max != default.max {
            item = item.size("max", self.config.max);
        }
        if self.config.cache != default.cache {
            item = item.size("cache", self.config.cache);
        }
        if self.config.reservation != default.reservation {
            item = item.size("reservation", self.config.reservation);
        }
        item.finish()
    }
}

// SAFETY: a block grows only into the free range right after it on `stream`'s own list (the
// caller frees it on `stream` or after it, so the work that freed those bytes on `stream` is
// ordered before any other use), every page under the grown block is mapped and enabled before
// `true` is returned, and the index records the new size, by which `deallocate` frees whatever
// size it is passed; on failure the block and its pages are as before.
unsafe impl<P: PhysicalPages> crate::resource::GrowInPlace for VirtualMemory<P> {
    /// Grows into the free virtual range right after the block, on the same stream, mapping the
    /// pages it needs. `Ok(false)` for a pointer that is not a live allocation of this resource
    /// of `size`, a smaller `new_size`, a `new_size` beyond the cap, or a neighbour that is
    /// allocated or free on another stream; `Err` where a page cannot be mapped (then the block
    /// is as it was).
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
        let (Some(r), Some((old, new))) =
            (st.region_of(addr), st.index.growth(addr, size, new_size))
        else {
            return Ok(false);
        };
        if new > self.config.max.min(self.pages.capacity()) {
            return Ok(false);
        }
        if new == old {
            return Ok(true);
        }
        // The index must have room for a record for the way back, should mapping fail.
        if !st.index.has_room() || !st.index.grow_in_place(addr, new, stream) {
            return Ok(false);
        }
        if let Err(e) = self.extend(&mut st, r, addr, old, new) {
            // Back to the old size: the index gives the tail back to the free range after it
            // (it has room for the record: checked above), on `stream`.
            st.index.shrink(addr, old, stream);
            return Err(e);
        }
        Ok(true)
    }
}

impl VirtualMemory<super::DevicePages> {
    /// Lets kernels and copies on `peer`'s device read and write this resource's memory: the
    /// pages mapped now (`cuMemSetAccess` over each run of them) and every page mapped later.
    /// Idempotent; the pages' own device always has access. `Unsupported` where the two devices
    /// cannot reach each other. The type does not change: `DeviceAccessible` means the pages'
    /// own device, and uses from `peer` are the caller's to make.
    pub fn grant_access(&self, peer: &cudarc::driver::CudaContext) -> Result<()> {
        let own = self.pages.context();
        if peer.cu_device() == own.cu_device() {
            return Ok(());
        }
        let mut can: std::ffi::c_int = 0;
        // SAFETY: a valid place for the answer; both devices are live handles.
        unsafe {
            cudarc::driver::sys::cuDeviceCanAccessPeer(&mut can, peer.cu_device(), own.cu_device())
        }
        .result()
        .map_err(|e| AllocError::cuda(e, 0, 0, NAME))?;
        if can == 0 {
            return Err(AllocError::new(
                crate::resource::AllocErrorKind::Unsupported(
                    "the peer device cannot access these pages' device (cuDeviceCanAccessPeer)",
                ),
                0,
                0,
                NAME,
            ));
        }
        // Under the lock, so that no page is mapped between the two steps without the grant.
        let st = self.lock();
        if self.pages.has_peer(peer.cu_device()) {
            return Ok(());
        }
        for region in &st.regions {
            let mut p = 0;
            while p < region.mapped.0.len() * 64 {
                if !region.mapped.get(p) {
                    p += 1;
                    continue;
                }
                let start = p;
                while p < region.mapped.0.len() * 64 && region.mapped.get(p) {
                    p += 1;
                }
                let (addr, len) = (region.base + start * self.page, (p - start) * self.page);
                // SAFETY: pages `start..p` of this region are mapped by these pages' source.
                unsafe { self.pages.set_access(addr, len, &[peer.cu_device()]) }?;
            }
        }
        // Last: a failure above leaves the peer out, to be granted again in full.
        self.pages.add_peer(peer.cu_device());
        Ok(())
    }
}

impl<P: PhysicalPages> Drop for VirtualMemory<P> {
    fn drop(&mut self) {
        let page = self.page;
        let mut guard = self.lock();
        let st = &mut *guard;
        // Wait for the streams that freed blocks since the last trim: then no work uses a page
        // without a live block. If that fails, work may still use them: leak them all.
        if self.synchronize_freed(st).is_err() {
            return;
        }
        // The pages of blocks still allocated: their owners were leaked (`mem::forget`), and
        // device work may still use them. Those pages and their ranges are leaked too.
        let mut live: Vec<Bits> = st.regions.iter().map(|_| Bits::default()).collect();
        for (addr, size) in st.index.live_blocks() {
            if let Some(r) = st.region_of(addr) {
                let (first, last, _, _) = page_span(st.regions[r].base, addr, size, self.shift);
                live[r].grow(last);
                live[r].set(first, last);
            }
        }
        for (region, live) in std::mem::take(&mut st.regions).into_iter().zip(live) {
            let mut leaked = false;
            for (p, handle) in region.handles.into_iter().enumerate() {
                if live.0.get(p / 64).is_some_and(|w| w & (1 << (p % 64)) != 0) {
                    leaked = true;
                    continue;
                }
                if let Some(h) = handle {
                    // SAFETY: a mapping of this source with no live block on it, whose last
                    // users were synchronized above; the resource hands out nothing any more.
                    unsafe { self.pages.unmap(region.base + p * page, page, h) };
                }
            }
            if !leaked {
                // SAFETY: a reservation of this source with nothing mapped in it any more.
                unsafe { self.pages.unreserve(region.base, region.size) };
            }
        }
    }
}

static_assertions::assert_impl_all!(
    VirtualMemory<super::DevicePages>: Send,
    Sync,
    crate::property::Accessible<crate::property::DeviceAccessible>
);
static_assertions::assert_not_impl_any!(
    VirtualMemory<super::DevicePages>: crate::property::Accessible<crate::property::HostAccessible>
);
static_assertions::assert_not_impl_any!(
    VirtualMemory<crate::leaf::Simulated>: crate::property::Accessible<crate::property::HostAccessible>,
    crate::property::Accessible<crate::property::DeviceAccessible>
);
const _: () =
    assert!(crate::property::alignment_of::<VirtualMemory<crate::leaf::Simulated>>() == 256);

#[cfg(test)]
mod tests {
    //! The ordering of synchronizations, maps, enables and unmaps, seen through a page source
    //! that records them (the trait is sealed, so only the crate can write one).
    use super::*;
    use crate::leaf::pages::sealed::Sealed;
    use crate::leaf::Simulated;
    use crate::stream::StreamId;

    #[derive(Debug, Clone, PartialEq)]
    enum Ev {
        Sync(StreamId),
        Map(usize),
        Enable(usize, usize),
        Unmap(usize),
    }

    #[derive(Debug)]
    struct Recording {
        sim: Simulated,
        log: Mutex<Vec<Ev>>,
    }

    impl Recording {
        fn new(capacity: usize) -> Self {
            Recording {
                sim: Simulated::with_page_size(capacity, P),
                log: Mutex::new(Vec::new()),
            }
        }
        fn push(&self, e: Ev) {
            self.log
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(e);
        }
        fn log(&self) -> Vec<Ev> {
            self.log
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        }
    }

    impl Sealed for Recording {}

    // SAFETY: every call goes to `Simulated`, whose promises hold; recording touches no memory.
    unsafe impl PhysicalPages for Recording {
        type Host = typenum::B0;
        type Device = typenum::B0;
        type Managed = typenum::B0;
        type Page = ();
        fn page_size(&self) -> usize {
            PhysicalPages::page_size(&self.sim)
        }
        fn capacity(&self) -> usize {
            PhysicalPages::capacity(&self.sim)
        }
        fn default_reservation(&self) -> usize {
            self.sim.default_reservation()
        }
        fn reserve(&self, size: usize) -> Result<usize> {
            self.sim.reserve(size)
        }
        unsafe fn unreserve(&self, addr: usize, size: usize) {
            // SAFETY: forwarded from the caller.
            unsafe { self.sim.unreserve(addr, size) }
        }
        unsafe fn map(&self, addr: usize, size: usize) -> Result<()> {
            // SAFETY: forwarded from the caller.
            unsafe { self.sim.map(addr, size) }?;
            self.push(Ev::Map(addr));
            Ok(())
        }
        unsafe fn enable(&self, addr: usize, size: usize) -> Result<()> {
            self.push(Ev::Enable(addr, size));
            Ok(())
        }
        unsafe fn unmap(&self, addr: usize, size: usize, page: ()) {
            self.push(Ev::Unmap(addr));
            // SAFETY: forwarded from the caller.
            unsafe { self.sim.unmap(addr, size, page) }
        }
        fn synchronize(&self, stream: StreamRef) -> Result<()> {
            self.push(Ev::Sync(stream.id()));
            Ok(())
        }
        fn order_after(&self, _: StreamRef, _: StreamRef) -> Result<()> {
            Ok(())
        }
        fn name(&self) -> &'static str {
            "Recording"
        }
        fn describe_fields<'a, 'b>(&self, item: ItemWriter<'a, 'b>) -> ItemWriter<'a, 'b> {
            item.flag("recording", true)
        }
    }

    const P: usize = 64 << 10;

    /// True when every unmap of `page` in `log` comes after a synchronization of `stream`.
    fn synced_before_unmap(log: &[Ev], page: usize, stream: StreamRef) -> bool {
        let unmap = log.iter().position(|e| *e == Ev::Unmap(page));
        let sync = log.iter().position(|e| *e == Ev::Sync(stream.id()));
        unmap.is_none_or(|u| sync.is_some_and(|s| s < u))
    }

    #[test]
    fn a_failed_allocation_keeps_the_stream_to_wait_for() {
        // U is freed on S while S's work may still use it; a failed request on S takes S's
        // blocks (its slot goes) and gives them back: S must still be waited for before U's page
        // is unmapped.
        let rec = Recording::new(1 << 30);
        let config = VirtualMemoryConfig {
            reservation: 5 * P,
            max: 3 * P,
            cache: 1 << 40,
        };
        let vm = VirtualMemory::new(&rec, config).unwrap();
        let (d, s) = (StreamRef::DEFAULT, StreamRef::simulated(1));
        let d0 = vm.allocate(P, 256, d).unwrap();
        let _d1 = vm.allocate(P, 256, d).unwrap();
        let u = vm.allocate(P, 256, s).unwrap();
        let base = d0.as_ptr() as usize;
        assert_eq!(u.as_ptr() as usize, base + 2 * P);
        // SAFETY: live with these sizes.
        unsafe {
            vm.deallocate(u, P, 256, s);
            vm.deallocate(d0, P, 256, d);
        }
        assert!(vm.allocate(3 * P, 256, s).unwrap_err().is_out_of_memory());
        vm.release();
        assert!(
            synced_before_unmap(&rec.log(), base + 2 * P, s),
            "{:?}",
            rec.log()
        );
    }

    #[test]
    fn a_failed_growth_keeps_the_stream_to_wait_for() {
        let rec = Recording::new(1 << 30);
        let config = VirtualMemoryConfig {
            reservation: 6 * P,
            max: 4 * P,
            cache: 1 << 40,
        };
        let vm = VirtualMemory::new(&rec, config).unwrap();
        let (d, s) = (StreamRef::DEFAULT, StreamRef::simulated(1));
        let d0 = vm.allocate(P, 256, d).unwrap();
        let _d2 = vm.allocate(P, 256, d).unwrap();
        let a = vm.allocate(P, 256, d).unwrap();
        let u = vm.allocate(P, 256, s).unwrap();
        let base = d0.as_ptr() as usize;
        assert_eq!(u.as_ptr() as usize, base + 3 * P);
        // SAFETY: live with these sizes.
        unsafe {
            vm.deallocate(u, P, 256, s);
            vm.deallocate(d0, P, 256, d);
        }
        let grown = {
            // SAFETY: `a` is live, owned here, freed on `s`.
            unsafe { crate::resource::GrowInPlace::grow_in_place(&vm, a, P, 256, 4 * P, s) }
        };
        assert!(grown.is_err());
        vm.release();
        assert!(
            synced_before_unmap(&rec.log(), base + 3 * P, s),
            "{:?}",
            rec.log()
        );
    }

    #[test]
    fn a_map_that_fails_midway_leaves_no_page_unenabled() {
        let rec = Recording::new(3 * P);
        let config = VirtualMemoryConfig {
            reservation: 16 * P,
            ..Default::default()
        };
        let vm = VirtualMemory::new(&rec, config).unwrap();
        let d = StreamRef::DEFAULT;
        // Someone else holds a page of the memory: the third page of the block cannot be mapped.
        let other = MemoryResource::allocate(&rec.sim, P, 256, d).unwrap();
        assert!(vm.allocate(3 * P, 256, d).is_err());
        // SAFETY: live with this size.
        unsafe { MemoryResource::deallocate(&rec.sim, other, P, 256, d) };
        let a = vm.allocate(2 * P, 256, d).unwrap();
        let log = rec.log();
        let base = a.as_ptr() as usize;
        for page in [base, base + P] {
            let last_map = log.iter().rposition(|e| *e == Ev::Map(page)).unwrap();
            let enabled = log[last_map..]
                .iter()
                .any(|e| matches!(*e, Ev::Enable(x, n) if x <= page && page < x + n));
            assert!(
                enabled,
                "page {page:#x} of a live block was never enabled: {log:?}"
            );
        }
    }

    #[test]
    fn a_huge_alignment_is_refused_before_any_table_grows() {
        let sim = Simulated::new(64 << 20);
        let vm = VirtualMemory::new(&sim, VirtualMemoryConfig::default()).unwrap();
        for shift in [30, 40, 56, 62] {
            let e = vm.allocate(1, 1 << shift, StreamRef::DEFAULT).unwrap_err();
            assert!(e.is_out_of_memory(), "{e}");
        }
        let p = vm.allocate(1, 1 << 20, StreamRef::DEFAULT).unwrap();
        assert_eq!(p.as_ptr() as usize % (1 << 20), 0);
        // SAFETY: live with this size and alignment.
        unsafe { vm.deallocate(p, 1, 1 << 20, StreamRef::DEFAULT) };
    }
}
