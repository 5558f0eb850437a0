//! `Cuda`: device memory from `cuMemAlloc` / `cuMemFree`.

use super::context_leaf;
use crate::resource::{properties, MemoryResource};
use cudarc::driver::{result, CudaContext};
use typenum::{B0, B1, U256};

/// Device memory from `cuMemAlloc`, freed with `cuMemFree`.
///
/// Each allocation is one `cuMemAlloc` and each deallocation one `cuMemFree`; the resource keeps
/// nothing between calls. It is bound to one context and makes that context current before each
/// call, so any thread may allocate.
///
/// # Cost
///
/// One driver call per operation (about 86 µs per alloc+free pair on an H100, which is why pools
/// exist), after making the context current; `cuMemFree` synchronizes the device. No lock or
/// atomic of its own; the resource is one `Arc` of its context.
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
/// None: a leaf. It calls the CUDA driver (`cuMemAlloc`, `cuMemFree`), loaded at run time through
/// cudarc, and needs a CUDA device: on a machine without the driver the constructors return
/// [`AllocErrorKind::NoDriver`](crate::resource::AllocErrorKind::NoDriver). It gives device-accessible
/// memory and guarantees 256-byte alignment; a larger alignment is refused with
/// [`AllocErrorKind::Unsupported`](crate::resource::AllocErrorKind::Unsupported) (wrap the resource in
/// [`Aligned`](crate::adaptor::Aligned)).
///
/// # Examples
///
/// ```no_run
/// use mrstack::prelude::*;
///
/// # fn main() -> Result<(), AllocError> {
/// let cuda = Cuda::on_device(0)?; // Err(NoDriver) on a machine without CUDA
/// let p = cuda.allocate_sync(1 << 20, 256)?;
/// // SAFETY: p came from cuda with this size and alignment.
/// unsafe { cuda.deallocate_sync(p, 1 << 20, 256) };
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Cuda {
    ctx: std::sync::Arc<CudaContext>,
}

context_leaf!(Cuda, "device memory");

// SAFETY: cuMemAlloc returns device memory of `size` bytes aligned to 256 (checked), which stays
// valid until cuMemFree; alignments above 256 are refused by driver_allocate.
unsafe impl MemoryResource for Cuda {
    properties! { Host = B0, Device = B1, Migratable = B0, Pageable = B0, Alignment = U256 }

    context_leaf!(
        driver "cuda",
        // SAFETY: a plain allocation with the context current; the memory is not read.
        alloc = |n| unsafe { result::malloc_sync(n) }.map(|p| p as usize),
        // SAFETY: frees a pointer from cuMemAlloc once: one just allocated that nothing else has
        // seen, or one the caller of `deallocate` passes back, not freed yet.
        free = |p| unsafe { result::free_sync(p as _) },
    );
}

static_assertions::assert_impl_all!(Cuda: Send, Sync, crate::property::Accessible<crate::property::DeviceAccessible>);
static_assertions::assert_not_impl_any!(Cuda: crate::property::Accessible<crate::property::HostAccessible>);
static_assertions::assert_eq_size!(Cuda, usize);
