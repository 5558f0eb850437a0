// A library function whose resource parameter is bound to host memory only cannot make a
// DeviceVec of it: one error, at the argument, that says what is missing and how to bound `R`.
use mrstack::prelude::*;
use std::sync::Arc;

fn upload<'a, R: MemoryResource + Accessible<HostAccessible>>(
    mr: &'a R,
    data: &[f32],
    stream: &Arc<cudarc::driver::CudaStream>,
) -> Result<DeviceVec<f32, &'a R>, AllocError> {
    DeviceVec::from_slice(data, mr, stream)
}

fn main() {
    let _ = upload::<System>;
}
