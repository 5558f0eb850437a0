// A DeviceBox hands its memory to kernels: host malloc memory cannot back it.
use mrstack::prelude::*;
use std::sync::Arc;

fn make(stream: &Arc<cudarc::driver::CudaStream>) {
    let _b = DeviceBox::new(1.0f32, System::new(), stream);
}

fn main() {}
