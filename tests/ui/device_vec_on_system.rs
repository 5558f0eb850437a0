// A DeviceVec on host malloc memory would give kernels a pointer they cannot dereference.
use mrstack::prelude::*;
use std::sync::Arc;

fn make(stream: &Arc<cudarc::driver::CudaStream>) {
    let _v = DeviceVec::<f32, _>::zeroed(1024, System::new(), stream);
}

fn main() {}
