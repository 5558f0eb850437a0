// The check behind `Accessible` (a property bit is set) is not a trait users can implement:
// implementing it for `B0` would turn every honest resource's "no" into a "yes".

impl mrstack::property::sealed::IsSet for typenum::B0 {}

fn main() {}
