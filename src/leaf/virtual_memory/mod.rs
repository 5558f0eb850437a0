//! `VirtualMemory`: blocks carved from a reserved virtual range, with physical pages mapped only where live blocks are.

use super::pages::PhysicalPages;
use crate::resource::{check_request, AllocError, MemoryResource, Result};
use crate::stack::ItemWriter;
use crate::stream::StreamRef;
use crate::suballoc::tlsf_index::TlsfIndex;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use typenum::U256;

/// What a resource over a field `pages` of type `P: PhysicalPages` takes from it: the properties
/// of its memory (those of the pages; not pageable; 256-byte alignment) and its stream calls,
/// which every heap, region and mapping of the resource shares; and its `name`, the module's
/// `NAME`.
macro_rules! page_leaf {
    () => {
        crate::resource::properties!(
            Host = P::Host,
            Device = P::Device,
            Migratable = P::Migratable,
            Pageable = typenum::B0,
            Alignment = U256
        );

        crate::resource::streams_through!(self.pages);
    };
}

mod bitset;
mod cache;
mod heaps;
mod mapping;
mod region;
mod table;

pub use heaps::{PagedHeaps, PagedHeapsConfig};

use region::{page_span, State};

const NAME: &str = "VirtualMemory";

/// The state of a `VirtualMemory` over `P`, locked.
type Guard<'a, P> = MutexGuard<'a, State<<P as PhysicalPages>::Page, <P as PhysicalPages>::Mark>>;

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
    /// Keeps the pages mapped within the most bytes of pages live blocks have needed so far
    /// plus a slack: this, or a 64th of that peak if less, and a page at least. A block that
    /// needs new pages beyond it first unmaps wholly free pages whose freeing work is done (an
    /// event recorded on the streams that freed them reached), the highest first, so that what
    /// is mapped does not rise above the bound while such pages remain; where too few are, it
    /// waits up to 200 ms for events recorded by an earlier call, and pages whose work still
    /// runs go once their events are reached. Where swapping pages for the bound (the remap and
    /// the new page's access grant) takes over a fortieth of the wall time over a second, a
    /// quarter over a tenth of one, or half over 20 ms (16 swaps at least), the slack doubles, up
    /// to 64 times: a program that does little but allocate soon maps nothing more.
    /// `usize::MAX` (the default): no such bound.
    pub peak_slack: usize,
}

impl Default for VirtualMemoryConfig {
    fn default() -> Self {
        VirtualMemoryConfig {
            reservation: 0,
            max: usize::MAX,
            cache: usize::MAX,
            peak_slack: usize::MAX,
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
    /// Pages mapped so far (each a `cuMemCreate` + `cuMemMap` on a GPU, or only a `cuMemMap`
    /// where the memory of a page unmapped in its place moved to it).
    pub maps: u64,
    /// Pages unmapped so far (each a `cuMemUnmap` on a GPU, and a `cuMemRelease` unless its
    /// memory moved to a page mapped in its place).
    pub unmaps: u64,
    /// Time requests spent waiting on the host for device work so far: the bounded waits for
    /// events before mapping beyond the peak bound, and the synchronizations before memory
    /// pressure, `release` or drop unmap free pages.
    pub waited: std::time::Duration,
    /// Host bytes of the page tables: what is known of each page, in chunks of 256 pages made
    /// when a block first lies in them and freed once none of their pages is mapped or partly
    /// under a live block. So it follows live blocks and mapped pages, not the reservation.
    pub page_table_bytes: usize,
    /// How many times the peak slack has doubled because unmapping and swapping pages for the
    /// bounds took too much of the time ([`VirtualMemoryConfig::peak_slack`]): under a
    /// `peak_slack`, the bound on mapped pages is the peak of live pages plus the slack times
    /// two to this power (with none, it widens nothing).
    pub slack_doublings: u32,
    /// Allocations of a [`PagedHeaps`] that found their stream's heap held by another thread
    /// (and waited for it, or, where more than four threads met there, went to the calling
    /// thread's own heap): threads allocating on one stream at once, which [`PagedHeaps`] says
    /// the cost of. Always 0 for a `VirtualMemory` alone.
    pub busy: u64,
    /// Allocations of a [`PagedHeaps`] placed in another heap's mapped pages, where mapping
    /// pages in their own would take all heaps beyond the peak of their live pages and its
    /// slack. Always 0 for a `VirtualMemory` alone.
    pub borrowed: u64,
}

/// How [`VirtualMemory::allocate_with`] takes the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lock {
    /// Waits for it.
    Wait,
    /// Gives up at once where another thread holds it ([`Attempt::Held`]).
    Try,
}

/// Where [`VirtualMemory::allocate_with`] may place a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Room {
    /// Anywhere: pages are mapped and ranges reserved as the block needs.
    Any,
    /// Only where every page under the block is mapped already, in the stream's free ranges
    /// or another stream's (after `order_after`); [`Attempt::NoRoom`] otherwise.
    Mapped,
    /// As [`Mapped`](Self::Mapped), in the stream's own free ranges only: a block for another
    /// heap's thread, placed only where it costs no wait on another stream.
    Borrowed,
}

