//! `CudaAsync`: stream-ordered device memory from a driver memory pool of its own.

use super::{driver_allocate, driver_free, driver_synchronize};
use crate::resource::{properties, AllocError, MemoryResource, Result};
use crate::stack::ItemWriter;
use crate::stream::StreamRef;
use cudarc::driver::{result, sys, CudaContext};
use std::ptr::NonNull;
use std::sync::Arc;
use typenum::{B0, B1, U256};

/// Options for [`CudaAsync::with_options`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CudaAsyncOptions {
    /// Bytes allocated (and released into the pool) at construction, so early requests are fast.
    pub initial_pool_size: Option<usize>,
    /// Bytes of unused memory the pool keeps across synchronizations (default: device memory).
    pub release_threshold: Option<usize>,
    /// Whether the pool can be shared with other processes: made with POSIX file descriptors as
    /// its shareable handle type (RMM's `export_handle_type`), so that
    /// [`CudaAsync::export_pool`] and [`CudaAsync::export_pointer`] work (Linux only).
    pub exportable: bool,
}

/// Stream-ordered device memory from a driver memory pool owned by this resource, as RMM's
/// `cuda_async_memory_resource`.
///
/// The resource creates a `cuMemPool` of its own on the context's device and allocates from it
/// with `cuMemAllocFromPoolAsync`, freeing with `cuMemFreeAsync`. Options
/// ([`CudaAsyncOptions`]): an initial size (allocated and freed once at construction so the pool
/// holds it) and a release threshold (bytes the pool keeps when streams synchronize; defaults to
/// the device's total memory, as RMM does). The pool is destroyed on drop; the driver releases its
/// memory once the frees queued on streams have run.
///
/// # Cost
///
/// One driver call per operation, after making the context current; no lock or atomic of its own
/// (the driver synchronizes its pool). The pool keeps up to the release threshold of freed memory
/// across synchronizations ([`reserved_bytes`](Self::reserved_bytes) reads what it holds).
///
/// # Streams
///
/// Allocation and free are queued on the stream: the driver's pool reuses memory freed on a stream
/// for later work on that stream without a device synchronization. `allocate` on a stream the pool
/// cannot queue on — a simulated stream, another thread's per-thread stream, a stream of another
/// context — fails with [`AllocErrorKind::Unsupported`](crate::resource::AllocErrorKind::Unsupported);
/// `deallocate` on such a stream waits for it on the host, then frees on the null stream.
/// `synchronize` makes the stream's context current and synchronizes the stream (the whole context
/// for another thread's per-thread stream). `order_after` records an event on `after` and makes
/// `stream` wait on it; where either stream cannot be named from this thread, or `stream` is
/// simulated, the host waits for `after` instead. It keeps no stream alive.
///
/// # Upstream
///
/// None: a leaf. It calls the CUDA driver's memory pools (`cuMemPoolCreate`,
/// `cuMemPoolSetAttribute`, `cuMemAllocFromPoolAsync`, `cuMemFreeAsync`, `cuMemPoolDestroy`),
/// loaded at run time through cudarc, and needs a CUDA device: on a machine without the driver
/// [`on_device`](Self::on_device) returns
/// [`AllocErrorKind::NoDriver`](crate::resource::AllocErrorKind::NoDriver).
/// It gives device-accessible memory and guarantees 256-byte alignment; a larger alignment is
/// refused with [`AllocErrorKind::Unsupported`](crate::resource::AllocErrorKind::Unsupported).
///
/// # Examples
///
/// ```no_run
/// use mrstack::prelude::*;
/// use mrstack::leaf::CudaAsyncOptions;
///
/// # fn main() -> Result<(), AllocError> {
/// let ctx = mrstack::cuda_context(0)?; // Err(NoDriver) on a machine without CUDA
/// let options = CudaAsyncOptions { initial_pool_size: Some(256 << 20), ..Default::default() };
/// let mr = CudaAsync::with_options(&ctx, options)?;
/// let stream = ctx.default_stream();
/// let s = StreamRef::from(&stream);
/// let p = mr.allocate(1 << 20, 256, s)?; // queued on `stream`
/// // SAFETY: p came from mr with this size and alignment; the free is queued on `stream`, after
/// // the work that used p.
/// unsafe { mr.deallocate(p, 1 << 20, 256, s) };
/// mr.synchronize(s)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct CudaAsync {
    ctx: Arc<CudaContext>,
    pool: sys::CUmemoryPool,
    /// What it was built with, for its description.
    options: CudaAsyncOptions,
    /// An exportable pool's first export, kept open: the driver exports no allocation of a pool
    /// that was never exported itself (`cuMemPoolExportPointer` fails with `INVALID_VALUE`).
    #[cfg(unix)]
    _armed: Option<std::os::fd::OwnedFd>,
}

