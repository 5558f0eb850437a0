//! `PageTable`: what a region knows of each of its pages, in chunks of [`CHUNK_PAGES`] pages made
//! when a block first lies in them and freed once none of their pages is mapped or counted
//! (partly under a live block), so that the bookkeeping follows live blocks and mapped pages, not
//! the reservation. A page a block covers wholly has no count: it is mapped while the block
//! lives, and its chunk is made again if it went while the block's pages were being mapped.

use super::bitset::Bits;
use super::region::{ends, Overlap};

/// Pages a chunk of the table covers: 512 MiB of 2 MiB pages, about 5 KiB of bookkeeping.
pub(super) const CHUNK_PAGES: usize = 256;
const CHUNK_LOG: u32 = CHUNK_PAGES.trailing_zeros();

/// The pages of one chunk.
#[derive(Debug)]
pub(super) struct Chunk<H> {
    /// The live blocks that overlap each page without covering it (a page covered wholly by a
    /// block can overlap no other, so it needs no count: it is live exactly while that block is).
    partial: [u32; CHUNK_PAGES],
    /// The physical memory mapped at each page.
    handles: [Option<H>; CHUNK_PAGES],
    /// Pages mapped, and pages in the cache (mapped, no live block).
    mapped: Bits,
    cached: Bits,
    /// Cached pages whose freeing work is complete (a batch's marks reached, or their streams
    /// synchronized): they can be unmapped at once. A subset of `cached`.
    settled: Bits,
    /// Cached pages, not settled, when the pending batch was made (`State::batch`): settled once
    /// its marks are reached. A subset of `cached`: a page that goes live again leaves all three.
    pending: Bits,
}

impl<H> Chunk<H> {
    fn new() -> Box<Self> {
        Box::new(Chunk {
            partial: [0; CHUNK_PAGES],
            handles: std::array::from_fn(|_| None),
            mapped: Bits::default(),
            cached: Bits::default(),
            settled: Bits::default(),
            pending: Bits::default(),
        })
    }

    /// [`PageTable::revive`] in this chunk.
    #[inline]
    fn revive(&mut self, lo: usize, hi: usize) -> usize {
        let cached = self.cached.clear(lo, hi);
        if cached > 0 {
            self.settled.clear(lo, hi);
            self.pending.clear(lo, hi);
        }
        cached
    }

    /// One more block partly on page `i`: returns 1 where that takes the page out of the cache.
    #[inline]
    fn join(&mut self, i: usize) -> usize {
        self.partial[i] += 1;
        if self.partial[i] == 1 {
            self.revive(i, i + 1)
        } else {
            0
        }
    }

    /// One block fewer partly on page `i` (it had one): returns 1 where that leaves the page,
    /// mapped, with no live block, in the cache.
    #[inline]
    fn part(&mut self, i: usize) -> usize {
        self.partial[i] -= 1;
        if self.partial[i] == 0 && self.mapped.get(i) {
            self.cached.set(i, i + 1)
        } else {
            0
        }
    }

    /// [`PageTable::touch`] of page `i` of this chunk.
    #[inline]
    fn touch(&mut self, i: usize, from: Overlap, to: Overlap) -> usize {
        match (from, to) {
            (Overlap::None, Overlap::Partial) => return self.join(i),
            (Overlap::Partial, Overlap::None) => return self.part(i),
            _ => {}
        }
        let was_live = self.partial[i] > 0 || from == Overlap::Whole;
        if from == Overlap::Partial {
            self.partial[i] -= 1;
        }
        if to == Overlap::Partial {
            self.partial[i] += 1;
        }
        let live = self.partial[i] > 0 || to == Overlap::Whole;
        match (was_live, live) {
            (false, true) => self.revive(i, i + 1),
            (true, false) if self.mapped.get(i) => self.cached.set(i, i + 1),
            _ => 0,
        }
    }

