// A container holding `&R` cannot outlive R: the borrow checker stops the use-after-free.
use mrstack::prelude::*;
use std::sync::Arc;

fn escape(stream: &Arc<cudarc::driver::CudaStream>) -> DeviceVec<u32, &'static Cuda> {
    let cuda = Cuda::on_device(0).unwrap();
    DeviceVec::zeroed(16, &cuda, stream).unwrap()
}

fn main() {}
