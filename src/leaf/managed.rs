//! `Managed`: unified memory from `cuMemAllocManaged`, reachable from host and device.
//!
//! The driver migrates pages on demand (or on prefetch), so the memory is `Migratable`. One driver
//! call per operation, like `Cuda`. Guarantees 256-byte alignment. Do not ask for more managed
//! memory than the device has free: oversubscription can stall the whole GPU.

use super::{context_leaf, driver_allocate, driver_free};
use crate::resource::{check_request, MemoryResource, Result};
use crate::stream::StreamRef;
use cudarc::driver::{result, sys, CudaContext};
use std::ptr::NonNull;
use typenum::{B1, U256};

/// Managed (unified) memory from `cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)`.
#[derive(Debug, Clone)]
pub struct Managed {
    ctx: std::sync::Arc<CudaContext>,
}

context_leaf!(Managed, "managed memory");

// SAFETY: cuMemAllocManaged returns memory valid on host and device until cuMemFree, aligned to
// 256 (checked by driver_allocate, which refuses larger alignments).
unsafe impl MemoryResource for Managed {
    type Host = B1;
    type Device = B1;
    type Managed = B1;
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
            |n| {
                // SAFETY: a plain allocation with the context current; the memory is not read.
                unsafe { result::malloc_managed(n, sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL) }
                    .map(|p| p as usize)
            },
            // SAFETY: frees the pointer just allocated, which nothing else has seen.
            |p| unsafe { result::free_sync(p as _) },
        )
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, _: usize, _: StreamRef) {
        if size == 0 {
            return;
        }
        // SAFETY: the caller passes a pointer from cuMemAllocManaged that is not freed yet.
        driver_free(&self.ctx, || unsafe {
            result::free_sync(ptr.as_ptr() as _)
        });
    }

    context_leaf!(streams);
}

static_assertions::assert_impl_all!(
    Managed: Send,
    Sync,
    crate::Accessible<(crate::HostAccessible, crate::DeviceAccessible)>,
    crate::Accessible<crate::Migratable>
);
static_assertions::assert_eq_size!(Managed, usize);
