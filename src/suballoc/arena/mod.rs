//! `Arena<U>`: the resource, its configuration, and where each request goes.

mod chunk;
mod global;
mod local;
mod max_tree;
mod owners;
mod superblock;
mod tags;
mod threads;

use super::usage::Usage;
use crate::resource::{
    align_up, check_request, forward_upstream, AllocError, AllocErrorKind, MemoryResource, Result,
};
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::{Held, StreamId, StreamKeeper, StreamRef};
use chunk::Chunk;
use global::Global;
use local::Local;
use owners::Owners;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use tags::Tags;
use threads::Registry;
use typenum::U256;

const NAME: &str = "Arena";
/// Every block is a multiple of this and aligned to it.
const GRAN: usize = 256;
/// The most upstream allocations the arena holds (one unless the upstream refused the whole size).
const MAX_CHUNKS: usize = 64;
/// The most local arenas; beyond, requests go to the global arena.
const MAX_ARENAS: usize = 1024;
/// Wholly free stream arenas that keep their superblocks; past this, the one idle longest gives
/// them back.
const IDLE_STREAM_ARENAS: usize = 4;
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

layer_by_new!(ArenaConfig => Arena);

/// A global arena of memory from `U` with per-thread and per-stream arenas over it: RMM's arena
/// suballocator, made to scale with threads.
///
/// The arena takes up to [`ArenaConfig::size`] bytes from its upstream (all at once, on the first
/// allocation that needs memory) and splits them between a *global arena* and *local arenas*:
///
/// * one local arena per thread for work on the default stream, and one per stream for other
///   streams. A local arena takes *superblocks* (chunks of [`ArenaConfig::superblock`] bytes,
///   aligned to their size) from the global arena and serves requests up to a quarter of a
///   superblock from them by first fit (its superblocks in slot order, then each one's blocks by
///   address), coalescing what is freed. Superblocks that become wholly free go back to the global
///   arena. They move in batches (a local arena takes up to 4 at once, holds up to 8 empty ones,
///   then gives back all but the 4 in its lowest slots), so that a thread takes the global lock
///   once per few superblocks, not on every exchange. A stream's arena whose superblocks are all
///   free joins a list of idle arenas; past 4 there, the one idle longest gives back every
///   superblock it holds, so that idle streams hold a bounded number of superblocks between them;
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
/// A small request takes only its own arena's lock, an O(log n) walk down a max-tree and a
/// first-fit scan inside one superblock; a large one takes the global lock for an O(log n) best
/// fit.
///
/// In detail: a small request on the default stream finds the thread's arena in thread-local
/// storage and takes that arena's own lock, which other threads take only to free memory this
/// thread allocated: no global lock, no shared counter. The first superblock that fits is found by
/// a walk down a 16-ary max-tree over the arena's superblocks (three steps for 4096 of them);
/// inside the superblock, first fit scans its free blocks. A deallocation finds the owner of its
/// pointer in a hash map from superblock to owner, split in 64 shards each under a read-write
/// lock (a read lock on one shard, then the owner's lock). Exchanging superblocks with the global
/// arena takes the global lock for a few pushes or pops, and a shard's write lock per superblock.
/// A deallocation that leaves a stream's arena wholly free takes the idle list's lock once, and
/// may have the arena idle longest give its superblocks back: O(1), whatever the number of
/// streams. Up to 1024 local arenas (a thread that ends leaves its arena to the next new thread; a
/// stream keeps its arena until it is evicted from the idle list, after which a new stream may
/// take it); past that, with no evicted arena to take, requests go to the global arena. A large request's best fit
/// is O(log n) in the global arena's free ranges when one of them holds the request at any
/// alignment; failing that, it checks each range that might (the path to growing or failing).
///
/// Host memory follows what is in use, not the capacity: about 100 bytes per superblock held by a
/// local arena (its slot in that arena, its entry in the owner map) and per free range of the
/// global arena, plus about 24 KiB of fixed tables; an arena of 2^62 bytes costs the same as one
/// of 1 GiB doing the same work.
///
/// # Streams
///
/// Memory freed on a stream is reused at once by that stream's arena (until that arena is among
/// the idle ones that give their superblocks back, above). Memory that changes streams
/// is ordered with the upstream's [`order_after`](MemoryResource::order_after), without blocking
/// the host: a block freed on another stream than its arena's orders the arena's stream after the
/// freeing stream; memory returned to the global arena is tagged with the streams that freed it, and
/// whoever takes it next is ordered after them. (A free range that merges memory of more than four
/// streams synchronizes them instead.) Memory fresh from the upstream is synchronized once taken.
/// The arena keeps alive the streams of its stream arenas and of the tags on its free ranges for
/// as long as they name them, so that reuse is ordered after a stream even once its owner dropped
/// it; a stream that nothing names any more is let go, so the arena holds at most one stream per
/// local arena and four per free range, not every stream it ever saw.
///
/// # Upstream
///
/// Any resource: the arena asks it for superblock-aligned memory and falls back to 256-byte or
/// natural alignment when the upstream refuses that alignment as unsupported. Every byte taken
/// goes back to the upstream when the arena is dropped, unless a block is still allocated (its
/// owner leaked with `mem::forget`, device work may still use it): then every byte is leaked. The arena is
/// `Sync` (one arena for all threads) when `U` is.
/// Its lock is let go while the upstream allocates a chunk, which may run your code (a
/// [`Retry`](crate::adaptor::Retry) callback that frees through this resource or trims it); one
/// growth runs at a time, and a thread that needs to grow meanwhile waits for it.
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
///
/// # fn main() -> Result<(), AllocError> {
/// let gpu = Simulated::new(1 << 30);
/// let mr = resource_stack![&gpu, Arena { size: 256 MiB }];
/// let p = mr.allocate(1000, 256, StreamRef::DEFAULT)?;
/// assert_eq!(mr.usage().held, 256 << 20); // reserved on first use
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
    /// Signalled when a growth (with `global` let go) ends.
    grown: std::sync::Condvar,
    taken: AtomicUsize,
    chunks: Box<[OnceLock<Chunk>]>,
    nchunks: AtomicUsize,
    arenas: Box<[OnceLock<Box<Local>>]>,
    narenas: AtomicUsize,
    /// The local arena (and slot) of each superblock that local arenas hold.
    owners: Owners,
    /// Stream arenas that became wholly free, oldest first (see `went_idle`).
    idle: Mutex<VecDeque<u32>>,
    /// Stream arenas evicted from `idle` (holding no superblock), for new streams once all
    /// [`MAX_ARENAS`] exist.
    evicted: Mutex<Vec<u32>>,
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
            grown: std::sync::Condvar::new(),
            taken: AtomicUsize::new(0),
            chunks: (0..MAX_CHUNKS).map(|_| OnceLock::new()).collect(),
            nchunks: AtomicUsize::new(0),
            arenas: (0..MAX_ARENAS).map(|_| OnceLock::new()).collect(),
            narenas: AtomicUsize::new(0),
            owners: Owners::default(),
            idle: Mutex::new(VecDeque::new()),
            evicted: Mutex::new(Vec::new()),
            create: Mutex::new(()),
            streams: RwLock::new(HashMap::new()),
            registry: Arc::new(Registry::new()),
            keeper: Mutex::new(StreamKeeper::default()),
        }
    }

    /// An arena that reserves its whole size from `upstream` now, or the upstream's error.
    pub fn try_new(upstream: U, config: ArenaConfig) -> Result<Self, AllocError> {
        let arena = Self::new(upstream, config);
        if arena.max_size > 0 {
            arena.grow(arena.max_size)?;
        }
        Ok(arena)
    }

    /// What the arena holds. The arena gives nothing back before it is dropped, so the peak is
    /// what it holds. Read arena by arena (the global arena, then each local one under its own
    /// lock): under concurrent use, the parts are of moments a little apart.
    pub fn usage(&self) -> Usage {
        let held = self.taken.load(Ordering::Relaxed);
        let (mut free, mut free_blocks) = lock(&self.global).free(self.superblock_size());
        let arenas = self.narenas.load(Ordering::Acquire);
        for local in self.arenas[..arenas].iter().filter_map(OnceLock::get) {
            let (bytes, blocks) = local.free();
            free += bytes;
            free_blocks += blocks;
        }
        let chunks = self.nchunks.load(Ordering::Acquire);
        let slack: usize = self.chunks[..chunks]
            .iter()
            .filter_map(OnceLock::get)
            .map(Chunk::slack)
            .sum();
        Usage {
            held,
            peak_held: held,
            allocated: held.saturating_sub(free + slack),
            free_blocks,
            chunks,
        }
    }

    /// Host bytes of the arena's bookkeeping, estimated from its tables' sizes: fixed tables,
    /// the global arena's free ranges, the owner map and each local arena's tables. For tests
    /// that check it follows what is in use, not the capacity.
    #[doc(hidden)]
    pub fn metadata_bytes(&self) -> usize {
        let fixed = std::mem::size_of::<Self>()
            + MAX_CHUNKS * std::mem::size_of::<OnceLock<Chunk>>()
            + MAX_ARENAS * std::mem::size_of::<OnceLock<Box<Local>>>();
        let streams = self.streams.read().map_or(0, |m| m.capacity()) * 16;
        let idle = lock(&self.idle).capacity() * 4;
        let arenas = self.narenas.load(Ordering::Acquire);
        let locals: usize = self.arenas[..arenas]
            .iter()
            .filter_map(OnceLock::get)
            .map(|l| l.bytes())
            .sum();
        fixed + lock(&self.global).bytes() + self.owners.bytes() + streams + idle + locals
    }

    /// Superblocks that local arenas hold now. For tests that check that idle stream arenas give
    /// theirs back.
    #[doc(hidden)]
    pub fn local_superblocks(&self) -> usize {
        let arenas = self.narenas.load(Ordering::Acquire);
        self.arenas[..arenas]
            .iter()
            .filter_map(OnceLock::get)
            .map(|l| l.superblocks())
            .sum()
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

    /// Keeps `stream` alive as long as the arena, for a local arena or a free range's tags.
    fn hold(&self, stream: StreamRef) -> Held {
        lock(&self.keeper).hold(stream)
    }

    /// Holds each stream of `tags` `times` more, for as many new copies of them.
    fn retain(&self, tags: &Tags, times: usize) {
        if times == 0 || tags.iter().next().is_none() {
            return;
        }
        let mut keeper = lock(&self.keeper);
        for h in tags.iter() {
            for _ in 0..times {
                keeper.retain(h);
            }
        }
    }

    /// Undoes one hold of each of `held`: a stream that nothing of the arena names any more is
    /// dropped, so the keeper holds the streams named now, not every stream ever seen.
    fn release(&self, held: impl IntoIterator<Item = Held>) {
        let mut held = held.into_iter().peekable();
        if held.peek().is_none() {
            return;
        }
        let mut keeper = lock(&self.keeper);
        for h in held {
            keeper.release(h);
        }
    }

    /// True when `ptr` lies in a superblock that a local arena holds. For tests that check which
    /// arena serves a stream.
    #[doc(hidden)]
    pub fn in_local_arena(&self, ptr: NonNull<u8>) -> bool {
        self.owners
            .get(ptr.as_ptr() as usize >> self.sb_shift)
            .is_some()
    }

    /// Streams the arena holds now (the default stream included). For tests that check they
    /// follow the streams named now, not every stream ever seen.
    #[doc(hidden)]
    pub fn held_streams(&self) -> usize {
        lock(&self.keeper).held()
    }

    /// The stream `held` names, valid while it is held.
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

    /// As `order`, for paths that cannot return an error (see `growth::order_or_wait`).
    #[must_use]
    fn order_or_wait(&self, stream: StreamRef, after: StreamRef) -> bool {
        super::growth::order_or_wait(&self.upstream, stream, after)
    }
}

