//! `Cuda`: device memory from `cuMemAlloc` / `cuMemFree`.
//!
//! Costs one driver call per operation (about 86 µs per alloc+free pair on an H100, which is why
//! pools exist); `cuMemFree` synchronizes the device. Bound to one context: it makes that context
//! current before each call, so any thread may allocate. Guarantees 256-byte alignment.

use super::{context_leaf, driver_allocate, driver_free};
use crate::resource::{check_request, MemoryResource, Result};
use crate::stream::StreamRef;
use cudarc::driver::{result, CudaContext};
use std::ptr::NonNull;
use typenum::{B0, B1, U256};

/// Device memory from `cuMemAlloc`, freed with `cuMemFree`.
#[derive(Debug, Clone)]
pub struct Cuda {
    ctx: std::sync::Arc<CudaContext>,
}

context_leaf!(Cuda, "device memory");

// SAFETY: cuMemAlloc returns device memory of `size` bytes aligned to 256 (checked), which stays
// valid until cuMemFree; alignments above 256 are refused by driver_allocate.
unsafe impl MemoryResource for Cuda {
    type Host = B0;
    type Device = B1;
    type Managed = B0;
    type Alignment = U256;

    fn allocate(&self, size: usize, align: usize, _: StreamRef) -> Result<NonNull<u8>> {
        if let Some(empty) = check_request::<Self>(size, align, Self::NAME)? {
            return Ok(empty);
        }
        driver_allocate(
            &self.ctx,
            size,
            align,
            Self::NAME,
            // SAFETY: a plain allocation with the context current; the memory is not read.
            |n| unsafe { result::malloc_sync(n) }.map(|p| p as usize),
            // SAFETY: frees the pointer just allocated, which nothing else has seen.
            |p| unsafe { result::free_sync(p as _) },
        )
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, _: usize, _: StreamRef) {
        if size == 0 {
            return;
        }
        // SAFETY: the caller passes a pointer from cuMemAlloc that is not freed yet.
        driver_free(&self.ctx, || unsafe {
            result::free_sync(ptr.as_ptr() as _)
        });
    }

    context_leaf!(streams);
}

static_assertions::assert_impl_all!(Cuda: Send, Sync, crate::Accessible<crate::DeviceAccessible>);
static_assertions::assert_not_impl_any!(Cuda: crate::Accessible<crate::HostAccessible>);
static_assertions::assert_eq_size!(Cuda, usize);
