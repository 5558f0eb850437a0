// `SameProperties` is sealed: declaring it by hand for a resource whose properties differ from the
// upstream's (host and device memory, not pageable, under a binning over System) would let
// `with_bin` put memory the driver may DMA into under the binning's pageable claim.
use mrstack::prelude::*;
use mrstack::property::SameProperties;
use std::ptr::NonNull;

struct Disguised(Pinned);

// SAFETY: every call goes to the pinned resource, whose properties these are.
unsafe impl MemoryResource for Disguised {
    type Host = typenum::B1;
    type Device = typenum::B1;
    type Migratable = typenum::B0;
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

impl SameProperties<System> for Disguised {}

fn main() {}
