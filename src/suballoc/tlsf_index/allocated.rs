//! Allocated blocks: freeing them, their sizes, and growing or shrinking them in place.

use super::{TlsfIndex, GRANULE, NIL};
use crate::stream::StreamRef;

impl TlsfIndex {
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
}
