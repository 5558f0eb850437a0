//! [`PhysicalPages`]: what a virtual-memory resource maps its pages from, the CUDA driver's VMM
//! API ([`DevicePages`]) or the simulated device ([`Simulated`](crate::leaf::Simulated)).

use crate::resource::{AllocError, AllocErrorKind, Result};
use crate::stack::ItemWriter;
use crate::stream::StreamRef;
use cudarc::driver::{sys, CudaContext};
use std::sync::Arc;
use typenum::{Bit, B0, B1};

pub(crate) mod sealed {
    /// Only mrstack's page sources: the properties of the memory a
    /// [`VirtualMemory`](crate::leaf::VirtualMemory) gives come from them.
    pub trait Sealed {}
}

/// A source of physical pages mapped into reserved virtual ranges: the device's memory through
/// the CUDA driver's virtual memory management ([`DevicePages`]) or the simulated device
/// ([`Simulated`](crate::leaf::Simulated), which counts mapped pages against its capacity). Sealed:
/// [`VirtualMemory`](crate::leaf::VirtualMemory) takes its properties from it.
///
/// # Safety
///
/// An implementation promises: `reserve` returns a range of `size` bytes (rounded up to the page
/// size), page-aligned, that overlaps no other reservation or allocation and stays reserved until
/// `unreserve`; after `map(addr, size)` returns `Ok` and `enable` covered the range,
/// `[addr, addr + size)` is memory with the `Host`/`Device`/`Migratable` properties below, backed by
/// its own physical pages, until `unmap`; `synchronize` and `order_after` keep the promises of
/// [`MemoryResource`](crate::resource::MemoryResource)'s; once `reached` has said `true` of a
/// mark, or `wait` has returned `Ok` for it, every piece of work queued on the marked stream
/// before `mark` is complete (for `mark` returning `None`: before it returned).
pub unsafe trait PhysicalPages: sealed::Sealed + Send + Sync {
    /// Whether mapped memory is accessible from the host.
    type Host: Bit;
    /// Whether mapped memory is accessible from the device.
    type Device: Bit;
    /// Whether mapped memory migrates.
    type Migratable: Bit;
    /// The physical memory behind one mapping, given back by `unmap`.
    type Page: Send;
    /// A point in one stream's work (an event recorded on it), from [`mark`](Self::mark).
    /// Shared: a thread may query it without the lock of the resource that keeps it.
    type Mark: Send + Sync;

