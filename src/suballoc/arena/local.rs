//! `Local`: a per-thread or per-stream arena, and how it trades superblocks with the global arena.

use super::global::Spare;
use super::max_tree::MaxTree;
use super::owners::Owner;
use super::superblock::Superblock;
use super::tags::Tags;
use super::{lock, to_ptr, Arena, GRAN, IDLE_STREAM_ARENAS, MAX_ARENAS};
use crate::resource::{AllocError, MemoryResource, Undo};
use crate::stream::{Held, StreamId, StreamRef};
use std::collections::{BTreeSet, HashMap};
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

    /// The arena's stream, in the arena's keeper.
    pub(super) fn stream(&self) -> Held {
        self.lock().held
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
    /// The arena's stream, held in the arena's keeper while it is this arena's: valid while this
    /// lock is held. A stream arena evicted from the idle list may pass to a new stream
    /// ([`Arena::reuse_arena`]), so the stream is read and used under the lock only.
    stream: StreamRef<'static>,
    held: Held,
    /// In the arena's list of evicted stream arenas that a new stream may take.
    evicted: bool,
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
    /// request, then that superblock's first free block that does: (address, slot).
    fn allocate(&mut self, bytes: usize, align: usize, units: u32) -> Option<(usize, u32)> {
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
        Some((addr, w as u32))
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

/// What [`Arena::acquire_superblock`] did.
enum Acquired {
    /// Superblocks went to the local arena.
    Yes,
    /// The global arena has none to give: it must grow first (with no lock held).
    Grow,
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
        let id = match self.new_arena(stream, true) {
            Some(id) => id,
            None => self.reuse_arena(stream, &mut map)?,
        };
        map.insert(stream.id(), id);
        Some(id)
    }

    /// Gives a stream arena that was evicted from the idle list (so holds no superblock) to
    /// `stream`, when all [`MAX_ARENAS`] exist: so a process that goes through many streams keeps
    /// serving each from its own arena. An evicted arena used again by its stream since stays
    /// its stream's. A thread that still has the arena's old stream cached may keep using the
    /// arena; it is then a foreign stream to it, and is ordered like one.
    fn reuse_arena(&self, stream: StreamRef, map: &mut HashMap<StreamId, u32>) -> Option<u32> {
        loop {
            let id = lock(&self.evicted).pop()?;
            let mut st = self.local(id).lock();
            st.evicted = false;
            if st.held() > 0 || st.idle {
                continue;
            }
            let old = st.held;
            map.remove(&lock(&self.keeper).id(old));
            st.held = self.hold(stream);
            st.stream = self.stream_of(st.held);
            // Nothing of the arena names the old stream any more (it holds no superblock).
            self.release([old]);
            return Some(id);
        }
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
            for_stream,
            state: Mutex::new(LocalState {
                stream,
                held,
                ..LocalState::default()
            }),
        }));
        self.narenas.store(n + 1, Ordering::Release);
        Some(n as u32)
    }

    /// Gives empty superblocks of the local arena `st` back to the global arena, each tagged
    /// with the arena's stream (held once per superblock). Called under the arena's lock, which
    /// keeps its stream its own.
    fn release_superblocks(&self, st: &LocalState, sbs: Vec<Superblock>) {
        if sbs.is_empty() {
            return;
        }
        for sb in &sbs {
            self.owners.remove(sb.base >> self.sb_shift);
        }
        let tags = Tags::one(st.held);
        self.retain(&tags, sbs.len());
        let mut g = lock(&self.global);
        g.spare.extend(sbs.iter().map(|sb| Spare {
            at: sb.base,
            chunk: sb.chunk,
            tags,
        }));
    }

    /// Asks every local arena to give back its empty superblocks.
    pub(super) fn reclaim(&self) {
        let n = self.narenas.load(Ordering::Acquire);
        for local in self.arenas[..n].iter().filter_map(OnceLock::get) {
            let mut st = local.lock();
            let freed = st.take_empty(0);
            self.release_superblocks(&st, freed);
        }
    }

    /// Moves superblocks (up to [`TAKE`] when the global arena has them whole) from the global
    /// arena into local arena `id`; [`Acquired::Grow`] when the global arena has none to give.
    fn acquire_superblock(&self, id: u32, st: &mut LocalState) -> Result<Acquired, AllocError> {
        let sb = self.superblock_size();
        let mut taken: Vec<Spare> = Vec::with_capacity(TAKE);
        {
            let mut g = lock(&self.global);
            let from = g.spare.len().saturating_sub(TAKE);
            taken.extend(g.spare.drain(from..));
            if g.spare.len() * 4 < g.spare.capacity() {
                let len = g.spare.len();
                g.spare.shrink_to(len * 2);
            }
            if taken.is_empty() {
                // Growing is the caller's, with no lock held (see `grow`).
                let Some((start, at)) = g.find_window(sb) else {
                    return Ok(Acquired::Grow);
                };
                let room = (start + g.runs[&start].len - at) / sb;
                let n = room.min(TAKE);
                let (run, pieces) = g.carve(start, at, n * sb);
                // One copy of the range's tags per superblock and per piece left free.
                self.retain(&run.tags, n - 1 + pieces);
                taken.extend((0..n).map(|i| Spare {
                    at: at + i * sb,
                    chunk: run.chunk,
                    tags: run.tags,
                }));
            }
        }
        let mut tags = Tags::NONE;
        let (mut sync, mut dup) = (Vec::new(), Vec::new());
        for sp in &taken {
            tags.absorb(&sp.tags, &mut sync, &mut dup);
        }
        // Every hold stays with `taken` until the superblocks are ordered: on failure they go
        // back to the spare list as they were, and so they do when the upstream panics (lost, they
        // would take every chunk with them at the drop).
        let put_back = Undo(|| lock(&self.global).spare.extend(taken.iter().copied()));
        sync.into_iter()
            .try_for_each(|s| self.upstream.synchronize(self.stream_of(s)))
            .and_then(|()| self.order(st.stream, &tags))?;
        std::mem::forget(put_back);
        self.release(taken.iter().flat_map(|sp| sp.tags.iter()));
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
        Ok(Acquired::Yes)
    }

    /// Serves a small request on `stream` from local arena `id`; `Ok(None)` when it finds no
    /// room even after reclaiming, and the caller falls back on the global arena.
    pub(super) fn local_allocate(
        &self,
        id: u32,
        bytes: usize,
        align: usize,
        stream: StreamRef,
    ) -> Result<Option<NonNull<u8>>, AllocError> {
        let local = self.local(id);
        let units = self.units_per_superblock();
        let mut reclaimed = false;
        loop {
            let mut grow = false;
            {
                let mut st = local.lock();
                let mut found = st.allocate(bytes, align, units);
                if found.is_none() {
                    match self.acquire_superblock(id, &mut st)? {
                        Acquired::Yes => found = st.allocate(bytes, align, units),
                        Acquired::Grow => grow = true,
                    }
                }
                if let Some((addr, slot)) = found {
                    self.order_block(&mut st, addr, slot, bytes, stream)?;
                    return Ok(Some(to_ptr(addr)));
                }
            }
            // Our own lock is released: the upstream may run code that frees into this arena,
            // and reclaiming takes every arena's lock in turn.
            if grow {
                match self.grow(self.superblock_size()) {
                    Ok(()) => continue,
                    Err(e) if !e.is_out_of_memory() => return Err(e),
                    Err(_) => {}
                }
            }
            if reclaimed {
                return Ok(None);
            }
            self.reclaim();
            reclaimed = true;
        }
    }

    /// A local arena's blocks are ordered on its stream. Thread arenas serve every default stream
    /// (`DEFAULT`, and each context's), which may be distinct streams, and a stream arena may
    /// serve a thread that cached it for its stream before it passed to another: order the
    /// caller's stream after the arena's (nothing to do where they are one stream). Under the
    /// arena's lock, which keeps its stream valid. On failure the block goes back.
    fn order_block(
        &self,
        st: &mut LocalState,
        addr: usize,
        slot: u32,
        bytes: usize,
        stream: StreamRef,
    ) -> Result<(), AllocError> {
        if st.stream.id() == stream.id() {
            return Ok(());
        }
        let after = st.stream;
        // The block goes back when the ordering fails, and when the upstream panics.
        let units = self.units_per_superblock();
        let give_back = Undo(|| {
            let freed = st.deallocate(slot, addr, (bytes / GRAN) as u32, units);
            self.release_superblocks(st, freed);
        });
        self.upstream.order_after(stream, after)?;
        std::mem::forget(give_back);
        Ok(())
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
        let idle = {
            let mut st = local.lock();
            // Before the block can be reused on the arena's stream, that stream must wait for
            // the work that used it on `stream`. Where it can neither be ordered nor waited for,
            // the block is leaked rather than reused under that work (it stays counted as
            // allocated, so the arena's drop leaks its chunks too).
            if !self.order_or_wait(st.stream, stream) {
                return;
            }
            let released = st.deallocate(slot, addr, (bytes / GRAN) as u32, units);
            self.release_superblocks(&st, released);
            let idle = local.for_stream && !st.idle && st.wholly_free();
            st.idle |= idle;
            idle
        };
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
        let mut st = self.local(old).lock();
        st.idle = false;
        // An arena used again since it went idle keeps what it holds; it rejoins the list
        // when it is wholly free again.
        if st.wholly_free() {
            let freed = st.take_empty(0);
            self.release_superblocks(&st, freed);
            if !st.evicted {
                st.evicted = true;
                lock(&self.evicted).push(old);
            }
        }
    }
}
