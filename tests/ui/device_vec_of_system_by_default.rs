// The container types name any resource (`DeviceVec<T, R: MemoryResource>`), but nothing other
// than the constructors (which ask for DeviceAccessible) makes one: no Default, Clone or From.
use mrstack::prelude::*;

fn make() -> DeviceVec<u32, System> {
    Default::default()
}

fn main() {}
