// A `&mut [T]` of pinned memory would let cudarc copy into it asynchronously behind the vector's
// back (`stream.memcpy_dtoh(&dev, &mut pinned[..])`): PinnedVec hands out no mutable slice.
use mrstack::prelude::*;
use std::sync::Arc;

fn copy_back(
    stream: &Arc<cudarc::driver::CudaStream>,
    dev: &DeviceVec<u32, Cuda>,
    pinned: &mut PinnedVec<u32, Pinned>,
) {
    stream.memcpy_dtoh(dev, &mut pinned[..]).unwrap();
}

fn main() {}
