//! `Local`: a per-thread or per-stream arena, and how it trades superblocks with the global arena.

use super::global::Spare;
use super::max_tree::MaxTree;
use super::owners::Owner;
use super::superblock::Superblock;
use super::tags::Tags;
use super::{lock, to_ptr, Arena, GRAN, IDLE_STREAM_ARENAS, MAX_ARENAS};
use crate::resource::{AllocError, MemoryResource};
use crate::stream::{Held, StreamRef};
use std::collections::BTreeSet;
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
    /// A stream's arena (not a thread's): when wholly free it joins the arena's idle list.
    for_stream: bool,
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

    /// Superblocks this arena holds.
    pub(super) fn superblocks(&self) -> usize {
        self.lock().held()
    }

    /// Host bytes of this arena's metadata (an estimate of its tables).
    pub(super) fn bytes(&self) -> usize {
        let st = self.lock();
        let sbs: usize = st
            .sbs
            .iter()
            .flatten()
            .map(|sb| sb.free.capacity() * std::mem::size_of::<(u32, u32)>())
            .sum();
        std::mem::size_of::<Local>()
            + sbs
            + st.sbs.capacity() * std::mem::size_of::<Option<Superblock>>()
            + st.tree.bytes()
            // A B-tree set of u32: about 8 bytes per entry with its nodes.
            + st.vacant.len() * 8
            + st.empties.capacity() * 4
    }
}

/// The superblocks of a local arena, behind its lock, in slots numbered from 0: every table
/// here is proportional to the superblocks the arena holds (at most twice its peak), whatever the
/// size of the whole arena.
#[derive(Debug, Default)]
struct LocalState {
    /// Per slot: the largest free block of the superblock there (0: none, or a vacant slot).
    tree: MaxTree,
    sbs: Vec<Option<Superblock>>,
    /// The vacant slots below `sbs.len()`, lowest reused first so that the slots stay dense.
    vacant: BTreeSet<u32>,
    /// The slots of the superblocks that are wholly free.
    empties: Vec<u32>,
    /// In the arena's list of idle stream arenas.
    idle: bool,
}

impl LocalState {
    /// Superblocks held.
    fn held(&self) -> usize {
        self.sbs.len() - self.vacant.len()
    }

    /// Holds superblocks, all of them wholly free.
    fn wholly_free(&self) -> bool {
        self.held() > 0 && self.empties.len() == self.held()
    }

    fn insert(&mut self, sb: Superblock, units: u32) -> u32 {
        let slot = match self.vacant.pop_first() {
            Some(s) => {
                self.sbs[s as usize] = Some(sb);
                s
            }
            None => {
                self.sbs.push(Some(sb));
                (self.sbs.len() - 1) as u32
            }
        };
        self.tree.ensure(slot as usize);
        self.tree.set(slot as usize, units);
        self.empties.push(slot);
        slot
    }

    fn remove(&mut self, slot: u32) -> Superblock {
        let sb = self.sbs[slot as usize]
            .take()
            .expect("Arena: removing a superblock that exists");
        self.tree.set(slot as usize, 0);
        self.vacant.insert(slot);
        // Vacant slots at the end go, and the tables shrink with them.
        while self
            .vacant
            .last()
            .is_some_and(|&v| v as usize + 1 == self.sbs.len())
        {
            self.vacant.pop_last();
            self.sbs.pop();
        }
        if self.sbs.len() * 4 < self.sbs.capacity() {
            self.sbs.shrink_to(self.sbs.len() * 2);
        }
        self.tree.shrink(self.sbs.len());
        sb
    }

    /// First fit: the lowest slot whose superblock's largest free block surely holds the
    /// request, then that superblock's first free block that does.
    fn allocate(&mut self, bytes: usize, align: usize, units: u32) -> Option<usize> {
        let n = (bytes / GRAN) as u32;
        let need = n + (align / GRAN) as u32 - 1;
        let w = self.tree.first_at_least(need)?;
        let sb = self.sbs.get_mut(w)?.as_mut()?;
        let was_empty = sb.free_units == units;
        let off = sb.take(n, align)?;
        let max = sb.max_free();
        let addr = sb.base + off as usize * GRAN;
        if was_empty {
            self.empties.retain(|&s| s as usize != w);
        }
        self.tree.set(w, max);
        Some(addr)
    }

