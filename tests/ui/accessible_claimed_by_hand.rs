// A resource whose `unsafe impl MemoryResource` says `Host = B0` cannot be declared
// host-accessible by a safe `impl Accessible<HostAccessible>`: the bits are the only claim.
use mrstack::prelude::*;
use std::ptr::NonNull;
use typenum::{B0, U256};

/// Hands out no memory: every request fails.
struct Empty;

// SAFETY: no memory is ever handed out, so no claim about it can be false.
unsafe impl MemoryResource for Empty {
    type Host = B0;
    type Device = B0;
    type Migratable = B0;
    type Pageable = B0;
    type Alignment = U256;
    fn allocate(&self, size: usize, align: usize, _: StreamRef) -> Result<NonNull<u8>, AllocError> {
        Err(AllocError::out_of_memory(size, align, "Empty"))
    }
    unsafe fn deallocate(&self, _: NonNull<u8>, _: usize, _: usize, _: StreamRef) {}
    fn synchronize(&self, _: StreamRef) -> Result<(), AllocError> {
        Ok(())
    }
    fn order_after(&self, _: StreamRef, _: StreamRef) -> Result<(), AllocError> {
        Ok(())
    }
}

impl Accessible<HostAccessible> for Empty {}

fn main() {}
