//! `Simulated`: a fake address space that hands out aligned ranges with no memory behind them.

use crate::resource::{
    align_up, check_request, properties, AllocError, AllocErrorKind, MemoryResource, Result,
};
use crate::stream::StreamRef;
use std::collections::{BTreeMap, HashMap};
use std::ptr::NonNull;
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
/// reused until the address space runs out with nothing live), so a use-after-free in a test
/// shows up as an unknown pointer; `deallocate` panics on
/// a pointer that is not live or a size that differs from the allocation's.
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
/// [`AllocErrorKind::OutOfMemory`](crate::AllocErrorKind::OutOfMemory).
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

impl Simulated {
    const NAME: &'static str = "Simulated";
    /// Where the fake address space starts: far from null and from real heap addresses.
    const BASE: usize = 1 << 44;
    /// The default page: 2 MiB, the granularity CUDA maps device memory in.
    const PAGE: usize = 2 << 20;

    /// An address space that lets at most `capacity` bytes be allocated at once.
    pub fn new(capacity: usize) -> Self {
        Self::with_page_size(capacity, Self::PAGE)
    }

    /// An address space of `capacity` bytes whose physical pages (for
    /// [`VirtualMemory`](crate::VirtualMemory) over it) are `page` bytes: a power of two of at
    /// least 4 KiB; other values are rounded up to one.
    pub fn with_page_size(capacity: usize, page: usize) -> Self {
        let page = page
            .max(4096)
            .checked_next_power_of_two()
            .unwrap_or(Self::PAGE);
        Simulated {
            capacity,
            page,
            state: Mutex::new(State {
                next: Self::BASE,
                ..State::default()
            }),
        }
    }

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

    /// Takes `size` bytes (`bytes` rounded up to a page) of fresh address space from the bump
    /// pointer, aligned to `align`.
    fn bump(s: &mut State, size: usize, align: usize) -> Option<usize> {
        let fits = |next: usize| {
            let addr = align_up(next, align)?;
            Some((addr, addr.checked_add(size)?))
        };
        // The address space runs out long before the capacity when huge blocks come and go (a
        // log replayed pass after pass): once nothing is live, start over at the base.
        let (addr, end) = match fits(s.next) {
            None if s.live.is_empty() && s.reserved.is_empty() => fits(Self::BASE)?,
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

// SAFETY: ranges are carved from a bump pointer, which goes back to the base only when no range is
// live, so no two live ranges overlap;
// each is aligned to max(align, 256). The type claims no access property, so nothing dereferences it.
unsafe impl MemoryResource for Simulated {
    properties!(
        Host = B0,
        Device = B0,
        Managed = B0,
        Pageable = B0,
        Alignment = U256
    );

    fn allocate(&self, size: usize, align: usize, _: StreamRef) -> Result<NonNull<u8>> {
        if let Some(empty) = check_request::<Self>(size, align, Self::NAME)? {
            return Ok(empty);
        }
        let oom = AllocError::out_of_memory(size, align, Self::NAME);
        let mut s = self.lock();
        if size > self.capacity - s.in_use {
            return Err(oom);
        }
        let addr = Self::bump(&mut s, size, align.max(256)).ok_or(oom)?;
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
    fn synchronize(&self, _: StreamRef) -> Result<()> {
        Ok(())
    }

    fn order_after(&self, _: StreamRef, _: StreamRef) -> Result<()> {
        Ok(())
    }

    fn name(&self) -> &'static str {
        Self::NAME
    }

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
    type Managed = B0;
    type Page = ();

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
        let addr = Self::bump(&mut s, size, self.page).ok_or(oom)?;
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

    fn synchronize(&self, _: StreamRef) -> Result<()> {
        Ok(())
    }

    fn order_after(&self, _: StreamRef, _: StreamRef) -> Result<()> {
        Ok(())
    }

    fn name(&self) -> &'static str {
        Self::NAME
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
    Simulated: crate::Accessible<crate::HostAccessible>,
    crate::Accessible<crate::DeviceAccessible>
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
