// Property sets are mrstack's markers and their tuples: a set of one's own could map to any bits.
use mrstack::property::PropertySet;

struct Everything;

impl PropertySet for Everything {
    type Host = typenum::B1;
    type Device = typenum::B1;
    type Migratable = typenum::B1;
    type Pageable = typenum::B0;
}

fn main() {}
