// A misspelt configuration field in resource_stack! points at the field.
use mrstack::prelude::*;

fn main() {
    let mr = resource_stack![Simulated::new(1 << 30), Statistics, Limiting { limt: 1 GiB }];
    let _ = mr;
}
