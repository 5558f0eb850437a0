// Two mutable views of one vector, written on two streams at once, would each record the
// vector's one write event over the other's, and the drop would wait for one write only (a free
// under a DMA): a mutable view does not split.
use mrstack::prelude::*;
use std::sync::Arc;

fn halves(stream: &Arc<cudarc::driver::CudaStream>, v: &mut DeviceVec<u32, Cuda>) {
    let mut all = v.slice_mut(..).unwrap();
    let (mut a, mut b) = all.split_at_mut(8);
    stream.memset_zeros(&mut a).unwrap();
    stream.memset_zeros(&mut b).unwrap();
}

fn main() {}
