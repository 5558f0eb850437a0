//! The bookkeeping of a `Pool`: its chunks and its free blocks per stream, by size (best fit) and by address (coalescing).

use super::growth::{Chunks, FreeChunk, GRANULE};
use crate::stream::{Held, StreamKeeper, StreamRef};
use std::collections::{BTreeMap, BTreeSet, HashMap};

#[derive(Debug, Clone, Copy)]
pub(super) struct Free {
    pub(super) size: usize,
    pub(super) stream: Held,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Chunk {
    pub(super) size: usize,
    /// The stream the chunk was allocated on, which it is given back on.
    pub(super) stream: Held,
}

/// The free blocks last freed on one stream, by `(size, address)`: the best fit for `n` bytes is
/// the first entry at or after `(n, 0)`. Never empty: a list whose last block goes is removed and
/// releases its stream.
#[derive(Debug)]
pub(super) struct StreamFree {
    pub(super) stream: Held,
    pub(super) by_size: BTreeSet<(usize, usize)>,
    /// This list's entry in [`State::fits`]: at least its largest block's size (0: no entry).
    pub(super) recorded: usize,
}

type AddrMap<V> = HashMap<usize, V, crate::hash::FastHash>;

#[derive(Debug, Default)]
pub(super) struct State {
    /// Every free block by start address, with its size and stream.
    pub(super) starts: AddrMap<Free>,
    /// Every free block by end address, with its start: with `starts`, a freed block finds both
    /// its neighbours in two lookups.
    pub(super) ends: AddrMap<usize>,
    /// One best-fit index per stream that has free blocks, at its stream's keeper slot
    /// ([`Held::slot`]), so as long as the most streams held at once.
    pub(super) lists: Vec<Option<StreamFree>>,
    /// `(recorded, stream)` for every list: an upper bound on the list's largest block, raised
    /// when a larger block is inserted and lowered to the truth only when a search finds it
    /// stale, so that the hot paths touch it only when a list's largest block grows. The streams
    /// with a fit for `need` are among the entries at or above `need`.
    pub(super) fits: BTreeSet<(usize, Held)>,
    /// Upstream allocations by address: coalescing stops at their starts.
    pub(super) chunks: BTreeMap<usize, Chunk>,
    pub(super) pool_size: usize,
    /// The most `pool_size` has been.
    pub(super) peak: usize,
    pub(super) allocated: usize,
    /// Growths under way ([`Chunks::in_flight`]).
    in_flight: super::growth::InFlight,
    /// Keeps alive every stream a `Held` above names (declared last: dropped after them).
    pub(super) streams: StreamKeeper,
}

impl State {
    /// The list of the stream `held`, if it has one.
    #[inline]
    pub(super) fn list_mut(&mut self, held: Held) -> Option<&mut StreamFree> {
        self.lists.get_mut(held.slot()).and_then(Option::as_mut)
    }

    /// Records a free block on the stream `held`, whose list exists, in the indexes.
    pub(super) fn insert(&mut self, held: Held, addr: usize, size: usize) {
        self.starts.insert(addr, Free { size, stream: held });
        self.ends.insert(addr + size, addr);
        let Some(list) = self.lists.get_mut(held.slot()).and_then(Option::as_mut) else {
            return;
        };
        list.by_size.insert((size, addr));
        if size > list.recorded {
            self.fits.remove(&(list.recorded, held));
            self.fits.insert((size, held));
            list.recorded = size;
        }
    }

    /// Forgets the free block `(size, addr)` of the stream `held` in the indexes; its list goes
    /// (releasing the stream) when that was its last block.
    pub(super) fn remove(&mut self, held: Held, addr: usize, size: usize) {
        self.remove_keeping(held, addr, size);
        if self.list_mut(held).is_some_and(|l| l.by_size.is_empty()) {
            self.drop_list(held);
        }
    }

