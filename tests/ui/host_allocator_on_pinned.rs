// A Vec in pinned memory hands out `&mut [T]`, which cudarc copies into asynchronously: dropping
// the Vec could free memory a DMA still writes. HostAllocator takes host-only memory.
use mrstack::prelude::*;
use mrstack::container::HostAllocator;

fn main() {
    let ctx = mrstack::cuda_context(0).unwrap();
    let pinned = Pinned::new(&ctx).unwrap();
    let _alloc = HostAllocator::new(&pinned);
}
