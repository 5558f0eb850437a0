//! Host tests of `FixedSize`: preallocation and growth by chunks, stream ordering (with
//! `Binning`), out of memory and recovery.

use mrstack::prelude::*;
use mrstack::suballoc::{Binning, FixedSize};
use mrstack::suballoc::{BinningConfig, FixedSizeConfig};
use mrstack::testing::Recorder;

use crate::suballoc_support::check_cross_stream_reuse;

#[test]
fn fixed_size_preallocates_and_grows_by_chunks() {
    let sim = Simulated::new(1 << 30);
    // Naming every field in `resource_stack!` trips clippy's needless_update on the macro's
    // `..Default::default()`, so this names one and leaves the count to a plain constructor below.
    let mr = resource_stack![&sim, FixedSize { block_size: 4 KiB }];
    assert_eq!(mr.usage().free_blocks, 128);
    drop(mr);
    let mr = resource_stack![&sim, FixedSize { block_size: 4 KiB, blocks_to_preallocate: 4 }];
    assert_eq!(
        (sim.in_use(), sim.live(), mr.usage().free_blocks),
        (16 << 10, 1, 4)
    );
    let d = StreamRef::DEFAULT;
    let blocks: Vec<_> = (0..5).map(|_| mr.allocate(4096, 256, d).unwrap()).collect();
    assert_eq!(
        (sim.live(), mr.usage().free_blocks),
        (2, 3),
        "a second chunk of 4 blocks"
    );
    assert_eq!(
        blocks[1].as_ptr() as usize,
        blocks[0].as_ptr() as usize + 4096,
        "handed out from the chunk's start"
    );
    for p in blocks {
        // SAFETY: live with this size.
        unsafe { mr.deallocate(p, 4096, 256, d) };
    }
    let defaults = resource_stack![&sim, FixedSize];
    assert_eq!(
        (defaults.block_size(), defaults.usage().free_blocks),
        (1 << 20, 128)
    );
    drop((mr, defaults));
    assert_eq!((sim.in_use(), sim.live()), (0, 0));
}

#[test]
fn fixed_size_and_binning_order_streams_before_handing_blocks_across() {
    let rec = Recorder::new(Simulated::new(1 << 30));
    let fixed = FixedSizeConfig {
        block_size: 4096,
        blocks_to_preallocate: 0,
    };
    check_cross_stream_reuse(FixedSize::new(&rec, fixed), &rec, 100);
    let rec = Recorder::new(Simulated::new(1 << 30));
    let bins = BinningConfig {
        min: 256,
        max: 4096,
    };
    check_cross_stream_reuse(Binning::new(&rec, bins), &rec, 2000);
}

#[test]
fn fixed_size_out_of_memory_recovers() {
    let sim = Simulated::new(3 * 4096);
    let mr = resource_stack![&sim, FixedSize { block_size: 4 KiB, blocks_to_preallocate: 2 }];
    let d = StreamRef::DEFAULT;
    let a = mr.allocate(4096, 256, d).unwrap();
    let b = mr.allocate(4096, 256, d).unwrap();
    // The next chunk of 2 blocks does not fit; one block does.
    let c = mr.allocate(4096, 256, d).unwrap();
    let e = mr.allocate(4096, 256, d).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    // SAFETY: live with this size.
    unsafe { mr.deallocate(b, 4096, 256, d) };
    assert_eq!(mr.allocate(4096, 256, d).unwrap(), b);
    for p in [a, b, c] {
        // SAFETY: live with this size.
        unsafe { mr.deallocate(p, 4096, 256, d) };
    }
}

#[test]
fn fixed_size_preallocates_any_count_without_listing_each_block() {
    // 2^54 blocks of 256 bytes fit Simulated's address space; one address each would take 128
    // PiB of host memory (10^9 blocks alone would take 7.6 GB): a fresh chunk is a range.
    let sim = Simulated::new(usize::MAX);
    let config = FixedSizeConfig {
        block_size: 256,
        blocks_to_preallocate: 1 << 54,
    };
    let mr = FixedSize::try_new(&sim, config).unwrap();
    assert_eq!(mr.usage().free_blocks, 1 << 54);
    let d = StreamRef::DEFAULT;
    let (a, b) = (
        mr.allocate(256, 256, d).unwrap(),
        mr.allocate(1, 1, d).unwrap(),
    );
    // From the chunk's start, in address order.
    assert_eq!(b.as_ptr() as usize - a.as_ptr() as usize, 256);
    assert_eq!(mr.usage().free_blocks, (1 << 54) - 2);
    // SAFETY: both came from mr with these sizes and alignments.
    unsafe {
        mr.deallocate(a, 256, 256, d);
        mr.deallocate(b, 1, 1, d);
    }
    assert_eq!(mr.usage().free_blocks, 1 << 54);
    drop(mr);
    assert_eq!(sim.in_use(), 0, "the whole chunk went back");
}
