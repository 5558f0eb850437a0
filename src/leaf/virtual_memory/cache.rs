//! The cache of free mapped pages, and giving its pages back: at once after waiting for the
//! streams that freed blocks on them (pressure, `release`, drop), or later, once marks recorded
//! on those streams are reached, without waiting (a cache over its bound).

use crate::leaf::PhysicalPages;
use crate::resource::Result;
use crate::stream::Held;
use crate::suballoc::tlsf_index::ALL_STREAMS;

use super::region::State;
use super::VirtualMemory;

/// Calls between two queries of a pending batch's marks: a query costs a driver call (about a
/// microsecond), an allocation from the cache tens of nanoseconds.
const TICKS_PER_QUERY: u32 = 32;

impl<P: PhysicalPages> VirtualMemory<P> {
    /// Calls `f` on each stream whose list got free bytes since the last time (the bits of
    /// [`TlsfIndex::take_listed`](crate::suballoc::tlsf_index::TlsfIndex::take_listed)); if
    /// `f` fails, those streams stay listed and the error is returned.
    ///
    /// Why waiting for them suffices before unmapping a page with no live block: each of its
    /// bytes is in a free block, on the list of some stream `Y`. Either the bytes reached `Y`'s
    /// list since the last time, and `Y` is among the streams passed now, or before it, and `Y`
    /// was waited for (or marked, in the pending batch) then (no work uses freed bytes after
    /// their free). A stale bit only adds a wait.
    fn each_freed(
        &self,
        st: &mut State<P::Page, P::Mark>,
        mut f: impl FnMut(&P, crate::stream::StreamRef) -> Result<()>,
    ) -> Result<u64> {
        let bits = st.index.take_listed();
        let keeper = &st.index.streams;
        let done = if bits & (1 << ALL_STREAMS) != 0 {
            keeper.each().try_for_each(|s| f(&self.pages, s))
        } else {
            (0..ALL_STREAMS)
                .filter(|b| bits & (1 << b) != 0)
                .try_for_each(|b| f(&self.pages, keeper.get(Held::at(b))))
        };
        if done.is_err() {
            st.index.relist(bits);
        }
        done.map(|()| bits)
    }

    /// Waits on the host for the pending batch's marks and for the streams that freed blocks
    /// since; then no work uses a page with no live block. Unmaps the batch's pages. A mark
    /// that cannot be waited for gives the batch up: its streams are synchronized instead.
    pub(super) fn synchronize_freed(&self, st: &mut State<P::Page, P::Mark>) -> Result<()> {
        if let Some(batch) = &st.batch {
            if batch
                .marks
                .iter()
                .try_for_each(|m| self.pages.wait(m))
                .is_ok()
            {
                self.unmap_doomed(st);
            } else {
                self.abandon(st);
            }
        }
        self.each_freed(st, |pages, s| pages.synchronize(s))
            .map(drop)
    }

    /// Gives the pending batch up (a mark could not be queried or waited for): its pages stay
    /// cached, and its streams are listed again, to be marked or synchronized next time.
    fn abandon(&self, st: &mut State<P::Page, P::Mark>) {
        if let Some(batch) = st.batch.take() {
            st.index.relist(batch.streams);
            for region in &mut st.regions {
                region.doomed.0.fill(0);
            }
        }
    }

    /// Unmaps cached pages, the highest first (blocks are carved from the low end of free
    /// ranges, so low pages are the likeliest to serve again), until at most `target` bytes are
    /// cached, after waiting for the work that may still use them
    /// ([`synchronize_freed`](Self::synchronize_freed)); keeps them if a wait fails. For
    /// pressure, `release` and drop: a cache over its bound in the course of things goes
    /// through [`trim_later`](Self::trim_later), which never waits.
    pub(super) fn trim(&self, st: &mut State<P::Page, P::Mark>, target: usize) {
        let target = target / self.page;
        if st.cached <= target {
            return;
        }
        if self.synchronize_freed(st).is_err() {
            return;
        }
        self.unmap_highest(st, target);
    }

