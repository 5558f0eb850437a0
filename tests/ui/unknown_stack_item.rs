// A line of resource_stack! that names no adaptor configuration is an error on that line.
use mrstack::prelude::*;

fn main() {
    let _mr = resource_stack![
        System::new(),
        Compressing { level: 3 },
    ];
}
