// A HostDevicePair's device side is device memory: a PinnedVec (host + device) over it is refused.
use mrstack::suballoc::{HostDevicePair, Pool};
use mrstack::prelude::*;
use mrstack::suballoc::{HostDevicePair, Pool};
use std::sync::Arc;

fn staging<'a>(
    pair: &'a HostDevicePair<Pinned, Cuda>,
    stream: &Arc<cudarc::driver::CudaStream>,
) -> PinnedVec<f32, &'a Pool<Cuda>> {
    PinnedVec::zeroed(16, pair.device(), stream).unwrap()
}

fn main() {}
