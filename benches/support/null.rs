//! `Null`, the resource that does no work, so that what a bench measures is the code above it.

use mrstack::prelude::*;
use mrstack::resource::check_request;
use std::ptr::NonNull;
use typenum::{B0, U256};

/// A resource that does nothing: every allocation is the same address (aligned to 1 MiB, never
/// dereferenced: the type claims no access), every deallocation a no-op.
pub(crate) struct Null;

// SAFETY: claims no access property, so the address is never dereferenced; it meets every
// alignment up to 1 MiB. Overlap does not matter for memory nobody touches.
unsafe impl MemoryResource for Null {
    type Host = B0;
    type Device = B0;
    type Migratable = B0;
    type Pageable = B0;
    type Alignment = U256;

    #[inline]
    fn allocate(&self, size: usize, align: usize, _: StreamRef) -> Result<NonNull<u8>, AllocError> {
        if let Some(p) = check_request::<Self>(size, align, "Null")? {
            return Ok(p);
        }
        Ok(NonNull::new(std::ptr::without_provenance_mut(1 << 20)).expect("not null"))
    }

    #[inline]
    unsafe fn deallocate(&self, _: NonNull<u8>, _: usize, _: usize, _: StreamRef) {}
    fn synchronize(&self, _: StreamRef) -> Result<(), AllocError> {
        Ok(())
    }
    fn order_after(&self, _: StreamRef, _: StreamRef) -> Result<(), AllocError> {
        Ok(())
    }
}
