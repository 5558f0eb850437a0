//! `Simulated`: a fake address space that hands out aligned ranges with no memory behind them.

use crate::resource::{
    align_up, check_request, no_stream_work, properties, AllocError, AllocErrorKind,
    MemoryResource, Result,
};
use crate::stream::StreamRef;
use std::collections::{BTreeMap, HashMap};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use typenum::{B0, U256};

/// A fake address space of `capacity` bytes.
///
/// It hands out aligned address ranges with no memory behind them. It has no properties (neither
/// host- nor device-accessible: nothing may dereference what it returns), a capacity in bytes, and
/// exact accounting — bytes in use ([`in_use`](Self::in_use)), [`peak`](Self::peak), live
/// allocations ([`live`](Self::live)) — so that every suballocator can be tested, fuzzed and
/// replayed at any size on a machine with no GPU, and a test can check that a stack gave back
/// everything it took. Each allocation gets a fresh range from a bump pointer (addresses are not
/// reused until the instance's address range runs out with nothing live), so a use-after-free in
/// a test shows up as an unknown pointer; `deallocate` panics on
/// a pointer that is not live or a size that differs from the allocation's.
///
/// Each instance has an address range of its own, so that blocks of two instances in one stack
/// (a bin's own `Simulated` inside a `Simulated` stack) never overlap: 256 times its capacity
/// (rounded up to a power of two), at least 2^48 bytes, aligned to its size, between 2^48 and
/// 2^63. New instances take the next range up, and start over at the lowest once they reach
/// 2^63 (after 32,767 ranges of 2^48 bytes): an instance shares addresses only with one made
/// before that.
/// An instance of more than 2^52 bytes (4 PiB) has no range of its own: it takes everything from
/// 2^44 up, which other instances' ranges lie in.
///
/// # Cost
///
/// One mutex-protected map: fine for an upstream, not meant to be fast per call. Each operation
/// locks the mutex once and inserts or removes one entry of a `HashMap` of live allocations.
///
/// # Streams
///
/// None: no memory and no device, so nothing is ever queued on a stream to wait for or to order.
/// `allocate` and `deallocate` ignore the stream; `synchronize` and `order_after` return `Ok(())`
/// at once. It keeps no stream alive.
///
/// # Upstream
///
/// None: a leaf. It calls no driver and needs nothing of the machine. Every range is aligned to
/// `max(align, 256)`, and an allocation beyond the capacity left fails with
/// [`AllocErrorKind::OutOfMemory`](crate::resource::AllocErrorKind::OutOfMemory).
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
///
/// let sim = Simulated::new(1 << 20);
/// let p = sim.allocate(1000, 4096, StreamRef::DEFAULT).unwrap();
/// assert_eq!(p.as_ptr() as usize % 4096, 0);
/// assert_eq!((sim.in_use(), sim.live()), (1000, 1));
/// assert!(sim.allocate(1 << 20, 1, StreamRef::DEFAULT).is_err()); // over the capacity
/// // SAFETY: p came from sim with this size and alignment.
/// unsafe { sim.deallocate(p, 1000, 4096, StreamRef::DEFAULT) };
/// assert_eq!((sim.in_use(), sim.peak(), sim.live()), (0, 1000, 0));
/// ```
#[derive(Debug)]
pub struct Simulated {
    capacity: usize,
    /// This instance's address range: every block and reservation lies in `base..end`.
    base: usize,
    end: usize,
    /// The granule of [`PhysicalPages`](crate::leaf::PhysicalPages): what a virtual-memory
    /// resource over it maps at a time.
    page: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next: usize,
    in_use: usize,
    peak: usize,
    allocations: usize,
    live: HashMap<usize, usize>,
    /// Reserved virtual ranges by base, and pages mapped in them by address: the page model
    /// of [`PhysicalPages`](crate::leaf::PhysicalPages). Mapped bytes count in `in_use`.
    reserved: BTreeMap<usize, usize>,
    mapped: BTreeMap<usize, usize>,
    mapped_bytes: usize,
}

