//! The bookkeeping of a two-level segregated fit (TLSF) allocator, per stream: block records,
//! size classes searched through bitmaps, immediate coalescing. Shared by [`Tlsf`](super::Tlsf)
//! (over chunks of an upstream) and [`VirtualMemory`](crate::leaf::VirtualMemory) (over reserved
//! virtual ranges).
//!
//! Every free block belongs to the stream it was freed on (the stream of the chunk that added it,
//! for a fresh chunk) and sits in that stream's classes: a free list per class, a bitmap of the
//! non-empty classes of each first level and one of the non-empty first levels. Finding a class
//! with a block that surely fits is two bit scans; a freed block merges with its neighbours in
//! address order (kept as links between block records, so no lookup) when they are free on the
//! same stream and in the same chunk. The only map is from an allocated block's address to its
//! record, for `free`.

mod allocated;
mod chunks;
mod classes;
mod records;
mod take;
#[cfg(test)]
mod tests;

use crate::stream::{Held, StreamKeeper};
use classes::Classes;
use std::collections::{BTreeMap, HashMap};

pub(crate) use super::growth::GRANULE;
/// How many blocks of a request's own class are tried before a larger class is taken: a bounded
/// best-fit pass that keeps the fit close to the request where the class holds blocks that fit.
const OWN_CLASS_TRIES: usize = 8;
/// No record.
const NIL: u32 = u32::MAX;

/// The record of a block, free or allocated.
#[derive(Debug, Clone, Copy)]
struct Block {
    addr: usize,
    size: usize,
    /// The block just below and just above in the same chunk (`NIL` at the chunk's edges).
    prev: u32,
    next: u32,
    /// The free list links of a free block (`NIL` for an allocated one).
    prev_free: u32,
    next_free: u32,
    /// The stream a free block was freed on (or whose chunk it came from).
    stream: Held,
    free: bool,
}

/// An upstream allocation (or a reserved range) the blocks are carved from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Chunk {
    pub(crate) size: usize,
    /// The stream it was allocated on, which it is given back on.
    pub(crate) stream: Held,
    /// The record of the block at its start: always the same one, since the lowest piece of a
    /// split keeps its record and a merge keeps the lower one's.
    first: u32,
}

type AddrMap<V> = HashMap<usize, V, crate::hash::FastHash>;

/// Free and allocated blocks of some chunks, the free ones per stream by TLSF class.
#[derive(Debug, Default)]
pub(crate) struct TlsfIndex {
    blocks: Vec<Block>,
    /// Records not in use, for reuse: the records are as many as the most blocks at once.
    spare: Vec<u32>,
    /// Allocated blocks by address.
    live: AddrMap<u32>,
    /// One set of classes per stream with free blocks, at its keeper slot.
    lists: Vec<Option<Box<Classes>>>,
    /// The chunks by address.
    pub(crate) chunks: BTreeMap<usize, Chunk>,
    /// Bytes in chunks.
    pub(crate) size: usize,
    /// The most `size` has been.
    pub(crate) peak: usize,
    /// Bytes in allocated blocks.
    pub(crate) allocated: usize,
    /// Growths under way ([`Chunks::in_flight`](super::growth::Chunks::in_flight)).
    in_flight: super::growth::InFlight,
    /// A bit per keeper slot (bit 63 for every slot from 63 up) whose list got a block since
    /// [`take_listed`](Self::take_listed): set in [`push`](Self::push), which every path that
    /// puts bytes on a list goes through (a free, a merge, a split's leftover, a new chunk).
    listed: u64,
    /// Where a request takes a block of a larger class: the lowest-addressed of that class's
    /// first [`OWN_CLASS_TRIES`] blocks (true), or its first (false: `VirtualMemory`, where
    /// the lowest made page footprint worse, 1.024 to 1.027 of peak live on the transformer
    /// training trace).
    pub(crate) address_order: bool,
    /// Keeps alive every stream a `Held` above names (declared last: dropped after them).
    pub(crate) streams: StreamKeeper,
}

/// The bit of [`TlsfIndex::take_listed`] that stands for every stream.
pub(crate) const ALL_STREAMS: u32 = 63;

impl TlsfIndex {
    /// An empty index that takes the lowest-addressed fit of a larger class (`Tlsf`'s).
    pub(crate) fn address_ordered() -> Self {
        TlsfIndex {
            address_order: true,
            ..TlsfIndex::default()
        }
    }
}
