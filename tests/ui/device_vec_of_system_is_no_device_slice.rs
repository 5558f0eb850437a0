// The container types name any resource (`DeviceVec<T, R: MemoryResource>`), but only the
// constructors make values, and they ask for DeviceAccessible; cudarc's traits ask for it too, so a
// `DeviceVec` over host memory reaches no copy or kernel.
use mrstack::prelude::*;
use std::sync::Arc;

fn read(stream: &Arc<cudarc::driver::CudaStream>, v: &DeviceVec<u32, System>) -> Vec<u32> {
    stream.clone_dtoh(v).unwrap()
}

fn main() {}