/// Writes the accounting accessors of a resource with a `capacity` field and a `lock()` whose
/// guard holds `in_use`, `peak`, `allocations` and a `live` map: what `Simulated` and
/// `DeviceStandIn` both report.
macro_rules! usage_accessors {
    () => {
        /// The most bytes that may be allocated at once.
        pub fn capacity(&self) -> usize {
            self.capacity
        }

        /// Bytes allocated now.
        pub fn in_use(&self) -> usize {
            self.lock().in_use
        }

        /// The most bytes allocated at once so far.
        pub fn peak(&self) -> usize {
            self.lock().peak
        }

        /// Allocations made so far (successful calls, zero-size ones excluded).
        pub fn allocation_count(&self) -> usize {
            self.lock().allocations
        }

        /// Allocations not yet given back.
        pub fn live(&self) -> usize {
            self.lock().live.len()
        }
    };
}
#[cfg(feature = "testing")]
pub(crate) use usage_accessors;

impl Simulated {
    const NAME: &'static str = "Simulated";
    /// Where the range of an instance too large for a range of its own starts: far from null
    /// and from real heap addresses.
    const BASE: usize = 1 << 44;
    /// Where instances' own ranges lie: above every user-space address of a 4-level page table,
    /// and below 2^63, so that an address is a non-negative `isize`.
    const LOW: usize = 1 << 48;
    const TOP: usize = 1 << 63;
    /// The smallest range of an instance, and the factor of its capacity a range holds.
    const MIN_RANGE: usize = 1 << 48;
    const RANGE_PER_BYTE: usize = 256;
    /// The largest range handed out: an instance that needs more takes everything from `BASE`.
    const MAX_RANGE: usize = 1 << 60;
    /// The default page: 2 MiB, the granularity CUDA maps device memory in.
    const PAGE: usize = 2 << 20;

    /// An address space that lets at most `capacity` bytes be allocated at once.
    pub fn new(capacity: usize) -> Self {
        Self::with_page_size(capacity, Self::PAGE)
    }

    /// An address space of `capacity` bytes whose physical pages (for
    /// [`VirtualMemory`](crate::leaf::VirtualMemory) over it) are `page` bytes: a power of two of at
    /// least 4 KiB; other values are rounded up to one.
    pub fn with_page_size(capacity: usize, page: usize) -> Self {
        let page = page
            .max(4096)
            .checked_next_power_of_two()
            .unwrap_or(Self::PAGE);
        let (base, end) = Self::range(capacity);
        Simulated {
            capacity,
            base,
            end,
            page,
            state: Mutex::new(State {
                next: base,
                ..State::default()
            }),
        }
    }

    /// A new instance's address range for `capacity` bytes: the next range of its size
    /// (a power of two, aligned to it) in `LOW..TOP`, starting over at `LOW` when the next one
    /// would pass `TOP`; or everything from `BASE` for a capacity no range holds.
    fn range(capacity: usize) -> (usize, usize) {
        /// Where the next range may start: always in `LOW..=TOP`.
        static NEXT: AtomicUsize = AtomicUsize::new(Simulated::LOW);
        let size = capacity
            .checked_next_power_of_two()
            .and_then(|c| c.checked_mul(Self::RANGE_PER_BYTE))
            .map(|r| r.max(Self::MIN_RANGE));
        let Some(size) = size.filter(|&r| r <= Self::MAX_RANGE) else {
            return (Self::BASE, usize::MAX);
        };
        // `next` ≤ TOP = 2^63, which is a multiple of `size` (a power of two, at most 2^60): a
        // base rounded up from `next` is at most TOP, so `base + size` does not overflow.
        let place = |next: usize| {
            let base = next.next_multiple_of(size);
            if base + size <= Self::TOP {
                base
            } else {
                Self::LOW.next_multiple_of(size)
            }
        };
        let next = NEXT
            .fetch_update(Relaxed, Relaxed, |next| Some(place(next) + size))
            .unwrap_or_else(|next| next);
        let base = place(next);
        (base, base + size)
    }

