//! `ThreadHeaps`: a [`Tlsf`] heap per thread over one upstream, so that threads that free their
//! own blocks share no lock.

use super::tlsf::{Tlsf, TlsfConfig};
use super::usage::Usage;
use crate::resource::{check_request, forward_upstream, AllocError, MemoryResource, Result};
use crate::shard;
use crate::stack::{HasUpstream, ItemWriter};
use crate::stream::StreamRef;
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use typenum::U256;

const NAME: &str = "ThreadHeaps";

/// The configuration of a [`ThreadHeaps`]; `resource_stack!` builds one from
/// `ThreadHeaps { max: 8 GiB }`.
#[derive(Debug, Clone, Copy)]
pub struct ThreadHeapsConfig {
    /// The most bytes all heaps hold from the upstream together; `usize::MAX` (the default) for
    /// no cap.
    pub max: usize,
}

impl Default for ThreadHeapsConfig {
    fn default() -> Self {
        ThreadHeapsConfig { max: usize::MAX }
    }
}

layer_by_new!(ThreadHeapsConfig => ThreadHeaps);

/// A [`Tlsf`] heap for each thread, over one upstream `U`: a thread allocates from its own heap
/// and frees into the heap the block came from, so that threads that free what they allocated
/// (each worker of a server, each data-loader thread) never take a lock another thread takes.
/// The per-thread heaps of jemalloc and mimalloc, or RMM's arenas, for blocks of every size.
///
/// Each of the first 64 live threads has a heap of its own, made at its first request; later
/// threads share one more. A heap outlives its thread: the next thread to take the slot takes
/// the heap as it is, free blocks and all. Heaps take their chunks (doubling from 2 MiB, as a
/// `Tlsf` grows) from one shared `Tlsf` over the upstream, which grows from the upstream by the
/// same rule up to `max` and merges the chunks heaps give back, so that memory one thread no
/// longer uses reaches another with no upstream call. A heap merges a freed block with its free
/// neighbours at once, so it needs what its thread holds at its peak and a few percent more,
/// and 2 MiB at least (its first chunk); all heaps together need about the sum of their threads'
/// peaks, not the peak of the sum.
///
/// # Cost
///
/// An allocation is a `Tlsf` allocation in the calling thread's heap: its mutex, taken by no
/// other thread while no other thread frees into that heap, and O(1) bookkeeping. A free first
/// asks the calling thread's heap, which frees the block if it holds it (one lock, one hash-map
/// lookup); a block of another heap costs a look-up of its chunk in a map shared by all threads
/// (a mutex, O(log chunks)) and that heap's lock. A heap's growth takes a chunk from the shared
/// pool (its lock, and the chunk map's); upstream calls happen only when the shared pool grows
/// or gives memory back. When the shared pool is out of room (at `max`, or the upstream is),
/// every heap gives its wholly free chunks to it and the request is tried once more.
///
/// # Streams
///
/// Within a heap, as [`Tlsf`]: a block freed on stream `S` goes again at once to work on `S`,
/// and to another stream `T` only after `upstream.order_after(T, S)`. A block freed by another
/// thread goes back to its own heap, under the stream of the free. A chunk a heap gives back
/// goes to the shared pool after its stream is ordered behind every stream that freed a block
/// of it, and the pool orders the next heap's stream after it in turn.
///
/// # Upstream
///
/// Any [`MemoryResource`] that honours a 256-byte alignment request. The heaps give the
/// upstream's properties and guarantee 256-byte alignment.
/// A heap's lock and the shared pool's are let go while their upstream allocates a chunk, which
/// may run your code (a [`Retry`](crate::adaptor::Retry) callback that frees through these heaps
/// or calls [`release`](Self::release)); one growth of each runs at a time.
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
///
/// let sim = Simulated::new(1 << 30);
/// let heaps = resource_stack![&sim, ThreadHeaps { max: 512 MiB }];
/// std::thread::scope(|s| {
///     for _ in 0..4 {
///         s.spawn(|| {
///             // Each thread allocates from a heap of its own.
///             let a = heaps.allocate(1 << 20, 256, StreamRef::DEFAULT).unwrap();
///             // SAFETY: a came from heaps with this size and alignment.
///             unsafe { heaps.deallocate(a, 1 << 20, 256, StreamRef::DEFAULT) };
///         });
///     }
/// });
/// assert!(heaps.heaps() >= 1);
/// assert_eq!(heaps.usage().allocated, 0);
/// drop(heaps);
/// assert_eq!(sim.in_use(), 0); // every chunk went back
/// ```
#[derive(Debug)]
pub struct ThreadHeaps<U: MemoryResource> {
    /// One per thread slot ([`shard::SLOTS`]) and the shared one, made at first use. Declared
    /// first: dropped (their chunks given back) before `shared`'s last reference can go.
    heaps: Box<[shard::Line<OnceLock<Heap<U>>>]>,
    shared: Arc<Shared<U>>,
}