    /// [`remove`](Self::remove) for a block whose list will get another block at once: the list
    /// stays even when emptied.
    pub(super) fn remove_keeping(&mut self, held: Held, addr: usize, size: usize) {
        self.starts.remove(&addr);
        self.ends.remove(&(addr + size));
        if let Some(list) = self.list_mut(held) {
            list.by_size.remove(&(size, addr));
        }
    }

    /// Removes the list of `held` from the indexes (not its blocks from `starts`/`ends`: the
    /// caller's) and releases the stream; returns the list.
    pub(super) fn drop_list(&mut self, held: Held) -> Option<StreamFree> {
        let list = self.lists.get_mut(held.slot()).and_then(Option::take)?;
        self.fits.remove(&(list.recorded, held));
        self.streams.release(held);
        Some(list)
    }

    /// The `Held` of `stream` if it has a list.
    #[inline]
    pub(super) fn list_of(&self, stream: StreamRef) -> Option<Held> {
        let held = self.streams.find(stream)?;
        self.lists.get(held.slot())?.as_ref().map(|l| l.stream)
    }

    /// The list of `stream`, created (holding the stream) if missing; returns its `Held`.
    pub(super) fn list_for(&mut self, stream: StreamRef) -> Held {
        if let Some(held) = self.list_of(stream) {
            return held;
        }
        let held = self.streams.hold(stream);
        if self.lists.len() <= held.slot() {
            self.lists.resize_with(held.slot() + 1, || None);
        }
        self.lists[held.slot()] = Some(StreamFree {
            stream: held,
            by_size: BTreeSet::new(),
            recorded: 0,
        });
        held
    }

    /// Adds a chunk taken from the upstream as one free block on `stream`.
    pub(super) fn add_chunk(&mut self, addr: usize, size: usize, stream: StreamRef) {
        let held = self.streams.hold(stream);
        self.chunks.insert(addr, Chunk { size, stream: held });
        self.pool_size += size;
        self.peak = self.peak.max(self.pool_size);
        let held = self.list_for(stream);
        self.insert(held, addr, size);
    }

    /// Makes `[addr, addr + size)` free on `stream`, merged with same-stream free neighbours in its chunk.
    pub(super) fn free(&mut self, addr: usize, size: usize, stream: StreamRef) {
        // Held first, so that merging the neighbours away cannot drop the list.
        let held = self.list_for(stream);
        let (mut start, mut end) = (addr, addr + size);
        if let Some(&next) = self.starts.get(&end) {
            if next.stream == held && !self.chunks.contains_key(&end) {
                self.remove_keeping(held, end, next.size);
                end += next.size;
            }
        }
        if let Some(&prev) = self.ends.get(&addr) {
            if let Some(&p) = self.starts.get(&prev) {
                if p.stream == held && !self.chunks.contains_key(&addr) {
                    self.remove_keeping(held, prev, p.size);
                    start = prev;
                }
            }
        }
        self.insert(held, start, end - start);
    }

    /// Takes the best-fitting free block of `stream`'s list for `size` bytes (a granule
    /// multiple) at `align` (at least a granule), carving the block from its end.
    pub(super) fn take(&mut self, stream: StreamRef, size: usize, align: usize) -> Option<usize> {
        // Free blocks start at granule multiples, so `align - GRANULE` bytes of slack always
        // suffice to place an aligned block.
        let need = size + (align - GRANULE);
        let held = self.list_of(stream)?;
        let list = self.lists.get(held.slot())?.as_ref()?;
        let &(free_size, addr) = list.by_size.range((need, 0)..).next()?;
        let end = addr + free_size;
        let start = (end - size) & !(align - 1);
        let (before, after) = (start - addr, end - (start + size));
        if before == 0 && after == 0 {
            // The whole block: the list may go.
            self.remove(held, addr, free_size);
            return Some(start);
        }
        self.remove_keeping(held, addr, free_size);
        if before > 0 {
            self.insert(held, addr, before);
        }
        if after > 0 {
            // The carved block's successor is not a same-stream free block of this chunk (it
            // would have been merged), so the slack behind it needs no coalescing.
            self.insert(held, start + size, after);
        }
        Some(start)
    }