impl<U: MemoryResource> fmt::Debug for Arena<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena")
            .field("upstream", &self.upstream.name())
            .field("max_size", &self.max_size)
            .field("usage", &self.usage())
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
// A block freed on stream S reaches another stream T only after `order_after(T, S)` or a host
// wait for S succeeded: free ranges carry the streams that freed them (tags), ordered when taken;
// a merge that would forget streams waits for them first, or does not happen; a free into a local
// arena that can be neither ordered nor waited for leaks the block.
unsafe impl<U: MemoryResource> MemoryResource for Arena<U> {
    forward_upstream!(U, upstream, Alignment = U256);

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
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
                if let Some(p) = self
                    .local_allocate(id, bytes, align_g, stream)
                    .map_err(fix)?
                {
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
        let Some((ci, _)) = self.chunk_of(addr) else {
            panic!("Arena: {addr:#x} was not allocated by this arena");
        };
        match self.owners.get(addr >> self.sb_shift) {
            Some(owner) => self.local_deallocate(owner.arena, owner.slot, addr, bytes, stream),
            None => self.give_back(addr, bytes, ci, Tags::one(self.hold(stream))),
        }
    }

    fn describe_to(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        ItemWriter::over(f, &self.upstream, "arena")
            .size("size", self.max_size())
            .size("superblock", self.superblock_size())
            .finish()
    }

