// A field that counts blocks is not a size: a unit there is a mistake.
use mrstack::prelude::*;

fn main() {
    let _mr = resource_stack![
        System::new(),
        FixedSize { block_size: 1 MiB, blocks_to_preallocate: 128 MiB },
    ];
}
