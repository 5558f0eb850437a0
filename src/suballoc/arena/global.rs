//! `Global`: the global arena's free ranges and spare superblocks, and the path of large requests.

use super::tags::Tags;
use super::{lock, to_ptr, Arena, GRAN, NAME};
use crate::resource::{align_up, AllocError, MemoryResource, Undo};
use crate::stream::{Held, StreamRef};
use std::collections::{BTreeMap, BTreeSet};
use std::ptr::NonNull;

/// Free ranges too small to surely hold an aligned block that [`Global::find_block`] checks
/// before taking one that surely does.
const UNSURE: usize = 8;

/// A free range of the global arena, keyed by its start in [`Global::runs`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    pub(super) len: usize,
    pub(super) chunk: u32,
    pub(super) tags: Tags,
}

/// The free ranges of the global arena, by address (to coalesce) and by size (best fit).
#[derive(Debug, Default)]
pub(super) struct Global {
    pub(super) runs: BTreeMap<usize, Run>,
    by_size: BTreeSet<(usize, usize)>,
    /// Superblocks given back by local arenas, kept whole for the next local arena that needs
    /// one (a push and a pop instead of merging and carving ranges); merged into `runs` when a
    /// large request finds no room.
    pub(super) spare: Vec<Spare>,
    /// Growths under way, with this lock let go around the upstream's `allocate`.
    pub(super) in_flight: crate::suballoc::growth::InFlight,
}

/// A free superblock-sized window of the global arena.
#[derive(Debug, Clone, Copy)]
pub(super) struct Spare {
    pub(super) at: usize,
    pub(super) chunk: u32,
    pub(super) tags: Tags,
}

impl Global {
    /// Its growths under way.
    pub(super) fn in_flight(&mut self) -> &mut crate::suballoc::growth::InFlight {
        &mut self.in_flight
    }

    /// Free bytes and free ranges, spare superblocks (of `superblock` bytes) included.
    pub(super) fn free(&self, superblock: usize) -> (usize, usize) {
        let runs: usize = self.runs.values().map(|r| r.len).sum();
        (
            runs + self.spare.len() * superblock,
            self.runs.len() + self.spare.len(),
        )
    }

    /// Host bytes of the free-range tables (an estimate: B-tree entries count twice for their
    /// nodes).
    pub(super) fn bytes(&self) -> usize {
        self.runs.len() * 2 * (std::mem::size_of::<(usize, Run)>() + 16)
            + self.spare.capacity() * std::mem::size_of::<Spare>()
    }

    pub(super) fn insert(&mut self, start: usize, run: Run) {
        self.runs.insert(start, run);
        self.by_size.insert((run.len, start));
    }

    fn remove(&mut self, start: usize) -> Run {
        let run = self
            .runs
            .remove(&start)
            .expect("Arena: removing a free range that exists");
        self.by_size.remove(&(run.len, start));
        run
    }

    /// A free range that holds `bytes` at `align`: (range start, block address). Ranges start at
    /// multiples of 256, so one of at least `bytes + align - 256` bytes surely holds the block;
    /// a smaller one may. Best fit among the first [`UNSURE`] smaller ones that hold it and the
    /// smallest sure one (lowest address among equals): O(log n) when some range is sure. Only
    /// when none is does it scan the remaining smaller ones, before the caller grows or fails.
    pub(super) fn find_block(&self, bytes: usize, align: usize) -> Option<(usize, usize)> {
        let fits = |&(len, start): &(usize, usize)| {
            let at = align_up(start, align)?;
            (at.checked_add(bytes)? <= start + len).then_some((start, at))
        };
        let sure = bytes.checked_add(align - GRAN)?;
        let mut unsure = self.by_size.range((bytes, 0)..(sure, 0));
        unsure
            .by_ref()
            .take(UNSURE)
            .find_map(fits)
            .or_else(|| self.by_size.range((sure, 0)..).next().and_then(fits))
            .or_else(|| unsure.find_map(fits))
    }

    /// The smallest free range that holds a whole aligned window of `sb` bytes.
    pub(super) fn find_window(&self, sb: usize) -> Option<(usize, usize)> {
        self.find_block(sb, sb)
    }

