//! `SamHeadroom`: system-allocated memory the GPU reaches on HMM/ATS platforms, kept on the GPU
//! only up to its free memory minus a headroom.

use crate::resource::{
    check_request, properties, AllocError, AllocErrorKind, MemoryResource, Result,
};
use crate::stack::ItemWriter;
use crate::stream::StreamRef;
use cudarc::driver::{result, sys, CudaContext};
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;
use typenum::{B0, B1, U256};

/// The host page: allocations are whole pages, so that the placement advice of one never
/// applies to another's bytes.
const PAGE: usize = 4096;

/// System-allocated memory (SAM) with GPU headroom, as RMM's `sam_headroom_memory_resource`.
///
/// On a platform where the GPU reads and writes pageable host memory (HMM on x86 Linux with the
/// open kernel modules, ATS on Grace Hopper: `CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS`), memory
/// from the system allocator is reachable from host and device and migrates between them. Each
/// allocation is `std::alloc` memory (whole 4 KiB pages); its first part, up to the device's free
/// memory minus `headroom`, is advised to prefer the GPU (`cuMemAdvise` with
/// `SET_PREFERRED_LOCATION`), the rest to prefer the CPU, so that migrations never eat into the
/// headroom other CUDA calls (cuBLAS workspaces, kernels' own allocations) need.
///
/// Its type says host + device + migratable, and that claim is checked where it is made:
/// [`new`](Self::new) refuses, with
/// [`AllocErrorKind::Unsupported`](crate::resource::AllocErrorKind::Unsupported), a device that does not
/// report pageable memory access. So a `SamHeadroom` exists only where kernels may use its memory.
///
/// # Cost
///
/// Per allocation: the global allocator, `cuMemGetInfo`, and one or two `cuMemAdvise` calls
/// (microseconds): meant for large allocations, with a suballocator (`Binning`, `Pool`) in front
/// for small ones, as RMM advises. A deallocation waits for the stream on the host, then frees.
///
/// # Streams
///
/// The memory is usable by any stream at once. `deallocate` synchronizes its stream before the
/// host frees the pages (a host free is ordered on no stream). `synchronize` and `order_after` are
/// the driver's, as for the other CUDA leaves. It keeps no stream alive.
///
/// # Upstream
///
/// None: a leaf over `std::alloc` and the CUDA driver (loaded at run time; `NoDriver` without
/// it). Alignment: any power of two up to 4 KiB is met (256 is what the type promises, as for the
/// other CUDA leaves); larger ones are refused.
///
/// # Examples
///
/// ```no_run
/// use mrstack::prelude::*;
/// use mrstack::leaf::SamHeadroom;
///
/// # fn main() -> Result<(), AllocError> {
/// let ctx = mrstack::cuda_context(0)?;
/// // Unsupported where the GPU cannot reach pageable memory.
/// let sam = SamHeadroom::new(&ctx, 2 << 30)?; // keep 2 GiB of the GPU for others
/// let v = DeviceVec::<f32, _>::zeroed(1 << 20, &sam, &ctx.default_stream())?;
/// # drop(v);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SamHeadroom {
    ctx: Arc<CudaContext>,
    headroom: usize,
}

impl SamHeadroom {
    const NAME: &'static str = "SamHeadroom";

    /// System memory for `ctx`'s device, keeping `headroom` bytes of its memory free of
    /// migrations. `Unsupported` where the device does not report pageable memory access.
    pub fn new(ctx: &Arc<CudaContext>, headroom: usize) -> Result<Self, AllocError> {
        let err = |e| AllocError::cuda(e, 0, 0, Self::NAME);
        let _current = crate::leaf::make_current(ctx).map_err(err)?;
        if !Self::supported(ctx)? {
            return Err(AllocError::new(
                AllocErrorKind::Unsupported(
                    "this device cannot access pageable host memory (CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS is 0: no HMM or ATS)",
                ),
                0,
                0,
                Self::NAME,
            ));
        }
        Ok(SamHeadroom {
            ctx: ctx.clone(),
            headroom,
        })
    }

    /// [`new`](Self::new) on device `ordinal`; `Err(NoDriver)` on a machine without CUDA.
    pub fn on_device(ordinal: usize, headroom: usize) -> Result<Self, AllocError> {
        Self::new(&super::cuda_context(ordinal)?, headroom)
    }

