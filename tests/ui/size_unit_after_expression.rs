// A unit follows one number literal, not an expression: the error shows what to write.
use mrstack::prelude::*;

fn main() {
    let _mr = resource_stack![
        System::new(),
        Pool { max: 64 * 1024 MiB },
    ];
}
