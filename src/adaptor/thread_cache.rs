//! `ThreadCache<U>`: blocks a thread freed, kept for that thread's next requests of their size class.

use crate::resource::{check_request, forward_upstream, Layer, MemoryResource, Result};
use crate::shard;
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::{StreamHandle, StreamRef};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use typenum::U256;

const NAME: &str = "ThreadCache";
/// Every cached block is a multiple of this and asked for at this alignment.
const GRANULE: usize = 256;
/// Size classes per power of two above 2 KiB (below, one class per 256 bytes): a block is at most
/// 1/8 larger than its request.
const SUBCLASSES: u32 = 8;
/// A cache reserves room in the shared budget this many times at least to fill it once: the
/// budget is shared out in pieces of `bytes / 64` (or the block, if larger).
const PIECES: usize = 64;
/// The most streams a class's shared list keeps blocks of: a new stream's blocks push the oldest
/// stream's back to the upstream, so streams that are used once do not pile up there.
const STREAMS_PER_CLASS: usize = 8;

/// The configuration of a [`ThreadCache`]; `resource_stack!` builds one from
/// `ThreadCache { bytes: 1 GiB }`.
#[derive(Debug, Clone, Copy)]
pub struct ThreadCacheConfig {
    /// The most bytes all threads' caches and the shared lists keep together (default 256 MiB).
    /// A thread that would pass it gives the older half of each of its size classes back to the
    /// upstream instead.
    pub bytes: usize,
    /// The largest request served through the caches (default 16 MiB); larger ones go to the
    /// upstream as asked. [`ThreadCache::new`] lowers it to `bytes` (a text config refuses it
    /// above `bytes`); a class whose blocks are larger than the budget is never kept.
    pub max_block: usize,
}

impl Default for ThreadCacheConfig {
    fn default() -> Self {
        ThreadCacheConfig {
            bytes: 256 << 20,
            max_block: 16 << 20,
        }
    }
}

/// One thread's free blocks, all freed on `stream`, by size class.
#[derive(Debug, Default)]
struct Cache {
    /// The token of the thread whose exit hands this slot's blocks on ([`shard::token`]).
    hooked: u64,
    /// Keeps the stream alive while blocks freed on it wait here.
    stream: Option<StreamHandle>,
    /// Bytes in `classes` (class sizes, not request sizes).
    held: usize,
    /// Bytes of the shared budget this cache has reserved: at least `held`.
    quota: usize,
    /// By class index, oldest first (grown to the largest class used).
    classes: Vec<Vec<usize>>,
}

impl Cache {
    fn holds(&self, stream: StreamRef) -> bool {
        self.stream.as_ref().is_some_and(|s| s.id() == stream.id())
    }

    /// Takes every block out, with its class size, and lets the stream go (the quota stays).
    fn take_all(&mut self, out: &mut Vec<(usize, usize)>) -> Option<StreamHandle> {
        for (i, blocks) in self.classes.iter_mut().enumerate() {
            let size = class_size(i);
            out.extend(blocks.drain(..).map(|a| (a, size)));
        }
        self.held = 0;
        self.stream.take()
    }

    /// Takes the older half of every class (at least one block of each non-empty class) out,
    /// with its class size: at least half of what the cache holds.
    fn take_older_half(&mut self, out: &mut Vec<(usize, usize)>) {
        for (i, blocks) in self.classes.iter_mut().enumerate() {
            if blocks.is_empty() {
                continue;
            }
            let size = class_size(i);
            let n = blocks.len().div_ceil(2);
            self.held -= n * size;
            out.extend(blocks.drain(..n).map(|a| (a, size)));
        }
    }
}

/// The blocks of one size class that threads gave up, per stream they were freed on: where a
/// thread's miss looks before the upstream.
#[derive(Debug, Default)]
struct Central {
    /// Each stream's blocks, newest last; a stream with none is dropped (and let go).
    lists: Vec<(StreamHandle, Vec<usize>)>,
}