/// One thread's heap.
type Heap<U> = Tlsf<HeapUpstream<U>>;

/// What the heaps share: the pool they take chunks from and which heap owns each chunk.
#[derive(Debug)]
struct Shared<U: MemoryResource> {
    /// The chunks of every heap come from here, and go back here when a heap gives them up, so
    /// that another heap takes them with no upstream call.
    global: Tlsf<U>,
    /// Each chunk a heap holds: its start, its end and the heap's slot.
    owners: Mutex<BTreeMap<usize, (usize, usize)>>,
}

impl<U: MemoryResource> Shared<U> {
    fn owners(&self) -> MutexGuard<'_, BTreeMap<usize, (usize, usize)>> {
        // Every update is one insert or remove, which completes or does not happen.
        self.owners.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The slot of the heap whose chunk holds `addr`.
    fn owner_of(&self, addr: usize) -> Option<usize> {
        let owners = self.owners();
        let (_, &(end, slot)) = owners.range(..=addr).next_back()?;
        (addr < end).then_some(slot)
    }
}

/// The shared pool as one heap sees it: the chunks it takes are recorded as that heap's.
#[derive(Debug)]
struct HeapUpstream<U: MemoryResource> {
    shared: Arc<Shared<U>>,
    slot: usize,
}

// SAFETY: every allocation is the shared pool's, returned unchanged (so its properties are the
// upstream's and its alignment the pool's); the chunk map is bookkeeping beside it.
unsafe impl<U: MemoryResource> MemoryResource for HeapUpstream<U> {
    forward_upstream!(properties of U);
    type Alignment = U256;

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        let ptr = self.shared.global.allocate(size, align, stream)?;
        let start = ptr.as_ptr() as usize;
        // Recorded before the heap can hand out a block of it, so that a free of one from any
        // thread finds its heap.
        self.shared
            .owners()
            .insert(start, (start + size, self.slot));
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        let start = ptr.as_ptr() as usize;
        // Forgotten before the pool has it back: another heap may get the same address at once,
        // and its record must not be the one removed. Until then the record is this heap's.
        self.shared.owners().remove(&start);
        // SAFETY: forwarded from the heap, which gives back only chunks it took from here, on
        // the stream it ordered behind every stream that freed a block of them.
        unsafe { self.shared.global.deallocate(ptr, size, align, stream) };
    }

    crate::resource::streams_through!(self.shared.global);
}

impl<U: MemoryResource> ThreadHeaps<U> {
    /// Heaps over `upstream` holding at most `config.max` bytes from it together (rounded down
    /// to 256 bytes). No heap exists until a thread asks for memory.
    pub fn new(upstream: U, config: ThreadHeapsConfig) -> Self {
        ThreadHeaps {
            heaps: (0..=shard::SLOTS)
                .map(|_| shard::Line(OnceLock::new()))
                .collect(),
            shared: Arc::new(Shared {
                global: Tlsf::new(
                    upstream,
                    TlsfConfig {
                        initial: 0,
                        max: config.max,
                    },
                ),
                owners: Mutex::default(),
            }),
        }
    }

    /// The heap of thread slot `slot`, made on first use.
    fn heap(&self, slot: usize) -> &Heap<U> {
        self.heaps[slot].get_or_init(|| {
            let upstream = HeapUpstream {
                shared: self.shared.clone(),
                slot,
            };
            // No cap of its own: the shared pool's is the one that counts.
            Tlsf::new(upstream, TlsfConfig::default())
        })
    }

    /// The cap on the bytes taken from the upstream (the configured maximum rounded down to 256
    /// bytes).
    pub fn max_size(&self) -> usize {
        self.shared.global.max_size()
    }

    /// How many heaps exist: one per thread slot that has asked for memory.
    pub fn heaps(&self) -> usize {
        self.heaps.iter().filter(|h| h.get().is_some()).count()
    }

    /// What the heaps hold, each read at its own instant (exact when no thread is in a call):
    /// `held`, `peak_held` and `chunks` are the upstream's bytes and allocations (the shared
    /// pool's), `allocated` and `free_blocks` the heaps' blocks.
    pub fn usage(&self) -> Usage {
        let global = self.shared.global.usage();
        let mut total = Usage {
            held: global.held,
            peak_held: global.peak_held,
            chunks: global.chunks,
            ..Usage::default()
        };
        for heap in self.heaps.iter().filter_map(|h| h.get()) {
            let u = heap.usage();
            total.allocated += u.allocated;
            total.free_blocks += u.free_blocks;
        }
        total
    }