    /// [`PageTable::cache_mapped`] in this chunk.
    #[inline]
    fn cache_mapped(&mut self, lo: usize, hi: usize) -> usize {
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

    /// No page mapped and no live block on any: nothing to keep.
    fn unused(&self) -> bool {
        self.mapped.is_empty() && self.partial.iter().all(|&n| n == 0)
    }
}

/// The pages of a region, by index from its base.
#[derive(Debug)]
pub(super) struct PageTable<H> {
    chunks: Vec<Option<Box<Chunk<H>>>>,
}

impl<H> Default for PageTable<H> {
    fn default() -> Self {
        PageTable { chunks: Vec::new() }
    }
}

/// Calls `f(chunk, lo, hi)` for each chunk index the pages `lo..hi` fall in, with the part of
/// the range in it, by index in the chunk.
#[inline]
fn spans(lo: usize, hi: usize, mut f: impl FnMut(usize, usize, usize)) {
    let mut p = lo;
    while p < hi {
        let c = p >> CHUNK_LOG;
        let end = hi.min((c + 1) << CHUNK_LOG);
        f(c, p & (CHUNK_PAGES - 1), end - (c << CHUNK_LOG));
        p = end;
    }
}

impl<H> PageTable<H> {
    /// The chunk of page `p`, which [`make`](Self::make) made.
    #[inline]
    fn chunk(&mut self, p: usize) -> Option<&mut Chunk<H>> {
        self.chunks.get_mut(p >> CHUNK_LOG)?.as_deref_mut()
    }

    /// Makes the chunks of pages `lo..hi`, for a block about to lie on them.
    #[inline]
    pub(super) fn make(&mut self, lo: usize, hi: usize) {
        let last = (hi - 1) >> CHUNK_LOG;
        if self.chunks.len() <= last {
            self.chunks.resize_with(last + 1, || None);
        }
        for c in &mut self.chunks[lo >> CHUNK_LOG..=last] {
            c.get_or_insert_with(Chunk::new);
        }
    }

    /// Chunk `c`, made if missing.
    #[inline]
    fn make_one(&mut self, c: usize) -> &mut Chunk<H> {
        if self.chunks.len() <= c {
            self.chunks.resize_with(c + 1, || None);
        }
        self.chunks[c].get_or_insert_with(Chunk::new)
    }

    /// Frees the chunks of pages `lo..hi` that keep nothing (after a block that was never
    /// mapped is given up).
    pub(super) fn forget_unused(&mut self, lo: usize, hi: usize) {
        spans(lo, hi, |c, _, _| {
            if let Some(Some(chunk)) = self.chunks.get(c) {
                if chunk.unused() {
                    self.forget(c);
                }
            }
        });
    }

    /// Frees chunk `c`; the pointers too once no chunk is left.
    fn forget(&mut self, c: usize) {
        self.chunks[c] = None;
        if self.chunks.iter().all(Option::is_none) {
            self.chunks = Vec::new();
        }
    }

    /// Host bytes held: the chunks, and while any is, a pointer for each chunk of the
    /// reservation up to the highest used so far.
    pub(super) fn bytes(&self) -> usize {
        let chunks = self.chunks.iter().flatten().count();
        chunks * std::mem::size_of::<Chunk<H>>()
            + self.chunks.capacity() * std::mem::size_of::<Option<Box<Chunk<H>>>>()
    }

    /// Page `p` goes from being overlapped `from` to `to` by one block (its other blocks
    /// unchanged); returns 1 when that takes it out of the cache (live again) or puts it in (no
    /// live block left), 0 otherwise. Its chunk was made.
    #[inline]
    pub(super) fn touch(&mut self, p: usize, from: Overlap, to: Overlap) -> usize {
        let Some(chunk) = self.chunk(p) else {
            debug_assert!(false, "page {p} has no chunk");
            return 0;
        };
        chunk.touch(p & (CHUNK_PAGES - 1), from, to)
    }

    /// Makes the pages of a block with [`page_span`](super::region::page_span) `span` live: the
    /// pages it covers wholly leave the cache (a page covered wholly has no count: it is live
    /// exactly while the block is), and the end pages it shares count it. Returns how many left
    /// the cache, and whether every one of its pages is mapped. A block within one chunk (nearly
    /// every one) looks its chunk up once.
    #[inline]
    pub(super) fn enter(
        &mut self,
        (first, last, lo, hi): (usize, usize, usize, usize),
    ) -> (usize, bool) {
        let c = first >> CHUNK_LOG;
        if c != (last - 1) >> CHUNK_LOG {
            return self.enter_chunks(first, last, lo, hi);
        }
        let chunk = self.make_one(c);
        let base = c << CHUNK_LOG;
        let (first, last, lo, hi) = (first - base, last - base, lo - base, hi - base);
        // Within one page that other live blocks share (the usual small block): one count more
        // there, the steps below would change nothing else.
        if first + 1 == last && lo == hi && chunk.partial[first] > 0 && chunk.mapped.get(first) {
            chunk.partial[first] += 1;
            return (0, true);
        }
        let mut uncached = if lo < hi { chunk.revive(lo, hi) } else { 0 };
        // A covered page was free, so it is mapped exactly when it was cached; an end page is
        // looked up, one bit each, instead of counting the span.
        let mut mapped = uncached == hi - lo;
        for p in ends(first, last, lo, hi) {
            uncached += chunk.join(p);
            mapped &= chunk.mapped.get(p);
        }
        (uncached, mapped)
    }