impl Central {
    fn pop(&mut self, stream: StreamRef) -> Option<usize> {
        let at = self.lists.iter().position(|(s, _)| s.id() == stream.id())?;
        let addr = self.lists[at].1.pop();
        if self.lists[at].1.is_empty() {
            // `remove`, not `swap_remove`: the lists stay oldest first, for `push`.
            self.lists.remove(at);
        }
        addr
    }

    /// Adds `blocks` to `stream`'s list; a list of a new stream beyond [`STREAMS_PER_CLASS`]
    /// pushes the oldest stream's list out, which the caller gives back to the upstream.
    fn push(
        &mut self,
        stream: StreamRef,
        blocks: impl Iterator<Item = usize>,
    ) -> Vec<(StreamHandle, Vec<usize>)> {
        match self.lists.iter_mut().find(|(s, _)| s.id() == stream.id()) {
            Some((_, list)) => {
                list.extend(blocks);
                Vec::new()
            }
            None => {
                self.lists.push((stream.to_handle(), blocks.collect()));
                let over = self.lists.len().saturating_sub(STREAMS_PER_CLASS);
                self.lists.drain(..over).collect()
            }
        }
    }

    fn bytes(&self, class: usize) -> usize {
        self.lists.iter().map(|(_, l)| l.len() * class).sum()
    }
}

/// The class of a request of `size` bytes (1 ≤ size ≤ 2^(usize::BITS - 2)): its index and the
/// size of its blocks. Up to 2 KiB, classes of 256 bytes; above, 8 classes per power of two.
#[inline]
fn class_of(size: usize) -> (usize, usize) {
    let s = size.max(1) - 1;
    if s < 8 * GRANULE {
        let i = s / GRANULE;
        return (i, (i + 1) * GRANULE);
    }
    // s >= 2048: the top bit p >= 11; the class steps by 2^(p - 3) within (2^p, 2^(p+1)].
    let p = usize::BITS - 1 - s.leading_zeros();
    let step = p - SUBCLASSES.trailing_zeros();
    let top = s >> step; // in [8, 16)
    let i = ((p - 11) * SUBCLASSES) as usize + top;
    (i, (top + 1) << step)
}

/// The block size of class `i` (the inverse of [`class_of`]).
#[inline]
fn class_size(i: usize) -> usize {
    if i < 8 {
        return (i + 1) * GRANULE;
    }
    let p = (i / SUBCLASSES as usize) as u32 + 10;
    let top = i % SUBCLASSES as usize + 8;
    (top + 1) << (p - SUBCLASSES.trailing_zeros())
}