/// What [`VirtualMemory::allocate_with`] did.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// Another thread held the lock ([`Lock::Try`]); nothing was done.
    Held,
    /// No free range with its pages mapped fits ([`Room::Mapped`], [`Room::Borrowed`]); nothing
    /// was done.
    NoRoom,
    /// The allocation, or why it failed.
    Done(Result<NonNull<u8>>),
}

impl Attempt {
    /// The allocation of an attempt that waited for the lock with room to map, which ends
    /// `Done`: the other two read as `oom`.
    pub(crate) fn done_or(self, oom: impl FnOnce() -> AllocError) -> Result<NonNull<u8>> {
        match self {
            Attempt::Done(done) => done,
            Attempt::Held | Attempt::NoRoom => Err(oom()),
        }
    }
}

/// How long a heap keeps what it needed lately when others need pages
/// ([`VirtualMemory::give_up`]): one or two of these.
pub(super) const RECENT: std::time::Duration = std::time::Duration::from_millis(100);

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
/// `cuMemUnmap` + `cuMemRelease`: tens of microseconds per 2 MiB page together on an H200
/// (`scripts/vmm-costs.py` measures them), which the cache keeps off the path of a workload whose
/// working set repeats. Free pages beyond the bounds (the cache, down to half of it; the peak of
/// live pages and its slack) are unmapped without waiting on the host (but up to 200 ms for events
/// an earlier call recorded, where pages would be mapped beyond the peak bound; an allocation waits
/// without the lock, so that other threads' calls go on, and is then placed again): those whose
/// freeing work is known done (settled) at once, the others after an event recorded on each stream
/// that freed blocks since the last batch is reached (queried at most every 32 calls and every
/// 50 µs, about a microsecond a query); a page that goes live again meanwhile stays, and must
/// settle again once freed.
///
/// The host memory of the page table follows live blocks and mapped pages: it is kept in chunks
/// of 256 pages (about 5 KiB each), made when a block first lies in one and freed once none of
/// its pages is mapped or partly under a live block ([`VmUsage::page_table_bytes`]). A page
/// unmapped for the bounds gives its physical memory to the page mapped in its place
/// ([`PhysicalPages::remap`](crate::leaf::PhysicalPages::remap): `cuMemUnmap`, then `cuMemMap`
/// of the same allocation), which spares `cuMemRelease` and `cuMemCreate`.
///
/// # Streams
///
/// As [`Tlsf`](crate::suballoc::Tlsf): a block freed on stream `S` is reused at once on `S`, and by another
/// stream `T` only after `order_after(T, S)`. A page is unmapped only after the work queued
/// before its blocks' frees is complete (unmapping does not wait for device work; each byte of a
/// wholly free page is in a free block, whose stream is ordered after every use of it): an event
/// recorded on each stream that freed blocks is reached, or, under memory pressure, `release`
/// and drop, those streams are synchronized on the host. Every stream a free block names is kept
/// alive.
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
    state: Mutex<State<P::Page, P::Mark>>,
    /// The share of time swapping pages for the bounds takes, which widens the slack where
    /// swaps would slow the program: its own, or shared by the heaps of a `PagedHeaps`.
    pace: Arc<region::Pace>,
    /// The state's `mapped` bytes and `cached` pages as each call left them, for a
    /// `PagedHeaps` to add up across heaps without taking their locks.
    shown: [AtomicUsize; 2],
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
        Self::with_pace(pages, config, Arc::new(region::Pace::new()))
    }

    /// [`new`](Self::new), counting its swaps in `pace`, which other heaps may share.
    fn with_pace(pages: P, config: VirtualMemoryConfig, pace: Arc<region::Pace>) -> Result<Self> {
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
                owed: 0,
                live_peak: 0,
                recent_peak: 0,
                prior_peak: 0,
                window_at: None,
                batch: None,
                deferred: None,
                waited_for_batch: false,
                ticks: 0,
                events_at: None,
                maps: 0,
                unmaps: 0,
                waited: std::time::Duration::ZERO,
                donate: false,
                donors: Vec::new(),
            }),
            pace,
            shown: [AtomicUsize::new(0), AtomicUsize::new(0)],
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
            maps: st.maps,
            unmaps: st.unmaps,
            waited: st.waited,
            page_table_bytes: st.regions.iter().map(|r| r.pages.bytes()).sum(),
            slack_doublings: self.pace.doublings(),
            busy: 0,
            borrowed: 0,
        }
    }

    /// Unmaps every cached page (after synchronizing the streams with free blocks), and gives
    /// back every reserved range but one that holds no block and no page; returns the physical
    /// bytes given back.
    pub fn release(&self) -> usize {
        let mut st = self.lock();
        let before = st.mapped;
        self.trim(&mut st, 0);
        self.unreserve_free(&mut st);
        self.show(&st);
        before - st.mapped
    }

    /// Gives back every reserved range, but one, with no live block and no page mapped: a range
    /// reserved for one request (a large alignment, a block no free range held) would otherwise
    /// hold address space until the resource drops.
    fn unreserve_free(&self, st: &mut State<P::Page, P::Mark>) {
        let mut r = st.regions.len();
        while r > 0 && st.regions.len() > 1 {
            r -= 1;
            let base = st.regions[r].base;
            if st.regions[r].pages.mapped_pages().next().is_some()
                || st.index.free_chunk_streams(base).is_none()
            {
                continue;
            }
            let Some(chunk) = st.index.remove_chunk(base) else {
                continue;
            };
            st.index.streams.release(chunk.stream);
            let region = st.regions.remove(r);
            // SAFETY: a reservation of this source with nothing mapped in it and no block in it
            // any more.
            unsafe { self.pages.unreserve(region.base, region.size) };
        }
    }

    /// Whether a request could never be served: more than could ever be mapped, or a placement
    /// further into a range than twice that (a huge alignment). Such a request is refused before
    /// a range is reserved for it, so the ranges stay within twice the source's capacity, and
    /// no memory is given back for it.
    pub(crate) fn never_fits(&self, size: usize, align: usize) -> bool {
        let (_, block, need) = crate::suballoc::growth::block_of(size, align);
        self.never_fits_block(block, need)
    }

    /// [`never_fits`](Self::never_fits) for the block and the free bytes `block_of` gave.
    #[inline]
    fn never_fits_block(&self, block: usize, need: usize) -> bool {
        let most = self.most();
        block > most || need > most.saturating_mul(2)
    }

    /// The most physical bytes it could ever map: its cap, or its source's capacity if less.
    #[inline]
    fn most(&self) -> usize {
        self.config.max.min(self.pages.capacity())
    }

    /// An allocation in the room `room` allows, the lock taken as `lock` says, of a request
    /// the caller checked (`check_request` gave `Ok(None)`: a size above zero, within what
    /// `block_of` rounds without overflow, at a power-of-two alignment).
    pub(crate) fn allocate_with(
        &self,
        size: usize,
        align: usize,
        stream: StreamRef,
        lock: Lock,
        room: Room,
    ) -> Attempt {
        debug_assert!(matches!(check_request::<Self>(size, align, NAME), Ok(None)));
        let oom = || AllocError::out_of_memory(size, align, NAME);
        let (align, block, need) = crate::suballoc::growth::block_of(size, align);
        if self.never_fits_block(block, need) {
            return Attempt::Done(Err(oom()));
        }
        let mut guard = match lock {
            Lock::Try => match self.state.try_lock() {
                Ok(st) => st,
                Err(std::sync::TryLockError::Poisoned(p)) => self.recover(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => return Attempt::Held,
            },
            Lock::Wait => self.lock(),
        };
        self.tick(&mut guard);
        let (guard, placed) = self.undone_to_wait(guard, |st| {
            match self.place(st, stream, block, align, room, Some(need)) {
                // A block placed partway into a page touches a page more than its size needs:
                // where that page was what ran short, the block at a page boundary may fit.
                Err(e) if e.is_out_of_memory() && align < self.page => {
                    match self.place(st, stream, block, self.page, room, None) {
                        Err(again) if again.is_out_of_memory() => Err(e),
                        other => other,
                    }
                }
                other => other,
            }
        });
        self.show(&guard);
        // Running short is the caller's request that could not be served, whichever page or
        // range the page source was asked for.
        match placed {
            Ok(None) => Attempt::NoRoom,
            Ok(Some(addr)) => Attempt::Done(
                NonNull::new(std::ptr::with_exposed_provenance_mut(addr)).ok_or_else(oom),
            ),
            Err(e) if e.is_out_of_memory() => Attempt::Done(Err(oom())),
            Err(e) => Attempt::Done(Err(e)),
        }
    }

    /// Places a block of `block` bytes at `align` for `stream` and maps its pages: from the
    /// stream's free ranges, another stream's after `order_after` (but for [`Room::Borrowed`]),
    /// or, given `reserve` (the block with its alignment slack) and [`Room::Any`], a new range of
    /// at least that many bytes. `Ok(None)` where `room` asks for mapped pages and the block
    /// found lies on a page that is not mapped. On failure the index is as before (but for a new
    /// range, kept free).
    fn place(
        &self,
        st: &mut State<P::Page, P::Mark>,
        stream: StreamRef,
        block: usize,
        align: usize,
        room: Room,
        reserve: Option<usize>,
    ) -> Result<Option<usize>> {
        let oom = || AllocError::out_of_memory(block, align, NAME);
        let found = match room {
            Room::Borrowed => st.index.take(stream, block, align),
            Room::Mapped | Room::Any => st.index.take_or_steal(stream, block, align, |after| {
                self.pages.order_after(stream, after)
            })?,
        };
        let addr = match (found, room) {
            (Some(addr), _) => addr,
            (None, Room::Any) => {
                let need = reserve.ok_or_else(oom)?;
                self.reserve(st, need, stream)?;
                st.index.take(stream, block, align).ok_or_else(oom)?
            }
            (None, _) => return Ok(None),
        };
        let r = st.region_of(addr).ok_or_else(oom)?;
        match self.commit(st, r, addr, block, room == Room::Any) {
            Ok(true) => Ok(Some(addr)),
            failed => {
                // Back to the free ranges, on this stream (ordered after any other already).
                let _ = st.index.free(addr, stream);
                failed.map(|_| None)
            }
        }
    }

    /// Frees the block at `addr` on `stream` if `addr` lies in one of its reserved ranges, and
    /// says whether it does. The index knows the block's size; an address in a range that it
    /// never handed out is ignored.
    pub(crate) fn free_if_owned(&self, addr: usize, stream: StreamRef) -> bool {
        let mut st = self.lock();
        // A heap of `PagedHeaps` asked about another's block does nothing, so counts no call.
        let Some(r) = st.region_of(addr) else {
            return false;
        };
        self.tick(&mut st);
        if let Some(block) = st.index.free(addr, stream) {
            self.uncommit(&mut st, r, addr, block, true);
        }
        self.show(&st);
        true
    }

    /// Publishes what `st` holds ([`shown`](Self::shown)).
    #[inline]
    fn show(&self, st: &State<P::Page, P::Mark>) {
        self.shown[0].store(st.mapped, Ordering::Relaxed);
        self.shown[1].store(st.cached, Ordering::Relaxed);
    }

    /// Bytes mapped, bytes of pages under live blocks, and cached pages, as the last call left
    /// them (a hint: read without the lock).
    pub(crate) fn shown(&self) -> (usize, usize, usize) {
        let mapped = self.shown[0].load(Ordering::Relaxed);
        let cached = self.shown[1].load(Ordering::Relaxed);
        (mapped, mapped.saturating_sub(cached * self.page), cached)
    }

    /// Unmaps up to `n` cached pages for a bound across heaps, but only pages beyond what it
    /// needed lately (the peak of its live pages over the last one or two [`RECENT`]s, and its
    /// slack): those whose freeing work is done now and, as the rest settle, in later calls (it
    /// marks the streams that freed them, never waiting); what it owes replaces what an earlier
    /// call asked. A heap that reaches its peak again and again keeps its pages, so that heaps
    /// whose peaks fall at different moments do not swap pages back and forth; a heap whose
    /// thread moved on gives them up. Does nothing where another thread holds the lock.
    /// Returns how many pages it owes now: those it gives up now or as they settle.
    pub(crate) fn give_up(&self, n: usize) -> usize {
        let mut st = match self.state.try_lock() {
            Ok(st) => st,
            Err(std::sync::TryLockError::Poisoned(p)) => self.recover(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => return 0,
        };
        let now = std::time::Instant::now();
        match st.window_at {
            None => st.window_at = Some(now),
            Some(at) if now.duration_since(at) >= RECENT => {
                st.prior_peak = st.recent_peak;
                st.recent_peak = st.live(self.page);
                st.window_at = Some(now);
            }
            Some(_) => {}
        }
        let needed = st.recent_peak.max(st.prior_peak);
        let keep =
            needed.saturating_add(self.pace.slack(self.config.peak_slack, needed, self.page));
        let spare = st.mapped.saturating_sub(keep) / self.page;
        st.owed = n.min(spare);
        let owed = st.owed;
        self.trim_later(&mut st, 0);
        self.show(&st);
        owed
    }

    /// Its reserved ranges, `(base, size)`.
    pub(crate) fn ranges(&self) -> Vec<(usize, usize)> {
        self.lock()
            .regions
            .iter()
            .map(|r| (r.base, r.size))
            .collect()
    }

    /// Runs `attempt` under `guard`; where it was undone to wait for a batch (`deferred` set),
    /// waits for the batch's marks with the lock let go
    /// ([`WAIT_FOR_BATCH`](cache::WAIT_FOR_BATCH) at most), takes the lock again and runs it
    /// once more, with `waited_for_batch` set: it waits no more. Returns the lock and the last
    /// attempt's outcome.
    #[inline]
    fn undone_to_wait<'a, T>(
        &'a self,
        mut guard: Guard<'a, P>,
        mut attempt: impl FnMut(&mut State<P::Page, P::Mark>) -> T,
    ) -> (Guard<'a, P>, T) {
        let done = attempt(&mut guard);
        let Some(marks) = guard.deferred.take() else {
            return (guard, done);
        };
        let mut guard = self.wait_unlocked(guard, &marks);
        guard.waited_for_batch = true;
        let done = attempt(&mut guard);
        guard.waited_for_batch = false;
        (guard, done)
    }

    /// Waits for `marks` with the lock let go, and takes it again.
    #[cold]
    fn wait_unlocked<'a>(&'a self, guard: Guard<'a, P>, marks: &[P::Mark]) -> Guard<'a, P> {
        drop(guard);
        let waited = self.wait_marks(marks, cache::WAIT_FOR_BATCH);
        let mut guard = self.lock();
        guard.waited += waited;
        guard
    }

    fn lock(&self) -> Guard<'_, P> {
        match self.state.lock() {
            Ok(st) => st,
            Err(poisoned) => self.recover(poisoned.into_inner()),
        }
    }

    /// The state behind a poisoned lock, made whole. Every update completes before the next call
    /// to the page source, the only thing that may panic inside the lock (a test source catching
    /// a broken contract), so the state is consistent but for a request cut short: pages
    /// unmapped for the bounds still waiting for a page to take their memory, which go back,
    /// and marks it left to wait for, which are dropped.
    fn recover<'a>(&self, mut st: Guard<'a, P>) -> Guard<'a, P> {
        st.donate = false;
        self.give_back_donors(&mut st);
        // Set and taken within one holding of the lock: the next request must not read them as
        // its own.
        st.deferred = None;
        st.waited_for_batch = false;
        st
    }
}