    /// [`enter`](Self::enter) for a block over several chunks.
    #[cold]
    fn enter_chunks(&mut self, first: usize, last: usize, lo: usize, hi: usize) -> (usize, bool) {
        self.make(first, last);
        let mut uncached = self.revive(lo, hi);
        let mut mapped = uncached == hi - lo;
        for p in ends(first, last, lo, hi) {
            uncached += self.touch(p, Overlap::None, Overlap::Partial);
            mapped &= self.is_mapped(p);
        }
        (uncached, mapped)
    }

    /// Gives up the pages of a block with [`page_span`](super::region::page_span) `span` (the
    /// mirror of [`enter`](Self::enter)); returns how many went in the cache: mapped pages left
    /// with no live block.
    #[inline]
    pub(super) fn leave(&mut self, (first, last, lo, hi): (usize, usize, usize, usize)) -> usize {
        let c = first >> CHUNK_LOG;
        if c != (last - 1) >> CHUNK_LOG {
            return self.leave_chunks(first, last, lo, hi);
        }
        // No chunk: the block's pages were never mapped nor counted (it is given up because
        // mapping them failed after its chunk went).
        let Some(chunk) = self.chunk(first) else {
            return 0;
        };
        let base = c << CHUNK_LOG;
        let (first, last, lo, hi) = (first - base, last - base, lo - base, hi - base);
        // Within one page that other live blocks still share: one count fewer there.
        if first + 1 == last && lo == hi && chunk.partial[first] > 1 {
            chunk.partial[first] -= 1;
            return 0;
        }
        // The pages the block covered wholly are free now; they are mapped, unless the block is
        // being given up because mapping them failed.
        let mut freed = chunk.cache_mapped(lo, hi);
        for p in ends(first, last, lo, hi) {
            freed += chunk.part(p);
        }
        freed
    }

    /// [`leave`](Self::leave) for a block over several chunks.
    #[cold]
    fn leave_chunks(&mut self, first: usize, last: usize, lo: usize, hi: usize) -> usize {
        let mut freed = self.cache_mapped(lo, hi);
        for p in ends(first, last, lo, hi) {
            freed += self.touch(p, Overlap::Partial, Overlap::None);
        }
        freed
    }

    /// Takes the pages of `lo..hi`, which a block now lives on, out of the cache (and out of
    /// the settled and pending sets: a page with a live block is never unmapped, and once freed
    /// again its new work must complete first); returns how many were cached.
    #[inline]
    pub(super) fn revive(&mut self, lo: usize, hi: usize) -> usize {
        let mut n = 0;
        spans(lo, hi, |c, lo, hi| {
            if let Some(chunk) = self.chunks.get_mut(c).and_then(Option::as_deref_mut) {
                n += chunk.revive(lo, hi);
            }
        });
        n
    }

    /// Puts the mapped pages of `lo..hi`, which no live block is on any more, in the cache;
    /// returns how many.
    pub(super) fn cache_mapped(&mut self, lo: usize, hi: usize) -> usize {
        let mut n = 0;
        spans(lo, hi, |c, lo, hi| {
            if let Some(chunk) = self.chunks.get_mut(c).and_then(Option::as_deref_mut) {
                n += chunk.cache_mapped(lo, hi);
            }
        });
        n
    }

    /// Whether page `p` is mapped.
    #[inline]
    pub(super) fn is_mapped(&self, p: usize) -> bool {
        let chunk = self.chunks.get(p >> CHUNK_LOG).and_then(Option::as_deref);
        chunk.is_some_and(|c| c.mapped.get(p & (CHUNK_PAGES - 1)))
    }

    /// How many pages of `lo..hi` are not mapped.
    pub(super) fn count_unmapped(&self, lo: usize, hi: usize) -> usize {
        let mut n = 0;
        spans(lo, hi, |c, lo, hi| {
            n += match self.chunks.get(c).and_then(Option::as_deref) {
                Some(chunk) => chunk.mapped.count_clear(lo, hi),
                None => hi - lo,
            }
        });
        n
    }

