//! `Global`: the global arena's free ranges and spare superblocks, and the path of large requests.

use super::tags::Tags;
use super::{lock, to_ptr, Arena, GRAN, NAME};
use crate::resource::{align_up, AllocError, MemoryResource};
use crate::stream::{Held, StreamRef};
use std::collections::{BTreeMap, BTreeSet};
use std::ptr::NonNull;

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
    /// Window ids given out so far: the next chunk's windows start here.
    pub(super) windows: u32,
}

/// A free superblock-sized window of the global arena.
#[derive(Debug, Clone, Copy)]
pub(super) struct Spare {
    pub(super) at: usize,
    pub(super) chunk: u32,
    pub(super) tags: Tags,
}

impl Global {
    /// Free bytes and free ranges, spare superblocks (of `superblock` bytes) included.
    pub(super) fn free(&self, superblock: usize) -> (usize, usize) {
        let runs: usize = self.runs.values().map(|r| r.len).sum();
        (
            runs + self.spare.len() * superblock,
            self.runs.len() + self.spare.len(),
        )
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

    /// The smallest free range (lowest address among equals) that holds `bytes` at `align`:
    /// (range start, block address).
    fn find_block(&self, bytes: usize, align: usize) -> Option<(usize, usize)> {
        self.by_size.range((bytes, 0)..).find_map(|&(len, start)| {
            let at = align_up(start, align)?;
            (at + bytes <= start + len).then_some((start, at))
        })
    }

    /// The smallest free range that holds a whole aligned window of `sb` bytes.
    pub(super) fn find_window(&self, sb: usize) -> Option<(usize, usize)> {
        self.find_block(sb, sb)
    }

    /// Takes `[at, at + len)` out of the free range at `start`; returns that range's chunk and tags.
    pub(super) fn carve(&mut self, start: usize, at: usize, len: usize) -> Run {
        let run = self.remove(start);
        if at > start {
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
            self.insert(
                end,
                Run {
                    len: run_end - end,
                    ..run
                },
            );
        }
        run
    }

    /// Frees `[start, start + len)`, coalescing with its neighbours in the same chunk. Returns
    /// the streams to synchronize (before unlocking) when the merged range's tags overflowed.
    #[must_use]
    fn give(&mut self, start: usize, len: usize, chunk: u32, tags: Tags) -> Vec<Held> {
        let mut sync = Vec::new();
        let (mut start, mut len, mut tags) = (start, len, tags);
        if let Some((&ps, prev)) = self.runs.range(..start).next_back() {
            debug_assert!(ps + prev.len <= start, "Arena: double free of {start:#x}");
            if ps + prev.len == start && prev.chunk == chunk {
                let prev = self.remove(ps);
                tags.absorb(&prev.tags, &mut sync);
                start = ps;
                len += prev.len;
            }
        }
        if let Some(next) = self.runs.get(&(start + len)) {
            if next.chunk == chunk {
                let next = self.remove(start + len);
                tags.absorb(&next.tags, &mut sync);
                len += next.len;
            }
        }
        self.insert(start, Run { len, chunk, tags });
        sync
    }
}

impl<U: MemoryResource> Arena<U> {
    /// Returns a range to the global arena.
    pub(super) fn give_back(&self, start: usize, len: usize, chunk: u32, tags: Tags) {
        let mut g = lock(&self.global);
        for s in g.give(start, len, chunk, tags) {
            // The merged range forgot these streams; wait for them before anyone can take it.
            let _ = self.upstream.synchronize(self.stream_of(s));
        }
    }

    /// Merges the spare superblocks into the free ranges, for a request they may make room for.
    fn flush_spare(&self, g: &mut Global) {
        for sp in std::mem::take(&mut g.spare) {
            for s in g.give(sp.at, self.superblock_size(), sp.chunk, sp.tags) {
                let _ = self.upstream.synchronize(self.stream_of(s));
            }
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
                let run = g.carve(start, at, bytes);
                drop(g);
                if let Err(e) = self.order(stream, &run.tags) {
                    self.give_back(at, bytes, run.chunk, run.tags);
                    return Err(e);
                }
                return Ok(to_ptr(at));
            }
            if !g.spare.is_empty() {
                self.flush_spare(&mut g);
                continue;
            }
            match self.grow(&mut g, bytes + (align - GRAN)) {
                Ok(()) => continue,
                Err(e) if !e.is_out_of_memory() => return Err(e),
                Err(_) => {}
            }
            drop(g);
            if reclaimed {
                return Err(AllocError::out_of_memory(bytes, align, NAME));
            }
            self.reclaim();
            reclaimed = true;
        }
    }
}
