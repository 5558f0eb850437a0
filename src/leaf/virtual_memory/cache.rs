//! The cache of free mapped pages: synchronizing the streams that freed blocks, and trimming
//! the cache by unmapping pages, the highest first.

use crate::leaf::PhysicalPages;
use crate::resource::Result;
use crate::stream::Held;
use crate::suballoc::tlsf_index::ALL_STREAMS;

use super::region::State;
use super::VirtualMemory;

impl<P: PhysicalPages> VirtualMemory<P> {
    /// Synchronizes the streams whose lists got free bytes since the last time
    /// ([`TlsfIndex::take_listed`](crate::suballoc::tlsf_index::TlsfIndex::take_listed)); if one
    /// fails, they are all waited for again next time.
    ///
    /// Why that suffices before unmapping a page with no live block: each of its bytes is in a
    /// free block, on the list of some stream `Y`. Either the bytes reached `Y`'s list since the
    /// last synchronization, and `Y` is among the streams waited for now, or before it, and `Y`
    /// was waited for then (no work uses freed bytes after their free). A stale bit only adds a
    /// synchronization.
    pub(super) fn synchronize_freed(&self, st: &mut State<P::Page>) -> Result<()> {
        let bits = st.index.take_listed();
        let keeper = &st.index.streams;
        let synced = if bits & (1 << ALL_STREAMS) != 0 {
            keeper.each().try_for_each(|s| self.pages.synchronize(s))
        } else {
            (0..ALL_STREAMS)
                .filter(|b| bits & (1 << b) != 0)
                .try_for_each(|b| self.pages.synchronize(keeper.get(Held::at(b))))
        };
        if synced.is_err() {
            // Waited for or not, these streams must be waited for before the next unmapping.
            st.index.relist(bits);
        }
        synced
    }

    /// Unmaps cached pages, the highest first (blocks are carved from the low end of free
    /// ranges, so low pages are the likeliest to serve again), until at most `target` bytes are
    /// cached, after synchronizing the streams that freed blocks since the last trim
    /// ([`synchronize_freed`](Self::synchronize_freed)); keeps them if a synchronization fails.
    /// O(pages reserved / 64) on top of the unmapping: trims are batched, off the hot path.
    pub(super) fn trim(&self, st: &mut State<P::Page>, target: usize) {
        let target = target / self.page;
        if st.cached <= target {
            return;
        }
        if self.synchronize_freed(st).is_err() {
            return;
        }
        for r in (0..st.regions.len()).rev() {
            for w in (0..st.regions[r].cached.0.len()).rev() {
                while st.cached > target && st.regions[r].cached.0[w] != 0 {
                    let bits = st.regions[r].cached.0[w];
                    let p = w * 64 + (63 - bits.leading_zeros() as usize);
                    st.regions[r].cached.clear(p, p + 1);
                    st.cached -= 1;
                    self.unmap_page(st, r, p);
                }
                if st.cached <= target {
                    return;
                }
            }
        }
    }
}
