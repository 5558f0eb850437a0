//! A reserved range (`Region`) and its page table, how a block covers its pages (`page_span`,
//! `Overlap`, `ends`), and the `State` behind the lock.

use crate::suballoc::tlsf_index::TlsfIndex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::table::PageTable;

#[derive(Debug)]
pub(super) struct Region<H> {
    pub(super) base: usize,
    pub(super) size: usize,
    /// What is known of each page: made in chunks as blocks come (a reservation of the device's
    /// whole memory costs nothing until used), freed as they go.
    pub(super) pages: PageTable<H>,
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
    /// Shared with a request that waits for them without the lock ([`State::deferred`]).
    pub(super) marks: Arc<[M]>,
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
    /// Cached pages to unmap for a bound across heaps
    /// ([`PagedHeaps`](super::PagedHeaps)), beside this heap's own: set by
    /// [`give_up`](super::VirtualMemory::give_up), counted down as pages go, cleared when this
    /// heap maps pages itself.
    pub(super) owed: usize,
    /// The most bytes of pages under live blocks so far (`mapped` less the cache).
    pub(super) live_peak: usize,
    /// The most bytes of pages under live blocks since `window_at`, and in the window before:
    /// what the heap needed lately, which it keeps when others need pages
    /// ([`give_up`](super::VirtualMemory::give_up)).
    pub(super) recent_peak: usize,
    pub(super) prior_peak: usize,
    /// The start of the current window, set by the first `give_up`.
    pub(super) window_at: Option<Instant>,
    /// The pending batch: its `pending` pages are settled once its marks are all reached.
    pub(super) batch: Option<Batch<M>>,
    /// The marks of the pending batch, left by a request about to map pages beyond the peak
    /// bound while that batch, marked by an earlier call, was pending: the request mapped
    /// nothing and was undone, and its caller waits for them without the lock, then places it
    /// again with `waited_for_batch` set.
    pub(super) deferred: Option<Arc<[M]>>,
    /// Set while a request that waited for a batch is placed again: it maps beyond the bound
    /// rather than wait once more.
    pub(super) waited_for_batch: bool,
    /// Calls since the pending batch's marks were last queried.
    pub(super) ticks: u32,
    /// When the tick's last round of work on events began
    /// ([`EVENT_INTERVAL`](super::cache::EVENT_INTERVAL)).
    pub(super) events_at: Option<Instant>,
    /// Pages mapped and unmapped so far.
    pub(super) maps: u64,
    pub(super) unmaps: u64,
    /// While set, pages unmapped for the bounds are not given back but kept in `donors`, for
    /// the block about to be mapped to take ([`PhysicalPages::remap`](crate::leaf::PhysicalPages::remap)).
    pub(super) donate: bool,
    /// Pages unmapped for the bounds (their address and physical memory) that the block being
    /// mapped takes; empty outside `map_range`.
    pub(super) donors: Vec<(usize, H)>,
    /// Time spent waiting on the host for device work ([`VmUsage::waited`](super::VmUsage::waited)).
    pub(super) waited: Duration,
}

/// Pages swapped for the bounds (a free page's memory moved to a new page's, `cuMemUnmap` +
/// `cuMemMap` and the new page's `cuMemSetAccess`, or a free page unmapped) may take a fortieth
/// of the wall time over a second, a quarter over a tenth of one, or half over 20 ms: where
/// swaps take more, the peak slack doubles (up to [`Pace::MAX_DOUBLINGS`] times), so that a
/// program that does nothing but swap stops within a few tens of milliseconds. The heaps of one
/// [`PagedHeaps`](super::PagedHeaps) share one pace, and their swaps count together, since the
/// driver serializes them: sixteen heaps that each swap a sixteenth of the time keep the driver
/// busy all of it. A program that allocates between long kernels (PyTorch training: about 80
/// swaps in a step of 256 ms, and bursts of a few hundred as its first steps reach their peak)
/// keeps its pages at its peak, while one that does little but allocate (a replay, a benchmark)
/// soon stops swapping and maps nothing more, as with no bound. Growth maps no page in place of
/// another, and counts nothing.
///
/// A window of fewer than [`Pace::MIN_SWAPS`] swaps doubles nothing: a few swaps that took
/// long because their thread was preempted are not a program that swaps.
///
/// Atomics, not a lock: heaps count their swaps while holding their own locks. The figures are
/// a hint: a swap counted as a window closes may count in the next.
#[derive(Debug)]
pub(super) struct Pace {
    /// The origin of the instants below.
    epoch: Instant,
    /// The start of the window, in nanoseconds from `epoch`.
    since: AtomicU64,
    /// Nanoseconds spent swapping pages for the bounds within the window.
    spent: AtomicU64,
    /// Pages swapped within the window.
    swaps: AtomicU64,
    /// How many times the slack has been doubled.
    doublings: AtomicU32,
}

