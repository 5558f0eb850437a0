//! `Local`: a per-thread or per-stream arena, and how it trades superblocks with the global arena.

use super::global::Spare;
use super::max_tree::MaxTree;
use super::superblock::Superblock;
use super::tags::Tags;
use super::{lock, to_ptr, Arena, GRAN, MAX_ARENAS};
use crate::resource::{AllocError, MemoryResource};
use crate::stream::{Held, StreamRef};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Superblocks a local arena takes from the global arena at once, when it has them whole.
const TAKE: usize = 4;
/// Empty superblocks a local arena holds before giving back all but [`KEEP`]: superblocks move
/// between arenas in batches, so that the global lock is taken once per few of them.
const HOLD: usize = 2 * TAKE;
const KEEP: usize = TAKE;

/// A local arena: one per thread (default stream) or per stream.
#[repr(align(64))] // its lock is the hot one: keep it off other arenas' cache lines
#[derive(Debug)]
pub(super) struct Local {
    /// The arena's stream, kept alive by the arena's keeper (so valid while the arena lives).
    pub(super) stream: StreamRef<'static>,
    pub(super) held: Held,
    state: Mutex<LocalState>,
}

impl Local {
    fn lock(&self) -> MutexGuard<'_, LocalState> {
        lock(&self.state)
    }

    /// Free bytes and free blocks in this arena's superblocks.
    pub(super) fn free(&self) -> (usize, usize) {
        let st = self.lock();
        st.sbs.iter().flatten().fold((0, 0), |(bytes, blocks), sb| {
            (
                bytes + sb.free_units as usize * GRAN,
                blocks + sb.free.len(),
            )
        })
    }
}

/// The superblocks of a local arena, behind its lock.
#[derive(Debug, Default)]
struct LocalState {
    /// Per window id: the largest free block of this arena's superblock there (0: none).
    tree: MaxTree,
    /// Per window id: the slot in `sbs` of this arena's superblock there.
    slot_of: Vec<u32>,
    sbs: Vec<Option<Superblock>>,
    vacant: Vec<u32>,
    /// The slots of the superblocks that are wholly free.
    empties: Vec<u32>,
}

impl LocalState {
    fn insert(&mut self, sb: Superblock, units: u32) -> u32 {
        let w = sb.window as usize;
        let slot = match self.vacant.pop() {
            Some(s) => {
                self.sbs[s as usize] = Some(sb);
                s
            }
            None => {
                self.sbs.push(Some(sb));
                (self.sbs.len() - 1) as u32
            }
        };
        self.tree.ensure(w);
        if self.slot_of.len() <= w {
            self.slot_of.resize(self.tree.leaves(), u32::MAX);
        }
        self.slot_of[w] = slot;
        self.tree.set(w, units);
        self.empties.push(slot);
        slot
    }

    fn remove(&mut self, slot: u32) -> Superblock {
        let sb = self.sbs[slot as usize]
            .take()
            .expect("Arena: removing a superblock that exists");
        self.tree.set(sb.window as usize, 0);
        self.vacant.push(slot);
        sb
    }

    /// Address-ordered first fit: the first superblock whose largest free block surely holds
    /// the request, then its first free block that does.
    fn allocate(&mut self, bytes: usize, align: usize, units: u32) -> Option<usize> {
        let n = (bytes / GRAN) as u32;
        let need = n + (align / GRAN) as u32 - 1;
        let w = self.tree.first_at_least(need)?;
        let sb = self.sbs[self.slot_of[w] as usize].as_mut()?;
        let was_empty = sb.free_units == units;
        let off = sb.take(n, align)?;
        let max = sb.max_free();
        let addr = sb.base + off as usize * GRAN;
        if was_empty {
            let slot = self.slot_of[w];
            self.empties.retain(|&s| s != slot);
        }
        self.tree.set(w, max);
        Some(addr)
    }