    /// Takes `[at, at + len)` out of the free range at `start`; returns that range's chunk and
    /// tags, and how many pieces of the range stay free with copies of those tags (each copy
    /// needs its own holds: the caller retains them).
    pub(super) fn carve(&mut self, start: usize, at: usize, len: usize) -> (Run, usize) {
        let run = self.remove(start);
        let mut pieces = 0;
        if at > start {
            pieces += 1;
            self.insert(
                start,
                Run {
                    len: at - start,
                    ..run
                },
            );
        }
        let (end, run_end) = (at + len, start + run.len);
        if run_end > end {
            pieces += 1;
            self.insert(
                end,
                Run {
                    len: run_end - end,
                    ..run
                },
            );
        }
        (run, pieces)
    }

    /// Frees `[start, start + len)`, coalescing with its neighbours in the same chunk. Returns
    /// the holds the merged range forgot (see [`Tags::absorb`]).
    /// A merge whose tags would overflow names streams the merged range forgets: it happens
    /// only once `wait` has waited for them all (true); where it cannot, the ranges stay apart,
    /// each with its own tags, so that no stream gets the merged range unordered.
    #[must_use]
    fn give(
        &mut self,
        start: usize,
        len: usize,
        chunk: u32,
        tags: Tags,
        wait: &mut dyn FnMut(&[Held]) -> bool,
    ) -> Forgotten {
        let mut f = Forgotten::default();
        let (mut start, mut len, mut tags) = (start, len, tags);
        if let Some((&ns, _)) = self.runs.range(start..).next() {
            debug_assert!(start + len <= ns, "Arena: double free of {start:#x}");
        }
        // Merges `tags` with a neighbour's, if the streams it would forget were waited for.
        let mut merge = |tags: &mut Tags, theirs: &Tags, f: &mut Forgotten| {
            let (mut merged, mut sync, mut dup) = (*tags, Vec::new(), Vec::new());
            merged.absorb(theirs, &mut sync, &mut dup);
            let ok = sync.is_empty() || wait(&sync);
            if ok {
                *tags = merged;
                f.sync.extend(sync);
                f.dup.extend(dup);
            }
            ok
        };
        if let Some((&ps, &prev)) = self.runs.range(..start).next_back() {
            debug_assert!(ps + prev.len <= start, "Arena: double free of {start:#x}");
            if ps + prev.len == start && prev.chunk == chunk && merge(&mut tags, &prev.tags, &mut f)
            {
                self.remove(ps);
                start = ps;
                len += prev.len;
            }
        }
        if let Some(&next) = self.runs.get(&(start + len)) {
            if next.chunk == chunk && merge(&mut tags, &next.tags, &mut f) {
                self.remove(start + len);
                len += next.len;
            }
        }
        self.insert(start, Run { len, chunk, tags });
        f
    }
}

/// Holds that free ranges dropped when they merged, to release: `sync`, streams waited for
/// before the merge, and `dup`, named on both sides.
#[derive(Debug, Default)]
pub(super) struct Forgotten {
    pub(super) sync: Vec<Held>,
    pub(super) dup: Vec<Held>,
}

impl<U: MemoryResource> Arena<U> {
    /// Returns a range to the global arena.
    pub(super) fn give_back(&self, start: usize, len: usize, chunk: u32, tags: Tags) {
        let mut g = lock(&self.global);
        let forgotten = g.give(start, len, chunk, tags, &mut |s| self.wait_for(s));
        self.forget(forgotten);
    }

    /// Waits on the host for `streams` (under the global arena's lock, so that no one takes the
    /// range that forgets them first); false when a wait fails.
    fn wait_for(&self, streams: &[Held]) -> bool {
        let mut streams = streams.to_vec();
        streams.sort_unstable();
        streams.dedup();
        streams
            .iter()
            .all(|&s| self.upstream.synchronize(self.stream_of(s)).is_ok())
    }

    /// Releases every hold a merge forgot.
    pub(super) fn forget(&self, f: Forgotten) {
        self.release(f.sync.into_iter().chain(f.dup));
    }