/// A cache per thread in front of an upstream resource `U`: a block freed by a thread is kept
/// for that thread's next request of its size class on the same stream, so that a thread that
/// frees and allocates alike (each iteration of a training loop, each request of a server) takes
/// no lock shared with other threads. What a thread cache (tcmalloc's, or `Binning`'s for small
/// blocks) does, for every size up to [`ThreadCacheConfig::max_block`].
///
/// Requests are rounded up to a size class: multiples of 256 bytes up to 2 KiB, then eight
/// classes per power of two, so a block is at most 1/8 larger than asked (the upstream is asked
/// for the class size, at 256-byte alignment, and gets the same size back). A request above
/// `max_block`, or aligned beyond 256, goes to the upstream as asked (its alignment raised to
/// 256).
///
/// # Cost
///
/// A hit is a pop from the calling thread's own vector, under a lock only that thread takes (one
/// compare-and-swap); a free is a push. The first 64 live threads get a cache each; later ones
/// cache nothing, and their frees go to the shared lists. A thread's miss looks in its class's shared list next (a mutex per class), then
/// asks the upstream, with no lock of this resource held.
///
/// The caches and the shared lists keep at most [`ThreadCacheConfig::bytes`] together. A cache
/// reserves room in that budget a piece at a time (1/64 of it, one atomic operation per piece)
/// and gives back what it does not use beyond two pieces; once the budget has been found full,
/// the unused room of every cache whose thread is not in a call is taken back at once, and
/// caches keep no unused room until half of the budget is free again. A thread that finds no room gives
/// the older half of each of its classes to the shared lists, or to the upstream where they have
/// no room either. A thread that exits hands its blocks to the shared lists and its room back.
/// When the upstream is out of memory, for a request of any size (one above `max_block`
/// included), every cache and list is emptied into it and the request tried once more. What the
/// caches hold fragments the upstream the way live blocks do: leave the upstream room for `bytes`
/// beyond the peak the workload holds.
///
/// # Streams
///
/// A cache keeps blocks freed on one stream, and hands them out only for requests on that
/// stream, where the free is already ordered before the new work. A thread's free on another
/// stream first gives its cached blocks to the shared lists, under the stream they were freed
/// on; a request on another stream is a miss. The shared lists keep each stream's blocks apart
/// and hand them out only on that stream, too: at most 8 streams per class, a ninth pushing the
/// oldest stream's blocks back to the upstream, so that streams used once do not pile up. The
/// caches and lists keep alive the streams they hold blocks of. `synchronize` and `order_after`
/// go to the upstream.
///
/// # Upstream
///
/// Any [`MemoryResource`] that honours a 256-byte alignment request; it gives the upstream's
/// properties. Typically a [`Pool`](crate::suballoc::Pool) or [`Tlsf`](crate::suballoc::Tlsf)
/// whose one lock the caches keep most threads off.
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
///
/// let sim = Simulated::new(1 << 30);
/// let mr = resource_stack![&sim, Pool { max: 512 MiB }, ThreadCache { bytes: 64 MiB }];
/// let a = mr.allocate(3 << 20, 256, StreamRef::DEFAULT)?;
/// // SAFETY: a came from mr with this size and alignment, and is not used again.
/// unsafe { mr.deallocate(a, 3 << 20, 256, StreamRef::DEFAULT) };
/// assert_eq!(mr.cached(), 3 << 20); // kept for this thread
/// let b = mr.allocate(3 << 20, 256, StreamRef::DEFAULT)?; // the same block, no pool lock
/// assert_eq!(a, b);
/// # unsafe { mr.deallocate(b, 3 << 20, 256, StreamRef::DEFAULT) };
/// # Ok::<(), AllocError>(())
/// ```
#[derive(Debug)]
pub struct ThreadCache<U: MemoryResource> {
    upstream: U,
    max_block: usize,
    /// What the caches hold, apart from the upstream: shared with the exit hooks of the threads
    /// that used this resource.
    shared: Arc<Shared>,
}

/// A stream's list of blocks of one class leaving the shared lists for the upstream: the
/// stream they were freed on, the class size, the addresses. Their bytes are still reserved.
type Evicted = (StreamHandle, usize, Vec<usize>);

/// The caches, the shared lists and the budget.
#[derive(Debug)]
struct Shared {
    bytes: usize,
    /// Bytes of `bytes` that no cache and no list holds reserved: the caches' quotas, the lists'
    /// blocks and this sum to `bytes`.
    unreserved: AtomicUsize,
    /// What a cache reserves at a time, at least.
    piece: usize,
    /// Set when a cache found the budget full: caches then keep no room beyond what they hold,
    /// until half the budget is free again.
    tight: AtomicBool,
    /// One per thread slot ([`shard::SLOTS`]), and the shared one.
    caches: Box<[shard::SlotLock<Cache>]>,
    /// One per size class up to `max_block`'s, each under its own lock.
    central: Box<[Mutex<Central>]>,
    /// Lists an exit hook pushed out of `central` (their bytes still reserved), for the next call
    /// to give back; `has_orphans` says there are some.
    orphans: Mutex<Vec<Evicted>>,
    has_orphans: AtomicBool,
}

