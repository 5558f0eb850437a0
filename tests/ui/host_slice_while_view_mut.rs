// A mutable view may be handed to a device write on any stream: the host cannot read the values
// (managed memory, `as_host_slice`) while it is alive.
use mrstack::prelude::*;
use std::sync::Arc;

fn race(stream: &Arc<cudarc::driver::CudaStream>, mr: &Managed) {
    let mut v = DeviceVec::<u32, _>::zeroed(16, mr, stream).unwrap();
    let mut view = v.slice_mut(..).unwrap();
    let host = v.as_host_slice().unwrap();
    stream.memset_zeros(&mut view).unwrap();
    let _ = host[0];
}

fn main() {}