    /// A stream other than `stream` with a free block of at least `need` bytes, when `stream`
    /// has none. Each stale entry of `fits` met on the way is lowered to its list's largest block
    /// (below `need`, or it would be returned), at most once per shrinking of that list since its
    /// last correction: O(log n) amortized, whatever the number of streams.
    pub(super) fn other_with_fit(&mut self, stream: StreamRef, need: usize) -> Option<Held> {
        loop {
            let &(recorded, held) = self.fits.range((need, Held::DEFAULT)..).next()?;
            self.fits.remove(&(recorded, held));
            let list = self.lists.get_mut(held.slot()).and_then(Option::as_mut)?;
            let largest = list.by_size.last().map_or(0, |&(size, _)| size);
            list.recorded = largest;
            self.fits.insert((largest, held));
            if largest >= need {
                // `stream` has no fit (the caller's `take` failed), so this is another stream;
                // checked all the same.
                return (!self.streams.is(held, stream)).then_some(held);
            }
        }
    }

    /// Moves every free block of `from`'s list to `to`, coalescing them with `to`'s.
    pub(super) fn merge(&mut self, from: Held, to: StreamRef) {
        // `from` stays held until its blocks are moved, so `to` cannot be given its slot.
        let Some(list) = self.lists.get_mut(from.slot()).and_then(Option::take) else {
            return;
        };
        self.fits.remove(&(list.recorded, from));
        for &(size, addr) in &list.by_size {
            self.starts.remove(&addr);
            self.ends.remove(&(addr + size));
            self.free(addr, size, to);
        }
        self.streams.release(from);
    }

    /// For each chunk, the free bytes inside it and the streams they were freed on (blocks never
    /// straddle chunks, so a chunk is wholly free when its free bytes add up to its size).
    /// O(n log c) for n free blocks in c chunks: for `release` and drop, not the hot path.
    fn census(&self) -> BTreeMap<usize, (usize, Vec<Held>)> {
        let mut census: BTreeMap<usize, (usize, Vec<Held>)> = BTreeMap::new();
        for (&addr, f) in &self.starts {
            if let Some((&chunk, _)) = self.chunks.range(..=addr).next_back() {
                let (bytes, streams) = census.entry(chunk).or_default();
                *bytes += f.size;
                streams.push(f.stream);
            }
        }
        // Each stream once, sorted rather than searched as they come: a chunk whose blocks were
        // freed on many streams costs O(n log n), not O(n × streams).
        for (_, streams) in census.values_mut() {
            streams.sort_unstable();
            streams.dedup();
        }
        census
    }

    /// Forgets the wholly free chunks starting at `removed` and the free blocks inside them,
    /// which tile each chunk: walked from its start, O(blocks in the chunk).
    fn remove_chunks(&mut self, removed: &[usize]) {
        for &start in removed {
            let Some(c) = self.chunks.remove(&start) else {
                continue;
            };
            self.pool_size -= c.size;
            let mut addr = start;
            while addr < start + c.size {
                let Some(&f) = self.starts.get(&addr) else {
                    break;
                };
                self.remove(f.stream, addr, f.size);
                addr += f.size;
            }
        }
    }
}

impl Chunks for State {
    fn held(&self) -> usize {
        self.pool_size
    }

    fn add(&mut self, addr: usize, size: usize, stream: StreamRef) -> bool {
        self.add_chunk(addr, size, stream);
        true
    }

    fn free_chunks(&self) -> Vec<FreeChunk> {
        self.census()
            .into_iter()
            .filter_map(|(start, (free, freed_on))| {
                let chunk = self.chunks.get(&start)?;
                (free == chunk.size).then_some(FreeChunk {
                    start,
                    size: chunk.size,
                    stream: chunk.stream,
                    freed_on,
                })
            })
            .collect()
    }

    fn forget(&mut self, starts: &[usize]) {
        self.remove_chunks(starts);
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
