// Items are separated by commas: one missing after a layer is named.
use mrstack::prelude::*;

fn main() {
    let _mr = resource_stack![
        System::new(),
        Pool { initial: 1 GiB }
        Statistics,
    ];
}