    /// Gives every heap's wholly free chunks to the shared pool, where any heap can take them.
    fn pool_free_chunks(&self) -> usize {
        self.heaps
            .iter()
            .filter_map(|h| h.get())
            .map(Tlsf::release)
            .sum()
    }

    /// Gives every wholly free chunk back to the upstream: the heaps' to the shared pool first,
    /// then the pool's; returns the bytes the upstream got back.
    pub fn release(&self) -> usize {
        self.pool_free_chunks();
        self.shared.global.release()
    }

    /// The resource the heaps take their chunks from.
    pub fn upstream(&self) -> &U {
        self.shared.global.upstream()
    }
}

// SAFETY: every block comes from one heap, a `Tlsf` over `HeapUpstream<U>` (the upstream's memory
// unchanged), whose blocks are disjoint pieces of live chunks, aligned to 256 bytes, handed to
// another stream only after `order_after`. Heaps' chunks are disjoint (each is a live block of
// the shared pool) and recorded in the chunk map before any block of them is handed out, until the
// heap gives the chunk back, which a `Tlsf` does only when no block of it is live. So a free goes
// to the heap the block came from: the calling thread's heap frees only a block it holds live,
// and otherwise the map names the heap whose chunk holds the address.
unsafe impl<U: MemoryResource> MemoryResource for ThreadHeaps<U> {
    forward_upstream!(properties of U);
    type Alignment = U256;

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(p) = check_request::<Self>(size, align, NAME)? {
            return Ok(p);
        }
        let heap = self.heap(shard::slot());
        match heap.allocate(size, align, stream) {
            Err(e) if e.is_out_of_memory() => {
                let oom = AllocError::out_of_memory(size, align, NAME);
                // A request above the cap gives nothing back: it would only empty the heaps.
                if super::growth::block_of(size, align).2 > self.max_size() {
                    return Err(oom);
                }
                // Other threads' heaps may hold wholly free chunks that would fit (given to the
                // shared pool by this call or, meanwhile, by another thread's).
                self.pool_free_chunks();
                heap.allocate(size, align, stream).map_err(|e| {
                    if e.is_out_of_memory() {
                        oom
                    } else {
                        e
                    }
                })
            }
            other => other,
        }
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        if let Some(own) = self.heaps[shard::slot()].get() {
            if own.free_if_owned(ptr, stream) {
                return;
            }
        }
        // Another thread's block: the heap whose chunk holds it. An address of no chunk is
        // ignored, as each heap ignores one it never handed out.
        let Some(slot) = self.shared.owner_of(ptr.as_ptr() as usize) else {
            return;
        };
        if let Some(heap) = self.heaps.get(slot).and_then(|h| h.get()) {
            // SAFETY: forwarded from the caller; the block is that heap's (see the impl's
            // SAFETY): its chunk cannot go back while the block is live.
            unsafe { heap.deallocate(ptr, size, align, stream) };
        }
    }

    // Through the shared `Tlsf`, which every heap's chunks come from and which forwards to the
    // upstream: whoever holds a block hears it.
    crate::resource::streams_through!(self.shared.global);

    /// `thread_heaps(max=…)`, leaving out the default.
    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut item = ItemWriter::over(f, self.upstream(), "thread_heaps");
        if self.max_size() != ThreadHeapsConfig::default().max & !255 {
            item = item.size("max", self.max_size());
        }
        item.finish()
    }

    fn upstream_layer(&self) -> Option<&dyn crate::stack::AnyLayer>
    where
        Self: 'static,
    {
        Some(self.upstream())
    }
}

impl<U: MemoryResource> HasUpstream for ThreadHeaps<U> {
    type Upstream = U;
    fn upstream(&self) -> &U {
        self.shared.global.upstream()
    }
}

crate::property::assert_keeps_properties!(ThreadHeaps);
static_assertions::assert_impl_all!(
    ThreadHeaps<crate::leaf::Pinned>: crate::property::Accessible<(crate::property::HostAccessible, crate::property::DeviceAccessible)>
);
static_assertions::assert_not_impl_any!(ThreadHeaps<crate::leaf::Pinned>: crate::property::Accessible<crate::property::Pageable>);
const _: () = assert!(crate::property::alignment_of::<ThreadHeaps<crate::leaf::System>>() == 256);
