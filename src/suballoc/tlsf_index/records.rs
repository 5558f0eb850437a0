//! Block records and the per-stream class lists: the steps every operation of the index is
//! made of (a record made or recycled, a block listed or unlinked, neighbours merged).

use super::classes::{class_of, Classes};
use super::{Block, TlsfIndex, ALL_STREAMS, NIL};
use crate::stream::{Held, StreamRef};

impl TlsfIndex {
    /// True when `n` more records can be made: record numbers stay below `NIL`. The callers
    /// check before they change anything, so a full table refuses a request (out of memory)
    /// rather than alias two records.
    pub(super) fn room_for(&self, n: usize) -> bool {
        self.spare.len() >= n || self.blocks.len() + n < NIL as usize
    }

    /// True when one more record can be made (a split, a shrink).
    pub(crate) fn has_room(&self) -> bool {
        self.room_for(1)
    }

    /// A record for `block`; the caller checked [`room_for`](Self::room_for).
    pub(super) fn record(&mut self, block: Block) -> u32 {
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
    pub(super) fn list_for(&mut self, stream: StreamRef) -> Held {
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
    #[inline]
    pub(super) fn push(&mut self, i: u32) {
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
    #[inline]
    pub(super) fn unlink(&mut self, i: u32) {
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
    pub(super) fn drop_if_empty(&mut self, held: Held) {
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

    /// Merges the free block `i` (on `held`, in no list) with its free neighbours on `held`,
    /// and lists the result.
    pub(super) fn coalesce_and_push(&mut self, i: u32, held: Held) {
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
    #[inline]
    pub(super) fn split_after(&mut self, i: u32, addr: usize, size: usize) -> u32 {
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

    #[inline]
    pub(super) fn mergeable(&self, j: u32, held: Held) -> bool {
        let b = &self.blocks[j as usize];
        b.free && b.stream == held
    }

    /// Makes `lo` cover `hi` too (`hi` follows `lo`); `hi`'s record is recycled.
    #[inline]
    pub(super) fn absorb(&mut self, lo: u32, hi: u32) {
        let h = self.blocks[hi as usize];
        self.blocks[lo as usize].size += h.size;
        self.blocks[lo as usize].next = h.next;
        if h.next != NIL {
            self.blocks[h.next as usize].prev = lo;
        }
        self.spare.push(hi);
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
