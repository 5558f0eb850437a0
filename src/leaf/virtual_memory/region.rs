//! A reserved range (`Region`): its page handles, live-block counts and bit sets, how a block
//! covers its pages (`page_span`, `Overlap`, `ends`), and the `State` behind the lock.

use crate::suballoc::tlsf_index::TlsfIndex;

use super::bitset::Bits;

#[derive(Debug)]
pub(super) struct Region<H> {
    pub(super) base: usize,
    pub(super) size: usize,
    /// Per page, up to the highest page ever used (grown on demand: a reservation of the
    /// device's whole memory costs nothing until used): the live blocks that overlap the page
    /// without covering it (a page covered wholly by a block can overlap no other, so it needs
    /// no count: it is live exactly while that block is).
    pub(super) partial: Vec<u32>,
    /// The physical memory mapped at each page.
    pub(super) handles: Vec<Option<H>>,
    /// Pages mapped, and pages in the cache (mapped, no live block).
    pub(super) mapped: Bits,
    pub(super) cached: Bits,
    /// Cached pages chosen to be unmapped once the pending batch's marks are reached
    /// (`State::batch`); a subset of `cached`: a page that goes live again leaves both.
    pub(super) doomed: Bits,
}

impl<H> Region<H> {
    /// Page `p` goes from being overlapped `from` to `to` by one block (its other blocks
    /// unchanged); returns 1 when that takes it out of the cache (live again) or puts it in (no
    /// live block left), 0 otherwise.
    #[inline]
    pub(super) fn touch(&mut self, p: usize, from: Overlap, to: Overlap) -> usize {
        let was_live = self.partial[p] > 0 || from == Overlap::Whole;
        if from == Overlap::Partial {
            self.partial[p] -= 1;
        }
        if to == Overlap::Partial {
            self.partial[p] += 1;
        }
        let live = self.partial[p] > 0 || to == Overlap::Whole;
        match (was_live, live) {
            (false, true) => self.revive(p, p + 1),
            (true, false) if self.mapped.get(p) => self.cached.set(p, p + 1),
            _ => 0,
        }
    }

    /// Takes the pages of `lo..hi`, which a block now lives on, out of the cache (and out of the
    /// pending batch: a page with a live block is never unmapped); returns how many were cached.
    #[inline]
    pub(super) fn revive(&mut self, lo: usize, hi: usize) -> usize {
        self.doomed.clear(lo, hi);
        self.cached.clear(lo, hi)
    }

    /// Puts the mapped pages of `lo..hi`, which no live block is on any more, in the cache;
    /// returns how many.
    pub(super) fn cache_mapped(&mut self, lo: usize, hi: usize) -> usize {
        let mut n = 0;
        if lo < hi {
            let (mapped, cached) = (&self.mapped.0, &mut self.cached.0);
            Bits::words(lo, hi, |w, m| {
                let newly = mapped[w] & m & !cached[w];
                n += newly.count_ones() as usize;
                cached[w] |= newly;
            });
        }
        n
    }

    pub(super) fn grow(&mut self, pages: usize) {
        if self.partial.len() < pages {
            self.partial.resize(pages, 0);
            self.handles.resize_with(pages, || None);
            self.mapped.grow(pages);
            self.cached.grow(pages);
            self.doomed.grow(pages);
        }
    }
}

/// How a block lies on a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Overlap {
    None,
    /// Part of the page: other blocks may share it (the page's `partial` count).
    Partial,
    /// All of the page: no other block can be on it.
    Whole,
}

impl Overlap {
    /// How a block with `page_span` `span` lies on page `p`.
    pub(super) fn of((first, last, lo, hi): (usize, usize, usize, usize), p: usize) -> Overlap {
        if p >= lo && p < hi {
            Overlap::Whole
        } else if p >= first && p < last {
            Overlap::Partial
        } else {
            Overlap::None
        }
    }
}

/// The end pages of a block with `page_span` `(first, last, lo, hi)` that it does not cover
/// wholly, each once.
pub(super) fn ends(first: usize, last: usize, lo: usize, hi: usize) -> impl Iterator<Item = usize> {
    let one = first + 1 == last;
    [first, last - 1]
        .into_iter()
        .enumerate()
        .filter(move |&(i, p)| !(one && i == 1) && (p < lo || p >= hi))
        .map(|(_, p)| p)
}

/// Marks on every stream whose list got free bytes after the last synchronization (or the batch
/// before) and before the batch was made, and those streams' bits, to list them again should a
/// mark fail.
#[derive(Debug)]
pub(super) struct Batch<M> {
    pub(super) marks: Vec<M>,
    pub(super) streams: u64,
}

#[derive(Debug)]
pub(super) struct State<H, M> {
    pub(super) index: TlsfIndex,
    /// The reserved ranges, by base.
    pub(super) regions: Vec<Region<H>>,
    pub(super) mapped: usize,
    pub(super) peak_mapped: usize,
    /// Pages in the cache.
    pub(super) cached: usize,
    /// The most bytes of pages under live blocks so far (`mapped` less the cache).
    pub(super) live_peak: usize,
    /// The pending batch: its `doomed` pages are unmapped once its marks are all reached.
    pub(super) batch: Option<Batch<M>>,
    /// Calls since the pending batch's marks were last queried.
    pub(super) ticks: u32,
}

/// The pages of `[addr, addr + len)` in a region at `base`: `(first, last)` touched (end
/// exclusive) and `(lo, hi)` covered wholly.
#[inline]
pub(super) fn page_span(
    base: usize,
    addr: usize,
    len: usize,
    shift: u32,
) -> (usize, usize, usize, usize) {
    // Shifts, not divisions: this runs twice per allocation and free.
    let (start, end) = (addr - base, addr - base + len);
    let (first, last) = (start >> shift, ((end - 1) >> shift) + 1);
    let partial_first = usize::from(start & ((1 << shift) - 1) != 0);
    let (lo, hi) = (first + partial_first, end >> shift);
    (first, last, lo, hi.max(lo))
}

impl<H, M> State<H, M> {
    /// The region holding `addr`, if one does.
    #[inline]
    pub(super) fn region_of(&self, addr: usize) -> Option<usize> {
        let r = self
            .regions
            .partition_point(|r| r.base <= addr)
            .checked_sub(1)?;
        let region = &self.regions[r];
        (addr - region.base < region.size).then_some(r)
    }
}
