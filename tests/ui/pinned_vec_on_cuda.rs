// A PinnedVec derefs to [T] on the host: device-only memory cannot back it.
use mrstack::prelude::*;
use std::sync::Arc;

fn make(cuda: Cuda, stream: &Arc<cudarc::driver::CudaStream>) {
    let _v = PinnedVec::<u32, _>::zeroed(16, cuda, stream);
}

fn main() {}
