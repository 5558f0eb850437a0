//! Reserving ranges and mapping, enabling and unmapping the pages under blocks.

use crate::leaf::PhysicalPages;
use crate::resource::{AllocError, Result};
use crate::stream::StreamRef;
use crate::suballoc::tlsf_index::GRANULE;
use std::time::Instant;

use super::region::{ends, page_span, Overlap, Region, State};
use super::{VirtualMemory, NAME};

impl<P: PhysicalPages> VirtualMemory<P> {
    /// Reserves a range of at least `need` bytes (the configured reservation, or more) as one
    /// free block on `stream`.
    pub(super) fn reserve(
        &self,
        st: &mut State<P::Page, P::Mark>,
        need: usize,
        stream: StreamRef,
    ) -> Result<()> {
        let wanted = match self.config.reservation {
            0 => self.pages.default_reservation(),
            n => n,
        };
        // At least a page: a source of no capacity (a simulated one of 0 bytes) has a default
        // reservation of 0, which no source reserves.
        let size = wanted
            .max(need)
            .max(self.page)
            .checked_next_multiple_of(self.page)
            .filter(|&s| s <= isize::MAX as usize)
            .ok_or(AllocError::out_of_memory(need, GRANULE, NAME))?;
        let base = self.pages.reserve(size)?;
        if !st.index.add_chunk(base, size, stream) {
            // SAFETY: just reserved with this size; nothing is mapped in it.
            unsafe { self.pages.unreserve(base, size) };
            return Err(AllocError::out_of_memory(need, GRANULE, NAME));
        }
        let at = st.regions.partition_point(|r| r.base < base);
        st.regions.insert(
            at,
            Region {
                base,
                size,
                pages: Default::default(),
            },
        );
        Ok(())
    }

    /// Makes the pages of the block `[addr, addr + len)` of region `r` live: out of the cache,
    /// and mapped where they are not, given `map`; without it, or where the request is to wait
    /// for a batch unlocked first (`st.deferred` set), `Ok(false)` where a page is not mapped,
    /// and nothing has changed. On failure nothing has changed (but the cache may have
    /// been emptied).
    pub(super) fn commit(
        &self,
        st: &mut State<P::Page, P::Mark>,
        r: usize,
        addr: usize,
        len: usize,
        map: bool,
    ) -> Result<bool> {
        let span = page_span(st.regions[r].base, addr, len, self.shift);
        let (uncached, all_mapped) = st.regions[r].pages.enter(span);
        st.cached -= uncached;
        if all_mapped {
            // What is live grew only by the pages that left the cache (the usual small block, on
            // a page other live blocks share, takes none).
            if uncached > 0 {
                self.note_live(st);
            }
            return Ok(true);
        }
        if !map {
            // Undone as after a failed mapping: the cached pages go back to the cache.
            self.uncommit(st, r, addr, len, false);
            return Ok(false);
        }
        let result = self.map_range(st, r, span.0, span.1);
        if st.deferred.is_some() {
            // Undone as where pages may not be mapped: the request waits for a batch first.
            self.uncommit(st, r, addr, len, false);
            return Ok(false);
        }
        if result.is_err() {
            self.uncommit(st, r, addr, len, false);
        }
        self.after_mapping(st, result.is_ok());
        result.map(|()| true)
    }

    /// Keeps the cache within its bounds after pages were mapped for a block (later, never
    /// waiting); after a failure the pages mapped for the request went to the cache, and what
    /// the bounds ask goes now.
    fn after_mapping(&self, st: &mut State<P::Page, P::Mark>, mapped: bool) {
        if mapped {
            self.note_live(st);
            // Usually nothing: the swaps before the mapping kept within the bounds.
            self.trim_later(st, 0);
        } else {
            let keep = st.cached - self.excess(st, 0);
            self.trim(st, keep * self.page);
        }
    }

    /// Raises the peak of live pages to what is live now.
    #[inline]
    fn note_live(&self, st: &mut State<P::Page, P::Mark>) {
        let live = st.live(self.page);
        st.live_peak = st.live_peak.max(live);
        st.recent_peak = st.recent_peak.max(live);
    }

