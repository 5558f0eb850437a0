// Erasing to `AnyResource<HostAccessible>` forgets that the memory is pinned, so the erased stack
// is not known to be pageable either.
use mrstack::prelude::*;
use mrstack::{container::HostAllocator, erased::AnyResource};

fn main() {
    let ctx = mrstack::cuda_context(0).unwrap();
    let any = AnyResource::<HostAccessible>::new(Pinned::new(&ctx).unwrap());
    let _alloc = HostAllocator::new(any);
}
