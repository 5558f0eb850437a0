// Holoscan-style size strings are checked at compile time too.
use mrstack::prelude::*;

fn main() {
    let _mr = resource_stack![
        System::new(),
        Pool { max: "512 MiBytes" },
    ];
}
