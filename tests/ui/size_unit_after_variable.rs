// A unit follows a number literal, not a variable: the error shows the usize expression to write.
use mrstack::prelude::*;

fn main() {
    let n = 2;
    let _mr = resource_stack![
        System::new(),
        Pool { initial: n GiB },
    ];
}
