//! Wraps a foreign allocator as an mrstack resource through `Callback`, the way PyTorch's
//! pluggable allocator or TensorRT's `IGpuAllocator` take one: here cudarc's own stream-ordered
//! allocation (`CudaStream::alloc`, i.e. `cuMemAllocAsync`), then makes it the current resource of
//! device 0 so that `*_in_current` containers use it. Without a GPU, wraps a host allocator
//! instead and fills an allocator-api2 `Vec` from it.
//!
//! Run: `cargo run --release --example callback`

use cudarc::driver::{result, CudaStream};
use mrstack::prelude::*;
use mrstack::registry;
use std::ptr::NonNull;
use std::sync::Arc;
use typenum::{U16, U256};

/// cudarc's allocation on `own`: ordered on `own`, so a request for another stream waits for the
/// allocation first, and a free from another stream waits for that stream's work.
fn allocate(
    own: &Arc<CudaStream>,
    size: usize,
    align: usize,
    stream: StreamRef,
) -> Result<NonNull<u8>, AllocError> {
    let err = |e| AllocError::cuda(e, size, align, "cudarc");
    // SAFETY: uninitialized device memory, handed out as raw bytes for the caller to fill.
    let ptr = unsafe { own.alloc::<u8>(size) }.map_err(err)?.leak();
    if stream != StreamRef::from(own) {
        own.synchronize().map_err(err)?;
    }
    NonNull::new(ptr as *mut u8).ok_or(AllocError::out_of_memory(size, align, "cudarc"))
}

/// # Safety
///
/// `ptr` came from [`allocate`] on `own` with `size` bytes and is freed once.
unsafe fn deallocate(
    own: &Arc<CudaStream>,
    ptr: NonNull<u8>,
    size: usize,
    _: usize,
    stream: StreamRef,
) {
    if stream != StreamRef::from(own) {
        // SAFETY: `stream` is a live stream (StreamRef's contract); waiting on it only reads it.
        own.context()
            .record_err(unsafe { result::stream::synchronize(stream.as_raw()) });
    }
    // SAFETY: the pointer and size came from `own.alloc::<u8>(size)`, leaked once; dropping the
    // slice frees it on `own` (cuMemFreeAsync), after the work queued there.
    drop(unsafe { own.upgrade_device_ptr::<u8>(ptr.as_ptr() as u64, size) });
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = match mrstack::cuda_context(0) {
        Ok(ctx) => ctx,
        Err(e) => {
            println!("no GPU here ({e}); wrapping a host allocator instead");
            return on_host();
        }
    };
    let own = ctx.new_stream()?;
    // SAFETY: cudarc returns device memory of `size` bytes from the driver (256-aligned, which
    // Callback checks), usable on `own` at once and on other streams after the wait in
    // `allocate`, and frees it after the work on the freeing stream.
    let foreign: Callback<_, DeviceAccessible, U256> =
        unsafe { Callback::new(own.clone(), allocate, deallocate) }.with_name("cudarc");

    // Used directly, as any resource:
    let host: Vec<f32> = (0..1_000_000).map(|i| i as f32).collect();
    let v = DeviceVec::from_slice(&host, &foreign, &own)?;
    assert_eq!(v.to_vec()?, host);
    drop(v);

    // Or as device 0's current resource, for code that takes whatever is current:
    let previous = registry::set_per_device_resource(0, AnyResource::new(foreign))?;
    let w = DeviceVec::<u32, _>::zeroed_in_current(1 << 20, &own)?;
    println!(
        "{} zeroed values from {} (the current resource of device 0; it replaced {})",
        w.to_vec()?.iter().filter(|&&x| x == 0).count(),
        w.resource().name(),
        previous.map_or("nothing", |p| p.name()),
    );
    drop(w);
    registry::reset_per_device_resource(0)?;
    Ok(())
}

/// A "foreign" host allocator (std::alloc here) wrapped the same way, backing an allocator-api2
/// `Vec`.
fn on_host() -> Result<(), Box<dyn std::error::Error>> {
    fn layout(size: usize, align: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(size, align.max(16)).expect("a valid layout")
    }
    fn host_alloc(
        _: &(),
        size: usize,
        align: usize,
        _: StreamRef,
    ) -> Result<NonNull<u8>, AllocError> {
        // SAFETY: Callback never asks for zero bytes.
        NonNull::new(unsafe { std::alloc::alloc(layout(size, align)) })
            .ok_or(AllocError::out_of_memory(size, align, "std::alloc"))
    }
    /// # Safety
    /// `ptr` came from `host_alloc` with this size and align.
    unsafe fn host_free(_: &(), ptr: NonNull<u8>, size: usize, align: usize, _: StreamRef) {
        // SAFETY: allocated by `host_alloc` with the same layout.
        unsafe { std::alloc::dealloc(ptr.as_ptr(), layout(size, align)) }
    }
    // SAFETY: std::alloc returns host memory of `size` bytes aligned to max(align, 16), freed with
    // the same layout; nothing is stream-ordered.
    let foreign: Callback<(), HostAccessible, U16> =
        unsafe { Callback::new((), host_alloc, host_free) }.with_name("std::alloc");
    let mut v = allocator_api2::vec::Vec::new_in(HostAllocator::new(&foreign));
    v.extend((0..1000u64).map(|i| i * i));
    println!(
        "sum of squares below 1000 through {}: {}",
        foreign.name(),
        v.iter().sum::<u64>()
    );
    Ok(())
}
