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

use super::chunk_pool::FreeIndex;
use super::growth::{Chunks, FreeChunk};
use crate::resource::AllocError;
use crate::stream::{Held, StreamKeeper, StreamRef};
use std::collections::{BTreeMap, HashMap};

pub(crate) use super::growth::GRANULE;
const GRANULE_LOG: u32 = GRANULE.trailing_zeros();
/// log2 of the classes per power of two: 32, so a class spans at most 1/32 of its sizes and a
/// search that rounds up to the next class wastes at most ~3%.
const SL_LOG: u32 = 5;
const SL: usize = 1 << SL_LOG;
/// First levels: class 0 holds the sizes below `SL` granules one per class (exact), level `f`
/// the sizes of `[2^(f+4), 2^(f+5))` granules.
const FL: usize = (usize::BITS - GRANULE_LOG - SL_LOG + 1) as usize;
/// How many blocks of a request's own class are tried before a larger class is taken: a bounded
/// best-fit pass that keeps the fit close to the request where the class holds blocks that fit.
const OWN_CLASS_TRIES: usize = 8;
/// No record.
const NIL: u32 = u32::MAX;

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

/// One stream's free blocks by class.
#[derive(Debug)]
#[repr(C)]
struct Classes {
    first: u64,
    /// Free blocks in these classes: the list goes (releasing the stream) at zero.
    blocks: usize,
    /// The stream these blocks were freed on (the keeper slot the list sits at).
    stream: Held,
    second: [u32; FL],
    heads: [[u32; SL]; FL],
}

impl Classes {
    fn new(stream: Held) -> Box<Self> {
        Box::new(Classes {
            stream,
            first: 0,
            second: [0; FL],
            heads: [[NIL; SL]; FL],
            blocks: 0,
        })
    }

    /// The first non-empty class at or above `(f, s)`.
    #[inline]
    fn find(&self, f: usize, s: usize) -> Option<(usize, usize)> {
        let here = self.second[f] & (u32::MAX << s);
        if here != 0 {
            return Some((f, here.trailing_zeros() as usize));
        }
        let above = self.first & u64::MAX.checked_shl(f as u32 + 1).unwrap_or(0);
        if above == 0 {
            return None;
        }
        let f = above.trailing_zeros() as usize;
        Some((f, self.second[f].trailing_zeros() as usize))
    }
}

/// The class a free block of `size` bytes (a granule multiple, not zero) is listed in: every
/// block of class `(f, s)` is at least the class's lower bound.
#[inline]
fn class_of(size: usize) -> (usize, usize) {
    let units = size >> GRANULE_LOG;
    if units < SL {
        return (0, units);
    }
    let log = usize::BITS - 1 - units.leading_zeros();
    let s = (units >> (log - SL_LOG)) - SL;
    ((log - SL_LOG + 1) as usize, s)
}

