//! `Arena<U>`: RMM's arena suballocator made to scale with threads: per-thread and per-stream
//! arenas take superblocks from a global arena and serve small requests from them; the global
//! arena serves large ones.
//!
//! Cost: a small request takes only its own arena's lock (found in thread-local storage), an
//! O(log n) walk down a max-tree and a first-fit scan inside one superblock; a large one takes the
//! global lock for an O(log n) best fit. Upstream: any resource, asked for superblock-aligned memory
//! (256-byte or natural alignment where it refuses), all of it given back on drop. Streams: the
//! arena keeps alive the streams of its stream arenas and of the tags on its free ranges until it
//! is dropped, so that reuse is ordered after a stream even once its owner dropped it. The whole
//! story is on [`Arena`].

use crate::resource::{align_up, check_request, AllocError, AllocErrorKind, Layer, MemoryResource};
use crate::stream::{Held, StreamId, StreamKeeper, StreamRef};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, Weak};
use typenum::U256;

const NAME: &str = "Arena";
/// Every block is a multiple of this and aligned to it.
const GRAN: usize = 256;
/// The most upstream allocations the arena holds (one unless the upstream refused the whole size).
const MAX_CHUNKS: usize = 64;
/// The most local arenas; beyond, requests go to the global arena.
const MAX_ARENAS: usize = 1024;
/// Superblocks a local arena takes from the global arena at once, when it has them whole.
const TAKE: usize = 4;
/// Empty superblocks a local arena holds before giving back all but [`KEEP`]: superblocks move
/// between arenas in batches, so that the global lock is taken once per few of them.
const HOLD: usize = 2 * TAKE;
const KEEP: usize = TAKE;
/// Streams a free range of the global arena remembers before synchronizing them.
const TAGS: usize = 4;
const MIN_SUPERBLOCK: usize = 64 << 10;
const MAX_SUPERBLOCK: usize = 1 << 30;

/// Configuration of an [`Arena`]; `resource_stack!` names it `Arena`.
#[derive(Debug, Clone)]
pub struct ArenaConfig {
    /// The most bytes the arena takes from its upstream, rounded down to 256. Default: 1 GiB.
    ///
    /// RMM's arena takes half the free device memory by default; an adaptor generic over its
    /// upstream cannot ask a device, so set this for real workloads. The arena reserves it in one
    /// upstream allocation on first use; if the upstream refuses, it takes smaller pieces on demand.
    pub size: usize,
    /// Bytes per superblock, rounded up to a power of two in [64 KiB, 1 GiB]. Default: 4 MiB.
    /// Requests up to a quarter of it are served by local arenas, larger ones by the global arena.
    pub superblock: usize,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        ArenaConfig {
            size: 1 << 30,
            superblock: 4 << 20,
        }
    }
}

impl<U: MemoryResource> Layer<U> for ArenaConfig {
    type Resource = Arena<U>;
    fn layer(self, upstream: U) -> Arena<U> {
        Arena::new(upstream, self)
    }
}

