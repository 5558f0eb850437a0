// Sizes with units are read in a layer's fields, not inside an expression such as the leaf.
use mrstack::prelude::*;

fn main() {
    let _mr = resource_stack![
        Simulated::new(1 GiB),
        Pool { initial: 64 MiB },
    ];
}
