//! What a suballocator holds, in one report for all of them.

use crate::units::Bytes;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// What a suballocator holds, read at one instant: [`Pool::usage`](super::Pool::usage),
/// [`FixedSize::usage`](super::FixedSize::usage), [`Binning::usage`](super::Binning::usage) and
/// [`Arena::usage`](super::Arena::usage) all report it.
///
/// `held` counts only memory the suballocator took from its upstream to carve: a request a
/// `Binning` passes straight to its upstream is in neither `held` nor `allocated`.
///
/// ```
/// use mrstack::prelude::*;
///
/// let mr = resource_stack![Simulated::new(1 << 30), Pool { initial: 1 MiB }];
/// let p = mr.allocate(1000, 256, StreamRef::DEFAULT).unwrap();
/// let usage = mr.usage();
/// assert_eq!((usage.held, usage.allocated, usage.chunks), (1 << 20, 1024, 1));
/// assert_eq!(usage.to_string(), "1.00 MiB held (peak 1.00 MiB) in 1 chunk: 1.00 KiB allocated, 1023.00 KiB free in 1 block");
/// # unsafe { mr.deallocate(p, 1000, 256, StreamRef::DEFAULT) };
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes held from the upstream now.
    pub held: usize,
    /// The most bytes held from the upstream at once since the resource was built.
    pub peak_held: usize,
    /// Bytes of `held` in live blocks (each request rounded up to the block that serves it).
    pub allocated: usize,
    /// Free blocks ready for reuse, over all streams.
    pub free_blocks: usize,
    /// Upstream allocations (chunks, superblocks) held.
    pub chunks: usize,
}

impl Usage {
    /// Bytes of `held` not in live blocks.
    pub fn free(&self) -> usize {
        self.held - self.allocated
    }
}

impl fmt::Display for Usage {
    /// `1.00 GiB held (peak 1.50 GiB) in 3 chunks: 512.00 MiB allocated, 512.00 MiB free in 12 blocks`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        write!(
            f,
            "{} held (peak {}) in {} chunk{}: {} allocated, {} free in {} block{}",
            Bytes::from(self.held),
            Bytes::from(self.peak_held),
            self.chunks,
            plural(self.chunks),
            Bytes::from(self.allocated),
            Bytes::from(self.free()),
            self.free_blocks,
            plural(self.free_blocks),
        )
    }
}

/// Bytes held from the upstream and their peak, updated where chunks are taken and given back.
#[derive(Debug, Default)]
pub(crate) struct Meter {
    held: AtomicUsize,
    peak: AtomicUsize,
}

impl Meter {
    pub(crate) fn grew(&self, bytes: usize) {
        let held = self.held.fetch_add(bytes, Relaxed) + bytes;
        self.peak.fetch_max(held, Relaxed);
    }

    pub(crate) fn shrank(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Relaxed);
    }

    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Relaxed)
    }
}
