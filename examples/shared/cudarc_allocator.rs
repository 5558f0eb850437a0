//! A foreign allocator wrapped through `Callback`: cudarc's own stream-ordered allocation. Shared
//! by `examples/callback.rs` and the GPU tests (`tests/gpu/erased.rs`), so that the example's
//! code is the code the tests run on a GPU.

use cudarc::driver::{result, CudaStream};
use mrstack::leaf::Callback;
use mrstack::prelude::*;
use std::ptr::NonNull;
use std::sync::Arc;
use typenum::U256;

/// A foreign allocator: cudarc's own `CudaStream::alloc` (cuMemAllocAsync on its stream) and
/// `CudaSlice` drop (cuMemFreeAsync). Requests for another stream are ordered by waiting.
pub(crate) fn cudarc_allocator(
    stream: Arc<CudaStream>,
) -> Callback<Arc<CudaStream>, DeviceAccessible, U256> {
    fn allocate(
        own: &Arc<CudaStream>,
        size: usize,
        align: usize,
        s: StreamRef,
    ) -> Result<NonNull<u8>, AllocError> {
        let err = |e| AllocError::cuda(e, size, align, "cudarc");
        // SAFETY: uninitialized device memory, handed out as raw bytes.
        let ptr = unsafe { own.alloc::<u8>(size) }.map_err(err)?.leak();
        if s != StreamRef::from(own) {
            own.synchronize().map_err(err)?;
        }
        NonNull::new(ptr as *mut u8).ok_or(AllocError::out_of_memory(size, align, "cudarc"))
    }
    /// # Safety
    /// `ptr` came from `allocate` on `own` with `size` bytes.
    unsafe fn deallocate(
        own: &Arc<CudaStream>,
        ptr: NonNull<u8>,
        size: usize,
        _: usize,
        s: StreamRef,
    ) {
        if s != StreamRef::from(own) {
            // SAFETY: `s` is a live stream (StreamRef's contract); the free below waits for it.
            own.context()
                .record_err(unsafe { result::stream::synchronize(s.as_raw()) });
        }
        // SAFETY: the pointer and size came from `own.alloc::<u8>(size)`, leaked once.
        drop(unsafe { own.upgrade_device_ptr::<u8>(ptr.as_ptr() as u64, size) });
    }
    // SAFETY: cudarc's allocation is device memory of `size` bytes, usable on `own` at once and on
    // another stream after the synchronize above, freed after the work on the freeing stream.
    // The driver's allocations are 256-aligned, which Callback checks on every pointer.
    unsafe { Callback::new(stream, allocate, deallocate) }.with_name("cudarc")
}