    /// The bytes of a page: every mapping is a multiple of it, at a multiple of it.
    fn page_size(&self) -> usize;
    /// The most physical bytes it could ever map (the device's memory, the simulated capacity):
    /// a request above it is refused before any bookkeeping is sized for it.
    fn capacity(&self) -> usize;
    /// The virtual bytes to reserve at a time when asked for nothing more: room for everything
    /// the source could map, with slack for fragmented address space.
    fn default_reservation(&self) -> usize;
    /// Reserves a virtual range of at least `size` bytes; returns its base.
    fn reserve(&self, size: usize) -> Result<usize>;
    /// Gives a reservation back.
    ///
    /// # Safety
    ///
    /// `addr`/`size` are a reservation of this source (its size as `reserve` rounded it), with
    /// nothing mapped in it.
    unsafe fn unreserve(&self, addr: usize, size: usize);
    /// Backs `[addr, addr + size)` with new physical memory; out of memory when there is none.
    ///
    /// # Safety
    ///
    /// The range is whole pages of a reservation this source made for the caller, none of them
    /// mapped: a caller that could map into another's reservation could change memory under it.
    unsafe fn map(&self, addr: usize, size: usize) -> Result<Self::Page>;
    /// Makes mapped `[addr, addr + size)` accessible as the properties say (the driver grants its
    /// device read and write).
    ///
    /// # Safety
    ///
    /// The range was mapped by the caller through this source.
    unsafe fn enable(&self, addr: usize, size: usize) -> Result<()>;
    /// Unmaps one mapping and gives its physical memory back.
    ///
    /// # Safety
    ///
    /// `addr`/`size`/`page` are one mapping `map` returned, and no work (host or device, queued
    /// or running) uses the range any more.
    unsafe fn unmap(&self, addr: usize, size: usize, page: Self::Page);
    /// Moves the physical memory of the mapping `from`/`page` to `to` (both `size` bytes): as
    /// `unmap(from, size, page)` then `map(to, size)`, which is what it does unless the source
    /// can keep the memory itself, sparing giving it back and making it anew. Returns the page
    /// now mapped at `to` (not yet enabled). On failure nothing is mapped at either, and the
    /// memory was given back.
    ///
    /// # Safety
    ///
    /// As [`unmap`](Self::unmap) for `from`/`size`/`page`, and as [`map`](Self::map) for
    /// `to`/`size`.
    unsafe fn remap(
        &self,
        from: usize,
        to: usize,
        size: usize,
        page: Self::Page,
    ) -> Result<Self::Page> {
        // SAFETY: the caller's promises for each call.
        unsafe {
            self.unmap(from, size, page);
            self.map(to, size)
        }
    }
    /// As [`MemoryResource::synchronize`](crate::resource::MemoryResource::synchronize).
    fn synchronize(&self, stream: StreamRef) -> Result<()>;
    /// As [`MemoryResource::order_after`](crate::resource::MemoryResource::order_after).
    fn order_after(&self, stream: StreamRef, after: StreamRef) -> Result<()>;
    /// Marks the work queued on `stream` so far, without waiting for it; `None` where no work
    /// is ever queued on the stream. An error where the stream cannot be marked now (it captures
    /// a graph, or it is another thread's per-thread stream): its work is then waited for some
    /// other way, or later.
    fn mark(&self, stream: StreamRef) -> Result<Option<Self::Mark>>;
    /// Whether the work before `mark` is complete; never waits.
    fn reached(&self, mark: &Self::Mark) -> Result<bool>;
    /// Waits on the host until the work before `mark` is complete.
    fn wait(&self, mark: &Self::Mark) -> Result<()>;
    /// A short name for errors.
    fn name(&self) -> &'static str;
    /// Writes the fields of the `vmm` text item that name this source (`device=0`,
    /// `simulated=64 MiB`), so that a description builds the same resource again.
    fn describe_fields<'a, 'b>(&self, item: ItemWriter<'a, 'b>) -> ItemWriter<'a, 'b>;
}

impl<P: PhysicalPages + ?Sized> sealed::Sealed for Arc<P> {}
impl<P: PhysicalPages + ?Sized> sealed::Sealed for &P {}

/// Writes the calls of a page source that wraps another, `$inner` (an expression of `self`), and
/// takes its geometry and reservations as they are: `page_size`, `capacity`,
/// `default_reservation`, `reserve` and `unreserve`.
macro_rules! forward_reservations {
    // `self` is named by the caller: a macro's own `self` would be another (hygiene).
    ($s:ident . $field:ident) => {
        $crate::leaf::pages::forward_reservations!(@ $s, $s.$field);
    };
    (** $s:ident) => {
        $crate::leaf::pages::forward_reservations!(@ $s, **$s);
    };
    (@ $s:ident, $($inner:tt)+) => {
        fn page_size(&$s) -> usize {
            $crate::leaf::PhysicalPages::page_size(&$($inner)+)
        }
        fn capacity(&$s) -> usize {
            $crate::leaf::PhysicalPages::capacity(&$($inner)+)
        }
        fn default_reservation(&$s) -> usize {
            $crate::leaf::PhysicalPages::default_reservation(&$($inner)+)
        }
        fn reserve(&$s, size: usize) -> $crate::resource::Result<usize> {
            $crate::leaf::PhysicalPages::reserve(&$($inner)+, size)
        }
        unsafe fn unreserve(&$s, addr: usize, size: usize) {
            // SAFETY: forwarded from the caller.
            unsafe { $crate::leaf::PhysicalPages::unreserve(&$($inner)+, addr, size) }
        }
    };
}
pub(crate) use forward_reservations;