    /// Maps the unmapped pages of `first..last` of region `r` (all live): first unmapping
    /// settled free pages beyond the bounds in their place, and emptying the cache where the cap
    /// or the source says there is no room. Maps nothing where the request is to wait for a
    /// batch unlocked first (it sets `st.deferred`).
    fn map_range(
        &self,
        st: &mut State<P::Page, P::Mark>,
        r: usize,
        first: usize,
        last: usize,
    ) -> Result<()> {
        let missing = st.regions[r].pages.count_unmapped(first, last);
        if missing == 0 {
            return Ok(());
        }
        // A heap that maps pages owes none to others: its growth bounds them all anew.
        let owed = std::mem::take(&mut st.owed);
        // New pages take the place of settled free ones beyond the bounds, so that what is
        // mapped never rises above them while such pages remain: their physical memory moves
        // here (`remap`) rather than going back and being made anew.
        st.donate = true;
        self.trim_later(st, missing);
        st.donate = false;
        if st.deferred.is_some() {
            // The request waits for a batch without the lock and is placed again: nothing was
            // unmapped for it, nothing is mapped now, and the heap still owes what it owed.
            st.owed = owed;
            return Ok(());
        }
        let result = self.map_pages(st, r, first, last, missing);
        self.give_back_donors(st);
        result
    }

    /// Gives back the physical memory of pages unmapped for the bounds that no new page took.
    pub(super) fn give_back_donors(&self, st: &mut State<P::Page, P::Mark>) {
        let start = Instant::now();
        let given = st.donors.len();
        // One at a time: should the source panic, the rest stay listed, to be given back later.
        while let Some((addr, page)) = st.donors.pop() {
            // SAFETY: a mapping of this source for a settled page, with no live block on it and
            // its freeing work complete, taken out of the page table.
            unsafe { self.pages.unmap(addr, self.page, page) };
        }
        if given > 0 {
            self.pace.spent(start.elapsed(), given);
        }
    }

    /// [`map_range`](Self::map_range) after the swaps: maps the `missing` unmapped pages of
    /// `first..last` of region `r`, taking the memory of the donors first.
    fn map_pages(
        &self,
        st: &mut State<P::Page, P::Mark>,
        r: usize,
        first: usize,
        last: usize,
        missing: usize,
    ) -> Result<()> {
        // The donors are out of `st.mapped` already, and their memory comes back in with the
        // pages they move to.
        let bytes = missing * self.page;
        if bytes > self.config.max.saturating_sub(st.mapped) {
            self.trim(st, 0);
            if bytes > self.config.max.saturating_sub(st.mapped) {
                return Err(AllocError::out_of_memory(bytes, self.page, NAME));
            }
        }
        let base = st.regions[r].base;
        let mut run: Option<usize> = None;
        // A swap costs its remap and the access grant to its new page: the pace counts the
        // swapped pages' share of the whole mapping.
        let start = Instant::now();
        let mut moved = 0usize;
        for p in first..=last {
            let unmapped = p < last && !st.regions[r].pages.is_mapped(p);
            if unmapped {
                let addr = base + p * self.page;
                let mapped = match st.donors.pop() {
                    Some((from, page)) => {
                        moved += 1;
                        // SAFETY: `from` as in `give_back_donors`; `addr` is one page of a
                        // reservation of this source, not mapped (its bit is clear, and nothing
                        // but this resource maps in its reservations).
                        unsafe { self.pages.remap(from, addr, self.page, page) }
                    }
                    // SAFETY: `addr` as above.
                    None => unsafe { self.pages.map(addr, self.page) },
                };
                let mapped = match mapped {
                    Err(e) if e.is_out_of_memory() && st.cached > 0 => {
                        self.trim(st, 0);
                        // SAFETY: as above; the trim unmapped only cached pages.
                        unsafe { self.pages.map(addr, self.page) }
                    }
                    other => other,
                };
                let page = match mapped {
                    Ok(page) => page,
                    Err(e) => {
                        // The pages of this run were never enabled: no one may use them.
                        if let Some(start) = run {
                            for q in start..p {
                                self.unmap_page(st, r, q);
                            }
                        }
                        return Err(e);
                    }
                };
                st.regions[r].pages.map(p, page);
                st.mapped += self.page;
                st.maps += 1;
                st.peak_mapped = st.peak_mapped.max(st.mapped);
                run.get_or_insert(p);
            } else if let Some(start) = run.take() {
                // SAFETY: pages `start..p` were just mapped by this source, in one of its
                // reservations.
                let enabled = unsafe {
                    self.pages
                        .enable(base + start * self.page, (p - start) * self.page)
                };
                if let Err(e) = enabled {
                    // Pages no one may access: unmap them (nothing used them).
                    for q in start..p {
                        self.unmap_page(st, r, q);
                    }
                    return Err(e);
                }
            }
        }
        if moved > 0 {
            let share = moved as f64 / missing as f64;
            self.pace.spent(start.elapsed().mul_f64(share), moved);
        }
        Ok(())
    }