fn lock(central: &Mutex<Central>) -> MutexGuard<'_, Central> {
    // Central's updates are whole vector operations that complete before the lock is released
    // (nothing inside calls out), so a poisoned one holds consistent lists.
    central.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// Takes `n` bytes of the budget, if that many are left.
    fn take(&self, n: usize) -> bool {
        self.unreserved
            .fetch_update(Relaxed, Relaxed, |left| left.checked_sub(n))
            .is_ok()
    }

    /// [`take`](Self::take), and on a refusal the caches turn tight: the first refusal also
    /// takes back the unused room of every cache whose thread is not in a call (an idle thread
    /// makes no call that would give it back), and tries once more. The caller's own cache, if
    /// it holds it, is locked, so `try_lock` passes it by and nothing waits.
    fn reserve(&self, n: usize) -> bool {
        if self.take(n) {
            return true;
        }
        if self.tight.swap(true, Relaxed) {
            return false;
        }
        for cache in self.caches.iter() {
            if let Some(mut c) = cache.try_lock() {
                let room = c.quota - c.held;
                c.quota -= room;
                self.release_quiet(room);
            }
        }
        self.take(n)
    }

    /// Gives `n` reserved bytes back without touching `tight`.
    fn release_quiet(&self, n: usize) {
        self.unreserved.fetch_add(n, Relaxed);
    }

    /// Gives `n` reserved bytes back to the budget.
    fn release(&self, n: usize) {
        let left = self.unreserved.fetch_add(n, Relaxed) + n;
        if left >= self.bytes / 2 && self.tight.load(Relaxed) {
            self.tight.store(false, Relaxed);
        }
    }

    /// Makes `cache`'s quota cover what it holds: from the budget (a piece at a time, or just
    /// what is needed once the caches are tight), or, where the budget has no room, by taking
    /// the older half of its classes out into `out` (their bytes then reserved by no one) until
    /// it does. Gives back what it reserved beyond two pieces of room (beyond none when tight),
    /// so that an idle thread keeps little of the budget from the others.
    fn fit(&self, cache: &mut Cache, out: &mut Vec<(usize, usize)>) {
        let piece = if self.tight.load(Relaxed) {
            0
        } else {
            self.piece
        };
        if cache.held > cache.quota {
            let need = cache.held - cache.quota;
            let want = need.max(piece);
            if want > need && self.take(want) {
                cache.quota += want;
            } else if self.reserve(need) {
                cache.quota += need;
            } else {
                while cache.held > cache.quota {
                    cache.take_older_half(out);
                }
            }
        }
        let room = cache.quota - cache.held;
        if room > 2 * piece {
            let back = room - piece;
            cache.quota -= back;
            self.release(back);
        }
    }

    /// Puts `blocks` (address, class size; a class's blocks side by side, as [`Cache`] takes
    /// them out), whose bytes are already reserved, on their classes' shared lists for
    /// `stream`. Returns the lists that pushed out, for the upstream.
    #[must_use]
    fn keep(&self, blocks: &[(usize, usize)], stream: StreamRef) -> Vec<Evicted> {
        let mut out = Vec::new();
        for run in blocks.chunk_by(|a, b| a.1 == b.1) {
            let class = run[0].1;
            let pushed =
                lock(&self.central[class_of(class).0]).push(stream, run.iter().map(|b| b.0));
            out.extend(pushed.into_iter().map(|(old, list)| (old, class, list)));
        }
        out
    }
}

impl shard::Flush for Shared {
    /// The slot's thread is exiting: its blocks go to the shared lists, with their reservation,
    /// and the rest of its quota back to the budget. Lists this pushes past
    /// [`STREAMS_PER_CLASS`] keep the extra streams until the next push there (no upstream is
    /// at hand here).
    fn flush(&self, slot: usize) {
        // The cache stays locked until its blocks are on the lists: an `empty` (a drop) that
        // runs meanwhile waits for it here, and finds them there (it empties the caches first).
        let mut cache = self.caches[slot].lock();
        cache.hooked = 0;
        let mut blocks = Vec::new();
        let stream = cache.take_all(&mut blocks);
        let held: usize = blocks.iter().map(|b| b.1).sum();
        self.release(std::mem::take(&mut cache.quota) - held);
        let Some(stream) = stream else { return };
        let evicted = self.keep(&blocks, stream.as_ref());
        if !evicted.is_empty() {
            // No upstream here: the next free (or `empty`) on any thread gives them back, their
            // bytes reserved until then.
            let mut orphans = self.orphans.lock().unwrap_or_else(PoisonError::into_inner);
            orphans.extend(evicted);
            self.has_orphans.store(true, Relaxed);
        }
    }
}

