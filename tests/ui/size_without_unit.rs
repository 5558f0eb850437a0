// A size field's number literal needs its unit: `initial: 64` would be 64 bytes, silently.
use mrstack::prelude::*;

fn main() {
    let _mr = resource_stack![
        System::new(),
        Pool { initial: 64 },
    ];
}
