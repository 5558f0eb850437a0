//! The cache of free mapped pages, and giving its pages back: at once after waiting for the
//! streams that freed blocks on them (pressure, `release`, drop), or later, once marks recorded
//! on those streams are reached (a cache over its bounds), waiting for them a bounded time at most
//! where pages are about to be mapped beyond the peak bound.

use crate::leaf::PhysicalPages;
use crate::resource::Result;
use crate::stream::Held;
use crate::suballoc::tlsf_index::ALL_STREAMS;

use super::region::{Batch, State};
use super::VirtualMemory;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Calls between two queries of a pending batch's marks: a query costs a driver call (about a
/// microsecond), an allocation from the cache tens of nanoseconds.
const TICKS_PER_QUERY: u32 = 32;

/// The least time between two rounds of [`tick`](VirtualMemory::tick)'s work on events (a batch
/// made or queried while pages are near the bound, which no request waits for): a batch costs an
/// event made, recorded and destroyed, a few microseconds, and a query most of one, so a program
/// that does little but allocate (tens of nanoseconds a call) spends a few nanoseconds a call on
/// them, while one with kernels between its calls (PyTorch: a step of hundreds of milliseconds)
/// sees its pages settle as often as it needs. A request over the bounds marks and queries at
/// once.
pub(super) const EVENT_INTERVAL: Duration = Duration::from_micros(50);

