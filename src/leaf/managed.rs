//! `Managed`: unified memory from `cuMemAllocManaged`, reachable from host and device.

use super::context_leaf;
use crate::resource::{properties, MemoryResource};
use cudarc::driver::{result, sys, CudaContext};
use typenum::{B0, B1, U256};

/// Managed (unified) memory from `cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)`, freed with `cuMemFree`.
///
/// The memory is reachable from host and device: the driver migrates pages on demand (or on
/// prefetch, see [`Prefetch`](crate::adaptor::Prefetch)), so it is
/// [`Migratable`](crate::property::Migratable). The resource is bound to one context and makes it current
/// before each call, so any thread may allocate.
///
/// # Cost
///
/// One driver call per operation, like [`Cuda`](crate::leaf::Cuda), after making the context current;
/// `cuMemFree` synchronizes the device. No lock or atomic of its own; the resource is one `Arc` of
/// its context.
///
/// # Streams
///
/// `allocate` and `deallocate` ignore the stream: the memory is usable at once by any stream, and
/// `cuMemFree` waits for the device. `synchronize` makes the stream's context current and
/// synchronizes the stream (the whole context for another thread's per-thread stream, which no
/// handle names here). `order_after` records an event on `after` and makes `stream` wait on it;
/// where either stream cannot be named from this thread, or `stream` is simulated, the host waits
/// for `after` instead. It keeps no stream alive.
///
/// # Upstream
///
/// None: a leaf. It calls the CUDA driver (`cuMemAllocManaged`, `cuMemFree`), loaded at run time
/// through cudarc, and needs a CUDA device: on a machine without the driver the constructors
/// return [`AllocErrorKind::NoDriver`](crate::resource::AllocErrorKind::NoDriver). Do not ask for more
/// managed memory than the device has free: oversubscription can stall the whole GPU. It gives
/// host- and device-accessible, migratable memory and guarantees 256-byte alignment; a larger
/// alignment is refused with [`AllocErrorKind::Unsupported`](crate::resource::AllocErrorKind::Unsupported).
/// The constructors refuse a device without concurrent managed access (Windows under WDDM, some
/// Tegra, devices before Pascal) with `Unsupported`: there the host may not touch managed memory
/// while any kernel runs on the device, which no wait on one stream ensures.
///
/// # Examples
///
/// ```no_run
/// use mrstack::prelude::*;
///
/// # fn main() -> Result<(), AllocError> {
/// let managed = Managed::on_device(0)?; // Err(NoDriver) on a machine without CUDA
/// let p = managed.allocate_sync(1 << 20, 256)?;
/// // SAFETY: managed memory is host-accessible, and the allocation was synchronized.
/// unsafe { p.as_ptr().write_bytes(0, 1 << 20) };
/// // SAFETY: p came from managed with this size and alignment.
/// unsafe { managed.deallocate_sync(p, 1 << 20, 256) };
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Managed {
    ctx: std::sync::Arc<CudaContext>,
}

// Host access to managed memory while kernels run needs concurrent managed access.
context_leaf!(
    Managed,
    "managed memory",
    check = crate::leaf::driver::require_concurrent_managed_access
);

// SAFETY: cuMemAllocManaged returns memory valid on host and device until cuMemFree, aligned to
// 256 (checked by driver_allocate, which refuses larger alignments).
unsafe impl MemoryResource for Managed {
    properties! { Host = B1, Device = B1, Migratable = B1, Pageable = B0, Alignment = U256 }

    context_leaf!(
        driver "managed",
        alloc = |n| {
            // SAFETY: a plain allocation with the context current; the memory is not read.
            unsafe { result::malloc_managed(n, sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL) }
                .map(|p| p as usize)
        },
        // SAFETY: frees a pointer from cuMemAllocManaged once: one just allocated that nothing
        // else has seen, or one the caller of `deallocate` passes back, not freed yet.
        free = |p| unsafe { result::free_sync(p as _) },
    );
}

static_assertions::assert_impl_all!(
    Managed: Send,
    Sync,
    crate::property::Accessible<(crate::property::HostAccessible, crate::property::DeviceAccessible)>,
    crate::property::Accessible<crate::property::Migratable>
);
static_assertions::assert_eq_size!(Managed, usize);