    /// Merges the spare superblocks into the free ranges, for a request they may make room for.
    fn flush_spare(&self, g: &mut Global) {
        for sp in std::mem::take(&mut g.spare) {
            let forgotten = g.give(sp.at, self.superblock_size(), sp.chunk, sp.tags, &mut |s| {
                self.wait_for(s)
            });
            self.forget(forgotten);
        }
    }

    /// Serves a request by best fit; when nothing fits, merges the spare superblocks, grows, then
    /// has the local arenas give back their empty superblocks, before it fails.
    pub(super) fn global_allocate(
        &self,
        bytes: usize,
        align: usize,
        stream: StreamRef,
    ) -> Result<NonNull<u8>, AllocError> {
        let mut reclaimed = false;
        loop {
            let mut g = lock(&self.global);
            if let Some((start, at)) = g.find_block(bytes, align) {
                let (run, pieces) = g.carve(start, at, bytes);
                self.retain(&run.tags, pieces);
                drop(g);
                // The block goes back when the ordering fails, and when the upstream panics.
                let give_back = Undo(|| self.give_back(at, bytes, run.chunk, run.tags));
                self.order(stream, &run.tags)?;
                std::mem::forget(give_back);
                // The block is in use: its range no longer names these streams.
                self.release(run.tags.iter());
                return Ok(to_ptr(at));
            }
            if !g.spare.is_empty() {
                self.flush_spare(&mut g);
                continue;
            }
            // No lock held while the upstream runs (see `grow`).
            drop(g);
            match self.grow(bytes + (align - GRAN)) {
                Ok(()) => continue,
                Err(e) if !e.is_out_of_memory() => return Err(e),
                Err(_) => {}
            }
            if reclaimed {
                return Err(AllocError::out_of_memory(bytes, align, NAME));
            }
            self.reclaim();
            reclaimed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// `find_block` returns an aligned block inside a free range whenever some range holds
        /// one, and never a larger range than the smallest that surely holds it.
        #[test]
        fn find_block_finds_a_fit_whenever_one_exists(
            lens in prop::collection::vec(1usize..40, 1..40),
            gaps in prop::collection::vec(1usize..8, 40),
            units in 1usize..20,
            align_shift in 0u32..5,
        ) {
            let mut g = Global::default();
            let mut at = 1 << 20;
            for (&len, &gap) in lens.iter().zip(&gaps) {
                g.insert(at, Run { len: len * GRAN, chunk: 0, tags: Tags::NONE });
                at += (len + gap) * GRAN;
            }
            let (bytes, align) = (units * GRAN, GRAN << align_shift);
            let holds = |start: usize, len: usize| {
                align_up(start, align).is_some_and(|a| a + bytes <= start + len)
            };
            let any = g.runs.iter().any(|(&s, r)| holds(s, r.len));
            let smallest_sure = g.runs.values().map(|r| r.len).filter(|&l| l >= bytes + align - GRAN).min();
            match g.find_block(bytes, align) {
                Some((start, block)) => {
                    let len = g.runs[&start].len;
                    prop_assert!(block % align == 0 && block >= start && block + bytes <= start + len);
                    if let Some(sure) = smallest_sure {
                        prop_assert!(len <= sure);
                    }
                }
                None => prop_assert!(!any),
            }
        }
    }

    #[test]
    fn find_block_skips_many_misaligned_ranges_for_a_sure_one() {
        let mut g = Global::default();
        // 10,000 ranges of 2 units, each starting one unit past a 1 KiB boundary: none holds
        // 2 units at 1 KiB alignment. One larger range surely does.
        for i in 0..10_000 {
            g.insert(
                (1 << 20) + i * 4096 + GRAN,
                Run {
                    len: 2 * GRAN,
                    chunk: 0,
                    tags: Tags::NONE,
                },
            );
        }
        let big = 1 << 30;
        g.insert(
            big + GRAN,
            Run {
                len: 8 * GRAN,
                chunk: 0,
                tags: Tags::NONE,
            },
        );
        assert_eq!(g.find_block(2 * GRAN, 1024), Some((big + GRAN, big + 1024)));
        assert_eq!(g.find_block(9 * GRAN, 1024), None);
    }
}
