//! `ThreadCache<U>`: blocks a thread freed, kept for that thread's next requests of their size class.

use crate::resource::{check_request, forward_upstream, Layer, MemoryResource, Result};
use crate::shard;
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::StreamRef;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use typenum::U256;

mod classes;
mod shared;

use classes::{class_of, class_size};
use shared::{lock, Cache, Evicted, Shared};

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

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        ItemWriter::over(f, &self.upstream, "thread_cache")
            .size("bytes", self.shared.bytes)
            .size("max_block", self.max_block)
            .finish()
    }

    forward_upstream!(layer over upstream, name = NAME);
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

static_assertions::assert_impl_all!(
    ThreadCache<crate::suballoc::Pool<crate::leaf::Cuda>>: Send,
    Sync,
    crate::property::Accessible<crate::property::DeviceAccessible>
);
crate::property::assert_keeps_properties!(ThreadCache);
const _: () = assert!(crate::property::alignment_of::<ThreadCache<crate::leaf::System>>() == 256);
