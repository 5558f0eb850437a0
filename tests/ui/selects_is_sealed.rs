// `Selects<P>` maps a resource to its property bit; `Accessible<P>` is derived from it. A caller
// who could implement it for a resource of theirs (or for a pointer to one) could make any
// resource claim any property: it is in a private module.
use mrstack::prelude::*;

struct Host(System);

impl mrstack::property::sealed::Selects<DeviceAccessible> for Host {
    type Bit = mrstack::typenum::B1;
}

fn main() {}
