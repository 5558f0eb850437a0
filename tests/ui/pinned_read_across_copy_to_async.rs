// `copy_to_async` queues a DMA into the `PinnedVec`: a host read of it taken before the call
// cannot be used after it (the next `Deref` waits for the copy instead).
use mrstack::prelude::*;

fn stale(dev: &DeviceVec<u32, Cuda>, pinned: &mut PinnedVec<u32, Pinned>) -> u32 {
    let before: &[u32] = &pinned[..];
    dev.copy_to_async(pinned).unwrap();
    before[0]
}

fn main() {}
