// A resource whose `unsafe impl MemoryResource` says `Host = B0` cannot be declared
// host-accessible by a safe `impl Accessible<HostAccessible>`: the bits are the only claim.
use mrstack::prelude::*;
use mrstack::resource::AllocError;
use std::ptr::NonNull;

struct MyWrap(Simulated);

// SAFETY: forwards to Simulated.
unsafe impl MemoryResource for MyWrap {
    type Host = typenum::B0;
    type Device = typenum::B0;
    type Managed = typenum::B0;
    type Pageable = typenum::B0;
    type Alignment = typenum::U256;
    fn allocate(&self, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>, AllocError> {
        self.0.allocate(size, align, s)
    }
    unsafe fn deallocate(&self, p: NonNull<u8>, size: usize, align: usize, s: StreamRef) {
        unsafe { self.0.deallocate(p, size, align, s) }
    }
    fn synchronize(&self, s: StreamRef) -> Result<(), AllocError> {
        self.0.synchronize(s)
    }
    fn order_after(&self, s: StreamRef, after: StreamRef) -> Result<(), AllocError> {
        self.0.order_after(s, after)
    }
}

impl Accessible<HostAccessible> for MyWrap {}

fn main() {}
