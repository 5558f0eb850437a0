// A user cannot give a resource a property by implementing `Accessible` for a marker of their
// own: `Simulated` has no memory behind it, and this would let an erased stack claim it does.
use mrstack::prelude::*;

struct MyMarker;

impl Accessible<MyMarker> for Simulated {}

fn main() {}