/// The lowest class whose every block holds `size` bytes (a granule multiple, not zero): the
/// request rounded up to the next class boundary.
#[inline]
fn class_at_least(size: usize) -> Option<(usize, usize)> {
    let units = size >> GRANULE_LOG;
    if units < SL {
        return Some((0, units));
    }
    let log = usize::BITS - 1 - units.leading_zeros();
    let step = (1usize << (log - SL_LOG)) - 1;
    let up = units.checked_add(step)? & !step;
    let (f, s) = class_of(up.checked_mul(GRANULE)?);
    (f < FL).then_some((f, s))
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
    /// Growths under way ([`Chunks::in_flight`]).
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

    /// True when `n` more records can be made: record numbers stay below `NIL`. The callers
    /// check before they change anything, so a full table refuses a request (out of memory)
    /// rather than alias two records.
    fn room_for(&self, n: usize) -> bool {
        self.spare.len() >= n || self.blocks.len() + n < NIL as usize
    }

    /// True when one more record can be made (a split, a shrink).
    pub(crate) fn has_room(&self) -> bool {
        self.room_for(1)
    }

    /// A record for `block`; the caller checked [`room_for`](Self::room_for).
    fn record(&mut self, block: Block) -> u32 {
        match self.spare.pop() {
            Some(i) => {
                self.blocks[i as usize] = block;
                i
            }
            None => {
                let i = self.blocks.len() as u32;
                self.blocks.push(block);
                i
            }
        }
    }

    /// The list of `held`, created (holding the stream once more) if missing.
    fn list_for(&mut self, stream: StreamRef) -> Held {
        if let Some(held) = self.streams.find(stream) {
            if self.lists.get(held.slot()).is_some_and(Option::is_some) {
                return held;
            }
        }
        let held = self.streams.hold(stream);
        if self.lists.len() <= held.slot() {
            self.lists.resize_with(held.slot() + 1, || None);
        }
        self.lists[held.slot()] = Some(Classes::new(held));
        held
    }

    /// The `Held` of `stream` if it has free blocks.
    #[inline]
    pub(crate) fn list_of(&self, stream: StreamRef) -> Option<Held> {
        let held = self.streams.find(stream)?;
        self.lists.get(held.slot())?.as_ref().map(|_| held)
    }

    /// Puts the free block `i` (its `stream` set) at the head of its class list.
    fn push(&mut self, i: u32) {
        let b = self.blocks[i as usize];
        let (f, s) = class_of(b.size);
        let Some(list) = self.lists.get_mut(b.stream.slot()).and_then(Option::as_mut) else {
            return;
        };
        let head = list.heads[f][s];
        list.heads[f][s] = i;
        list.first |= 1 << f;
        list.second[f] |= 1 << s;
        list.blocks += 1;
        self.listed |= 1 << b.stream.slot().min(ALL_STREAMS as usize);
        if head != NIL {
            self.blocks[head as usize].prev_free = i;
        }
        let b = &mut self.blocks[i as usize];
        b.prev_free = NIL;
        b.next_free = head;
    }

    /// Takes the free block `i` off its class list; the list stays even when emptied (the caller
    /// calls `drop_if_empty`).
    fn unlink(&mut self, i: u32) {
        let b = self.blocks[i as usize];
        let (f, s) = class_of(b.size);
        if b.next_free != NIL {
            self.blocks[b.next_free as usize].prev_free = b.prev_free;
        }
        if b.prev_free != NIL {
            self.blocks[b.prev_free as usize].next_free = b.next_free;
        }
        let Some(list) = self.lists.get_mut(b.stream.slot()).and_then(Option::as_mut) else {
            return;
        };
        if b.prev_free == NIL {
            list.heads[f][s] = b.next_free;
            if b.next_free == NIL {
                list.second[f] &= !(1 << s);
                if list.second[f] == 0 {
                    list.first &= !(1 << f);
                }
            }
        }
        list.blocks -= 1;
        let b = &mut self.blocks[i as usize];
        b.prev_free = NIL;
        b.next_free = NIL;
    }

    /// Drops the list of `held` if it has no block left, releasing the stream.
    fn drop_if_empty(&mut self, held: Held) {
        let slot = held.slot();
        if self
            .lists
            .get(slot)
            .and_then(Option::as_ref)
            .is_some_and(|l| l.blocks == 0)
        {
            self.lists[slot] = None;
            self.streams.release(held);
        }
    }

    /// Adds a chunk `[addr, addr + size)` (granule multiples) as one free block on `stream`;
    /// false (nothing added) when the index has no room for another record.
    #[must_use]
    pub(crate) fn add_chunk(&mut self, addr: usize, size: usize, stream: StreamRef) -> bool {
        if !self.room_for(1) {
            return false;
        }
        let chunk_stream = self.streams.hold(stream);
        let held = self.list_for(stream);
        let i = self.record(Block {
            addr,
            size,
            prev: NIL,
            next: NIL,
            prev_free: NIL,
            next_free: NIL,
            stream: held,
            free: true,
        });
        self.push(i);
        self.chunks.insert(
            addr,
            Chunk {
                size,
                stream: chunk_stream,
                first: i,
            },
        );
        self.size += size;
        self.peak = self.peak.max(self.size);
        true
    }

    /// A free block of `held`'s list with at least `need` bytes: first a bounded best-fit pass
    /// over the request's own class, then the head of the first class whose blocks all fit.
    #[inline]
    fn find(&self, held: Held, need: usize) -> Option<u32> {
        let list = self.lists.get(held.slot())?.as_ref()?;
        let (f, s) = class_of(need);
        let mut i = list.heads[f][s];
        let mut best: Option<(usize, u32)> = None;
        for _ in 0..OWN_CLASS_TRIES {
            if i == NIL {
                break;
            }
            let b = &self.blocks[i as usize];
            if b.size == need {
                return Some(i);
            }
            if b.size > need && best.is_none_or(|(size, _)| b.size < size) {
                best = Some((b.size, i));
            }
            i = b.next_free;
        }
        if let Some((_, i)) = best {
            return Some(i);
        }
        let (f, s) = class_at_least(need)?;
        let (f, s) = list.find(f, s)?;
        let head = list.heads[f][s];
        if !self.address_order {
            return Some(head);
        }
        // The lowest of the class's first few blocks: placing low leaves the high addresses
        // whole, so that a later large request finds them (1.169 to 1.120 of peak live on the
        // transformer training trace, no change on the others).
        let (mut i, mut low) = (head, head);
        for _ in 0..OWN_CLASS_TRIES {
            if i == NIL {
                break;
            }
            if self.blocks[i as usize].addr < self.blocks[low as usize].addr {
                low = i;
            }
            i = self.blocks[i as usize].next_free;
        }
        Some(low)
    }

    /// A stream other than `stream` with a free block of at least `need` bytes: O(streams with
    /// free blocks).
    pub(crate) fn other_with_fit(&self, stream: StreamRef, need: usize) -> Option<Held> {
        let own = self.streams.find(stream);
        self.lists
            .iter()
            .flatten()
            .map(|l| l.stream)
            .find(|&held| Some(held) != own && self.find(held, need).is_some())
    }

    /// The streams whose lists got a block since the last call, as keeper slots (bit 63: any
    /// stream), and forgets them. A bit names whatever its slot holds now; a slot is reused only
    /// once its stream has no list, whose bytes went to other lists (setting their bits) or are
    /// allocated. So every free byte is on the list of a stream whose bit is set, or that got it
    /// before the last call.
    pub(crate) fn take_listed(&mut self) -> u64 {
        std::mem::take(&mut self.listed)
    }

    /// Puts back bits [`take_listed`](Self::take_listed) returned, for a caller that could not
    /// act on them.
    pub(crate) fn relist(&mut self, bits: u64) {
        self.listed |= bits;
    }

    /// Carves a block of `size` bytes at `align` for `stream` from its own list or, failing
    /// that, from the list of another stream with a fit, after `order_after(that stream)` orders
    /// `stream` behind it (all of that stream's free blocks then move to `stream`: the one wait
    /// orders them all). Failing that, from a run of neighbouring free blocks freed on several
    /// streams that together fit: `stream` is ordered after each of those streams and the run's
    /// blocks (only they) move to it and merge. `Ok(None)` when nothing fits even so, or an
    /// `order_after` for such a run failed: the caller grows.
    pub(crate) fn take_or_steal(
        &mut self,
        stream: StreamRef,
        size: usize,
        align: usize,
        order_after: impl FnMut(StreamRef<'static>) -> Result<(), AllocError>,
    ) -> Result<Option<usize>, AllocError> {
        FreeIndex::take_any(self, stream, size, align, order_after)
    }

    /// The last step of [`take_or_steal`](Self::take_or_steal), when no one stream has a fit: a
    /// block carved from a run of neighbouring free blocks of several streams, after
    /// `order_after` each of them.
    pub(crate) fn steal_run(
        &mut self,
        stream: StreamRef,
        size: usize,
        align: usize,
        mut order_after: impl FnMut(StreamRef<'static>) -> Result<(), AllocError>,
    ) -> Result<Option<usize>, AllocError> {
        let need = size.saturating_add(align - GRANULE);
        // Blocks freed on different streams do not merge, so memory freed by several streams
        // can lie in pieces no one request fits. Only on the way to growing: O(blocks).
        let Some(run) = self.free_run(need) else {
            return Ok(None);
        };
        let own = self.streams.find(stream);
        let mut others: Vec<Held> = (run.iter())
            .map(|&i| self.blocks[i as usize].stream)
            .filter(|&held| Some(held) != own)
            .collect();
        others.sort_unstable();
        others.dedup();
        // Every wait first: one that fails leaves the index as it was, and the caller grows.
        for &other in &others {
            if order_after(self.streams.get(other)).is_err() {
                return Ok(None);
            }
        }
        // Held first, so that the list cannot go while blocks move into it.
        let to = self.list_for(stream);
        // Off their lists first, so that none is merged (and its record recycled) before its
        // turn; then the run becomes its first block, which merges with what lies beyond.
        for &i in &run {
            self.unlink(i);
            self.blocks[i as usize].stream = to;
        }
        for &i in &run[1..] {
            self.absorb(run[0], i);
        }
        self.coalesce_and_push(run[0], to);
        for other in others {
            self.drop_if_empty(other);
        }
        Ok(self.take(stream, size, align))
    }

    /// The first run of neighbouring free blocks in one chunk, of any streams, that hold `need`
    /// bytes together, in address order.
    fn free_run(&self, need: usize) -> Option<Vec<u32>> {
        for chunk in self.chunks.values() {
            let (mut run, mut bytes) = (Vec::new(), 0usize);
            let mut i = chunk.first;
            while i != NIL {
                let b = &self.blocks[i as usize];
                if b.free {
                    run.push(i);
                    bytes += b.size;
                    if bytes >= need {
                        return Some(run);
                    }
                } else {
                    run.clear();
                    bytes = 0;
                }
                i = b.next;
            }
        }
        None
    }

    /// Carves a block of `size` bytes (a granule multiple) at `align` (at least a granule) out
    /// of a free block of `stream`'s list; returns its address.
    #[inline]
    pub(crate) fn take(&mut self, stream: StreamRef, size: usize, align: usize) -> Option<usize> {
        let held = self.list_of(stream)?;
        self.take_from(held, size, align)
    }

    /// [`take`](Self::take) from the list of `held`; the pieces left over stay free on it.
    fn take_from(&mut self, held: Held, size: usize, align: usize) -> Option<usize> {
        // Blocks start at granule multiples, so `align - GRANULE` bytes of slack always suffice
        // to place an aligned block.
        let need = size.checked_add(align - GRANULE)?;
        if !self.room_for(2) {
            return None;
        }
        let i = self.find(held, need)?;
        self.unlink(i);
        let b = self.blocks[i as usize];
        let start = (b.addr + align - 1) & !(align - 1);
        let (front, back) = (start - b.addr, b.addr + b.size - (start + size));
        // The block keeps its record as the lowest piece (the chunk's `first` stays right).
        let used = if front > 0 {
            self.blocks[i as usize].size = front;
            let j = self.split_after(i, start, size + back);
            self.push(i);
            j
        } else {
            i
        };
        if back > 0 {
            self.blocks[used as usize].size = size;
            let k = self.split_after(used, start + size, back);
            self.blocks[k as usize].stream = held;
            self.blocks[k as usize].free = true;
            self.push(k);
        }
        let b = &mut self.blocks[used as usize];
        b.free = false;
        b.addr = start;
        b.size = size;
        self.live.insert(start, used);
        self.allocated += size;
        self.drop_if_empty(held);
        Some(start)
    }

    /// Moves every free block of `from`'s list to `stream`'s, merging each with its free
    /// neighbours there (the caller ordered `stream` after `from`: one wait orders all of them).
    /// O(blocks moved).
    pub(crate) fn merge(&mut self, from: Held, stream: StreamRef) {
        let Some(list) = self.lists.get(from.slot()).and_then(Option::as_ref) else {
            return;
        };
        let mut moved = Vec::with_capacity(list.blocks);
        let mut first = list.first;
        while first != 0 {
            let f = first.trailing_zeros() as usize;
            first &= first - 1;
            let mut second = list.second[f];
            while second != 0 {
                let s = second.trailing_zeros() as usize;
                second &= second - 1;
                let mut i = list.heads[f][s];
                while i != NIL {
                    moved.push(i);
                    i = self.blocks[i as usize].next_free;
                }
            }
        }
        // Held first, so that the list cannot go while blocks move into it.
        let to = self.list_for(stream);
        for i in moved {
            self.unlink(i);
            self.blocks[i as usize].stream = to;
            self.coalesce_and_push(i, to);
        }
        self.drop_if_empty(from);
    }

    /// Merges the free block `i` (on `held`, in no list) with its free neighbours on `held`,
    /// and lists the result.
    fn coalesce_and_push(&mut self, i: u32, held: Held) {
        let mut i = i;
        let next = self.blocks[i as usize].next;
        if next != NIL && self.mergeable(next, held) {
            self.unlink(next);
            self.absorb(i, next);
        }
        let prev = self.blocks[i as usize].prev;
        if prev != NIL && self.mergeable(prev, held) {
            self.unlink(prev);
            self.absorb(prev, i);
            i = prev;
        }
        self.push(i);
    }

    /// A new record for `[addr, addr + size)`, linked right after `i` in address order.
    fn split_after(&mut self, i: u32, addr: usize, size: usize) -> u32 {
        let next = self.blocks[i as usize].next;
        let j = self.record(Block {
            addr,
            size,
            prev: i,
            next,
            prev_free: NIL,
            next_free: NIL,
            stream: self.blocks[i as usize].stream,
            free: false,
        });
        self.blocks[i as usize].next = j;
        if next != NIL {
            self.blocks[next as usize].prev = j;
        }
        j
    }

    /// Frees the allocated block at `addr` on `stream`, merged with its free neighbours of the
    /// same stream; returns the block's size, or `None` for an address no block starts at.
    pub(crate) fn free(&mut self, addr: usize, stream: StreamRef) -> Option<usize> {
        let i = self.live.remove(&addr)?;
        let held = self.list_for(stream);
        let size = self.blocks[i as usize].size;
        self.allocated -= size;
        let b = &mut self.blocks[i as usize];
        b.free = true;
        b.stream = held;
        self.coalesce_and_push(i, held);
        Some(size)
    }

    fn mergeable(&self, j: u32, held: Held) -> bool {
        let b = &self.blocks[j as usize];
        b.free && b.stream == held
    }

    /// Makes `lo` cover `hi` too (`hi` follows `lo`); `hi`'s record is recycled.
    fn absorb(&mut self, lo: u32, hi: u32) {
        let h = self.blocks[hi as usize];
        self.blocks[lo as usize].size += h.size;
        self.blocks[lo as usize].next = h.next;
        if h.next != NIL {
            self.blocks[h.next as usize].prev = lo;
        }
        self.spare.push(hi);
    }

    /// Every allocated block, `(address, size)`.
    pub(crate) fn live_blocks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.live
            .iter()
            .map(|(&addr, &i)| (addr, self.blocks[i as usize].size))
    }

    /// The size of the allocated block at `addr`, if one starts there.
    pub(crate) fn live_size(&self, addr: usize) -> Option<usize> {
        self.live.get(&addr).map(|&i| self.blocks[i as usize].size)
    }

    /// The granule sizes `(old, new)` of growing the allocated block at `addr` from `size` to
    /// `new_size` bytes: `None` unless a block starts there with `size` (rounded up) and
    /// `new_size` is not below `size` (a smaller size is no growth, even where both round to one
    /// block), nor `size` zero, nor either size overflowing.
    pub(crate) fn growth(
        &self,
        addr: usize,
        size: usize,
        new_size: usize,
    ) -> Option<(usize, usize)> {
        let (old, new) = (
            crate::resource::align_up(size, GRANULE)?,
            crate::resource::align_up(new_size, GRANULE)?,
        );
        (size > 0 && new_size >= size && self.live_size(addr) == Some(old)).then_some((old, new))
    }

    /// Grows the allocated block at `addr` to `new_size` bytes (a granule multiple) in place, if
    /// the free block right after it is on `stream` and large enough; returns whether it did.
    pub(crate) fn grow_in_place(
        &mut self,
        addr: usize,
        new_size: usize,
        stream: StreamRef,
    ) -> bool {
        let Some(&i) = self.live.get(&addr) else {
            return false;
        };
        let Some(held) = self.list_of(stream) else {
            return false;
        };
        let b = self.blocks[i as usize];
        if new_size <= b.size {
            return new_size == b.size;
        }
        let extra = new_size - b.size;
        let next = b.next;
        if next == NIL || !self.mergeable(next, held) || self.blocks[next as usize].size < extra {
            return false;
        }
        self.unlink(next);
        let n = self.blocks[next as usize];
        if n.size == extra {
            self.absorb(i, next);
        } else {
            let nb = &mut self.blocks[next as usize];
            nb.addr += extra;
            nb.size -= extra;
            self.blocks[i as usize].size = new_size;
            self.push(next);
        }
        self.blocks[i as usize].size = new_size;
        self.allocated += extra;
        self.drop_if_empty(held);
        true
    }

    /// Shrinks the allocated block at `addr` to `size` bytes (a granule multiple, not above its
    /// size), the tail freed on `stream` (merged into the free block after it when that one is on
    /// `stream` too). Where no record is left for the tail, the block keeps its size.
    pub(crate) fn shrink(&mut self, addr: usize, size: usize, stream: StreamRef) {
        let Some(&i) = self.live.get(&addr) else {
            return;
        };
        let b = self.blocks[i as usize];
        if size >= b.size || !self.room_for(1) {
            return;
        }
        let tail = b.size - size;
        let held = self.list_for(stream);
        self.blocks[i as usize].size = size;
        self.allocated -= tail;
        if b.next != NIL && self.mergeable(b.next, held) {
            self.unlink(b.next);
            let n = &mut self.blocks[b.next as usize];
            n.addr -= tail;
            n.size += tail;
            self.push(b.next);
        } else {
            let k = self.split_after(i, addr + size, tail);
            self.blocks[k as usize].stream = held;
            self.blocks[k as usize].free = true;
            self.push(k);
        }
    }

    /// The free blocks of the chunk at `start` and the streams they are on, if the chunk is
    /// wholly free; `None` while a block of it is allocated. O(blocks in the chunk).
    pub(crate) fn free_chunk_streams(&self, start: usize) -> Option<Vec<Held>> {
        let chunk = self.chunks.get(&start)?;
        let mut streams = Vec::new();
        let mut i = chunk.first;
        while i != NIL {
            let b = &self.blocks[i as usize];
            if !b.free {
                return None;
            }
            streams.push(b.stream);
            i = b.next;
        }
        // Sorted rather than searched as they come: O(n log n) for blocks freed on many streams.
        streams.sort_unstable();
        streams.dedup();
        Some(streams)
    }

    /// Forgets the wholly free chunk at `start` and its blocks; returns it. The chunk's stream
    /// stays held: the caller releases it once it is done with it.
    pub(crate) fn remove_chunk(&mut self, start: usize) -> Option<Chunk> {
        let chunk = self.chunks.remove(&start)?;
        let mut i = chunk.first;
        while i != NIL {
            let b = self.blocks[i as usize];
            self.unlink(i);
            self.drop_if_empty(b.stream);
            self.spare.push(i);
            i = b.next;
        }
        self.size -= chunk.size;
        Some(chunk)
    }

    /// Free blocks, for usage reports.
    pub(crate) fn free_blocks(&self) -> usize {
        self.lists.iter().flatten().map(|l| l.blocks).sum()
    }

    /// Streams with free blocks, for the bound tests check.
    pub(crate) fn lists(&self) -> usize {
        self.lists.iter().flatten().count()
    }
}

impl Chunks for TlsfIndex {
    fn held(&self) -> usize {
        self.size
    }

    fn add(&mut self, addr: usize, size: usize, stream: StreamRef) -> bool {
        self.add_chunk(addr, size, stream)
    }

    fn free_chunks(&self) -> Vec<FreeChunk> {
        self.chunks
            .iter()
            .filter_map(|(&start, chunk)| {
                Some(FreeChunk {
                    start,
                    size: chunk.size,
                    stream: chunk.stream,
                    freed_on: self.free_chunk_streams(start)?,
                })
            })
            .collect()
    }

    fn forget(&mut self, starts: &[usize]) {
        for &start in starts {
            self.remove_chunk(start);
        }
    }

    fn streams(&mut self) -> &mut StreamKeeper {
        &mut self.streams
    }

    fn in_flight(&self) -> &super::growth::InFlight {
        &self.in_flight
    }

    fn in_flight_mut(&mut self) -> &mut super::growth::InFlight {
        &mut self.in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_bound_their_blocks() {
        for units in 1..5000usize {
            let size = units * GRANULE;
            let (f, s) = class_of(size);
            let (g, t) = class_at_least(size).unwrap();
            assert!((g, t) >= (f, s), "{size}");
            // Every block listed at (g, t) is at least `size`: the class's lowest size is.
            let lowest = (1..=units * 2)
                .map(|u| u * GRANULE)
                .find(|&b| class_of(b) == (g, t))
                .unwrap();
            assert!(
                lowest >= size,
                "{size}: class ({g}, {t}) starts at {lowest}"
            );
        }
        assert_eq!(class_at_least(usize::MAX & !(GRANULE - 1)), None);
    }

    #[test]
    fn splits_merge_back_into_one_block() {
        let mut ix = TlsfIndex::default();
        let s = StreamRef::DEFAULT;
        assert!(ix.add_chunk(1 << 20, 1 << 20, s));
        let a = ix.take(s, 256, 256).unwrap();
        let b = ix.take(s, 1024, 4096).unwrap();
        let c = ix.take(s, 512, 256).unwrap();
        assert_eq!(b % 4096, 0);
        assert!(a + 256 <= b || b + 1024 <= a);
        assert_eq!(ix.allocated, 256 + 1024 + 512);
        for p in [b, a, c] {
            ix.free(p, s).unwrap();
        }
        assert_eq!(ix.free_blocks(), 1);
        assert_eq!(ix.free_chunk_streams(1 << 20), Some(vec![Held::DEFAULT]));
        assert!(
            ix.free(a, s).is_none(),
            "a second free of one block is refused"
        );
    }

    #[test]
    fn an_address_ordered_index_takes_the_lowest_block_of_a_larger_class() {
        let s = StreamRef::DEFAULT;
        // Two free 64 KiB holes between live blocks, the higher freed last (the list's head),
        // then a 16 KiB request: a class of its own has nothing, so it takes from theirs.
        let holes = |mut ix: TlsfIndex| {
            assert!(ix.add_chunk(1 << 20, 256 << 10, s));
            let b: Vec<usize> = [64 << 10, 4096, 64 << 10, 4096]
                .iter()
                .map(|&n| ix.take(s, n, 256).unwrap())
                .collect();
            ix.free(b[0], s).unwrap();
            ix.free(b[2], s).unwrap();
            (ix.take(s, 16 << 10, 256).unwrap(), b)
        };
        let (low, b) = holes(TlsfIndex::address_ordered());
        assert_eq!(low, b[0], "the lower hole");
        let (head, b) = holes(TlsfIndex::default());
        assert_eq!(head, b[2], "the list's head");
    }

    #[test]
    fn blocks_of_two_streams_do_not_merge() {
        let mut ix = TlsfIndex::default();
        let (s, t) = (StreamRef::DEFAULT, StreamRef::simulated(1));
        assert!(ix.add_chunk(1 << 20, 4096, s));
        let a = ix.take(s, 1024, 256).unwrap();
        let b = ix.take(s, 1024, 256).unwrap();
        ix.free(a, t).unwrap();
        ix.free(b, s).unwrap();
        assert_eq!(ix.free_blocks(), 2);
        assert_eq!(ix.lists(), 2);
        assert!(ix.take(t, 2048, 256).is_none(), "t's block is 1 KiB");
        let other = ix.other_with_fit(t, 2048).unwrap();
        ix.merge(other, t);
        assert_eq!((ix.free_blocks(), ix.lists()), (1, 1), "all on t, merged");
        assert_eq!(ix.take(t, 4096, 256), Some(1 << 20));
    }

    #[test]
    fn neighbours_freed_on_several_streams_serve_a_request_none_fits_alone() {
        let mut ix = TlsfIndex::default();
        let (s, t, u) = (
            StreamRef::DEFAULT,
            StreamRef::simulated(1),
            StreamRef::simulated(2),
        );
        assert!(ix.add_chunk(1 << 20, 5120, s));
        let b: Vec<usize> = (0..5).map(|_| ix.take(s, 1024, 256).unwrap()).collect();
        // Free on t, u, t, then the last two stay: [t][u][t][live][live].
        for (&addr, stream) in b.iter().zip([t, u, t]) {
            ix.free(addr, stream).unwrap();
        }
        let ordered = std::cell::RefCell::new(Vec::new());
        let wait = |after: StreamRef<'static>| {
            ordered.borrow_mut().push(after.id());
            Ok(())
        };
        // 4 KiB: no run of free neighbours holds it; nothing is ordered, nothing moves.
        assert_eq!(ix.take_or_steal(s, 4096, 256, &wait).unwrap(), None);
        assert!(
            ordered.borrow().is_empty(),
            "no wait for a run that cannot help"
        );
        assert_eq!((ix.free_blocks(), ix.lists()), (3, 2));
        // 3 KiB: the three neighbours, ordered after t and u once each, merged on s.
        assert_eq!(
            ix.take_or_steal(s, 3072, 256, &wait).unwrap(),
            Some(1 << 20)
        );
        let ordered = ordered.into_inner();
        assert_eq!(ordered.len(), 2);
        assert!(ordered.contains(&t.id()) && ordered.contains(&u.id()));
        assert_eq!((ix.free_blocks(), ix.lists()), (0, 0));
        // A wait that fails: the caller grows, and the index is as it was.
        ix.free(1 << 20, t).unwrap();
        ix.free(b[3], u).unwrap();
        let refuse = |_: StreamRef<'static>| Err(AllocError::out_of_memory(0, 256, "test"));
        assert_eq!(ix.take_or_steal(s, 4096, 256, refuse).unwrap(), None);
        assert_eq!((ix.free_blocks(), ix.lists()), (2, 2));
        // A run with blocks of the asking stream in it: [t][s][t] merge into one block on s.
        let mut ix = TlsfIndex::default();
        assert!(ix.add_chunk(1 << 20, 4096, s));
        let b: Vec<usize> = (0..4).map(|_| ix.take(s, 1024, 256).unwrap()).collect();
        for (&addr, stream) in b.iter().zip([t, s, t]) {
            ix.free(addr, stream).unwrap();
        }
        assert_eq!(
            ix.take_or_steal(s, 3072, 256, |_| Ok(())).unwrap(),
            Some(1 << 20)
        );
        ix.free(1 << 20, s).unwrap();
        ix.free(b[3], s).unwrap();
        assert_eq!(
            (ix.free_blocks(), ix.lists()),
            (1, 1),
            "the chunk whole again"
        );
        assert_eq!(ix.take(s, 4096, 256), Some(1 << 20));
    }

    #[test]
    fn grows_in_place_into_its_free_neighbour() {
        let mut ix = TlsfIndex::default();
        let s = StreamRef::DEFAULT;
        assert!(ix.add_chunk(1 << 20, 8192, s));
        let a = ix.take(s, 1024, 256).unwrap();
        assert!(ix.grow_in_place(a, 4096, s));
        assert_eq!(ix.live_size(a), Some(4096));
        let b = ix.take(s, 4096, 256).unwrap();
        assert_eq!(b, a + 4096);
        assert!(!ix.grow_in_place(a, 8192, s), "its neighbour is allocated");
        ix.free(b, s).unwrap();
        assert!(
            ix.grow_in_place(a, 8192, s),
            "exactly the rest of the chunk"
        );
        ix.free(a, s).unwrap();
        assert_eq!(ix.free_chunk_streams(1 << 20), Some(vec![Held::DEFAULT]));
        assert_eq!(ix.allocated, 0);
    }
}