impl<U: MemoryResource> ThreadCache<U> {
    /// Caches of `config.bytes` in all over `upstream`, for requests up to `config.max_block`
    /// (lowered to `bytes`, and to 2^(usize::BITS - 2) bytes).
    pub fn new(upstream: U, config: ThreadCacheConfig) -> Self {
        let max_block = config
            .max_block
            .min(config.bytes)
            .min(1 << (usize::BITS - 2));
        ThreadCache {
            upstream,
            max_block,
            shared: Arc::new(Shared {
                bytes: config.bytes,
                unreserved: AtomicUsize::new(config.bytes),
                piece: (config.bytes / PIECES).max(GRANULE),
                tight: AtomicBool::new(false),
                caches: (0..=shard::SLOTS)
                    .map(|_| shard::SlotLock::default())
                    .collect(),
                central: (0..=class_of(max_block.max(1)).0)
                    .map(|_| Mutex::default())
                    .collect(),
                orphans: Mutex::default(),
                has_orphans: AtomicBool::new(false),
            }),
        }
    }

    /// Bytes waiting in the caches now (class sizes): the threads' and the shared lists, each
    /// read under its own lock. Exact when no call is in flight; read while other threads
    /// allocate and free, a block moving between a thread's cache and a shared list may be
    /// counted twice or not at all.
    pub fn cached(&self) -> usize {
        let threads: usize = self.shared.caches.iter().map(|c| c.lock().held).sum();
        let central: usize = (self.shared.central.iter().enumerate())
            .map(|(i, c)| lock(c).bytes(class_size(i)))
            .sum();
        let orphans: usize = (self
            .shared
            .orphans
            .lock()
            .unwrap_or_else(PoisonError::into_inner))
        .iter()
        .map(|(_, class, l)| class * l.len())
        .sum();
        threads + central + orphans
    }

    /// Gives every cached block back to the upstream (what an out-of-memory request does first).
    pub fn empty(&self) {
        let shared = &*self.shared;
        // The caches first: an exiting thread's hook moves its cache to the lists under the
        // cache's lock, so what it moves is on the lists before this finds the cache empty.
        for cache in shared.caches.iter() {
            let mut blocks = Vec::new();
            let stream = {
                let mut cache = cache.lock();
                let stream = cache.take_all(&mut blocks);
                shared.release(std::mem::take(&mut cache.quota));
                stream
            };
            // A cache without a stream holds no block.
            if let Some(stream) = stream {
                self.give_back(&blocks, stream.as_ref());
            }
        }
        self.give_back_orphans();
        for (i, central) in shared.central.iter().enumerate() {
            let lists = std::mem::take(&mut lock(central).lists);
            self.drop_lists(lists.into_iter().map(|(s, list)| (s, class_size(i), list)));
        }
    }

    /// The resource the caches take blocks from and give them back to.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// The class of a request the caches serve, or `None` for one that goes to the upstream.
    #[inline]
    fn class(&self, size: usize, align: usize) -> Option<(usize, usize)> {
        (size <= self.max_block && align <= GRANULE).then(|| class_of(size))
    }