/// A global arena of memory from `U` with per-thread and per-stream arenas over it.
///
/// The arena takes up to [`ArenaConfig::size`] bytes from its upstream (all at once, on the first
/// allocation that needs memory) and splits them between a *global arena* and *local arenas*:
///
/// * one local arena per thread for work on the default stream, and one per stream for other
///   streams. A local arena takes *superblocks* (chunks of [`ArenaConfig::superblock`] bytes,
///   aligned to their size) from the global arena and serves requests up to a quarter of a
///   superblock from them by address-ordered first fit, coalescing what is freed. Superblocks that
///   become wholly free go back to the global arena. They move in batches (a local arena takes up
///   to 4 at once, holds up to 8 empty ones, then gives back all but the 4 lowest), so that a
///   thread takes the global lock once per few superblocks, not on every exchange;
/// * the global arena serves larger requests itself, by best fit at 256-byte granularity with
///   coalescing, and hands out superblocks. Superblocks given back stay whole in a spare list for
///   the next local arena that needs one; they merge into the free ranges when a large request
///   finds no room.
///
/// When a request cannot be met, the arena grows (up to `size`), then asks every local arena to
/// give back its empty superblocks, then serves a small request from the global arena directly,
/// and only then fails with [`AllocErrorKind::OutOfMemory`]. A thread's arena outlives the thread:
/// what it allocated may be freed later from anywhere, and the next new thread adopts the arena.
///
/// # Cost
///
/// A small request on the default stream finds the thread's arena in thread-local storage and
/// takes that arena's own lock, which other threads take only to free memory this thread
/// allocated: no global lock, no shared counter. The first superblock that fits is found by a walk
/// down a 16-ary max-tree over superblock-sized windows (O(log n), three steps for 4096 windows);
/// inside the superblock, first fit scans its free blocks. A deallocation finds the owner of its
/// pointer in a per-window table, without any lock but the owner's. Exchanging superblocks with
/// the global arena takes the global lock for a few pushes or pops; large requests take it for a
/// best fit over the free ranges (O(log n)). Up to 1024 local arenas (a thread that ends leaves
/// its arena to the next new thread; a stream keeps its arena); past that, requests go to the
/// global arena. Host memory: each local arena keeps 8 to 16 bytes per
/// superblock-sized window of the arena (at most 64 KiB for 16 GiB with 4 MiB superblocks).
///
/// # Streams
///
/// Memory freed on a stream is reused at once by that stream's arena. Memory that changes streams
/// is ordered with the upstream's [`order_after`](MemoryResource::order_after), without blocking
/// the host: a block freed on another stream than its arena's orders the arena's stream after the
/// freeing stream; memory returned to the global arena is tagged with the streams that freed it, and
/// whoever takes it next is ordered after them. (A free range that merges memory of more than four
/// streams synchronizes them instead.) Memory fresh from the upstream is synchronized once taken.
///
/// # Upstream
///
/// Any resource: the arena asks it for superblock-aligned memory and falls back to 256-byte or
/// natural alignment when the upstream refuses that alignment as unsupported. Every byte taken
/// goes back to the upstream when the arena is dropped, whatever is still allocated. The arena is
/// `Sync` (one arena for all threads) when `U` is.
///
/// ```
/// use mrstack::prelude::*;
///
/// # fn main() -> Result<(), AllocError> {
/// let gpu = Simulated::new(1 << 30);
/// let mr = resource_stack![&gpu, Arena { size: 256 MiB }];
/// let p = mr.allocate(1000, 256, StreamRef::DEFAULT)?;
/// assert_eq!(mr.arena_size(), 256 << 20); // reserved on first use
/// // SAFETY: p came from mr with this size and alignment.
/// unsafe { mr.deallocate(p, 1000, 256, StreamRef::DEFAULT) };
/// drop(mr);
/// assert_eq!(gpu.in_use(), 0);
/// # Ok(()) }
/// ```
pub struct Arena<U: MemoryResource> {
    upstream: U,
    max_size: usize,
    sb_shift: u32,
    global: Mutex<Global>,
    taken: AtomicUsize,
    chunks: Box<[OnceLock<Chunk>]>,
    nchunks: AtomicUsize,
    arenas: Box<[OnceLock<Box<Local>>]>,
    narenas: AtomicUsize,
    create: Mutex<()>,
    streams: RwLock<HashMap<StreamId, u32>>,
    registry: Arc<Registry>,
    /// Keeps alive every stream a `Held` of this arena names (its local arenas' and its free
    /// ranges' tags); declared last, so dropped after everything that names one.
    keeper: Mutex<StreamKeeper>,
}

impl<U: MemoryResource> Arena<U> {
    /// An arena over `upstream` that takes nothing from it until the first allocation.
    pub fn new(upstream: U, config: ArenaConfig) -> Self {
        let superblock = config
            .superblock
            .clamp(MIN_SUPERBLOCK, MAX_SUPERBLOCK)
            .next_power_of_two();
        Arena {
            upstream,
            // No allocation can exceed isize::MAX less its alignment (at most a superblock): a cap
            // above that ("no cap") is clamped, so the first reservation is a request the
            // upstream can refuse as out of memory, and the arena then halves it.
            max_size: config.size.min(isize::MAX as usize - MAX_SUPERBLOCK) & !(GRAN - 1),
            sb_shift: superblock.trailing_zeros(),
            global: Mutex::new(Global::default()),
            taken: AtomicUsize::new(0),
            chunks: (0..MAX_CHUNKS).map(|_| OnceLock::new()).collect(),
            nchunks: AtomicUsize::new(0),
            arenas: (0..MAX_ARENAS).map(|_| OnceLock::new()).collect(),
            narenas: AtomicUsize::new(0),
            create: Mutex::new(()),
            streams: RwLock::new(HashMap::new()),
            registry: Arc::new(Registry {
                id: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
                idle: Mutex::new(Vec::new()),
            }),
            keeper: Mutex::new(StreamKeeper::default()),
        }
    }

