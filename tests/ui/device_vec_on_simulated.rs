// Simulated memory is address ranges only: no container may dereference it.
use mrstack::prelude::*;
use std::sync::Arc;

fn make(stream: &Arc<cudarc::driver::CudaStream>) {
    let sim = Simulated::new(1 << 30);
    let _v = DeviceVec::<u8, _>::zeroed(16, &sim, stream);
}

fn main() {}