    /// Frees a block; returns the empty superblocks to give back when there are too many.
    fn deallocate(&mut self, slot: u32, addr: usize, n: u32, units: u32) -> Vec<Superblock> {
        let sb = self.sbs[slot as usize]
            .as_mut()
            .expect("Arena: the window table names a live superblock");
        sb.give(((addr - sb.base) / GRAN) as u32, n);
        let (w, max, empty) = (sb.window as usize, sb.max_free(), sb.free_units == units);
        self.tree.set(w, max);
        if !empty {
            return Vec::new();
        }
        self.empties.push(slot);
        if self.empties.len() <= HOLD {
            return Vec::new();
        }
        self.take_empty(KEEP)
    }

    /// Removes the empty superblocks but the `keep` lowest: first fit packs blocks low, so the
    /// high ones are the least likely to be wanted again.
    fn take_empty(&mut self, keep: usize) -> Vec<Superblock> {
        let sbs = &self.sbs;
        let base = |s: &u32| sbs[*s as usize].as_ref().map_or(0, |sb| sb.base);
        self.empties.sort_unstable_by_key(base);
        let gone: Vec<u32> = self.empties.drain(keep.min(self.empties.len())..).collect();
        gone.into_iter().map(|s| self.remove(s)).collect()
    }
}

impl<U: MemoryResource> Arena<U> {
    fn units_per_superblock(&self) -> u32 {
        (self.superblock_size() / GRAN) as u32
    }

    /// Local arena `id`, as a window table or a thread's storage names it.
    pub(super) fn local(&self, id: u32) -> &Local {
        self.arenas[id as usize]
            .get()
            .expect("Arena: an arena id in the window table names a created arena")
    }

