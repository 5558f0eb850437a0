// Two mutable views of one vector at once would record its one write event over each other
// (see view_mut_split.rs): the second needs the first to be gone.
use mrstack::prelude::*;
use std::sync::Arc;

fn both(stream: &Arc<cudarc::driver::CudaStream>, v: &mut DeviceVec<u32, Cuda>) {
    let mut a = v.slice_mut(..8).unwrap();
    let mut b = v.slice_mut(8..).unwrap();
    stream.memset_zeros(&mut a).unwrap();
    stream.memset_zeros(&mut b).unwrap();
}

fn main() {}
