//! Leaf resources: the bottom of every stack, each backed by one kind of memory.
//!
//! The CUDA ones (`Cuda`, `CudaAsync`, `Managed`, `Pinned`) call the driver through cudarc's
//! dynamically loaded bindings, so the crate builds and runs with no CUDA toolkit: on a machine with
//! no driver their constructors return [`AllocErrorKind::NoDriver`] instead of panicking.
//! `System` is host memory, `Simulated` hands out address ranges and no memory, for tests and replay;
//! `Callback` wraps a foreign allocator given as functions.

pub mod callback;
mod cuda;
mod cuda_async;
mod managed;
mod pinned;
mod simulated;
mod system;

pub use callback::Callback;
pub use cuda::Cuda;
pub use cuda_async::{CudaAsync, CudaAsyncOptions};
pub use managed::Managed;
pub use pinned::Pinned;
pub use simulated::Simulated;
pub use system::System;

use crate::resource::{AllocError, AllocErrorKind};
use crate::stream::StreamRef;
use cudarc::driver::{result, sys, CudaContext, DriverError};
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

/// True when the CUDA driver library can be loaded here. Checked once, then cached.
pub fn driver_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: is_culib_present only tries to dlopen the library names and drops what it opened.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Opens (retains) the primary context of device `ordinal`, or says why it cannot:
/// [`AllocErrorKind::NoDriver`] without libcuda, a CUDA error without a device.
///
/// cudarc panics when the driver library is missing; this checks first.
pub fn cuda_context(ordinal: usize) -> Result<Arc<CudaContext>, AllocError> {
    if !driver_available() {
        return Err(AllocError::new(
            AllocErrorKind::NoDriver,
            0,
            0,
            "CudaContext",
        ));
    }
    CudaContext::new(ordinal).map_err(|e| AllocError::cuda(e, 0, 0, "CudaContext"))
}

/// The number of CUDA devices, 0 without a driver.
pub fn device_count() -> usize {
    if !driver_available() {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
}

/// Makes `ctx` current on this thread, then runs one allocating driver call, checking the pointer
/// it returns against the alignment asked. Shared by the CUDA leaves, whose guarantee is 256 bytes.
pub(crate) fn driver_allocate(
    ctx: &CudaContext,
    size: usize,
    align: usize,
    name: &'static str,
    alloc: impl FnOnce(usize) -> Result<usize, DriverError>,
    free: impl FnOnce(usize) -> Result<(), DriverError>,
) -> Result<NonNull<u8>, AllocError> {
    if align > CUDA_ALIGNMENT {
        return Err(AllocError::new(
            AllocErrorKind::Unsupported(
                "alignment above the 256 bytes CUDA allocations guarantee; wrap the resource in Aligned",
            ),
            size,
            align,
            name,
        ));
    }
    ctx.bind_to_thread()
        .map_err(|e| AllocError::cuda(e, size, align, name))?;
    let addr = alloc(size).map_err(|e| AllocError::cuda(e, size, align, name))?;
    match NonNull::new(addr as *mut u8) {
        Some(ptr) if addr % align == 0 => Ok(ptr),
        _ => {
            if addr != 0 {
                ctx.record_err(free(addr));
            }
            Err(AllocError::new(
                AllocErrorKind::Unsupported("the driver returned a null or misaligned pointer"),
                size,
                align,
                name,
            ))
        }
    }
}

/// Frees through one driver call with `ctx` current; a failure is recorded in the context
/// (`CudaContext::check_err`), since `deallocate` cannot return it.
pub(crate) fn driver_free(ctx: &CudaContext, free: impl FnOnce() -> Result<(), DriverError>) {
    ctx.record_err(ctx.bind_to_thread());
    ctx.record_err(free());
}

/// Synchronizes `stream` with `ctx` current.
pub(crate) fn driver_synchronize(
    ctx: &CudaContext,
    stream: StreamRef,
    name: &'static str,
) -> Result<(), AllocError> {
    if stream.is_simulated() {
        // No work is ever queued on a simulated stream.
        return Ok(());
    }
    ctx.bind_to_thread()
        .map_err(|e| AllocError::cuda(e, 0, 0, name))?;
    // SAFETY: `stream` is null or a live stream: a StreamRef borrows its stream for the call (or
    // was made by `from_raw`, whose caller promised it live).
    unsafe { result::stream::synchronize(stream.as_raw()) }
        .map_err(|e| AllocError::cuda(e, 0, 0, name))
}

/// Makes `stream` wait for the work queued on `after` so far: an event recorded on `after`, waited
/// for by `stream`, then destroyed (the driver keeps it until the wait is satisfied).
pub(crate) fn driver_order_after(
    ctx: &CudaContext,
    stream: StreamRef,
    after: StreamRef,
    name: &'static str,
) -> Result<(), AllocError> {
    if stream == after || after.is_simulated() {
        // No work is ever queued on a simulated stream: nothing to wait for.
        return Ok(());
    }
    if stream.is_simulated() {
        // A suballocator hands `after`'s blocks to the simulated stream, and may later hand them
        // on to a real stream ordered only after the simulated one: wait for `after` now.
        return driver_synchronize(ctx, after, name);
    }
    let err = |e| AllocError::cuda(e, 0, 0, name);
    ctx.bind_to_thread().map_err(err)?;
    let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(err)?;
    // SAFETY: the event was just created in the current context; both streams are null or live
    // (a StreamRef borrows its stream for the call, or was made by `from_raw`, whose caller
    // promised it live). The event is destroyed once, after the wait
    // is queued, which the driver allows.
    let waited = unsafe {
        result::event::record(event, after.as_raw()).and_then(|()| {
            result::stream::wait_event(
                stream.as_raw(),
                event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        })
    };
    // SAFETY: see above.
    ctx.record_err(unsafe { result::event::destroy(event) });
    waited.map_err(err)
}

/// The alignment every CUDA allocation guarantees.
pub(crate) const CUDA_ALIGNMENT: usize = 256;