    /// Gives up the pages of the block `[addr, addr + len)` of region `r`: those left with no
    /// live block go in the cache, and the cache is trimmed to its bound if `trim`.
    pub(super) fn uncommit(
        &self,
        st: &mut State<P::Page, P::Mark>,
        r: usize,
        addr: usize,
        len: usize,
        trim: bool,
    ) {
        let span = page_span(st.regions[r].base, addr, len, self.shift);
        let pages = &mut st.regions[r].pages;
        let freed = pages.leave(span);
        if !trim {
            // A block given up for want of pages may leave chunks with nothing in them.
            pages.forget_unused(span.0, span.1);
        }
        st.cached += freed;
        if trim && freed > 0 {
            self.trim_later(st, 0);
        }
    }

    /// Grows the live block `[addr, addr + old)` of region `r` to `new` bytes, page by page: the
    /// pages it now touches leave the cache or are mapped. On failure, or where the request is to
    /// wait for a batch unlocked first (`st.deferred` set), the pages are as before.
    pub(super) fn extend(
        &self,
        st: &mut State<P::Page, P::Mark>,
        r: usize,
        addr: usize,
        old: usize,
        new: usize,
    ) -> Result<()> {
        let base = st.regions[r].base;
        let before = page_span(base, addr, old, self.shift);
        let after = page_span(base, addr, new, self.shift);
        // The old block's last page is the only one it shares with the grown one's new pages.
        let shared = before.1 - 1;
        let (lo, hi) = (after.2.max(shared + 1), after.3.max(shared + 1));
        let pages = &mut st.regions[r].pages;
        pages.make(shared, after.1);
        let mut uncached = pages.touch(
            shared,
            Overlap::of(before, shared),
            Overlap::of(after, shared),
        );
        uncached += pages.revive(lo, hi);
        for p in ends(after.0, after.1, after.2, after.3).filter(|&p| p > shared) {
            uncached += pages.touch(p, Overlap::None, Overlap::Partial);
        }
        st.cached -= uncached;
        let result = self.map_range(st, r, shared, after.1);
        let deferred = st.deferred.is_some();
        if result.is_err() || deferred {
            // The same steps backwards: what the grown block alone held goes to the cache.
            let pages = &mut st.regions[r].pages;
            let mut freed = pages.cache_mapped(lo, hi);
            for p in ends(after.0, after.1, after.2, after.3).filter(|&p| p > shared) {
                freed += pages.touch(p, Overlap::Partial, Overlap::None);
            }
            freed += pages.touch(
                shared,
                Overlap::of(after, shared),
                Overlap::of(before, shared),
            );
            pages.forget_unused(shared, after.1);
            st.cached += freed;
        }
        if !deferred {
            self.after_mapping(st, result.is_ok());
        }
        result
    }

    /// Unmaps page `p` of region `r`, out of the cache, that no work uses: no live block is on
    /// it and the streams that freed blocks on it were synchronized, or it was never enabled.
    /// While `donate` is set, its memory goes to the donors, for the block being mapped.
    pub(super) fn unmap_page(&self, st: &mut State<P::Page, P::Mark>, r: usize, p: usize) {
        let region = &mut st.regions[r];
        let addr = region.base + p * self.page;
        if let Some(page) = region.pages.unmap(p) {
            st.mapped -= self.page;
            st.unmaps += 1;
            if st.donate {
                st.donors.push((addr, page));
                return;
            }
            // SAFETY: a mapping this source made for this page, with no live block on it, whose
            // last users the caller synchronized (or that nothing ever used).
            unsafe { self.pages.unmap(addr, self.page, page) };
        }
    }
}