/// Forwards every call to the `PhysicalPages` behind a pointer.
macro_rules! forward_pages {
    () => {
        type Host = P::Host;
        type Device = P::Device;
        type Migratable = P::Migratable;
        type Page = P::Page;
        type Mark = P::Mark;
        forward_reservations!(**self);
        unsafe fn map(&self, addr: usize, size: usize) -> Result<Self::Page> {
            // SAFETY: forwarded from the caller.
            unsafe { (**self).map(addr, size) }
        }
        unsafe fn enable(&self, addr: usize, size: usize) -> Result<()> {
            // SAFETY: forwarded from the caller.
            unsafe { (**self).enable(addr, size) }
        }
        unsafe fn unmap(&self, addr: usize, size: usize, page: Self::Page) {
            // SAFETY: forwarded from the caller.
            unsafe { (**self).unmap(addr, size, page) }
        }
        unsafe fn remap(
            &self,
            from: usize,
            to: usize,
            size: usize,
            page: Self::Page,
        ) -> Result<Self::Page> {
            // SAFETY: forwarded from the caller.
            unsafe { (**self).remap(from, to, size, page) }
        }
        fn synchronize(&self, stream: StreamRef) -> Result<()> {
            (**self).synchronize(stream)
        }
        fn order_after(&self, stream: StreamRef, after: StreamRef) -> Result<()> {
            (**self).order_after(stream, after)
        }
        fn mark(&self, stream: StreamRef) -> Result<Option<Self::Mark>> {
            (**self).mark(stream)
        }
        fn reached(&self, mark: &Self::Mark) -> Result<bool> {
            (**self).reached(mark)
        }
        fn wait(&self, mark: &Self::Mark) -> Result<()> {
            (**self).wait(mark)
        }
        fn name(&self) -> &'static str {
            (**self).name()
        }
        fn describe_fields<'a, 'b>(&self, item: ItemWriter<'a, 'b>) -> ItemWriter<'a, 'b> {
            (**self).describe_fields(item)
        }
    };
}

// SAFETY: every call goes to `P`, whose promises hold for the same ranges.
unsafe impl<P: PhysicalPages + ?Sized> PhysicalPages for Arc<P> {
    forward_pages!();
}

// SAFETY: every call goes to `P`, whose promises hold for the same ranges.
unsafe impl<P: PhysicalPages + ?Sized> PhysicalPages for &P {
    forward_pages!();
}

/// Device memory of one GPU through the CUDA driver's virtual memory management:
/// `cuMemAddressReserve` for address space, `cuMemCreate` + `cuMemMap` + `cuMemSetAccess` for
/// each page, `cuMemUnmap` + `cuMemRelease` to give it back.
///
/// Pages are the device's allocation granularity (`cuMemGetAllocationGranularity`, minimum: 2 MiB
/// on current GPUs) or a power-of-two multiple of it ([`with_page_size`](Self::with_page_size)). Access is
/// granted to this device only, so the memory is `DeviceAccessible` and nothing more.
///
/// ```no_run
/// use mrstack::prelude::*;
/// use mrstack::leaf::DevicePages;
/// use mrstack::{leaf::VirtualMemory, leaf::VirtualMemoryConfig};
///
/// # fn main() -> Result<(), AllocError> {
/// let ctx = mrstack::cuda_context(0)?;
/// let vm = VirtualMemory::new(DevicePages::new(&ctx)?, VirtualMemoryConfig::default())?;
/// let p = vm.allocate(3 << 20, 256, StreamRef::DEFAULT)?;
/// assert_eq!(vm.usage().mapped, 4 << 20); // two 2 MiB pages
/// unsafe { vm.deallocate(p, 3 << 20, 256, StreamRef::DEFAULT) };
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct DevicePages {
    ctx: Arc<CudaContext>,
    page: usize,
    /// The device's allocation granularity, which `page` is a multiple of.
    granularity: usize,
    total: usize,
    /// Other devices granted access to every page mapped from now on
    /// ([`VirtualMemory::grant_access`](crate::leaf::VirtualMemory::grant_access)).
    peers: std::sync::Mutex<Vec<sys::CUdevice>>,
}