    /// Frees a block; returns the empty superblocks to give back when there are too many.
    fn deallocate(&mut self, slot: u32, addr: usize, n: u32, units: u32) -> Vec<Superblock> {
        let sb = self.sbs[slot as usize]
            .as_mut()
            .expect("Arena: the owner map names a live superblock");
        sb.give(((addr - sb.base) / GRAN) as u32, n);
        let (max, empty) = (sb.max_free(), sb.free_units == units);
        self.tree.set(slot as usize, max);
        if !empty {
            return Vec::new();
        }
        self.empties.push(slot);
        if self.empties.len() <= HOLD {
            return Vec::new();
        }
        self.take_empty(KEEP)
    }

    /// Removes the empty superblocks but the `keep` in the lowest slots: first fit packs blocks
    /// into low slots, so the high ones are the least likely to be wanted again (and their slots
    /// go).
    fn take_empty(&mut self, keep: usize) -> Vec<Superblock> {
        self.empties.sort_unstable();
        let gone: Vec<u32> = self.empties.drain(keep.min(self.empties.len())..).collect();
        gone.into_iter().map(|s| self.remove(s)).collect()
    }
}

impl<U: MemoryResource> Arena<U> {
    fn units_per_superblock(&self) -> u32 {
        (self.superblock_size() / GRAN) as u32
    }

    /// Local arena `id`, as the owner map or a thread's storage names it.
    pub(super) fn local(&self, id: u32) -> &Local {
        self.arenas[id as usize]
            .get()
            .expect("Arena: an arena id in the owner map names a created arena")
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
        let id = self.new_arena(stream, true)?;
        map.insert(stream.id(), id);
        Some(id)
    }

    /// A new local arena on `stream` (a stream's arena if `for_stream`, else a thread's); `None`
    /// when there are [`MAX_ARENAS`] already.
    pub(super) fn new_arena(&self, stream: StreamRef, for_stream: bool) -> Option<u32> {
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
            for_stream,
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
            self.owners.remove(sb.base >> self.sb_shift);
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
                if g.spare.len() * 4 < g.spare.capacity() {
                    let len = g.spare.len();
                    g.spare.shrink_to(len * 2);
                }
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
            let slot = st.insert(
                Superblock {
                    base: sp.at,
                    chunk: sp.chunk,
                    free_units: units,
                    free: vec![(0, units)],
                },
                units,
            );
            self.owners
                .set(sp.at >> self.sb_shift, Owner { arena: id, slot });
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
        let (released, idle) = {
            let mut st = local.lock();
            // Before the block can be reused on the arena's stream, that stream must wait for
            // the work that used it on `stream`.
            self.order_or_wait(local.stream, stream);
            let released = st.deallocate(slot, addr, (bytes / GRAN) as u32, units);
            let idle = local.for_stream && !st.idle && st.wholly_free();
            st.idle |= idle;
            (released, idle)
        };
        self.release_superblocks(local.held, released);
        if idle {
            self.went_idle(id);
        }
    }

    /// Stream arena `id` holds only free superblocks: it joins the idle list, and the arena that
    /// went idle longest ago, past [`IDLE_STREAM_ARENAS`], gives back every superblock it still
    /// holds free. So many streams that each allocate now and then hold a bounded number of
    /// superblocks between them, at O(1) cost per operation.
    fn went_idle(&self, id: u32) {
        let evicted = {
            let mut idle = lock(&self.idle);
            idle.push_back(id);
            if idle.len() > IDLE_STREAM_ARENAS {
                idle.pop_front()
            } else {
                None
            }
        };
        let Some(old) = evicted else { return };
        let local = self.local(old);
        let freed = {
            let mut st = local.lock();
            st.idle = false;
            // An arena used again since it went idle keeps what it holds; it rejoins the list
            // when it is wholly free again.
            if st.wholly_free() {
                st.take_empty(0)
            } else {
                Vec::new()
            }
        };
        self.release_superblocks(local.held, freed);
    }
}
