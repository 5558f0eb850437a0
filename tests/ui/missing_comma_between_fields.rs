// A configuration's fields are separated by commas: one missing is named.
use mrstack::prelude::*;

fn main() {
    let _mr = resource_stack![
        System::new(),
        Pool { initial: 1 GiB max: 8 GiB },
    ];
}
