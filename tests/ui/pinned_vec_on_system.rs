// A PinnedVec is passed to kernels too: pageable host memory cannot back it.
use mrstack::prelude::*;
use std::sync::Arc;

fn make(stream: &Arc<cudarc::driver::CudaStream>) {
    let _v = PinnedVec::<u32, _>::zeroed(16, System::new(), stream);
}

fn main() {}