    /// The calling thread's cache, its exit hooked to hand the blocks on; `None` for a thread
    /// with no slot of its own (beyond 64 live threads, or one whose exit hooks have run): no
    /// hook would hand its blocks on, so such threads cache nothing.
    #[inline]
    fn cache(&self) -> Option<shard::SlotGuard<'_, Cache>> {
        let token = shard::token();
        let slot = shard::slot_of(token);
        if slot >= shard::SLOTS {
            return None;
        }
        let mut cache = self.shared.caches[slot].lock();
        if cache.hooked != token {
            let shared: Arc<dyn shard::Flush> = self.shared.clone();
            if !shard::on_exit(Arc::downgrade(&shared) as Weak<dyn shard::Flush>) {
                return None;
            }
            cache.hooked = token;
        }
        Some(cache)
    }

    /// Puts `blocks` freed on `stream` (unreserved) on the shared lists as far as the budget has
    /// room, and frees the rest to the upstream. Called with no cache lock held.
    fn give_up(&self, blocks: &[(usize, usize)], stream: StreamRef) {
        for run in blocks.chunk_by(|a, b| a.1 == b.1) {
            let class = run[0].1;
            if self.shared.reserve(run.len() * class) {
                self.drop_lists(self.shared.keep(run, stream));
            } else {
                self.give_back(run, stream);
            }
        }
    }

    /// Frees the lists exit hooks pushed out, releasing their reservation.
    fn give_back_orphans(&self) {
        if !self.shared.has_orphans.load(Relaxed) {
            return;
        }
        let lists = {
            let mut o = self
                .shared
                .orphans
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.shared.has_orphans.store(false, Relaxed);
            std::mem::take(&mut *o)
        };
        self.drop_lists(lists);
    }

    /// Lists leaving the shared lists: their reservation goes back to the budget and their
    /// blocks to the upstream, each on its stream.
    fn drop_lists(&self, lists: impl IntoIterator<Item = Evicted>) {
        for (stream, class, list) in lists {
            self.shared.release(list.len() * class);
            for addr in list {
                self.give_back_one(addr, class, stream.as_ref());
            }
        }
    }

    /// Frees `blocks` (address, class size) to the upstream on `stream`. Called with no cache
    /// lock held: the upstream may run the user's code, which may come back here.
    fn give_back(&self, blocks: &[(usize, usize)], stream: StreamRef) {
        for &(addr, size) in blocks {
            self.give_back_one(addr, size, stream);
        }
    }

    /// Asks the upstream; where it is out of memory, every cache and list (exited threads'
    /// blocks included) is emptied into it and the request tried once more: a request of any
    /// size fails out of memory only when nothing cached could have served it.
    fn upstream_or_empty(
        &self,
        size: usize,
        align: usize,
        stream: StreamRef,
    ) -> Result<NonNull<u8>> {
        match self.upstream.allocate(size, align, stream) {
            Err(e) if e.is_out_of_memory() => {
                // Blocks waiting in the caches may be what is missing.
                self.empty();
                self.upstream.allocate(size, align, stream)
            }
            r => r,
        }
    }

    fn give_back_one(&self, addr: usize, size: usize, stream: StreamRef) {
        // Cached addresses come from `NonNull`s: never null.
        let Some(ptr) = NonNull::new(std::ptr::with_exposed_provenance_mut(addr)) else {
            return;
        };
        // SAFETY: a block the upstream gave for a request of `size` bytes at GRANULE alignment
        // (its class's), freed to this resource on `stream` and taken out of its cache or list,
        // so it is given back once.
        unsafe { self.upstream.deallocate(ptr, size, GRANULE, stream) };
    }
}

// SAFETY: every block is the upstream's, asked for at least 256-byte alignment (which the
// upstream honours or refuses), for at least the bytes requested (a class size ≥ the request);
// a cached block was freed on the cache's stream and goes out again only on that stream, so the
// new work is ordered after the free.
unsafe impl<U: MemoryResource> MemoryResource for ThreadCache<U> {
    forward_upstream!(U, upstream, Alignment = U256);

