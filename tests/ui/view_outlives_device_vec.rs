// A view borrows its vector: it cannot outlive it (the vector's drop frees the memory the view
// points at).
use mrstack::prelude::*;
use mrstack::container::DeviceView;
use std::sync::Arc;

fn escape<'a>(stream: &'a Arc<cudarc::driver::CudaStream>, mr: &'a Cuda) -> DeviceView<'a, u32> {
    let v = DeviceVec::<u32, _>::zeroed(16, mr, stream).unwrap();
    v.slice(..).unwrap()
}

fn main() {}