/// The longest a request about to map pages beyond the peak bound waits for a batch marked
/// earlier. A bound, not a wait on the host without end: the work before the marks may itself
/// wait for the host (a stream waiting on a flag that a thread blocked on this heap would set).
/// PyTorch's GPT training waits far less: the device reaches a mark within the step it was
/// recorded in.
pub(super) const WAIT_FOR_BATCH: Duration = Duration::from_millis(200);

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
    /// since; then no work uses a page with no live block, and every cached page is settled. A
    /// mark that cannot be waited for gives the batch up: its streams are synchronized instead.
    pub(super) fn synchronize_freed(&self, st: &mut State<P::Page, P::Mark>) -> Result<()> {
        let start = Instant::now();
        self.wait_batch(st);
        let synchronized = self.each_freed(st, |pages, s| pages.synchronize(s));
        st.waited += start.elapsed();
        synchronized?;
        self.settle_all(st);
        Ok(())
    }

    /// Ends the pending batch, whose marks are reached: its pages are settled.
    fn settle(&self, st: &mut State<P::Page, P::Mark>) {
        st.batch = None;
        for region in &mut st.regions {
            region.pages.settle();
        }
    }

    /// Settles every cached page: the caller knows the work that freed them all is complete.
    fn settle_all(&self, st: &mut State<P::Page, P::Mark>) {
        for region in &mut st.regions {
            region.pages.settle_all();
        }
    }

    /// Clears the pending set, with no batch to settle it.
    fn abandon_pending(&self, st: &mut State<P::Page, P::Mark>) {
        for region in &mut st.regions {
            region.pages.abandon_pending();
        }
    }

    /// Gives the pending batch up (a mark could not be queried or waited for): its pages stay
    /// cached, unsettled, and its streams are listed again, to be marked or synchronized next
    /// time.
    fn abandon(&self, st: &mut State<P::Page, P::Mark>) {
        if let Some(batch) = st.batch.take() {
            st.index.relist(batch.streams);
            self.abandon_pending(st);
        }
    }

    /// Unmaps cached pages, the highest first (blocks are carved from the low end of free
    /// ranges, so low pages are the likeliest to serve again), until at most `target` bytes are
    /// cached, after waiting for the work that may still use them
    /// ([`synchronize_freed`](Self::synchronize_freed)); keeps them if a wait fails. For
    /// pressure, `release` and drop: a cache over its bounds in the course of things goes
    /// through [`trim_later`](Self::trim_later), which waits, if at all, a bounded time for marks.
    pub(super) fn trim(&self, st: &mut State<P::Page, P::Mark>, target: usize) {
        let target = target / self.page;
        if st.cached <= target {
            return;
        }
        if self.synchronize_freed(st).is_err() {
            return;
        }
        let over = st.cached - target;
        self.unmap_settled(st, over);
    }

    /// Cached pages to unmap for the bounds, were `extra` more pages mapped for live blocks:
    /// beyond [`VirtualMemoryConfig::cache`](super::VirtualMemoryConfig::cache), down to half
    /// of it; and beyond the peak of live pages and its slack
    /// ([`VirtualMemoryConfig::peak_slack`](super::VirtualMemoryConfig::peak_slack)), down to
    /// it. At most the cache.
    #[inline]
    pub(super) fn excess(&self, st: &State<P::Page, P::Mark>, extra: usize) -> usize {
        // Shifts, not divisions: this runs at every free that caches a page.
        let mut over = 0;
        if st.cached << self.shift > self.config.cache {
            over = st.cached - (self.config.cache >> (self.shift + 1));
        }
        if self.config.peak_slack != usize::MAX {
            let after = st.mapped + (extra << self.shift);
            let peak = st.live_peak.max(after - (st.cached << self.shift));
            let slack = self.pace.slack(self.config.peak_slack, peak, self.page);
            let beyond = after.saturating_sub(peak.saturating_add(slack));
            over = over.max((beyond >> self.shift) + usize::from(beyond & (self.page - 1) != 0));
        }
        over.max(st.owed).min(st.cached)
    }

    /// Brings the cache within its bounds ([`excess`](Self::excess), with `extra` pages about to
    /// be mapped): settled pages go at once, the highest first; for the rest, the streams that
    /// freed blocks since the last batch are marked, and pages that settle go when the marks are
    /// reached (a later call, [`reap`](Self::reap)). While a batch is pending no other is made.
    /// Never waits; where pages are about to be mapped beyond the bound while a batch marked by
    /// an earlier call is pending and too few pages are settled, it unmaps nothing and leaves
    /// that batch's marks in `st.deferred`, for the caller to wait for ([`WAIT_FOR_BATCH`] at
    /// most) without the lock before it maps anything. Returns how many pages were unmapped.
    pub(super) fn trim_later(&self, st: &mut State<P::Page, P::Mark>, extra: usize) -> usize {
        let over = self.excess(st, extra);
        if over == 0 {
            return 0;
        }
        if extra > 0 && st.batch.is_some() && !st.waited_for_batch && !self.batch_reached(st) {
            // Pages are about to be mapped beyond the bound while a batch marked earlier is
            // pending: where the settled pages fall short, waiting for its marks (work queued
            // before them, not all that is queued now, so the device keeps working meanwhile)
            // costs less than holding more physical memory than the peak and its slack. The
            // caller waits without the lock, so that the heap's other threads (frees from any
            // thread, the sharers of a stream's heap) are not held up, and nothing is unmapped
            // before it tries again.
            // Counted over the page table's chunks: on the way to mapping pages, which costs
            // far more. A batch given up (a mark that could not be queried) is not waited for.
            let settled: usize = st.regions.iter().map(|r| r.pages.settled()).sum();
            if let Some(batch) = st.batch.as_ref().filter(|_| settled < over) {
                st.deferred = Some(Arc::clone(&batch.marks));
                return 0;
            }
        }
        let start = Instant::now();
        let done = self.unmap_settled(st, over);
        let done = match over - done {
            0 => done,
            left => done + self.settle_more(st, extra, left),
        };
        let spent = start.elapsed();
        // Pages kept for the block being mapped count as they move (`map_pages`) or go back
        // (`give_back_donors`).
        if done > 0 && !st.donate {
            self.pace.spent(spent, done);
        }
        done
    }

    /// Whether every one of `marks` is reached; an error where one cannot be queried. Never
    /// waits.
    fn all_reached(&self, marks: &[P::Mark]) -> Result<bool> {
        for m in marks {
            if !self.pages.reached(m)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Polls `marks` until all are reached, one cannot be queried, or `limit` has passed;
    /// returns the time it took. Needs no lock: the caller queries the batch again under it.
    pub(super) fn wait_marks(&self, marks: &[P::Mark], limit: Duration) -> Duration {
        let start = Instant::now();
        while matches!(self.all_reached(marks), Ok(false)) && start.elapsed() < limit {
            std::thread::sleep(Duration::from_micros(50));
        }
        start.elapsed()
    }

    /// Queries the pending batch's marks once, never waiting: settles its pages if all are
    /// reached, gives the batch up if one cannot be queried. Says whether it settled.
    fn batch_reached(&self, st: &mut State<P::Page, P::Mark>) -> bool {
        let Some(batch) = &st.batch else { return false };
        match self.all_reached(&batch.marks) {
            Ok(true) => {
                self.settle(st);
                true
            }
            Ok(false) => false,
            Err(_) => {
                self.abandon(st);
                false
            }
        }
    }

    /// Waits for the pending batch's marks and settles its pages; gives the batch up if a mark
    /// cannot be waited for. Says whether it settled.
    fn wait_batch(&self, st: &mut State<P::Page, P::Mark>) -> bool {
        let Some(batch) = &st.batch else { return false };
        if batch
            .marks
            .iter()
            .try_for_each(|m| self.pages.wait(m))
            .is_err()
        {
            self.abandon(st);
            return false;
        }
        self.settle(st);
        true
    }

    /// Reaps the pending batch, or, where cached pages are not settled, marks the streams that
    /// freed blocks since the last batch so that they settle; unmaps what the bounds ask (with
    /// `extra` pages about to be mapped) of the pages that settle now, up to `over` where no
    /// mark is needed. Returns how many pages were unmapped.
    fn settle_more(&self, st: &mut State<P::Page, P::Mark>, extra: usize, over: usize) -> usize {
        if st.batch.is_some() {
            return self.reap(st, extra);
        }
        let mut unsettled = false;
        for region in &mut st.regions {
            unsettled |= region.pages.mark_pending();
        }
        if !unsettled {
            return 0;
        }
        let mut marks = Vec::new();
        let marked = self.each_freed(st, |pages, s| {
            marks.extend(pages.mark(s)?);
            Ok(())
        });
        match marked {
            // A stream that cannot be marked now (one that captures a graph, another thread's
            // per-thread stream): the streams stay listed; a later trim tries again, or a
            // forced one waits.
            Err(_) => {
                self.abandon_pending(st);
                0
            }
            Ok(_) if marks.is_empty() => {
                // No batch is pending and no stream listed since the last has work to wait
                // for: every cached page is settled.
                self.settle_all(st);
                self.unmap_settled(st, over)
            }
            Ok(streams) => {
                st.batch = Some(Batch {
                    marks: marks.into(),
                    streams,
                });
                // Work often finishes before the host frees its blocks: then the pages go now.
                self.reap(st, extra)
            }
        }
    }

    /// Settles the pending batch's pages if all its marks are reached, and unmaps what the
    /// bounds ask (with `extra` pages about to be mapped); never waits. Queried at most once
    /// every few calls. Returns how many pages were unmapped.
    pub(super) fn reap(&self, st: &mut State<P::Page, P::Mark>, extra: usize) -> usize {
        st.ticks = 0;
        if !self.batch_reached(st) {
            return 0;
        }
        let over = self.excess(st, extra);
        self.unmap_settled(st, over)
    }

    /// Every [`TICKS_PER_QUERY`] calls, and [`EVENT_INTERVAL`] at least after the last time:
    /// queries the pending batch, or, where the next page mapped would go beyond the peak bound,
    /// marks the streams that freed blocks since the last batch, so that free pages keep
    /// settling and new pages take their place rather than add to them.
    #[inline]
    pub(super) fn tick(&self, st: &mut State<P::Page, P::Mark>) {
        st.ticks += 1;
        if st.ticks >= TICKS_PER_QUERY {
            self.tick_round(st);
        }
    }

    /// The work of every [`TICKS_PER_QUERY`]-th [`tick`](Self::tick), apart, so that the other
    /// calls cost a count and a compare.
    #[cold]
    fn tick_round(&self, st: &mut State<P::Page, P::Mark>) {
        st.ticks = 0;
        let pending = st.batch.is_some();
        if !pending && (self.config.peak_slack == usize::MAX || self.excess(st, 1) == 0) {
            return;
        }
        let Some(start) = self.events_due(st) else {
            return;
        };
        let unmapped = match pending {
            true => self.reap(st, 0),
            false => self.settle_more(st, 0, 0),
        };
        if unmapped > 0 {
            self.pace.spent(start.elapsed(), unmapped);
        }
    }

    /// When [`EVENT_INTERVAL`] has passed since the tick's last round of work on events: the
    /// instant a new round starts, now.
    fn events_due(&self, st: &mut State<P::Page, P::Mark>) -> Option<Instant> {
        let now = Instant::now();
        if st
            .events_at
            .is_some_and(|at| now.duration_since(at) < EVENT_INTERVAL)
        {
            return None;
        }
        st.events_at = Some(now);
        Some(now)
    }

    /// Unmaps up to `n` settled pages, the highest first (blocks are carved from the low end of
    /// free ranges, so low pages are the likeliest to serve again); returns how many.
    fn unmap_settled(&self, st: &mut State<P::Page, P::Mark>, n: usize) -> usize {
        let mut done = 0;
        for r in (0..st.regions.len()).rev() {
            let mut below = usize::MAX;
            while done < n {
                let Some(p) = st.regions[r].pages.highest_settled(below) else {
                    break;
                };
                st.cached -= 1;
                st.owed = st.owed.saturating_sub(1);
                self.unmap_page(st, r, p);
                done += 1;
                below = p;
            }
        }
        done
    }
}