impl Pace {
    /// Each window length (the last closes the window whatever was spent), and the share of
    /// it swaps may take: at most one in this many nanoseconds.
    const RULES: [(Duration, u64); 3] = [
        (Duration::from_millis(20), 2),
        (Duration::from_millis(100), 4),
        (Duration::from_secs(1), 40),
    ];
    const MAX_DOUBLINGS: u32 = 6;
    const MIN_SWAPS: u64 = 16;

    pub(super) fn new() -> Self {
        Pace {
            epoch: Instant::now(),
            since: AtomicU64::new(0),
            spent: AtomicU64::new(0),
            swaps: AtomicU64::new(0),
            doublings: AtomicU32::new(0),
        }
    }

    /// How many times the slack has been doubled.
    #[inline]
    pub(super) fn doublings(&self) -> u32 {
        self.doublings.load(Ordering::Relaxed)
    }

    /// The slack above a peak of `peak` live bytes, of pages of `page` bytes, under a
    /// `peak_slack`: a 64th of the peak at most, so that a small workload's footprint stays as
    /// close to its peak as a large one's; a page at least, so that a block freed and made again
    /// within a page maps nothing; doubled as often as swaps took too much of the time.
    #[inline]
    pub(super) fn slack(&self, peak_slack: usize, peak: usize, page: usize) -> usize {
        (peak_slack.min(peak >> 6).max(page)).saturating_mul(1 << self.doublings())
    }

    /// Counts `time` spent swapping `pages` pages for the bounds; doubles the slack where swaps
    /// took more than their share of the window so far.
    pub(super) fn spent(&self, time: Duration, pages: usize) {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let add = nanos(time);
        let spent = self
            .spent
            .fetch_add(add, Ordering::Relaxed)
            .saturating_add(add);
        let pages = u64::try_from(pages).unwrap_or(u64::MAX);
        let swaps = self
            .swaps
            .fetch_add(pages, Ordering::Relaxed)
            .saturating_add(pages);
        let since = self.since.load(Ordering::Relaxed);
        let now = nanos(self.epoch.elapsed());
        let window = now.saturating_sub(since);
        let over = swaps >= Self::MIN_SWAPS
            && Self::RULES
                .iter()
                .any(|&(at, share)| window >= nanos(at) && spent.saturating_mul(share) > window);
        let longest = Self::RULES[Self::RULES.len() - 1].0;
        // One caller closes a window: the one that moves its start.
        let close = over || window >= nanos(longest);
        if close
            && self
                .since
                .compare_exchange(since, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // What others add from now on counts in the new window.
            for (total, seen) in [(&self.spent, spent), (&self.swaps, swaps)] {
                let _ = total.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                    Some(s.saturating_sub(seen))
                });
            }
            if over {
                let _ = self
                    .doublings
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| {
                        Some((d + 1).min(Self::MAX_DOUBLINGS))
                    });
            }
        }
    }
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
    /// Bytes of pages under live blocks, of pages of `page` bytes: `mapped` less the cache.
    #[inline]
    pub(super) fn live(&self, page: usize) -> usize {
        self.mapped - self.cached * page
    }

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
