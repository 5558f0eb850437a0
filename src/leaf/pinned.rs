//! `Pinned`: page-locked host memory from `cuMemHostAlloc`, mapped into the device's address space.

use super::context_leaf;
use crate::resource::{properties, MemoryResource};
use cudarc::driver::{result, sys, CudaContext};
use typenum::{B0, B1, U256};

/// Pinned host memory from `cuMemHostAlloc(PORTABLE | DEVICEMAP)`, freed with `cuMemFreeHost`.
///
/// The memory is page-locked and mapped into the device's address space. With unified addressing
/// (every 64-bit platform CUDA supports) the host pointer is also the device pointer, so kernels
/// read it over PCIe/NVLink and copies from it run at full speed. The resource is bound to one
/// context and makes it current before each call, so any thread may allocate.
///
/// # Cost
///
/// One driver call per operation, after making the context current; pinning is slow, so put a
/// pool over it for frequent allocations. No lock or atomic of its own; the resource is one `Arc`
/// of its context.
///
/// # Streams
///
/// `allocate` and `deallocate` ignore the stream: the memory is usable at once by any stream, and
/// is freed by `cuMemFreeHost` when `deallocate` is called. `synchronize` makes the stream's
/// context current and synchronizes the stream (the whole context for another thread's per-thread
/// stream, which no handle names here). `order_after` records an event on `after` and makes
/// `stream` wait on it; where either stream cannot be named from this thread, or `stream` is
/// simulated, the host waits for `after` instead. It keeps no stream alive.
///
/// # Upstream
///
/// None: a leaf. It calls the CUDA driver (`cuMemHostAlloc`, `cuMemFreeHost`), loaded at run time
/// through cudarc, and needs a CUDA device: on a machine without the driver the constructors
/// return [`AllocErrorKind::NoDriver`](crate::resource::AllocErrorKind::NoDriver). It gives host- and
/// device-accessible memory (not migratable) and guarantees 256-byte alignment; a larger
/// alignment is refused with [`AllocErrorKind::Unsupported`](crate::resource::AllocErrorKind::Unsupported).
///
/// # Examples
///
/// ```no_run
/// use mrstack::prelude::*;
///
/// # fn main() -> Result<(), AllocError> {
/// let pinned = Pinned::on_device(0)?; // Err(NoDriver) on a machine without CUDA
/// let staging = resource_stack![pinned, Pool { initial: 64 MiB }]; // pinning is slow: pool it
/// let p = staging.allocate_sync(4096, 256)?;
/// // SAFETY: p came from staging with this size and alignment.
/// unsafe { staging.deallocate_sync(p, 4096, 256) };
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Pinned {
    ctx: std::sync::Arc<CudaContext>,
}

context_leaf!(Pinned, "pinned host memory");

impl Pinned {
    const FLAGS: u32 = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
}

// SAFETY: cuMemHostAlloc with DEVICEMAP returns host memory that is also addressable by the device
// under unified addressing, valid until cuMemFreeHost, aligned to 256 (checked).
unsafe impl MemoryResource for Pinned {
    properties! { Host = B1, Device = B1, Migratable = B0, Pageable = B0, Alignment = U256 }

    context_leaf!(
        driver "pinned",
        // SAFETY: a plain allocation with the context current; the memory is not read.
        alloc = |n| unsafe { result::malloc_host(n, Self::FLAGS) }.map(|p| p as usize),
        // SAFETY: frees a pointer from cuMemHostAlloc once: one just allocated that nothing else
        // has seen, or one the caller of `deallocate` passes back, not freed yet.
        free = |p| unsafe { result::free_host(p as _) },
    );
}

static_assertions::assert_impl_all!(
    Pinned: Send,
    Sync,
    crate::property::Accessible<(crate::property::HostAccessible, crate::property::DeviceAccessible)>
);
static_assertions::assert_not_impl_any!(Pinned: crate::property::Accessible<crate::property::Migratable>);
static_assertions::assert_eq_size!(Pinned, usize);
