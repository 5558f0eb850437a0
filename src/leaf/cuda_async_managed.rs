//! `CudaAsyncManaged`: stream-ordered managed memory from the device's default managed memory
//! pool (CUDA 13).

use crate::resource::{properties, AllocError, AllocErrorKind, MemoryResource, Result};
use cudarc::driver::{sys, CudaContext};
use std::sync::Arc;
use typenum::{B0, B1, U256};

/// Stream-ordered managed (unified) memory from a driver pool, as RMM's
/// `cuda_async_managed_memory_resource`: `cuMemAllocFromPoolAsync` from the device's default pool
/// of managed memory (`cuMemGetDefaultMemPool` with `CU_MEM_ALLOCATION_TYPE_MANAGED`, preferred
/// location the device), `cuMemFreeAsync` on the stream.
///
/// The memory is reachable from host and device and migrates on demand or on prefetch
/// ([`Prefetch`](crate::adaptor::Prefetch)): host + device + [`Migratable`](crate::property::Migratable) in
/// its type, as [`Managed`](crate::leaf::Managed), but allocated and freed in stream order rather than
/// with `cuMemAllocManaged` / `cuMemFree` (which synchronize the device).
///
/// # Cost
///
/// One driver call per operation, after making the context current. The pool belongs to the
/// driver: what it keeps across synchronizations is its release threshold (0 unless someone set
/// it), and this resource destroys nothing.
///
/// # Streams
///
/// As [`CudaAsync`](crate::leaf::CudaAsync): allocation and free are queued on the stream. The host may
/// touch the memory only once the work queued before on that stream is done (containers wait for
/// it before host access, as for [`Managed`](crate::leaf::Managed)).
///
/// # Upstream
///
/// None: a leaf over the CUDA driver (13.0 or later: managed memory pools), loaded at run time
/// through cudarc. [`new`](Self::new) refuses with
/// [`AllocErrorKind::Unsupported`](crate::resource::AllocErrorKind::Unsupported) a device without
/// concurrent managed access (the driver's condition for managed pools: Windows, WSL, some Tegra)
/// and a driver without managed pools. Do not ask for more managed memory than the device has
/// free: oversubscription can stall the whole GPU. 256-byte alignment; a larger one is refused.
///
/// # Examples
///
/// ```no_run
/// use mrstack::prelude::*;
/// use mrstack::leaf::CudaAsyncManaged;
///
/// # fn main() -> Result<(), AllocError> {
/// let ctx = mrstack::cuda_context(0)?;
/// let mr = CudaAsyncManaged::new(&ctx)?;
/// let stream = ctx.default_stream();
/// let v = DeviceVec::<u32, _>::zeroed(1000, &mr, &stream)?;
/// assert_eq!(v.as_host_slice()?[999], 0); // host access: managed memory
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct CudaAsyncManaged {
    ctx: Arc<CudaContext>,
    pool: sys::CUmemoryPool,
}

// SAFETY: a CUmemoryPool handle may be used from any thread; the driver synchronizes it.
unsafe impl Send for CudaAsyncManaged {}
// SAFETY: as above: every use is a driver call taking the handle by value.
unsafe impl Sync for CudaAsyncManaged {}

impl CudaAsyncManaged {
    const NAME: &'static str = "CudaAsyncManaged";

    /// The default managed memory pool of `ctx`'s device.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, AllocError> {
        let err = |e| AllocError::cuda(e, 0, 0, Self::NAME);
        let _current = crate::leaf::make_current(ctx).map_err(err)?;
        crate::leaf::driver::require_concurrent_managed_access(ctx, Self::NAME)?;
        let mut location = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ctx.cu_device(),
        };
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        /// `cuMemGetDefaultMemPool(pool, location, type)`; the type is passed as its number
        /// (`CU_MEM_ALLOCATION_TYPE_MANAGED` = 2), which CUDA 12's bindings do not name.
        type GetDefault = unsafe extern "C" fn(
            *mut sys::CUmemoryPool,
            *mut sys::CUmemLocation,
            std::ffi::c_uint,
        ) -> sys::CUresult;
        const MANAGED: std::ffi::c_uint = 2;
        // SAFETY: the signature of cuMemGetDefaultMemPool (CUDA 13), a NUL-terminated name.
        let Some(get) =
            (unsafe { super::driver_symbol::<GetDefault>(b"cuMemGetDefaultMemPool\0") })
        else {
            return Err(AllocError::new(
                AllocErrorKind::Unsupported(
                    "this CUDA driver has no managed memory pools (CUDA 13.0 or later)",
                ),
                0,
                0,
                Self::NAME,
            ));
        };
        // SAFETY: `pool` and `location` are valid places; the location names the context's
        // device; MANAGED is the driver's value for managed memory.
        unsafe { get(&mut pool, &mut location, MANAGED) }
            .result()
            .map_err(err)?;
        Ok(CudaAsyncManaged {
            ctx: ctx.clone(),
            pool,
        })
    }

    /// The default managed pool of device `ordinal`; `Err(NoDriver)` on a machine without CUDA.
    pub fn on_device(ordinal: usize) -> Result<Self, AllocError> {
        Self::new(&super::cuda_context(ordinal)?)
    }

    super::context_leaf!(pool accessors);
}

// SAFETY: the default managed pool (which the driver keeps for the device's life) returns managed
// memory, valid on host and device, usable by work on `stream` once queued, aligned to 256
// (checked), until cuMemFreeAsync.
unsafe impl MemoryResource for CudaAsyncManaged {
    properties! { Host = B1, Device = B1, Migratable = B1, Pageable = B0, Alignment = U256 }

    super::context_leaf!(pool);
    super::context_leaf!(describe "cuda_async_managed");
}

static_assertions::assert_impl_all!(
    CudaAsyncManaged: Send,
    Sync,
    crate::property::Accessible<(crate::property::HostAccessible, crate::property::DeviceAccessible)>,
    crate::property::Accessible<crate::property::Migratable>
);
