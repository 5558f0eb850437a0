// `Pageable` in a tuple set does not make an erased resource pageable: only `AnyResource<Pageable>`
// (built from `HostOnly` resources) is `HostOnly`, and `HostAllocator` hands out `&mut [T]` only
// over that. A tuple naming `Pageable` alongside other markers claims nothing pageable.
use mrstack::property::Pageable;
use mrstack::prelude::*;

fn host_only<R: HostOnly>() {}

fn main() {
    host_only::<AnyResource<(Pageable, HostAccessible)>>();
}
