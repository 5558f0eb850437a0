// An arena carves its upstream's memory: over host malloc memory it gives host memory only, and a
// DeviceVec on it would hand kernels a pointer they cannot dereference.
use mrstack::prelude::*;
use std::sync::Arc;

fn make(stream: &Arc<cudarc::driver::CudaStream>) {
    let arena = resource_stack![System::new(), Arena { size: 64 MiB }];
    let _v = DeviceVec::<f32, _>::zeroed(1024, &arena, stream);
}

fn main() {}