    /// Chooses cached pages beyond `target` bytes, the highest first, to be unmapped once the
    /// work queued so far on the streams that freed blocks is done: marks on those streams, and
    /// the pages doomed; unmapped at once where no mark is needed. Never waits. While a batch
    /// is pending no other is made (the cache stays over its bound until it is reaped).
    pub(super) fn trim_later(&self, st: &mut State<P::Page, P::Mark>, target: usize) {
        if st.batch.is_some() {
            self.reap(st);
            if st.batch.is_some() {
                return;
            }
        }
        let target = target / self.page;
        if st.cached <= target {
            return;
        }
        let mut marks = Vec::new();
        let marked = self.each_freed(st, |pages, s| {
            marks.extend(pages.mark(s)?);
            Ok(())
        });
        // A stream that cannot be marked now (one that captures a graph, another thread's
        // per-thread stream): the streams stay listed; a later trim tries again, or a forced
        // one waits.
        let Ok(streams) = marked else { return };
        if marks.is_empty() {
            // Nothing left to wait for: the pages go now.
            self.unmap_highest(st, target);
            return;
        }
        // No batch is pending, so no page is doomed yet.
        for (r, p) in self.highest_cached(st, st.cached - target) {
            st.regions[r].doomed.set(p, p + 1);
        }
        st.batch = Some(super::region::Batch { marks, streams });
        // Work often finishes before the host frees its blocks: then the pages go now.
        self.reap(st);
    }

    /// Unmaps the pending batch's pages (those still cached) if all its marks are reached;
    /// never waits. Queried at most once every few calls.
    pub(super) fn reap(&self, st: &mut State<P::Page, P::Mark>) {
        let Some(batch) = &st.batch else { return };
        st.ticks = 0;
        let mut reached = true;
        for m in &batch.marks {
            match self.pages.reached(m) {
                Ok(true) => {}
                Ok(false) => reached = false,
                Err(_) => {
                    self.abandon(st);
                    return;
                }
            }
        }
        if reached {
            self.unmap_doomed(st);
        }
    }

    /// Queries the pending batch every [`TICKS_PER_QUERY`] calls.
    #[inline]
    pub(super) fn tick(&self, st: &mut State<P::Page, P::Mark>) {
        if st.batch.is_some() {
            st.ticks += 1;
            if st.ticks >= TICKS_PER_QUERY {
                self.reap(st);
            }
        }
    }

    /// Unmaps every doomed page and ends the batch; its marks are reached.
    fn unmap_doomed(&self, st: &mut State<P::Page, P::Mark>) {
        st.batch = None;
        for r in 0..st.regions.len() {
            for w in 0..st.regions[r].doomed.0.len() {
                while st.regions[r].doomed.0[w] != 0 {
                    let bits = st.regions[r].doomed.0[w];
                    let p = w * 64 + bits.trailing_zeros() as usize;
                    st.regions[r].cached.clear(p, p + 1);
                    st.cached -= 1;
                    self.unmap_page(st, r, p);
                }
            }
        }
    }

    /// Unmaps cached pages, the highest first, until at most `target` pages are cached. The
    /// caller has waited for every use of cached pages.
    fn unmap_highest(&self, st: &mut State<P::Page, P::Mark>, target: usize) {
        for (r, p) in self.highest_cached(st, st.cached.saturating_sub(target)) {
            st.regions[r].cached.clear(p, p + 1);
            st.cached -= 1;
            self.unmap_page(st, r, p);
        }
    }

    /// The `n` highest cached pages, `(region, page)`, highest first: blocks are carved from the
    /// low end of free ranges, so low pages are the likeliest to serve again.
    fn highest_cached(&self, st: &State<P::Page, P::Mark>, n: usize) -> Vec<(usize, usize)> {
        let mut pages = Vec::with_capacity(n.min(st.cached));
        for (r, region) in st.regions.iter().enumerate().rev() {
            for (w, &word) in region.cached.0.iter().enumerate().rev() {
                let mut bits = word;
                while bits != 0 {
                    if pages.len() == n {
                        return pages;
                    }
                    let b = 63 - bits.leading_zeros() as usize;
                    bits &= !(1 << b);
                    pages.push((r, w * 64 + b));
                }
            }
        }
        pages
    }
}
