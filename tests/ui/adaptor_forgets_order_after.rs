// Stream ordering is part of the contract: an adaptor must say what it does with `synchronize`
// and `order_after` (forward them, usually); there is no default to forget.
use mrstack::prelude::*;
use mrstack::resource::AllocError;
use std::ptr::NonNull;

struct Counting<U> {
    upstream: U,
}

// SAFETY: allocations go to the upstream unchanged.
unsafe impl<U: MemoryResource> MemoryResource for Counting<U> {
    type Host = U::Host;
    type Device = U::Device;
    type Migratable = U::Migratable;
    type Pageable = U::Pageable;
    type Alignment = U::Alignment;
    fn allocate(&self, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>, AllocError> {
        self.upstream.allocate(size, align, s)
    }
    unsafe fn deallocate(&self, p: NonNull<u8>, size: usize, align: usize, s: StreamRef) {
        unsafe { self.upstream.deallocate(p, size, align, s) }
    }
}

fn main() {}