    /// Records `handle` mapped at page `p`.
    pub(super) fn map(&mut self, p: usize, handle: H) {
        // The chunk may have gone since the block was placed: a page a block covers wholly has
        // no count, so a chunk whose last mapped page was unmapped to make room for the block's
        // own pages kept nothing; it is made again, exact, as those pages are mapped.
        self.make(p, p + 1);
        let Some(chunk) = self.chunk(p) else {
            debug_assert!(false, "page {p} has no chunk");
            return;
        };
        let i = p & (CHUNK_PAGES - 1);
        chunk.handles[i] = Some(handle);
        chunk.mapped.set(i, i + 1);
    }

    /// Forgets page `p`'s mapping (out of every set) and returns its handle, if it had one;
    /// frees its chunk if that keeps nothing any more.
    pub(super) fn unmap(&mut self, p: usize) -> Option<H> {
        let c = p >> CHUNK_LOG;
        let chunk = self.chunks.get_mut(c)?.as_deref_mut()?;
        let i = p & (CHUNK_PAGES - 1);
        for set in [
            &mut chunk.mapped,
            &mut chunk.cached,
            &mut chunk.settled,
            &mut chunk.pending,
        ] {
            set.clear(i, i + 1);
        }
        let handle = chunk.handles[i].take();
        if chunk.unused() {
            self.forget(c);
        }
        handle
    }

    /// Ends the pending batch, whose marks are reached: its pages are settled.
    pub(super) fn settle(&mut self) {
        for chunk in self.chunks.iter_mut().flatten() {
            for (s, p) in chunk.settled.0.iter_mut().zip(&mut chunk.pending.0) {
                *s |= std::mem::take(p);
            }
        }
    }

    /// Settles every cached page, and empties the pending set.
    pub(super) fn settle_all(&mut self) {
        for chunk in self.chunks.iter_mut().flatten() {
            chunk.settled = chunk.cached;
            chunk.pending = Bits::default();
        }
    }

    /// Empties the pending set.
    pub(super) fn abandon_pending(&mut self) {
        for chunk in self.chunks.iter_mut().flatten() {
            chunk.pending = Bits::default();
        }
    }

    /// Makes the cached pages that are not settled pending; says whether there are any.
    pub(super) fn mark_pending(&mut self) -> bool {
        let mut any = false;
        for chunk in self.chunks.iter_mut().flatten() {
            for ((p, c), s) in chunk
                .pending
                .0
                .iter_mut()
                .zip(&chunk.cached.0)
                .zip(&chunk.settled.0)
            {
                *p = c & !s;
                any |= *p != 0;
            }
        }
        any
    }

    /// Settled pages.
    pub(super) fn settled(&self) -> usize {
        self.chunks
            .iter()
            .flatten()
            .map(|c| c.settled.count())
            .sum()
    }

    /// The highest settled page below `below`.
    pub(super) fn highest_settled(&self, below: usize) -> Option<usize> {
        let top = below.checked_sub(1)?;
        let first = (top >> CHUNK_LOG).min(self.chunks.len().checked_sub(1)?);
        for c in (0..=first).rev() {
            let Some(chunk) = self.chunks[c].as_deref() else {
                continue;
            };
            for w in (0..chunk.settled.0.len()).rev() {
                let base = (c << CHUNK_LOG) + w * 64;
                if base > top {
                    continue;
                }
                let keep = top - base;
                let mask = if keep >= 63 {
                    u64::MAX
                } else {
                    (1u64 << (keep + 1)) - 1
                };
                let bits = chunk.settled.0[w] & mask;
                if bits != 0 {
                    return Some(base + 63 - bits.leading_zeros() as usize);
                }
            }
        }
        None
    }

    /// The mapped pages, lowest first.
    pub(super) fn mapped_pages(&self) -> impl Iterator<Item = usize> + '_ {
        self.chunks.iter().enumerate().flat_map(|(c, chunk)| {
            let mapped = chunk
                .as_deref()
                .map_or(Bits::default(), |chunk| chunk.mapped);
            (0..CHUNK_PAGES)
                .filter(move |&i| mapped.get(i))
                .map(move |i| (c << CHUNK_LOG) + i)
        })
    }

    /// Every mapped page with its handle, lowest first, emptying the table.
    pub(super) fn drain(self) -> impl Iterator<Item = (usize, H)> {
        self.chunks
            .into_iter()
            .enumerate()
            .filter_map(|(c, chunk)| chunk.map(|chunk| (c, chunk)))
            .flat_map(|(c, chunk)| {
                let Chunk { handles, .. } = *chunk;
                handles
                    .into_iter()
                    .enumerate()
                    .filter_map(move |(i, h)| h.map(|h| ((c << CHUNK_LOG) + i, h)))
            })
    }
}