// SAFETY: a CUmemoryPool handle may be used from any thread; the driver synchronizes it.
unsafe impl Send for CudaAsync {}
// SAFETY: as above: every use is a driver call taking the handle by value.
unsafe impl Sync for CudaAsync {}

impl CudaAsync {
    const NAME: &'static str = "CudaAsync";

    /// A new pool on `ctx`'s device with the default options.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, AllocError> {
        Self::with_options(ctx, CudaAsyncOptions::default())
    }

    /// A new pool on device `ordinal`; `Err(NoDriver)` on a machine without CUDA.
    pub fn on_device(ordinal: usize) -> Result<Self, AllocError> {
        Self::new(&super::cuda_context(ordinal)?)
    }

    /// A new pool on `ctx`'s device with `options`.
    pub fn with_options(
        ctx: &Arc<CudaContext>,
        options: CudaAsyncOptions,
    ) -> Result<Self, AllocError> {
        let err = |e| AllocError::cuda(e, options.initial_pool_size.unwrap_or(0), 0, Self::NAME);
        let _current = crate::leaf::make_current(ctx).map_err(err)?;
        // SAFETY: CUmemPoolProps is plain data; all-zero is its documented "no options" value.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = if options.exportable {
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        } else {
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
        };
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = ctx.cu_device();
        // SAFETY: props is a valid, initialized CUmemPoolProps.
        let pool = unsafe { result::mem_pool::create(&props) }.map_err(err)?;
        if options.exportable {
            // So that an import of it in this process is refused (its drop destroys it).
            super::imported_pool::own_exportable(pool);
        }
        #[allow(unused_mut)] // the export below is Unix only
        let mut this = CudaAsync {
            ctx: ctx.clone(),
            pool,
            options,
            #[cfg(unix)]
            _armed: None,
        };
        if options.exportable {
            #[cfg(unix)]
            {
                this._armed = Some(this.export_pool()?);
            }
            #[cfg(not(unix))]
            return Err(AllocError::new(
                crate::resource::AllocErrorKind::Unsupported(
                    "exportable pools share POSIX file descriptors: Linux only",
                ),
                0,
                0,
                Self::NAME,
            ));
        }
        let threshold = match options.release_threshold {
            Some(t) => t,
            None => ctx.total_mem().map_err(err)?,
        };
        let mut value = threshold as u64;
        // SAFETY: the pool is live and RELEASE_THRESHOLD takes a cuuint64_t.
        unsafe {
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut value as *mut u64).cast(),
            )
        }
        .map_err(err)?;
        if let Some(initial) = options.initial_pool_size.filter(|&n| n > 0) {
            let ptr = this.allocate(initial, 1, StreamRef::DEFAULT)?;
            // SAFETY: freeing what was just allocated, unused, on the same stream.
            unsafe { this.deallocate(ptr, initial, 1, StreamRef::DEFAULT) };
            this.synchronize(StreamRef::DEFAULT)?;
        }
        Ok(this)
    }

    /// The pool as a file descriptor another process can import
    /// ([`ImportedPool::from_fd`](crate::leaf::ImportedPool::from_fd)), sent to it over a Unix
    /// socket or inherited. `Unsupported` unless the pool was made
    /// [`exportable`](CudaAsyncOptions::exportable).
    #[cfg(unix)]
    pub fn export_pool(&self) -> Result<std::os::fd::OwnedFd, AllocError> {
        use std::os::fd::FromRawFd;
        self.exportable()?;
        let err = |e| AllocError::cuda(e, 0, 0, Self::NAME);
        let _current = crate::leaf::make_current(&self.ctx).map_err(err)?;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: the pool is live; for POSIX file descriptors the handle written is an int.
        unsafe {
            sys::cuMemPoolExportToShareableHandle(
                (&mut fd as *mut std::ffi::c_int).cast(),
                self.pool,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        }
        .result()
        .map_err(err)?;
        // SAFETY: the driver made `fd` for the caller, who owns it from here.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    /// What another process that imported the pool needs to map the allocation at `ptr`
    /// ([`ImportedPool::import`](crate::leaf::ImportedPool::import)): 64 opaque bytes.
    /// `Unsupported` unless the pool was made [`exportable`](CudaAsyncOptions::exportable); a
    /// CUDA error for a pointer that is not a live allocation of this pool.
    ///
    /// # Safety
    ///
    /// Whoever imports the allocation may write any bytes into it, at any time: every value
    /// this process reads from it must be valid for any bytes (integers and floats, not `bool`
    /// or enums), or the importers must write only valid ones. Export only once the allocation
    /// is complete on its stream (synchronize it first), and keep it allocated until every
    /// importer is done with it: the driver frees it under them otherwise.
    pub unsafe fn export_pointer(&self, ptr: NonNull<u8>) -> Result<super::IpcPointer, AllocError> {
        self.exportable()?;
        let err = |e| AllocError::cuda(e, 0, 0, Self::NAME);
        let _current = crate::leaf::make_current(&self.ctx).map_err(err)?;
        // SAFETY: plain data, written by the driver below.
        let mut data: sys::CUmemPoolPtrExportData = unsafe { std::mem::zeroed() };
        // SAFETY: `data` is a valid place; the driver checks that `ptr` is an allocation of a
        // pool it knows and fails otherwise.
        unsafe { sys::cuMemPoolExportPointer(&mut data, ptr.as_ptr() as sys::CUdeviceptr) }
            .result()
            .map_err(err)?;
        Ok(super::IpcPointer::from_bytes(data.reserved))
    }

    fn exportable(&self) -> Result<(), AllocError> {
        if self.options.exportable {
            return Ok(());
        }
        Err(AllocError::new(
            crate::resource::AllocErrorKind::Unsupported(
                "this CudaAsync's pool is not exportable: build it with CudaAsyncOptions { exportable: true, .. }",
            ),
            0,
            0,
            Self::NAME,
        ))
    }

    /// Lets kernels and copies on `peer`'s device read and write this pool's memory
    /// (`cuMemPoolSetAccess`, read-write), its allocations now and later. Idempotent; a pool's own
    /// device always has access. `Unsupported` where the two devices cannot reach each other.
    pub fn grant_access(&self, peer: &CudaContext) -> Result<(), AllocError> {
        super::driver::grant_pool_access(self.pool, &self.ctx, peer, Self::NAME)
    }

    super::context_leaf!(pool accessors);

    /// Bytes the driver pool holds from the device (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub fn reserved_bytes(&self) -> Result<usize, AllocError> {
        self.reserved(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    }

    /// The most bytes the driver pool has held from the device at once since it was made
    /// (`CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`): what the pool cost at its peak.
    pub fn reserved_high(&self) -> Result<usize, AllocError> {
        self.reserved(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
    }

    /// A byte count of the pool's: `attr` is one of the `RESERVED_MEM_*` attributes, which the
    /// driver writes as a cuuint64_t.
    fn reserved(&self, attr: sys::CUmemPool_attribute) -> Result<usize, AllocError> {
        let err = |e| AllocError::cuda(e, 0, 0, Self::NAME);
        let _current = crate::leaf::make_current(&self.ctx).map_err(err)?;
        let mut value: u64 = 0;
        // SAFETY: the pool is live (it is destroyed only when self drops), and the caller's
        // attribute writes a cuuint64_t, which `value` is.
        unsafe {
            result::mem_pool::get_attribute(self.pool, attr, (&mut value as *mut u64).cast())
        }
        .map_err(err)?;
        Ok(usize::try_from(value).unwrap_or(usize::MAX))
    }
}

// SAFETY: cuMemAllocFromPoolAsync returns device memory usable by work on `stream` once queued,
// aligned to 256 (checked), valid until cuMemFreeAsync on that stream.
unsafe impl MemoryResource for CudaAsync {
    properties! { Host = B0, Device = B1, Migratable = B0, Pageable = B0, Alignment = U256 }

    super::context_leaf!(pool);

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut item = ItemWriter::leaf(f, "cuda_async").number("device", self.ctx.ordinal());
        if let Some(initial) = self.options.initial_pool_size {
            item = item.size("initial", initial);
        }
        if let Some(threshold) = self.options.release_threshold {
            item = item.size("release_threshold", threshold);
        }
        if self.options.exportable {
            item = item.flag("exportable", true);
        }
        item.finish()
    }
}

/// Allocates `size` bytes (checked already) from `pool` on `stream`, in `ctx`:
/// `cuMemAllocFromPoolAsync`. Shared by the leaves over driver pools.
///
/// # Safety
///
/// `pool` is a live memory pool of `ctx`'s device, and stays live while the allocation does.
pub(crate) unsafe fn pool_allocate(
    ctx: &CudaContext,
    pool: sys::CUmemoryPool,
    size: usize,
    align: usize,
    stream: StreamRef,
    name: &'static str,
) -> Result<NonNull<u8>> {
    let handle = super::stream_in(ctx, stream, size, align, name)?;
    driver_allocate(
        ctx,
        size,
        align,
        name,
        |n| {
            // SAFETY: the pool is live (the caller's promise); `handle` is null, a special handle
            // valid on this thread, or a live stream of this context (`stream_in` checked it; a
            // StreamRef borrows its stream for the call).
            unsafe { result::mem_pool::alloc_async(pool, n, handle) }.map(|p| p as usize)
        },
        // SAFETY: frees the pointer just allocated on the same stream.
        |p| unsafe { result::free_async(p as _, handle) },
    )
}

/// Frees `ptr` (from [`pool_allocate`] in `ctx`) on `stream`: `cuMemFreeAsync`. On a stream the
/// pool cannot queue on (simulated, another thread's per-thread stream, another context's), the
/// host waits for it, then frees on the null stream.
///
/// # Safety
///
/// `ptr` came from [`pool_allocate`] in `ctx` with this size and was not freed since.
pub(crate) unsafe fn pool_free(
    ctx: &CudaContext,
    ptr: NonNull<u8>,
    size: usize,
    align: usize,
    stream: StreamRef,
    name: &'static str,
) {
    if size == 0 {
        return;
    }
    let handle = match super::stream_in(ctx, stream, size, align, name) {
        Ok(handle) => handle,
        Err(_) => match driver_synchronize(ctx, stream, name) {
            Ok(()) => std::ptr::null_mut(),
            // Not waited for: the block may still be in use, so it is leaked, not freed.
            Err(e) => return super::record(ctx, Err(e)),
        },
    };
    // SAFETY: the caller passes a live pointer from a pool of this context; the free is ordered
    // on `handle`, a stream of this context the work that used it was queued on, or the null
    // stream after the host waited for that work.
    driver_free(ctx, || unsafe {
        result::free_async(ptr.as_ptr() as _, handle)
    });
}

impl Drop for CudaAsync {
    fn drop(&mut self) {
        let _current = crate::leaf::make_current_or_record(&self.ctx);
        if self.options.exportable {
            // SAFETY: as below; under the lock imports take, so that no import in this process
            // is handed this handle while it goes.
            unsafe { super::imported_pool::destroy_own(&self.ctx, self.pool) };
            return;
        }
        // SAFETY: the pool is ours and destroyed once; the driver defers the release of memory
        // still referenced by queued frees.
        self.ctx
            .record_err(unsafe { result::mem_pool::destroy(self.pool) });
    }
}

static_assertions::assert_impl_all!(CudaAsync: Send, Sync, crate::property::Accessible<crate::property::DeviceAccessible>);
static_assertions::assert_not_impl_any!(CudaAsync: crate::property::Accessible<crate::property::HostAccessible>);