impl Clone for DevicePages {
    /// The same device's pages, with the peers granted so far.
    fn clone(&self) -> Self {
        DevicePages {
            ctx: self.ctx.clone(),
            page: self.page,
            granularity: self.granularity,
            total: self.total,
            peers: std::sync::Mutex::new(self.peers()),
        }
    }
}

impl DevicePages {
    const NAME: &'static str = "DevicePages";

    /// Pages of `ctx`'s device at its allocation granularity; an error where the device has no
    /// virtual memory management.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        Self::with_page_size(ctx, 0)
    }

    /// Pages of `page` bytes, rounded up to a power-of-two multiple of the device's granularity
    /// (0 for the granularity itself): 6 MiB on a GPU of 2 MiB granularity gives 8 MiB pages.
    /// Powers of two let [`VirtualMemory`](crate::leaf::VirtualMemory) find a block's pages with
    /// shifts; [`Simulated`](crate::leaf::Simulated)'s pages are rounded the same way.
    ///
    /// Larger pages cost footprint (a block's pages are whole pages) and save the GPU's address
    /// translation: on an H200, a 2 GiB copy took 1.03–1.10 ms on 2 MiB pages, 1.06 on 4 MiB,
    /// 1.02 on 8 MiB and 1.01 on 16 MiB, as on `cudaMalloc`'s memory
    /// ([performance](crate::guide::performance)). They also cost less to move: unmapping a page
    /// and mapping it elsewhere (`VirtualMemory`'s swaps for its bound) took 39 µs whatever the
    /// page's size, from 2 to 64 MiB.
    pub fn with_page_size(ctx: &Arc<CudaContext>, page: usize) -> Result<Self> {
        let err = |e| AllocError::cuda(e, 0, 0, Self::NAME);
        let _current = crate::leaf::make_current(ctx).map_err(err)?;
        let supported = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
            )
            .map_err(err)?;
        if supported == 0 {
            return Err(AllocError::new(
                AllocErrorKind::Unsupported("the device has no virtual memory management"),
                0,
                0,
                Self::NAME,
            ));
        }
        let prop = Self::prop(ctx);
        let mut granularity = 0usize;
        // SAFETY: `prop` is a valid allocation description and `granularity` a valid out pointer.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        }
        .result()
        .map_err(err)?;
        let granularity = granularity.max(1);
        // A power of two at least the granularity is a multiple of it when the granularity is a
        // power of two (every GPU's is); otherwise the multiple stays, and `VirtualMemory`
        // refuses it with a clear error rather than find pages wrongly.
        let page = page
            .max(granularity)
            .checked_next_multiple_of(granularity)
            .and_then(|p| match granularity.is_power_of_two() {
                true => p.checked_next_power_of_two(),
                false => Some(p),
            })
            .ok_or(AllocError::new(
                AllocErrorKind::InvalidArgument("page size overflows"),
                page,
                0,
                Self::NAME,
            ))?;
        let total = ctx.total_mem().map_err(err)?;
        Ok(DevicePages {
            ctx: ctx.clone(),
            page,
            granularity,
            total,
            peers: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Pages of device `ordinal`; `Err(NoDriver)` on a machine without CUDA.
    pub fn on_device(ordinal: usize) -> Result<Self> {
        Self::new(&super::cuda_context(ordinal)?)
    }

    /// The context the pages are made in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The peers granted access so far.
    fn peers(&self) -> Vec<sys::CUdevice> {
        self.peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether `peer` was granted access already.
    pub(crate) fn has_peer(&self, peer: sys::CUdevice) -> bool {
        self.peers().contains(&peer)
    }

    /// Adds `peer` to the devices every later `enable` grants access to.
    pub(crate) fn add_peer(&self, peer: sys::CUdevice) {
        let mut peers = self
            .peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !peers.contains(&peer) {
            peers.push(peer);
        }
    }

    /// Grants `devices` read-write access to `[addr, addr + size)`.
    ///
    /// # Safety
    ///
    /// The range is mapped pages of this source.
    pub(crate) unsafe fn set_access(
        &self,
        addr: usize,
        size: usize,
        devices: &[sys::CUdevice],
    ) -> Result<()> {
        let err = self.err(size);
        let _current = crate::leaf::make_current(&self.ctx).map_err(&err)?;
        let descs: Vec<sys::CUmemAccessDesc> = devices
            .iter()
            .map(|&id| sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id,
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        // SAFETY: the range is mapped pages of this source (the caller's promise); the
        // descriptors are valid for the call.
        unsafe { sys::cuMemSetAccess(addr as sys::CUdeviceptr, size, descs.as_ptr(), descs.len()) }
            .result()
            .map_err(err)
    }

    fn prop(ctx: &CudaContext) -> sys::CUmemAllocationProp {
        // SAFETY: CUmemAllocationProp is plain data; all-zero means no handle types, no flags.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = ctx.cu_device();
        prop
    }

    fn err(&self, size: usize) -> impl Fn(cudarc::driver::DriverError) -> AllocError {
        move |e| AllocError::cuda(e, size, 0, Self::NAME)
    }

    /// Maps the allocation `handle` at `[addr, addr + size)` (this context current); where the
    /// driver refuses, gives the allocation back, so that on failure nothing is left of it.
    ///
    /// # Safety
    ///
    /// `[addr, addr + size)` is whole pages of a reservation of this source, not mapped, and
    /// `handle` an allocation of `size` bytes of this source, mapped nowhere.
    unsafe fn map_or_release(
        &self,
        addr: usize,
        size: usize,
        handle: sys::CUmemGenericAllocationHandle,
    ) -> Result<sys::CUmemGenericAllocationHandle> {
        // SAFETY: the caller's promises; the driver refuses anything else with an error.
        let mapped =
            unsafe { sys::cuMemMap(addr as sys::CUdeviceptr, size, 0, handle, 0) }.result();
        if let Err(e) = mapped {
            // SAFETY: the allocation is mapped nowhere.
            self.ctx
                .record_err(unsafe { sys::cuMemRelease(handle) }.result());
            return Err(self.err(size)(e));
        }
        Ok(handle)
    }
}

impl sealed::Sealed for DevicePages {}

// SAFETY: reservations come from cuMemAddressReserve (page-aligned, disjoint from every other
// mapping and reservation of the process); each `map` backs its range with a new physical
// allocation of this device (cuMemCreate) and `enable` grants this device read-write access (and
// the peers granted so far), so the range is device memory until cuMemUnmap. No host access:
// device, not host, not managed. Streams go to the driver as every CUDA leaf's do.
unsafe impl PhysicalPages for DevicePages {
    type Host = B0;
    type Device = B1;
    type Migratable = B0;
    type Page = sys::CUmemGenericAllocationHandle;
    type Mark = super::driver::StreamMark;

    fn page_size(&self) -> usize {
        self.page
    }

    fn capacity(&self) -> usize {
        self.total
    }

    fn default_reservation(&self) -> usize {
        // Twice the device's memory: a range every mapping fits in however the address space
        // fragments (address space is free; the process has 2^47 bytes of it).
        let twice = self.total.saturating_mul(2);
        twice
            .checked_next_multiple_of(self.page)
            .unwrap_or(twice - twice % self.page)
    }

    fn reserve(&self, size: usize) -> Result<usize> {
        let err = self.err(size);
        let size = size
            .checked_next_multiple_of(self.page)
            .ok_or(AllocError::out_of_memory(size, self.page, Self::NAME))?;
        let _current = crate::leaf::make_current(&self.ctx).map_err(&err)?;
        let mut addr: sys::CUdeviceptr = 0;
        // SAFETY: `addr` is a valid out pointer; no fixed address is asked for.
        unsafe { sys::cuMemAddressReserve(&mut addr, size, self.page, 0, 0) }
            .result()
            .map_err(err)?;
        Ok(addr as usize)
    }

    unsafe fn unreserve(&self, addr: usize, size: usize) {
        let _current = crate::leaf::make_current_or_record(&self.ctx);
        // SAFETY: the caller passes a reservation of this source with nothing mapped in it.
        let r = unsafe { sys::cuMemAddressFree(addr as sys::CUdeviceptr, size) }.result();
        self.ctx.record_err(r);
    }

    unsafe fn map(&self, addr: usize, size: usize) -> Result<Self::Page> {
        let err = self.err(size);
        let _current = crate::leaf::make_current(&self.ctx).map_err(&err)?;
        let prop = Self::prop(&self.ctx);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` describes device memory of this device; `handle` is a valid out pointer;
        // the driver checks `size` against the granularity and returns an error otherwise.
        unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) }
            .result()
            .map_err(&err)?;
        // SAFETY: `[addr, addr + size)` is whole pages of the caller's reservation, not mapped
        // (this function's contract); the handle was just created, `size` bytes.
        unsafe { self.map_or_release(addr, size, handle) }
    }

    unsafe fn enable(&self, addr: usize, size: usize) -> Result<()> {
        let mut devices = vec![self.ctx.cu_device()];
        devices.extend(self.peers());
        // SAFETY: the range is the caller's mapping (this function's contract).
        unsafe { self.set_access(addr, size, &devices) }
    }

    unsafe fn unmap(&self, addr: usize, size: usize, page: Self::Page) {
        let _current = crate::leaf::make_current_or_record(&self.ctx);
        // SAFETY: one mapping of this source that nothing uses any more (the caller's contract).
        let r = unsafe { sys::cuMemUnmap(addr as sys::CUdeviceptr, size) }.result();
        self.ctx.record_err(r);
        // SAFETY: the handle was mapped only there, and is unmapped now.
        self.ctx
            .record_err(unsafe { sys::cuMemRelease(page) }.result());
    }

    /// `cuMemUnmap` at `from`, then `cuMemMap` of the same allocation at `to`: a swap of pages
    /// spares `cuMemRelease` and `cuMemCreate`, about a third of its cost on an H200.
    unsafe fn remap(
        &self,
        from: usize,
        to: usize,
        size: usize,
        page: Self::Page,
    ) -> Result<Self::Page> {
        let current = crate::leaf::make_current(&self.ctx);
        // SAFETY: one mapping of this source that nothing uses any more (the caller's contract).
        let unmapped = current
            .is_ok()
            .then(|| unsafe { sys::cuMemUnmap(from as sys::CUdeviceptr, size) }.result());
        if unmapped != Some(Ok(())) {
            // Still mapped at `from`, or unknown: the allocation must not be mapped twice.
            if let Some(r) = unmapped {
                self.ctx.record_err(r);
            }
            // SAFETY: the caller's contract for `from` (unmapping it again is harmless) and `to`.
            return unsafe {
                self.unmap(from, size, page);
                self.map(to, size)
            };
        }
        // SAFETY: `[to, to + size)` is whole pages of the caller's reservation, not mapped (the
        // contract); the allocation is `size` bytes and mapped nowhere now.
        unsafe { self.map_or_release(to, size, page) }
    }

    fn synchronize(&self, stream: StreamRef) -> Result<()> {
        super::driver_synchronize(&self.ctx, stream, Self::NAME)
    }

    fn order_after(&self, stream: StreamRef, after: StreamRef) -> Result<()> {
        super::driver_order_after(&self.ctx, stream, after, Self::NAME)
    }

    fn mark(&self, stream: StreamRef) -> Result<Option<Self::Mark>> {
        super::driver::StreamMark::record(&self.ctx, stream, Self::NAME)
    }

    fn reached(&self, mark: &Self::Mark) -> Result<bool> {
        mark.reached(Self::NAME)
    }

    fn wait(&self, mark: &Self::Mark) -> Result<()> {
        mark.wait(Self::NAME)
    }

    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn describe_fields<'a, 'b>(&self, item: ItemWriter<'a, 'b>) -> ItemWriter<'a, 'b> {
        let item = item.number("device", self.ctx.ordinal());
        if self.page == self.granularity {
            item
        } else {
            item.size("page", self.page)
        }
    }
}

static_assertions::assert_impl_all!(DevicePages: Send, Sync, PhysicalPages);
