// A pool whose initial size is above its maximum, both literal sizes: refused at compile time.
use mrstack::prelude::*;

fn main() {
    let _mr = resource_stack![
        System::new(),
        Pool { initial: 2 GiB, max: 1 GiB },
    ];
}
