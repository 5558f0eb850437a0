// cuMemAlloc memory is device-only: reading it in place on the host is refused.
use mrstack::prelude::*;

fn read(v: &DeviceVec<f32, Cuda>) -> f32 {
    v.as_host_slice().unwrap()[0]
}

fn main() {}
