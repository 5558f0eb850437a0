//! Wraps a foreign allocator as an mrstack resource through `Callback`, the way PyTorch's
//! pluggable allocator or TensorRT's `IGpuAllocator` take one: here cudarc's own stream-ordered
//! allocation (`CudaStream::alloc`, i.e. `cuMemAllocAsync`), then makes it the current resource of
//! device 0 so that `*_in_current` containers use it. Without a GPU, wraps a host allocator
//! instead and fills an allocator-api2 `Vec` from it.
//!
//! Run: `cargo run --release --example callback`

use mrstack::prelude::*;
use mrstack::registry;
use mrstack::{container::HostAllocator, erased::AnyResource, leaf::Callback};

#[path = "shared/cudarc_allocator.rs"]
mod cudarc_allocator;
use cudarc_allocator::cudarc_allocator;
use std::ptr::NonNull;
use typenum::U16;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = match mrstack::cuda_context(0) {
        Ok(ctx) => ctx,
        Err(e) => {
            println!("no GPU here ({e}); wrapping a host allocator instead");
            return on_host();
        }
    };
    let own = ctx.new_stream()?;
    let foreign = cudarc_allocator(own.clone());

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
    // SAFETY: std::alloc returns pageable host memory of `size` bytes aligned to max(align, 16),
    // freed with the same layout; nothing is stream-ordered.
    let foreign: Callback<(), mrstack::property::Pageable, U16> =
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