    /// Whether `ctx`'s device reaches pageable host memory
    /// (`CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS`): what [`new`](Self::new) asks.
    pub fn supported(ctx: &Arc<CudaContext>) -> Result<bool, AllocError> {
        let value = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)
            .map_err(|e| AllocError::cuda(e, 0, 0, Self::NAME))?;
        Ok(value != 0)
    }

    /// The bytes of device memory kept free of this resource's migrations.
    pub fn headroom(&self) -> usize {
        self.headroom
    }

    /// The context whose device the memory prefers.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn layout(size: usize, align: usize) -> Option<Layout> {
        let size = size.checked_next_multiple_of(PAGE)?;
        Layout::from_size_align(size, align.max(PAGE)).ok()
    }

    /// Advises `[ptr, ptr + len)` to prefer `location`.
    fn advise(&self, ptr: usize, len: usize, location: sys::CUmemLocation) -> Result<()> {
        // SAFETY: a range of a live allocation of this resource; advice changes no byte.
        unsafe {
            sys::cuMemAdvise_v2(
                ptr as sys::CUdeviceptr,
                len,
                sys::CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                location,
            )
        }
        .result()
        .map_err(|e| AllocError::cuda(e, len, PAGE, Self::NAME))
    }
}

// SAFETY: std::alloc returns host memory valid until dealloc, aligned to max(align, 4096); the
// device reaches it (`new` checked pageable memory access), and the driver migrates it (hence
// Managed). It is freed only after the host waited for the stream it was freed on, and leaked
// where that wait fails.
unsafe impl MemoryResource for SamHeadroom {
    properties! { Host = B1, Device = B1, Migratable = B1, Pageable = B0, Alignment = U256 }

    fn allocate(&self, size: usize, align: usize, _stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(empty) = check_request::<Self>(size, align, Self::NAME)? {
            return Ok(empty);
        }
        let too_aligned = || {
            AllocError::new(
                AllocErrorKind::Unsupported("alignment above 4 KiB (a host page)"),
                size,
                align,
                Self::NAME,
            )
        };
        if align > PAGE {
            return Err(too_aligned());
        }
        let layout =
            Self::layout(size, align).ok_or(AllocError::out_of_memory(size, align, Self::NAME))?;
        let _current = super::make_current(&self.ctx)
            .map_err(|e| AllocError::cuda(e, size, align, Self::NAME))?;
        let (free, _) =
            result::mem_get_info().map_err(|e| AllocError::cuda(e, size, align, Self::NAME))?;
        // SAFETY: the layout's size is not zero (size > 0, rounded up to a page).
        let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) })
            .ok_or(AllocError::out_of_memory(size, align, Self::NAME))?;
        let addr = ptr.as_ptr() as usize;
        let on_gpu = free.saturating_sub(self.headroom).min(layout.size()) / PAGE * PAGE;
        let device = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: self.ctx.cu_device(),
        };
        let host = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        };
        let rest = layout.size() - on_gpu;
        let advised = match on_gpu {
            0 => Ok(()),
            n => self.advise(addr, n, device),
        }
        .and_then(|()| match rest {
            0 => Ok(()),
            n => self.advise(addr + on_gpu, n, host),
        });
        if let Err(e) = advised {
            // SAFETY: just allocated with this layout, handed to no one.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
            return Err(e);
        }
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        // A host free is ordered on no stream: the work that used the memory finishes first,
        // and where it cannot be waited for, the memory is leaked rather than freed under it.
        let synced = super::driver_synchronize(&self.ctx, stream, Self::NAME);
        let waited = synced.is_ok();
        super::record(&self.ctx, synced);
        if !waited {
            return;
        }
        if let Some(layout) = Self::layout(size, align) {
            // SAFETY: the caller passes a pointer from `allocate` with this size and alignment,
            // which made it with this very layout; the stream's work is done.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
        }
    }

    super::context_leaf!(streams);

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        ItemWriter::leaf(f, "sam_headroom")
            .number("device", self.ctx.ordinal())
            .size("headroom", self.headroom)
            .finish()
    }
}

static_assertions::assert_impl_all!(
    SamHeadroom: Send,
    Sync,
    crate::property::Accessible<(crate::property::HostAccessible, crate::property::DeviceAccessible)>,
    crate::property::Accessible<crate::property::Migratable>
);
