//! Taking a block: the search of a stream's classes, and the ways to a fit on another stream
//! (its whole list moved over, or a run of neighbours freed on several streams).

use super::classes::{class_at_least, class_of};
use super::{TlsfIndex, GRANULE, NIL, OWN_CLASS_TRIES};
use crate::resource::AllocError;
use crate::stream::{Held, StreamRef};
use crate::suballoc::chunk_pool::FreeIndex;

impl TlsfIndex {
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
}