    usage_accessors!();

    /// The page size of its physical-page model.
    pub fn page_size(&self) -> usize {
        self.page
    }

    /// Bytes of pages mapped now (they count in [`in_use`](Self::in_use) and against the
    /// capacity: physical memory).
    pub fn mapped(&self) -> usize {
        self.lock().mapped_bytes
    }

    /// Virtual ranges reserved now (they take no capacity: address space only).
    pub fn reservations(&self) -> usize {
        self.lock().reserved.len()
    }

    /// Takes `size` bytes of fresh address space of this instance's range from the bump
    /// pointer, aligned to `align`.
    fn bump(&self, s: &mut State, size: usize, align: usize) -> Option<usize> {
        let fits = |next: usize| {
            let addr = align_up(next, align)?;
            let end = addr.checked_add(size)?;
            (end <= self.end).then_some((addr, end))
        };
        // The address range runs out long before the capacity when huge blocks come and go (a
        // log replayed pass after pass): once nothing is live, start over at its base.
        let (addr, end) = match fits(s.next) {
            None if s.live.is_empty() && s.reserved.is_empty() => fits(self.base)?,
            found => found?,
        };
        s.next = end;
        Some(addr)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State inconsistent (every update is a few
        // plain stores), so a poisoned lock is still good to use.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

// SAFETY: ranges are carved from a bump pointer within the instance's own address range, which
// goes back to the range's base only when no range is live, so no two live ranges overlap;
// each is aligned to max(align, 256) and lies at 2^44 or above, never null. The type claims no
// access property, so nothing dereferences it.
unsafe impl MemoryResource for Simulated {
    properties! { Host = B0, Device = B0, Migratable = B0, Pageable = B0, Alignment = U256 }

    fn allocate(&self, size: usize, align: usize, _: StreamRef) -> Result<NonNull<u8>> {
        if let Some(empty) = check_request::<Self>(size, align, Self::NAME)? {
            return Ok(empty);
        }
        let oom = AllocError::out_of_memory(size, align, Self::NAME);
        let mut s = self.lock();
        if size > self.capacity - s.in_use {
            return Err(oom);
        }
        let addr = self.bump(&mut s, size, align.max(256)).ok_or(oom)?;
        s.in_use += size;
        s.peak = s.peak.max(s.in_use);
        s.allocations += 1;
        s.live.insert(addr, size);
        NonNull::new(std::ptr::without_provenance_mut(addr)).ok_or(oom)
    }

    /// # Panics
    ///
    /// On a pointer that is not live here or a size that differs from the allocation's: the
    /// caller broke `deallocate`'s contract, and a test upstream says so loudly.
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, _: usize, _: StreamRef) {
        if size == 0 {
            return;
        }
        let mut s = self.lock();
        let addr = ptr.as_ptr() as usize;
        match s.live.remove(&addr) {
            Some(n) if n == size => s.in_use -= size,
            Some(n) => {
                panic!("Simulated: {addr:#x} was allocated with {n} bytes, freed with {size}")
            }
            None => panic!("Simulated: {addr:#x} is not a live allocation (double free?)"),
        }
    }

    // No memory and no device: nothing is ever queued on a stream to wait for or to order.
    no_stream_work!(name = Self::NAME);

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        crate::stack::ItemWriter::leaf(f, "simulated")
            .size("capacity", self.capacity)
            .finish()
    }
}

impl crate::leaf::pages::sealed::Sealed for Simulated {}

// SAFETY: `reserve` hands out fresh ranges of the bump pointer (never overlapping a live
// allocation or another reservation), page-aligned; mapping checks the range lies in one
// reservation and is not mapped yet, and counts it against the capacity. Nothing is ever
// dereferenced (no access property), and there are no streams to order.
unsafe impl crate::leaf::PhysicalPages for Simulated {
    type Host = B0;
    type Device = B0;
    type Migratable = B0;
    type Page = ();
    type Mark = ();

