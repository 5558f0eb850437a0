// A Vec's elements are read and written by the host: device-only memory cannot back one.
use allocator_api2::vec::Vec;
use mrstack::prelude::*;
use mrstack::container::HostAllocator;

fn make(cuda: &Cuda) {
    let _v: Vec<u32, _> = Vec::new_in(HostAllocator::new(cuda));
}

fn main() {}
