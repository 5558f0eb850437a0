// Size literals are checked at compile time: `GiBs` is not a unit.
use mrstack::prelude::*;

fn main() {
    let _mr = resource_stack![
        System::new(),
        Pool { initial: 1 GiBs },
    ];
}