    forward_upstream!(layer over upstream, name = NAME);
}

has_upstream!(impl<U> for Arena<U> where U: MemoryResource);

impl<U: MemoryResource> Drop for Arena<U> {
    fn drop(&mut self) {
        if self.usage().allocated > 0 {
            // A block is still allocated: its owner was leaked (`mem::forget` of a container),
            // or its free could be neither ordered nor waited for. Device work queued before may
            // still use it: every chunk is leaked too, rather than handed back for reuse under
            // that work.
            return;
        }
        let g = self.global.get_mut().unwrap_or_else(|p| p.into_inner());
        // The keeper (a field) outlives this function, so every Held below is still valid.
        let mut streams: Vec<Held> = g.runs.values().flat_map(|r| r.tags.iter()).collect();
        streams.extend(g.spare.iter().flat_map(|sp| sp.tags.iter()));
        let n = *self.narenas.get_mut();
        streams.extend(
            self.arenas[..n]
                .iter()
                .filter_map(|a| Some(a.get()?.stream())),
        );
        streams.sort();
        streams.dedup();
        // The chunks go back on the default stream: it must first wait for work on the others.
        // Where that fails, work of that stream may still use them: they are all leaked.
        let mut ordered = true;
        for s in streams {
            ordered &= self.order_or_wait(StreamRef::DEFAULT, self.stream_of(s));
        }
        if !ordered {
            return;
        }
        let n = *self.nchunks.get_mut();
        for chunk in self.chunks[..n].iter().filter_map(OnceLock::get) {
            if let Some(ptr) = NonNull::new(std::ptr::with_exposed_provenance_mut::<u8>(chunk.ptr))
            {
                // SAFETY: the chunk came from the upstream with this size and alignment and goes
                // back once, on the default stream, which waits for every stream that freed a
                // block in it (or the chunks are leaked, above); no block of it is allocated.
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
    // Every update under the arena's mutexes completes before anything can panic, so a poisoned
    // one still guards consistent state.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

static_assertions::assert_impl_all!(
    Arena<crate::leaf::System>: Send,
    Sync,
    crate::property::Accessible<crate::property::HostAccessible>
);
static_assertions::assert_impl_all!(
    Arena<crate::leaf::Cuda>: Send,
    Sync,
    crate::property::Accessible<crate::property::DeviceAccessible>
);
static_assertions::assert_impl_all!(Arena<&crate::leaf::Simulated>: Send, Sync);
static_assertions::assert_not_impl_any!(Arena<crate::leaf::System>: crate::property::Accessible<crate::property::DeviceAccessible>);
const _: () = assert!(crate::property::alignment_of::<Arena<crate::leaf::System>>() == 256);