// SAFETY: blocks are disjoint pieces of reserved ranges (the blocks of a range tile it, each free
// or handed out once), at least `size` bytes, aligned to max(align, 256) (ranges are page-aligned
// and blocks carved at `align` multiples); before `allocate` returns, every page under the block
// is mapped and enabled (`commit`), and a page is unmapped only when no live block overlaps it,
// after the streams that freed blocks on it are synchronized. A block freed on one stream goes to
// another only after `order_after`. The memory has the page source's properties.
unsafe impl<P: PhysicalPages> MemoryResource for VirtualMemory<P> {
    page_leaf!();

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(p) = check_request::<Self>(size, align, NAME)? {
            return Ok(p);
        }
        self.allocate_with(size, align, stream, Lock::Wait, Room::Any)
            .done_or(|| AllocError::out_of_memory(size, align, NAME))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, _align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        self.free_if_owned(ptr.as_ptr() as usize, stream);
    }

    /// `vmm(device=0, …)` (or `vmm(simulated=…, …)`), leaving out what the defaults give.
    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (c, d) = (&self.config, VirtualMemoryConfig::default());
        describe_page_leaf(
            f,
            "vmm",
            &self.pages,
            &[
                ("max", c.max, d.max),
                ("cache", c.cache, d.cache),
                ("reservation", c.reservation, d.reservation),
                ("peak_slack", c.peak_slack, d.peak_slack),
            ],
        )
    }
}