    #[inline]
    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(p) = check_request::<Self>(size, align, NAME)? {
            return Ok(p);
        }
        let Some((i, class)) = self.class(size, align) else {
            return self.upstream_or_empty(size, align.max(GRANULE), stream);
        };
        let cached = match self.cache() {
            Some(mut cache) if cache.holds(stream) => {
                let addr = cache.classes.get_mut(i).and_then(Vec::pop);
                if addr.is_some() {
                    cache.held -= class;
                    // Room this thread does not use goes back to the budget (nothing is taken
                    // out: the cache holds less than its quota).
                    self.shared.fit(&mut cache, &mut Vec::new());
                }
                addr
            }
            _ => None,
        };
        // Then a block another thread of this stream gave up.
        let cached = cached.or_else(|| {
            let addr = lock(&self.shared.central[i]).pop(stream)?;
            self.shared.release(class);
            Some(addr)
        });
        if let Some(ptr) =
            cached.and_then(|a| NonNull::new(std::ptr::with_exposed_provenance_mut(a)))
        {
            return Ok(ptr);
        }
        self.upstream_or_empty(class, GRANULE, stream)
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        let Some((i, class)) = self.class(size, align) else {
            // SAFETY: the same routing sent this request to the upstream, with this size and the
            // alignment raised alike.
            unsafe {
                self.upstream
                    .deallocate(ptr, size, align.max(GRANULE), stream)
            };
            return;
        };
        self.give_back_orphans();
        let Some(mut cache) = self.cache() else {
            // No slot of its own, so no exit hook: the block goes to the shared lists.
            self.give_up(&[(ptr.as_ptr().expose_provenance(), class)], stream);
            return;
        };
        // Vectors grow only when blocks leave: a plain free allocates nothing.
        let (mut switched, mut spilled) = (Vec::new(), Vec::new());
        let old = {
            let old = if cache.holds(stream) {
                None
            } else {
                // The other stream's blocks leave with their reservation, for the shared lists.
                let old = cache.take_all(&mut switched);
                cache.quota -= switched.iter().map(|b| b.1).sum::<usize>();
                cache.stream = Some(stream.to_handle());
                old
            };
            if cache.classes.len() <= i {
                cache.classes.resize_with(i + 1, Vec::new);
            }
            cache.classes[i].push(ptr.as_ptr().expose_provenance());
            cache.held += class;
            self.shared.fit(&mut cache, &mut spilled);
            old
        };
        // Each on the stream it was freed on.
        if let Some(old) = old {
            self.drop_lists(self.shared.keep(&switched, old.as_ref()));
        }
        self.give_up(&spilled, stream);
    }

    fn name(&self) -> &'static str {
        NAME
    }

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        ItemWriter::over(f, &self.upstream, "thread_cache")
            .size("bytes", self.shared.bytes)
            .size("max_block", self.max_block)
            .finish()
    }

    fn upstream_layer(&self) -> Option<&dyn crate::stack::AnyLayer>
    where
        Self: 'static,
    {
        Some(&self.upstream)
    }
}

has_upstream!(impl<U> for ThreadCache<U> where U: MemoryResource);

impl<U: MemoryResource> Layer<U> for ThreadCacheConfig {
    type Resource = ThreadCache<U>;
    fn layer(self, upstream: U) -> ThreadCache<U> {
        ThreadCache::new(upstream, self)
    }
}

impl<U: MemoryResource> Drop for ThreadCache<U> {
    fn drop(&mut self) {
        self.empty();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_by_at_most_an_eighth_and_invert() {
        let sizes = (1..70_000)
            .chain((1..62).map(|p| (1usize << p) + 1))
            .chain([1 << 62]);
        for size in sizes {
            let (i, block) = class_of(size);
            assert!(block >= size, "{size}: block {block}");
            assert_eq!(block % GRANULE, 0, "{size}");
            assert!(
                block - size < GRANULE || (block - size) * 8 <= size,
                "{size}: block {block}"
            );
            assert_eq!(class_size(i), block, "class {i} of {size}");
        }
        // Classes grow with the size, one index at a time.
        let mut last = 0;
        for size in 1..70_000 {
            let (i, _) = class_of(size);
            assert!(i == last || i == last + 1, "{size}: class {i} after {last}");
            last = i;
        }
    }
}

static_assertions::assert_impl_all!(
    ThreadCache<crate::suballoc::Pool<crate::leaf::Cuda>>: Send,
    Sync,
    crate::property::Accessible<crate::property::DeviceAccessible>
);
static_assertions::assert_not_impl_any!(ThreadCache<crate::leaf::Cuda>: crate::property::Accessible<crate::property::HostAccessible>);
static_assertions::assert_impl_all!(ThreadCache<crate::leaf::System>: Send, Sync, crate::property::Accessible<crate::property::HostAccessible>);
static_assertions::assert_not_impl_any!(ThreadCache<crate::leaf::System>: crate::property::Accessible<crate::property::DeviceAccessible>);
const _: () = assert!(crate::property::alignment_of::<ThreadCache<crate::leaf::System>>() == 256);
static_assertions::assert_impl_all!(ThreadCache<crate::leaf::System>: crate::property::Accessible<crate::property::Pageable>);
static_assertions::assert_not_impl_any!(ThreadCache<crate::leaf::Cuda>: crate::property::Accessible<crate::property::Pageable>);
