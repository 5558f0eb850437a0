// A bin of its own resource must claim what the binning claims from its upstream: a bin of pinned
// memory under a binning over System would make the binning pageable on paper, and a
// HostAllocator's Vec would land in memory the driver may DMA into.
use mrstack::suballoc::BinningConfig;
use mrstack::prelude::*;
use mrstack::{container::HostAllocator, erased::AnyResource, suballoc::{Binning, BinningConfig}};

fn main() {
    let ctx = mrstack::cuda_context(0).unwrap();
    let pinned = AnyResource::<HostAccessible>::new(Pinned::new(&ctx).unwrap());
    let binning = Binning::new(System::new(), BinningConfig::default())
        .with_bin(64 << 10, pinned)
        .unwrap();
    let _alloc = HostAllocator::new(binning);
}