    /// The arena of `stream`, created on first use; `None` when there are too many arenas.
    pub(super) fn stream_arena(&self, stream: StreamRef) -> Option<u32> {
        if let Some(&id) = self
            .streams
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&stream.id())
        {
            return Some(id);
        }
        let mut map = self.streams.write().unwrap_or_else(|p| p.into_inner());
        if let Some(&id) = map.get(&stream.id()) {
            return Some(id);
        }
        let id = self.new_arena(stream)?;
        map.insert(stream.id(), id);
        Some(id)
    }

    /// A new local arena on `stream`; `None` when there are [`MAX_ARENAS`] already.
    pub(super) fn new_arena(&self, stream: StreamRef) -> Option<u32> {
        let _guard = lock(&self.create);
        let n = self.narenas.load(Ordering::Relaxed);
        if n == MAX_ARENAS {
            return None;
        }
        let held = self.hold(stream);
        let stream = self.stream_of(held);
        let _ = self.arenas[n].set(Box::new(Local {
            stream,
            held,
            state: Mutex::new(LocalState::default()),
        }));
        self.narenas.store(n + 1, Ordering::Release);
        Some(n as u32)
    }

    /// Gives empty superblocks of a local arena on `stream` back to the global arena.
    fn release_superblocks(&self, stream: Held, sbs: Vec<Superblock>) {
        if sbs.is_empty() {
            return;
        }
        for sb in &sbs {
            if let Some(m) = self.chunks[sb.chunk as usize]
                .get()
                .and_then(|c| c.meta_at(sb.base, self.sb_shift))
            {
                m.store(0, Ordering::Release);
            }
        }
        let mut g = lock(&self.global);
        g.spare.extend(sbs.iter().map(|sb| Spare {
            at: sb.base,
            chunk: sb.chunk,
            tags: Tags::one(stream),
        }));
    }

    /// Asks every local arena to give back its empty superblocks.
    pub(super) fn reclaim(&self) {
        let n = self.narenas.load(Ordering::Acquire);
        for local in self.arenas[..n].iter().filter_map(OnceLock::get) {
            let freed = local.lock().take_empty(0);
            self.release_superblocks(local.held, freed);
        }
    }

    /// Moves superblocks (up to [`TAKE`] when the global arena has them whole) from the global
    /// arena into local arena `id`; `Ok(false)` when there is none to be had.
    fn acquire_superblock(
        &self,
        id: u32,
        local: &Local,
        st: &mut LocalState,
    ) -> Result<bool, AllocError> {
        let sb = self.superblock_size();
        let mut taken: Vec<Spare> = Vec::with_capacity(TAKE);
        {
            let mut g = lock(&self.global);
            loop {
                let from = g.spare.len().saturating_sub(TAKE);
                taken.extend(g.spare.drain(from..));
                if !taken.is_empty() {
                    break;
                }
                if let Some((start, at)) = g.find_window(sb) {
                    let room = (start + g.runs[&start].len - at) / sb;
                    let n = room.min(TAKE);
                    let run = g.carve(start, at, n * sb);
                    taken.extend((0..n).map(|i| Spare {
                        at: at + i * sb,
                        chunk: run.chunk,
                        tags: run.tags,
                    }));
                    break;
                }
                match self.grow(&mut g, sb) {
                    Ok(()) => {}
                    Err(e) if e.is_out_of_memory() => return Ok(false),
                    Err(e) => return Err(e),
                }
            }
        }
        let mut tags = Tags::NONE;
        let mut sync = Vec::new();
        for sp in &taken {
            tags.absorb(&sp.tags, &mut sync);
        }
        let ordered = sync
            .into_iter()
            .try_for_each(|s| self.upstream.synchronize(self.stream_of(s)))
            .and_then(|()| self.order(local.stream, &tags));
        if let Err(e) = ordered {
            lock(&self.global).spare.extend(taken);
            return Err(e);
        }
        let units = self.units_per_superblock();
        for sp in taken {
            let chunk = self.chunks[sp.chunk as usize]
                .get()
                .expect("Arena: a free range names a registered chunk");
            let index = (sp.at - chunk.win_base) >> self.sb_shift;
            let slot = st.insert(
                Superblock {
                    base: sp.at,
                    window: chunk.first_window + index as u32,
                    chunk: sp.chunk,
                    free_units: units,
                    free: vec![(0, units)],
                },
                units,
            );
            chunk.meta[index].store(
                (u64::from(id) + 1) << 32 | u64::from(slot),
                Ordering::Release,
            );
        }
        Ok(true)
    }

    /// Serves a small request from local arena `id`; `Ok(None)` when it finds no room even after
    /// reclaiming, and the caller falls back on the global arena.
    pub(super) fn local_allocate(
        &self,
        id: u32,
        bytes: usize,
        align: usize,
    ) -> Result<Option<NonNull<u8>>, AllocError> {
        let local = self.local(id);
        let units = self.units_per_superblock();
        let mut reclaimed = false;
        loop {
            {
                let mut st = local.lock();
                if let Some(addr) = st.allocate(bytes, align, units) {
                    return Ok(Some(to_ptr(addr)));
                }
                if self.acquire_superblock(id, local, &mut st)? {
                    if let Some(addr) = st.allocate(bytes, align, units) {
                        return Ok(Some(to_ptr(addr)));
                    }
                }
            }
            // Our own lock is released: reclaiming takes every arena's lock in turn.
            if reclaimed {
                return Ok(None);
            }
            self.reclaim();
            reclaimed = true;
        }
    }

    /// Frees a block of local arena `id`'s superblock `slot`, and gives back superblocks when the
    /// arena holds too many empty ones.
    pub(super) fn local_deallocate(
        &self,
        id: u32,
        slot: u32,
        addr: usize,
        bytes: usize,
        stream: StreamRef,
    ) {
        let local = self.local(id);
        let units = self.units_per_superblock();
        let released = {
            let mut st = local.lock();
            // Before the block can be reused on the arena's stream, that stream must wait for
            // the work that used it on `stream`.
            self.order_or_wait(local.stream, stream);
            st.deallocate(slot, addr, (bytes / GRAN) as u32, units)
        };
        self.release_superblocks(local.held, released);
    }
}
