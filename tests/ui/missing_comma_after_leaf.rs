// Items are separated by commas: one missing after the leaf is named.
use mrstack::prelude::*;
use mrstack::suballoc::Pool;

fn main() {
    let _mr = resource_stack![
        System::new()
        Pool { initial: 1 GiB },
    ];
}