    /// An arena that reserves its whole size from `upstream` now, or the upstream's error.
    pub fn try_new(upstream: U, config: ArenaConfig) -> Result<Self, AllocError> {
        let arena = Self::new(upstream, config);
        if arena.max_size > 0 {
            let mut g = lock(&arena.global);
            arena.grow(&mut g, arena.max_size)?;
        }
        Ok(arena)
    }

    /// Bytes taken from the upstream so far (all of them go back when the arena is dropped).
    pub fn arena_size(&self) -> usize {
        self.taken.load(Ordering::Relaxed)
    }

    /// The most bytes the arena may take from the upstream: the configured size, rounded down.
    pub fn max_size(&self) -> usize {
        self.max_size
    }

    /// Bytes per superblock.
    pub fn superblock_size(&self) -> usize {
        1 << self.sb_shift
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    fn units_per_superblock(&self) -> u32 {
        (self.superblock_size() / GRAN) as u32
    }

    fn local(&self, id: u32) -> &Local {
        self.arenas[id as usize]
            .get()
            .expect("Arena: an arena id in the window table names a created arena")
    }

    fn chunk_of(&self, addr: usize) -> Option<(u32, &Chunk)> {
        let n = self.nchunks.load(Ordering::Acquire);
        self.chunks[..n]
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some((i as u32, c.get()?)))
            .find(|(_, c)| c.start <= addr && addr < c.end)
    }

    /// The local arena for `stream` as seen from this thread, created on first use; `None` when
    /// there is none to be had (thread-local storage torn down, or too many arenas).
    fn arena_for(&self, stream: StreamRef) -> Option<u32> {
        let me = self.registry.id;
        THREAD_ARENAS
            .try_with(|cell| {
                let mut list = cell.try_borrow_mut().ok()?;
                let i = match list.iter().position(|e| e.instance == me) {
                    Some(i) => i,
                    None => {
                        // Entries of dropped arenas are dead weight: drop them as new ones come.
                        list.retain(|e| e.registry.strong_count() > 0);
                        list.insert(0, TlsEntry::new(me, &self.registry));
                        0
                    }
                };
                let entry = &mut list[i];
                if stream.is_default() {
                    if entry.thread_arena.is_none() {
                        entry.thread_arena = self.thread_arena();
                    }
                    entry.thread_arena
                } else {
                    match entry.last_stream {
                        Some((s, id)) if s == stream.id() => Some(id),
                        _ => {
                            let id = self.stream_arena(stream)?;
                            entry.last_stream = Some((stream.id(), id));
                            Some(id)
                        }
                    }
                }
            })
            .ok()
            .flatten()
    }

    fn thread_arena(&self) -> Option<u32> {
        let idle = lock(&self.registry.idle).pop();
        idle.or_else(|| self.new_arena(StreamRef::DEFAULT))
    }