    fn page_size(&self) -> usize {
        self.page
    }

    /// The capacity, or 2^20 pages if less (2 TiB of 2 MiB pages): a virtual-memory resource
    /// keeps a few bytes per page, so the model keeps a test's host memory small whatever
    /// capacity it is given.
    fn capacity(&self) -> usize {
        self.capacity.min(self.page.saturating_mul(1 << 20))
    }

    fn default_reservation(&self) -> usize {
        // Twice the capacity (room for fragmentation of the address space).
        crate::leaf::PhysicalPages::capacity(self).saturating_mul(2)
    }

    fn reserve(&self, size: usize) -> Result<usize> {
        let oom = AllocError::out_of_memory(size, self.page, Self::NAME);
        let size = align_up(size, self.page).ok_or(oom)?;
        if size == 0 {
            return Err(AllocError::new(
                AllocErrorKind::InvalidArgument("an empty reservation"),
                0,
                self.page,
                Self::NAME,
            ));
        }
        let mut s = self.lock();
        let addr = self.bump(&mut s, size, self.page).ok_or(oom)?;
        s.reserved.insert(addr, size);
        Ok(addr)
    }

    /// # Panics
    ///
    /// On a range that is not a reservation, or one with pages still mapped.
    unsafe fn unreserve(&self, addr: usize, size: usize) {
        let mut s = self.lock();
        assert_eq!(
            s.reserved.remove(&addr),
            Some(size),
            "Simulated: {addr:#x} is not a reservation of {size} bytes"
        );
        assert!(
            s.mapped.range(addr..addr + size).next().is_none(),
            "Simulated: {addr:#x} unreserved with pages still mapped"
        );
    }

    /// An invalid argument for a range outside a reservation, off its pages, or overlapping a
    /// mapping (a virtual-memory resource never asks for one: its tests see the error).
    unsafe fn map(&self, addr: usize, size: usize) -> Result<()> {
        let mut s = self.lock();
        let bad = |why| {
            Err(AllocError::new(
                AllocErrorKind::InvalidArgument(why),
                size,
                self.page,
                Self::NAME,
            ))
        };
        let Some(end) = addr.checked_add(size) else {
            return bad("the range to map overflows");
        };
        let inside = s
            .reserved
            .range(..=addr)
            .next_back()
            .is_some_and(|(&base, &len)| end <= base + len);
        if !inside || addr % self.page != 0 || size % self.page != 0 || size == 0 {
            return bad("the range to map is not whole pages of a reservation");
        }
        let before = s.mapped.range(..end).next_back();
        if before.is_some_and(|(&a, &n)| a + n > addr) {
            return bad("the range to map overlaps a mapping");
        }
        let model = crate::leaf::PhysicalPages::capacity(self);
        if size > self.capacity - s.in_use || size > model - s.mapped_bytes {
            return Err(AllocError::out_of_memory(size, self.page, Self::NAME));
        }
        s.mapped.insert(addr, size);
        s.in_use += size;
        s.mapped_bytes += size;
        s.peak = s.peak.max(s.in_use);
        Ok(())
    }

    unsafe fn enable(&self, _: usize, _: usize) -> Result<()> {
        Ok(())
    }

    /// # Panics
    ///
    /// On a range that was not mapped with this size.
    unsafe fn unmap(&self, addr: usize, size: usize, _: ()) {
        let mut s = self.lock();
        assert_eq!(
            s.mapped.remove(&addr),
            Some(size),
            "Simulated: {addr:#x} is not a mapping of {size} bytes"
        );
        s.in_use -= size;
        s.mapped_bytes -= size;
    }

    no_stream_work!(name = Self::NAME);

