//! `CudaAsyncView`: stream-ordered device memory from a driver memory pool this resource does not
//! own: the device's default pool, or one another library made.

use crate::resource::{properties, AllocError, MemoryResource, Result};
use crate::stack::ItemWriter;
use cudarc::driver::{sys, CudaContext};
use std::sync::Arc;
use typenum::{B0, B1, U256};

/// Stream-ordered device memory from a driver memory pool someone else owns, as RMM's
/// `cuda_async_view_memory_resource`.
///
/// [`default_pool`](Self::default_pool) views the device's own pool (`cuDeviceGetDefaultMemPool`:
/// what `cuMemAllocAsync` and PyTorch's `cudaMallocAsync` backend use), which the driver keeps for
/// the device's life: safe. [`from_handle`](Self::from_handle) views any pool handle (one a
/// library made, the device's current pool from `cuDeviceGetMemPool`): `unsafe`, since the view
/// cannot keep the pool alive or check what it is. The view never destroys the pool, nor changes
/// its attributes; memory it allocated and did not free stays the pool's.
///
/// # Cost
///
/// One driver call per operation (`cuMemAllocFromPoolAsync`, `cuMemFreeAsync`), after making the
/// context current, as [`CudaAsync`](crate::leaf::CudaAsync). What the pool keeps across
/// synchronizations is up to its owner's release threshold (the default pool's is 0: it gives
/// freed memory back at each synchronization unless someone raised it).
///
/// # Streams
///
/// As [`CudaAsync`](crate::leaf::CudaAsync): allocation and free are queued on the stream; a stream the
/// pool cannot queue on is refused at `allocate` and waited for on the host at `deallocate`.
/// `order_after` records an event. It keeps no stream alive.
///
/// # Upstream
///
/// None: a leaf over the CUDA driver, loaded at run time through cudarc
/// ([`AllocErrorKind::NoDriver`](crate::resource::AllocErrorKind::NoDriver) without it). Device-accessible
/// memory of the context's device, 256-byte aligned; a larger alignment is refused with
/// [`AllocErrorKind::Unsupported`](crate::resource::AllocErrorKind::Unsupported).
///
/// # Examples
///
/// ```no_run
/// use mrstack::prelude::*;
/// use mrstack::leaf::CudaAsyncView;
///
/// # fn main() -> Result<(), AllocError> {
/// let ctx = mrstack::cuda_context(0)?;
/// let mr = CudaAsyncView::default_pool(&ctx)?; // the pool cuMemAllocAsync uses
/// let stream = ctx.default_stream();
/// let v = DeviceVec::<f32, _>::zeroed(1 << 20, &mr, &stream)?;
/// # drop(v);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct CudaAsyncView {
    ctx: Arc<CudaContext>,
    pool: sys::CUmemoryPool,
    /// Whether `pool` is the device's default pool, which text can name.
    default: bool,
}

// SAFETY: a CUmemoryPool handle may be used from any thread; the driver synchronizes it.
unsafe impl Send for CudaAsyncView {}
// SAFETY: as above: every use is a driver call taking the handle by value.
unsafe impl Sync for CudaAsyncView {}

impl CudaAsyncView {
    const NAME: &'static str = "CudaAsyncView";

    /// A view of the default memory pool of `ctx`'s device, which the driver owns and keeps for
    /// the device's life.
    pub fn default_pool(ctx: &Arc<CudaContext>) -> Result<Self, AllocError> {
        Ok(CudaAsyncView {
            ctx: ctx.clone(),
            pool: Self::device_pool(ctx, sys::cuDeviceGetDefaultMemPool)?,
            default: true,
        })
    }

    /// A view of the default pool of device `ordinal`; `Err(NoDriver)` on a machine without CUDA.
    pub fn on_device(ordinal: usize) -> Result<Self, AllocError> {
        Self::default_pool(&super::cuda_context(ordinal)?)
    }

    /// The pool now set as `ctx`'s device's current pool (`cuDeviceGetMemPool`): the default
    /// pool unless someone called `cuDeviceSetMemPool`. A raw handle: see
    /// [`from_handle`](Self::from_handle) for what viewing it asks.
    pub fn current_pool_handle(ctx: &Arc<CudaContext>) -> Result<sys::CUmemoryPool, AllocError> {
        Self::device_pool(ctx, sys::cuDeviceGetMemPool)
    }

    /// A pool of `ctx`'s device that `get` (`cuDeviceGetDefaultMemPool`, `cuDeviceGetMemPool`)
    /// names, with `ctx` current.
    fn device_pool(
        ctx: &CudaContext,
        get: unsafe fn(*mut sys::CUmemoryPool, sys::CUdevice) -> sys::CUresult,
    ) -> Result<sys::CUmemoryPool, AllocError> {
        let err = |e| AllocError::cuda(e, 0, 0, Self::NAME);
        let _current = crate::leaf::make_current(ctx).map_err(err)?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `get` is a driver getter that writes one pool handle to `pool`, a valid place
        // for it; the device is the context's.
        unsafe { get(&mut pool, ctx.cu_device()) }
            .result()
            .map_err(err)?;
        Ok(pool)
    }

    /// A view of `pool`, a pool someone else owns.
    ///
    /// # Safety
    ///
    /// `pool` is a live memory pool of device memory (`CU_MEM_ALLOCATION_TYPE_PINNED`, located on
    /// `ctx`'s device) and stays live, not destroyed, while this view or any memory it allocated
    /// is.
    pub unsafe fn from_handle(ctx: &Arc<CudaContext>, pool: sys::CUmemoryPool) -> Self {
        CudaAsyncView {
            ctx: ctx.clone(),
            pool,
            default: false,
        }
    }

    super::context_leaf!(pool accessors);
}

// SAFETY: cuMemAllocFromPoolAsync returns device memory of the pool's device (the default pool's,
// or a device pool on the context's device, the `from_handle` caller's promise), usable by work
// on `stream` once queued, aligned to 256 (checked), valid until cuMemFreeAsync; the pool
// outlives the view (the driver's own, or the caller's promise).
unsafe impl MemoryResource for CudaAsyncView {
    properties! { Host = B0, Device = B1, Migratable = B0, Pageable = B0, Alignment = U256 }

    super::context_leaf!(pool);

    /// `cuda_async_view(device=N)`; a pool from a raw handle, which text cannot name, adds
    /// `pool=foreign`.
    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let item = ItemWriter::leaf(f, "cuda_async_view").number("device", self.ctx.ordinal());
        if self.default {
            item.finish()
        } else {
            item.text("pool", "foreign").finish()
        }
    }
}

static_assertions::assert_impl_all!(CudaAsyncView: Send, Sync, crate::property::Accessible<crate::property::DeviceAccessible>);
static_assertions::assert_not_impl_any!(CudaAsyncView: crate::property::Accessible<crate::property::HostAccessible>);