/// Writes text item `name` over `pages` with each size field `(field, value, default)` whose
/// value is not its default, so that the description builds the same resource again.
fn describe_page_leaf<P: PhysicalPages>(
    f: &mut std::fmt::Formatter<'_>,
    name: &str,
    pages: &P,
    sizes: &[(&'static str, usize, usize)],
) -> std::fmt::Result {
    let mut item = pages.describe_fields(ItemWriter::leaf(f, name));
    for &(field, value, default) in sizes {
        if value != default {
            item = item.size(field, value);
        }
    }
    item.finish()
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
        let (_guard, grown) = self.undone_to_wait(self.lock(), |st| {
            let (Some(r), Some((old, new))) =
                (st.region_of(addr), st.index.growth(addr, size, new_size))
            else {
                return Ok(false);
            };
            if new > self.most() {
                return Ok(false);
            }
            if new == old {
                return Ok(true);
            }
            // The index must have room for a record for the way back, should mapping fail.
            if !st.index.has_room() || !st.index.grow_in_place(addr, new, stream) {
                return Ok(false);
            }
            let extended = self.extend(st, r, addr, old, new);
            // Undone to wait for a batch, it is grown again after (the range after it may have
            // gone meanwhile).
            if extended.is_err() || st.deferred.is_some() {
                // Back to the old size: the index gives the tail back to the free range after it
                // (it has room for the record: checked above), on `stream`.
                st.index.shrink(addr, old, stream);
            }
            self.show(st);
            extended.map(|()| true)
        });
        grown
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
            // Runs of mapped pages, `start..end`, one call each.
            let mut run: Option<(usize, usize)> = None;
            let grant = |(start, end): (usize, usize)| {
                let (addr, len) = (region.base + start * self.page, (end - start) * self.page);
                // SAFETY: pages `start..end` of this region are mapped by these pages' source.
                unsafe { self.pages.set_access(addr, len, &[peer.cu_device()]) }
            };
            for p in region.pages.mapped_pages() {
                run = match run {
                    Some((start, end)) if end == p => Some((start, p + 1)),
                    Some(done) => {
                        grant(done)?;
                        Some((p, p + 1))
                    }
                    None => Some((p, p + 1)),
                };
            }
            if let Some(done) = run {
                grant(done)?;
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
        let mut live = std::collections::HashSet::new();
        for (addr, size) in st.index.live_blocks() {
            if let Some(r) = st.region_of(addr) {
                let (first, last, _, _) = page_span(st.regions[r].base, addr, size, self.shift);
                live.extend((first..last).map(|p| (r, p)));
            }
        }
        for (r, region) in std::mem::take(&mut st.regions).into_iter().enumerate() {
            let mut leaked = false;
            for (p, h) in region.pages.drain() {
                if live.contains(&(r, p)) {
                    leaked = true;
                    continue;
                }
                // SAFETY: a mapping of this source with no live block on it, whose last users
                // were synchronized above; the resource hands out nothing any more.
                unsafe { self.pages.unmap(region.base + p * page, page, h) };
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
mod tests;