    fn stream_arena(&self, stream: StreamRef) -> Option<u32> {
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

    fn new_arena(&self, stream: StreamRef) -> Option<u32> {
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

    /// Takes a new piece of at least `need` bytes from the upstream: all that is left to take if
    /// the upstream agrees, else halves down to `need`.
    fn grow(&self, g: &mut Global, need: usize) -> Result<(), AllocError> {
        let remaining = self.max_size - self.taken.load(Ordering::Relaxed);
        let n = self.nchunks.load(Ordering::Relaxed);
        let oom = AllocError::out_of_memory(need, GRAN, NAME);
        if n == MAX_CHUNKS || need > remaining || need == 0 {
            return Err(oom);
        }
        let mut len = remaining;
        loop {
            match self.take_chunk(len) {
                Ok((ptr, align)) => {
                    self.add_chunk(g, n, ptr, len, align);
                    return Ok(());
                }
                Err(e) if e.is_out_of_memory() && len > need => {
                    len = ((len / 2) & !(GRAN - 1)).max(need);
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn take_chunk(&self, len: usize) -> Result<(usize, usize), AllocError> {
        let mut refused = None;
        for align in [self.superblock_size(), GRAN, 1] {
            // allocate_sync: fresh memory may then go to any stream without ordering.
            match self.upstream.allocate_sync(len, align) {
                Ok(p) => return Ok((p.as_ptr() as usize, align)),
                Err(e) if matches!(e.kind, AllocErrorKind::Unsupported(_)) => refused = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(refused.unwrap_or(AllocError::out_of_memory(len, GRAN, NAME)))
    }

    fn add_chunk(&self, g: &mut Global, index: usize, ptr: usize, len: usize, align: usize) {
        let start = (ptr + GRAN - 1) & !(GRAN - 1);
        let end = ((ptr + len) & !(GRAN - 1)).max(start);
        let win_base = (start + self.superblock_size() - 1) & !(self.superblock_size() - 1);
        let windows = end.saturating_sub(win_base) >> self.sb_shift;
        let chunk = Chunk {
            ptr,
            len,
            align,
            start,
            end,
            win_base,
            first_window: g.windows,
            meta: (0..windows).map(|_| AtomicU64::new(0)).collect(),
        };
        g.windows += windows as u32;
        let _ = self.chunks[index].set(chunk);
        self.nchunks.store(index + 1, Ordering::Release);
        self.taken.fetch_add(len, Ordering::Relaxed);
        if end > start {
            g.insert(
                start,
                Run {
                    len: end - start,
                    chunk: index as u32,
                    tags: Tags::NONE,
                },
            );
        }
    }

    /// Keeps `stream` alive as long as the arena, for a local arena or a free range's tags.
    fn hold(&self, stream: StreamRef) -> Held {
        lock(&self.keeper).hold(stream)
    }

    /// The stream `held` names, valid while the arena (its keeper) lives.
    fn stream_of(&self, held: Held) -> StreamRef<'static> {
        lock(&self.keeper).get(held)
    }

    /// Makes `stream` wait for the work of every stream in `tags`.
    fn order(&self, stream: StreamRef, tags: &Tags) -> Result<(), AllocError> {
        for after in tags
            .iter()
            .map(|h| self.stream_of(h))
            .filter(|&s| s != stream)
        {
            self.upstream
                .order_after(stream, after)
                .or_else(|_| self.upstream.synchronize(after))?;
        }
        Ok(())
    }

    /// As `order`, for paths that cannot return an error: failing to order, wait.
    fn order_or_wait(&self, stream: StreamRef, after: StreamRef) {
        if stream != after && self.upstream.order_after(stream, after).is_err() {
            // Nothing better to do: a failed synchronize stays recorded in the CUDA context.
            let _ = self.upstream.synchronize(after);
        }
    }

    /// Returns a range to the global arena.
    fn give_back(&self, start: usize, len: usize, chunk: u32, tags: Tags) {
        let mut g = lock(&self.global);
        for s in g.give(start, len, chunk, tags) {
            // The merged range forgot these streams; wait for them before anyone can take it.
            let _ = self.upstream.synchronize(self.stream_of(s));
        }
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

    /// Merges the spare superblocks into the free ranges, for a request they may make room for.
    fn flush_spare(&self, g: &mut Global) {
        for sp in std::mem::take(&mut g.spare) {
            for s in g.give(sp.at, self.superblock_size(), sp.chunk, sp.tags) {
                let _ = self.upstream.synchronize(self.stream_of(s));
            }
        }
    }

    /// Asks every local arena to give back its empty superblocks.
    fn reclaim(&self) {
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

    fn local_allocate(
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

    fn global_allocate(
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

    fn local_deallocate(&self, id: u32, slot: u32, addr: usize, bytes: usize, stream: StreamRef) {
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

impl<U: MemoryResource> fmt::Debug for Arena<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena")
            .field("upstream", &self.upstream.name())
            .field("max_size", &self.max_size)
            .field("arena_size", &self.arena_size())
            .field("superblock_size", &self.superblock_size())
            .field("arenas", &self.narenas.load(Ordering::Relaxed))
            .finish()
    }
}

// SAFETY: every block handed out lies in memory taken from the upstream and not given back
// (chunks are freed only in Drop); blocks are carved from disjoint free ranges (global) or disjoint
// free blocks of a superblock (local) and return to exactly one of them when deallocated, so live
// blocks never overlap. Addresses are multiples of 256 (chunk starts are rounded up to 256) and
// requests for more are padded to their alignment. Access properties are the upstream's memory's.
unsafe impl<U: MemoryResource> MemoryResource for Arena<U> {
    type Host = U::Host;
    type Device = U::Device;
    type Managed = U::Managed;
    type Alignment = U256;

    fn allocate(
        &self,
        size: usize,
        align: usize,
        stream: StreamRef,
    ) -> Result<NonNull<u8>, AllocError> {
        if let Some(p) = check_request::<Self>(size, align, NAME)? {
            return Ok(p);
        }
        let fix = |e: AllocError| {
            if e.kind == AllocErrorKind::OutOfMemory {
                AllocError::out_of_memory(size, align, NAME)
            } else {
                e
            }
        };
        let align_g = align.max(GRAN);
        // check_request bounded size + align below isize::MAX.
        let bytes = align_up(size, GRAN).ok_or(AllocError::out_of_memory(size, align, NAME))?;
        let small = bytes <= self.superblock_size() / 4
            && bytes + (align_g - GRAN) <= self.superblock_size();
        if small {
            if let Some(id) = self.arena_for(stream) {
                if let Some(p) = self.local_allocate(id, bytes, align_g).map_err(fix)? {
                    // A local arena's blocks are ordered on its stream. The thread arenas serve
                    // every default stream (`DEFAULT`, and each context's), which may be
                    // distinct streams: order the caller's after the arena's (a no-op where
                    // they are one stream).
                    let local = self.local(id).stream;
                    if local.id() != stream.id() {
                        if let Err(e) = self.upstream.order_after(stream, local) {
                            // SAFETY: just allocated from this arena with these arguments and
                            // handed to no one.
                            unsafe { self.deallocate(p, size, align, local) };
                            return Err(e);
                        }
                    }
                    return Ok(p);
                }
            }
        }
        self.global_allocate(bytes, align_g, stream).map_err(fix)
    }

    /// # Panics
    ///
    /// On a pointer that lies outside every range the arena took from its upstream: the caller
    /// broke `deallocate`'s contract.
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, _align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        let bytes = (size + GRAN - 1) & !(GRAN - 1);
        let addr = ptr.as_ptr() as usize;
        let Some((ci, chunk)) = self.chunk_of(addr) else {
            panic!("Arena: {addr:#x} was not allocated by this arena");
        };
        let meta = chunk
            .meta_at(addr, self.sb_shift)
            .map_or(0, |m| m.load(Ordering::Acquire));
        if meta == 0 {
            self.give_back(addr, bytes, ci, Tags::one(self.hold(stream)));
        } else {
            self.local_deallocate((meta >> 32) as u32 - 1, meta as u32, addr, bytes, stream);
        }
    }

    fn synchronize(&self, stream: StreamRef) -> Result<(), AllocError> {
        self.upstream.synchronize(stream)
    }

    fn order_after(&self, stream: StreamRef, after: StreamRef) -> Result<(), AllocError> {
        self.upstream.order_after(stream, after)
    }

    fn name(&self) -> &'static str {
        NAME
    }
}

impl<U: MemoryResource> Drop for Arena<U> {
    fn drop(&mut self) {
        let g = self.global.get_mut().unwrap_or_else(|p| p.into_inner());
        // The keeper (a field) outlives this function, so every Held below is still valid.
        let mut streams: Vec<Held> = g.runs.values().flat_map(|r| r.tags.iter()).collect();
        streams.extend(g.spare.iter().flat_map(|sp| sp.tags.iter()));
        let n = *self.narenas.get_mut();
        streams.extend(self.arenas[..n].iter().filter_map(|a| Some(a.get()?.held)));
        streams.sort();
        streams.dedup();
        // The chunks go back on the default stream: it must first wait for work on the others.
        for s in streams {
            self.order_or_wait(StreamRef::DEFAULT, self.stream_of(s));
        }
        let n = *self.nchunks.get_mut();
        for chunk in self.chunks[..n].iter().filter_map(OnceLock::get) {
            if let Some(ptr) = NonNull::new(std::ptr::with_exposed_provenance_mut::<u8>(chunk.ptr))
            {
                // SAFETY: the chunk came from the upstream with this size and alignment and goes
                // back once; nothing of it is used after the arena is gone.
                unsafe {
                    self.upstream
                        .deallocate(ptr, chunk.len, chunk.align, StreamRef::DEFAULT)
                };
            }
        }
    }
}

fn to_ptr(addr: usize) -> NonNull<u8> {
    // Addresses come from NonNull pointers of the upstream, offset within their allocation.
    NonNull::new(std::ptr::with_exposed_provenance_mut(addr))
        .expect("Arena: a block address is never 0")
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks completes before anything can panic, so a poisoned lock
    // still guards consistent state.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One allocation from the upstream.
#[derive(Debug)]
struct Chunk {
    /// What the upstream returned, for giving it back.
    ptr: usize,
    len: usize,
    align: usize,
    /// The usable range, rounded to 256.
    start: usize,
    end: usize,
    /// The first superblock-aligned address at or after `start`.
    win_base: usize,
    /// The id of the window at `win_base`: ids are unique across chunks.
    first_window: u32,
    /// Per superblock-sized window: 0, or (owning arena + 1) << 32 | slot of the superblock there.
    meta: Box<[AtomicU64]>,
}

impl Chunk {
    fn meta_at(&self, addr: usize, shift: u32) -> Option<&AtomicU64> {
        let off = addr.checked_sub(self.win_base)?;
        self.meta.get(off >> shift)
    }
}

/// Streams whose work may still use a free range. A merged range keeps the union; past
/// [`TAGS`] streams, they are synchronized and forgotten.
#[derive(Debug, Clone, Copy)]
struct Tags {
    n: u8,
    s: [Held; TAGS],
}

impl Tags {
    const NONE: Tags = Tags {
        n: 0,
        s: [Held::DEFAULT; TAGS],
    };

    fn one(stream: Held) -> Self {
        let mut s = [Held::DEFAULT; TAGS];
        s[0] = stream;
        Tags { n: 1, s }
    }

    fn iter(&self) -> impl Iterator<Item = Held> + '_ {
        self.s[..usize::from(self.n)].iter().copied()
    }

    /// Adds `other`'s streams; when they do not fit, pushes every stream of both onto `sync`
    /// and forgets them all (the caller synchronizes them before the range can be taken).
    fn absorb(&mut self, other: &Tags, sync: &mut Vec<Held>) {
        for s in other.iter() {
            if self.iter().any(|t| t == s) {
                continue;
            }
            if usize::from(self.n) < TAGS {
                self.s[usize::from(self.n)] = s;
                self.n += 1;
            } else {
                sync.extend(self.iter());
                sync.extend(other.iter());
                self.n = 0;
                return;
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Run {
    len: usize,
    chunk: u32,
    tags: Tags,
}

/// The free ranges of the global arena, by address (to coalesce) and by size (best fit).
#[derive(Debug, Default)]
struct Global {
    runs: BTreeMap<usize, Run>,
    by_size: BTreeSet<(usize, usize)>,
    /// Superblocks given back by local arenas, kept whole for the next local arena that needs
    /// one (a push and a pop instead of merging and carving ranges); merged into `runs` when a
    /// large request finds no room.
    spare: Vec<Spare>,
    windows: u32,
}

/// A free superblock-sized window of the global arena.
#[derive(Debug, Clone, Copy)]
struct Spare {
    at: usize,
    chunk: u32,
    tags: Tags,
}

impl Global {
    fn insert(&mut self, start: usize, run: Run) {
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
    fn find_window(&self, sb: usize) -> Option<(usize, usize)> {
        self.find_block(sb, sb)
    }

    /// Takes `[at, at + len)` out of the free range at `start`; returns that range's chunk and tags.
    fn carve(&mut self, start: usize, at: usize, len: usize) -> Run {
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

/// A local arena: one per thread (default stream) or per stream.
#[repr(align(64))] // its lock is the hot one: keep it off other arenas' cache lines
#[derive(Debug)]
struct Local {
    /// The arena's stream, kept alive by the arena's keeper (so valid while the arena lives).
    stream: StreamRef<'static>,
    held: Held,
    state: Mutex<LocalState>,
}

impl Local {
    fn lock(&self) -> MutexGuard<'_, LocalState> {
        lock(&self.state)
    }
}

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

/// A superblock of a local arena: free blocks as (offset, length) in 256-byte units, by offset.
#[derive(Debug)]
struct Superblock {
    base: usize,
    window: u32,
    chunk: u32,
    free_units: u32,
    free: Vec<(u32, u32)>,
}

impl Superblock {
    fn max_free(&self) -> u32 {
        self.free.iter().map(|b| b.1).max().unwrap_or(0)
    }

    fn take(&mut self, n: u32, align: usize) -> Option<u32> {
        for i in 0..self.free.len() {
            let (start, len) = self.free[i];
            let addr = self.base + start as usize * GRAN;
            let pad = ((align_up(addr, align)? - addr) / GRAN) as u32;
            if u64::from(pad) + u64::from(n) > u64::from(len) {
                continue;
            }
            let rest = len - pad - n;
            match (pad > 0, rest > 0) {
                (false, false) => {
                    self.free.remove(i);
                }
                (false, true) => self.free[i] = (start + n, rest),
                (true, false) => self.free[i] = (start, pad),
                (true, true) => {
                    self.free[i] = (start, pad);
                    self.free.insert(i + 1, (start + pad + n, rest));
                }
            }
            self.free_units -= n;
            return Some(start + pad);
        }
        None
    }

    fn give(&mut self, off: u32, n: u32) {
        let i = self.free.partition_point(|b| b.0 < off);
        debug_assert!(
            (i == 0 || self.free[i - 1].0 + self.free[i - 1].1 <= off)
                && (i == self.free.len() || off + n <= self.free[i].0),
            "Arena: double free in a superblock"
        );
        let merge_prev = i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == off;
        let merge_next = i < self.free.len() && off + n == self.free[i].0;
        match (merge_prev, merge_next) {
            (true, true) => {
                let next = self.free.remove(i);
                self.free[i - 1].1 += n + next.1;
            }
            (true, false) => self.free[i - 1].1 += n,
            (false, true) => self.free[i] = (off, self.free[i].1 + n),
            (false, false) => self.free.insert(i, (off, n)),
        }
        self.free_units += n;
    }
}

/// A 16-ary max-tree over window ids: finds the lowest window whose value reaches a bound in
/// a few steps, each comparing 16 children at once (no branch per level to mispredict).
#[derive(Debug, Default)]
struct MaxTree {
    /// `levels[0]` holds the leaves; each level above holds the maxima of groups of 16 entries
    /// below (padded with zeros to a multiple of 16); the top level has 16 entries.
    levels: Vec<Vec<u32>>,
}

const FAN: usize = 16;

/// The first of 16 values that is at least `n`.
#[inline]
fn first_at_least(group: &[u32], n: u32) -> Option<usize> {
    let group: &[u32; FAN] = group.try_into().ok()?;
    let mut mask = 0u32;
    for (k, &v) in group.iter().enumerate() {
        mask |= u32::from(v >= n) << k;
    }
    (mask != 0).then(|| mask.trailing_zeros() as usize)
}

impl MaxTree {
    fn leaves(&self) -> usize {
        self.levels.first().map_or(0, Vec::len)
    }

    fn ensure(&mut self, leaf: usize) {
        if leaf < self.leaves() {
            return;
        }
        let round = |n: usize| n.div_ceil(FAN).max(1) * FAN;
        let mut leaves = vec![0; round((leaf + 1).max(2 * self.leaves()))];
        if let Some(old) = self.levels.first() {
            leaves[..old.len()].copy_from_slice(old);
        }
        let mut levels = vec![leaves];
        while let Some(below) = levels.last().filter(|l| l.len() > FAN) {
            let mut above: Vec<u32> = below
                .chunks(FAN)
                .map(|g| g.iter().copied().max().unwrap_or(0))
                .collect();
            above.resize(round(above.len()), 0);
            levels.push(above);
        }
        self.levels = levels;
    }

    fn set(&mut self, leaf: usize, v: u32) {
        let (mut i, mut new) = (leaf, v);
        let mut old = std::mem::replace(&mut self.levels[0][i], v);
        for k in 1..self.levels.len() {
            let parent = i / FAN;
            let cur = self.levels[k][parent];
            let m = if new >= cur {
                // A raise (or a tie) sets the parent without looking at the siblings.
                new
            } else if old < cur {
                // The child was not the maximum before and is less now: nothing changes above.
                return;
            } else {
                let below = &self.levels[k - 1][parent * FAN..parent * FAN + FAN];
                below.iter().copied().max().unwrap_or(0)
            };
            if m == cur {
                return;
            }
            self.levels[k][parent] = m;
            (i, old, new) = (parent, cur, m);
        }
    }

    fn first_at_least(&self, n: u32) -> Option<usize> {
        let mut levels = self.levels.iter().rev();
        let mut i = first_at_least(levels.next()?, n)?;
        for level in levels {
            i = i * FAN + first_at_least(&level[i * FAN..i * FAN + FAN], n)?;
        }
        Some(i)
    }
}

/// What a thread's storage shares with an arena: its id and the thread arenas that threads left.
#[derive(Debug)]
struct Registry {
    id: u64,
    idle: Mutex<Vec<u32>>,
}

/// A thread's view of one arena: its thread arena and the last stream arena it used.
struct TlsEntry {
    instance: u64,
    registry: Weak<Registry>,
    thread_arena: Option<u32>,
    last_stream: Option<(StreamId, u32)>,
}

impl TlsEntry {
    fn new(instance: u64, registry: &Arc<Registry>) -> Self {
        TlsEntry {
            instance,
            registry: Arc::downgrade(registry),
            thread_arena: None,
            last_stream: None,
        }
    }
}

impl Drop for TlsEntry {
    fn drop(&mut self) {
        // The thread is gone: a later thread adopts its arena (and whatever is still live in it).
        if let (Some(id), Some(registry)) = (self.thread_arena, self.registry.upgrade()) {
            lock(&registry.idle).push(id);
        }
    }
}

thread_local! {
    static THREAD_ARENAS: RefCell<Vec<TlsEntry>> = const { RefCell::new(Vec::new()) };
}

static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(0);

static_assertions::assert_impl_all!(
    Arena<crate::System>: Send,
    Sync,
    crate::Accessible<crate::HostAccessible>
);
static_assertions::assert_impl_all!(
    Arena<crate::Cuda>: Send,
    Sync,
    crate::Accessible<crate::DeviceAccessible>
);
static_assertions::assert_impl_all!(Arena<&crate::Simulated>: Send, Sync);
static_assertions::assert_not_impl_any!(Arena<crate::System>: crate::Accessible<crate::DeviceAccessible>);
const _: () = assert!(crate::property::alignment_of::<Arena<crate::System>>() == 256);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The max-tree finds what a scan of its leaves finds, as it grows and changes.
        #[test]
        fn max_tree_finds_the_first_leaf_reaching_a_bound(
            ops in prop::collection::vec((0usize..700, 0u32..50, 0u32..60), 1..200)
        ) {
            let mut tree = MaxTree::default();
            let mut model = Vec::new();
            for (leaf, value, bound) in ops {
                tree.ensure(leaf);
                if model.len() <= leaf {
                    model.resize(leaf + 1, 0);
                }
                tree.set(leaf, value);
                model[leaf] = value;
                let want = model.iter().position(|&v| v >= bound);
                prop_assert_eq!(tree.first_at_least(bound), want);
            }
        }
    }

    #[test]
    fn superblock_first_fit_aligns_and_coalesces() {
        let mut sb = Superblock {
            base: 1 << 20,
            window: 0,
            chunk: 0,
            free_units: 64,
            free: vec![(0, 64)],
        };
        assert_eq!(sb.take(1, 256), Some(0));
        // 4 KiB alignment skips to unit 16, leaving units 1..16 free before it.
        assert_eq!(sb.take(2, 4096), Some(16));
        assert_eq!(sb.free, [(1, 15), (18, 46)]);
        assert_eq!(
            sb.take(15, 256),
            Some(1),
            "first fit fills the hole exactly"
        );
        assert_eq!(sb.take(47, 256), None);
        sb.give(1, 15);
        sb.give(16, 2);
        sb.give(0, 1);
        assert_eq!((sb.free.as_slice(), sb.free_units), (&[(0, 64)][..], 64));
    }
}
