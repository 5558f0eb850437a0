// An AnyResource<DeviceAccessible> promises memory kernels can read: System's host memory cannot be
// erased into one.
use mrstack::prelude::*;
use mrstack::erased::AnyResource;

fn main() {
    let _mr = AnyResource::<DeviceAccessible>::new(System::new());
}
