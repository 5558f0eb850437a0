// The leaf goes first: a layer in its place is an error that says so.
use mrstack::prelude::*;
use mrstack::suballoc::Pool;

fn main() {
    let _mr = resource_stack![
        Pool { initial: 1 GiB },
        System::new(),
    ];
}