    /// No work is ever queued: nothing to wait for.
    fn mark(&self, _: StreamRef) -> Result<Option<()>> {
        Ok(None)
    }

    fn reached(&self, _: &()) -> Result<bool> {
        Ok(true)
    }

    fn wait(&self, _: &()) -> Result<()> {
        Ok(())
    }

    fn describe_fields<'a, 'b>(
        &self,
        item: crate::stack::ItemWriter<'a, 'b>,
    ) -> crate::stack::ItemWriter<'a, 'b> {
        let item = item.size("simulated", self.capacity);
        if self.page == Self::PAGE {
            item
        } else {
            item.size("page", self.page)
        }
    }
}

static_assertions::assert_impl_all!(Simulated: Send, Sync);
static_assertions::assert_not_impl_any!(
    Simulated: crate::property::Accessible<crate::property::HostAccessible>,
    crate::property::Accessible<crate::property::DeviceAccessible>
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_aligned_disjoint_and_accounted() {
        let sim = Simulated::new(10_000);
        let a = sim.allocate(1000, 1, StreamRef::DEFAULT).unwrap();
        let b = sim.allocate(3000, 4096, StreamRef::DEFAULT).unwrap();
        assert_eq!(a.as_ptr() as usize % 256, 0);
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert!(b.as_ptr() as usize >= a.as_ptr() as usize + 1000);
        assert_eq!((sim.in_use(), sim.peak(), sim.live()), (4000, 4000, 2));
        let err = sim.allocate(7000, 1, StreamRef::DEFAULT).unwrap_err();
        assert!(err.is_out_of_memory());
        // SAFETY: a is live with this size.
        unsafe { sim.deallocate(a, 1000, 1, StreamRef::DEFAULT) };
        assert_eq!((sim.in_use(), sim.peak(), sim.live()), (3000, 4000, 1));
        // SAFETY: b is live with this size.
        unsafe { sim.deallocate(b, 3000, 4096, StreamRef::DEFAULT) };
        assert_eq!(sim.in_use(), 0);
        assert_eq!(sim.allocation_count(), 2);
    }

    #[test]
    fn instances_hand_out_disjoint_ranges() {
        use crate::leaf::PhysicalPages;
        let d = StreamRef::DEFAULT;
        let sims: Vec<_> = [1 << 20, 1 << 30, 1 << 20, 1 << 40, 1 << 52]
            .into_iter()
            .map(Simulated::new)
            .collect();
        // Each instance's first blocks, and a reservation of one of them, all live at once.
        let mut blocks = Vec::new();
        for sim in &sims {
            for size in [4096, sim.capacity() / 2] {
                let p = sim.allocate(size, 256, d).unwrap();
                assert_eq!(p.as_ptr() as usize % 256, 0);
                blocks.push((p.as_ptr() as usize, size));
            }
        }
        let reserved = sims[0].reserve(8 << 20).unwrap();
        blocks.push((reserved, 8 << 20));
        blocks.sort_unstable();
        for pair in blocks.windows(2) {
            let ((a, n), (b, _)) = (pair[0], pair[1]);
            assert!(a + n <= b, "{a:#x} + {n} overlaps {b:#x}");
        }
        // SAFETY: the reservation is sims[0]'s, with nothing mapped.
        unsafe { sims[0].unreserve(reserved, 8 << 20) };
    }

    #[test]
    #[should_panic(expected = "not a live allocation")]
    fn double_free_is_caught() {
        let sim = Simulated::new(1 << 20);
        let a = sim.allocate(64, 1, StreamRef::DEFAULT).unwrap();
        // SAFETY: a is live with this size.
        unsafe { sim.deallocate(a, 64, 1, StreamRef::DEFAULT) };
        // SAFETY: deliberately broken (a double free): Simulated must catch it before any harm.
        unsafe { sim.deallocate(a, 64, 1, StreamRef::DEFAULT) };
    }
}
