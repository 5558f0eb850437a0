//! `PagedHeaps`: a [`VirtualMemory`] heap per thread over one page source, so that threads share
//! no lock and physical pages follow the live blocks of every thread.

use super::region::Pace;
use super::{Attempt, Lock, Room, VirtualMemory, VirtualMemoryConfig, VmUsage};
use crate::leaf::PhysicalPages;
use crate::resource::{check_request, AllocError, MemoryResource, Result};
use crate::shard;
use crate::stream::{StreamId, StreamRef};
use cudarc::driver::CudaStream;
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};
use typenum::U256;

const NAME: &str = "PagedHeaps";

/// Heaps chosen by stream, beside those chosen by thread: the first streams seen get one each;
/// streams beyond them share one by a hash of their id.
const STREAM_HEAPS: usize = 16;

/// Numbers the `PagedHeaps` of a process, so that a thread's remembered stream heap is of the
/// one it asks.
static INSTANCES: AtomicUsize = AtomicUsize::new(0);

/// A stream heap found held by another thread this many times within [`MEETING_WINDOW`] is
/// left to the threads' own heaps ([`PagedHeaps`] says why).
const MEETINGS_TO_LEAVE: u32 = 16;
const MEETING_WINDOW: Duration = Duration::from_millis(100);

/// Threads that share a stream heap, waiting for each other there; one more that finds it held
/// within [`MEETING_WINDOW`] makes it crowded ([`PagedHeaps`] says why).
pub(super) const SHARERS: usize = 4;

/// What a thread remembers across calls of every `PagedHeaps` (hints only: a wrong one costs a
/// lock, never a wrong answer).
struct Hint {
    /// The heap that served its last allocation, tried first by its next free.
    served: Cell<usize>,
    /// The stream heap of the last stream it allocated on: (instance, stream, heap).
    stream: Cell<(usize, StreamId, usize)>,
}

thread_local! {
    static HINT: Hint = const {
        Hint {
            served: Cell::new(usize::MAX),
            stream: Cell::new((usize::MAX, StreamId::DEFAULT, 0)),
        }
    };
}

/// How often a stream heap was found held by another thread, and whether it is left to the
/// threads' heaps since.
#[derive(Debug, Default)]
struct Meetings {
    /// The start of the current window, in nanoseconds from the instance's `epoch`.
    since: AtomicU64,
    /// Meetings in the current window.
    count: AtomicU32,
    /// The thread slots ([`shard::slot`], plus one) of the first [`SHARERS`] threads that found
    /// the heap held in the current window (0: none yet).
    threads: [AtomicU64; SHARERS],
    /// One more thread found it held in the current window.
    crowded: AtomicBool,
    /// Found held [`MEETINGS_TO_LEAVE`] times in one window: allocations on its stream go to
    /// their threads' heaps, until a new stream takes the slot.
    left: AtomicBool,
}

impl Meetings {
    /// Counts one meeting at `now` (nanoseconds from the instance's epoch), starting a new
    /// window (its count, its threads, not crowded) where the last is over; returns the count
    /// in the window.
    fn count_one(&self, now: u64) -> u32 {
        self.window_at(now);
        self.count.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Starts a new window at `now` where the current one is over then.
    fn window_at(&self, now: u64) {
        let window = u64::try_from(MEETING_WINDOW.as_nanos()).unwrap_or(u64::MAX);
        if now.saturating_sub(self.since.load(Ordering::Relaxed)) > window {
            // Racing threads may each start the window: a meeting or two lost, no harm.
            self.restart(now);
        }
    }

    /// Starts a window at `now`: no meetings, no threads, not crowded.
    fn restart(&self, now: u64) {
        self.since.store(now, Ordering::Relaxed);
        self.count.store(0, Ordering::Relaxed);
        for t in &self.threads {
            t.store(0, Ordering::Relaxed);
        }
        self.crowded.store(false, Ordering::Relaxed);
    }
}

/// The index in `PagedHeaps::heaps` of stream heap `i` (after the thread heaps).
const fn by_stream(i: usize) -> usize {
    shard::SLOTS + 1 + i
}

/// The streams that own a stream heap each: the first [`STREAM_HEAPS`] streams seen, a slot
/// given again once its stream is dropped (known for cudarc streams; the others, default,
/// per-thread and raw handles, keep theirs). Two streams on one heap take turns on its lock
/// and its pages follow both their peaks, so the common case, a few long-lived streams, gets
/// a heap per stream.
#[derive(Debug, Default)]
struct StreamSlots([Option<(StreamId, Option<Weak<CudaStream>>)>; STREAM_HEAPS]);

impl StreamSlots {
    /// The stream heap (`0..STREAM_HEAPS`) of `stream`, and whether the slot was just given
    /// to it (a new stream, or one made at a dropped one's handle).
    fn of(&mut self, stream: StreamRef) -> (usize, bool) {
        let id = stream.id();
        let alive = |s: &Option<(StreamId, Option<Weak<CudaStream>>)>| {
            s.as_ref()
                .is_some_and(|(_, w)| w.as_ref().is_none_or(|w| w.strong_count() > 0))
        };
        let weak = stream.cuda_stream().map(Arc::downgrade);
        if let Some(i) = self
            .0
            .iter()
            .position(|s| s.as_ref().is_some_and(|(k, _)| *k == id))
        {
            // A stream made at a dropped one's handle takes its slot over.
            if !alive(&self.0[i]) {
                self.0[i] = Some((id, weak));
                return (i, true);
            }
            return (i, false);
        }
        if let Some(i) = self.0.iter().position(|s| !alive(s)) {
            self.0[i] = Some((id, weak));
            return (i, true);
        }
        ((id.mix() as usize) % STREAM_HEAPS, false)
    }
}

/// The configuration of a [`PagedHeaps`]: what each thread's heap keeps mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagedHeapsConfig {
    /// Each heap's [`VirtualMemoryConfig::cache`]: the most bytes of wholly free pages it keeps
    /// mapped. Default: no bound but `peak_slack` and memory pressure (`usize::MAX`).
    pub cache: usize,
    /// Each heap's [`VirtualMemoryConfig::peak_slack`]: a block that needs new pages while the
    /// heap's mapped pages are at the peak of its live pages plus this (or a 64th of that peak
    /// if less) first unmaps free pages whose work is done, so that the physical memory follows
    /// the peak of live memory. Default: 1 GiB, so a 64th of the peak: PyTorch's GPT training
    /// (26 GiB live) mapped 1.017x its peak live bytes with it, 1.046x with no bound
    /// (`usize::MAX`). Where swapping pages for it takes too much of the time (as
    /// [`VirtualMemoryConfig::peak_slack`] says), every heap doubles its slack: their swaps
    /// count together, since the driver serializes them.
    pub peak_slack: usize,
}

impl Default for PagedHeapsConfig {
    fn default() -> Self {
        PagedHeapsConfig {
            cache: usize::MAX,
            peak_slack: 1 << 30,
        }
    }
}

/// The stack to start with: device memory that follows what is live, fast on one thread and on
/// many. [`VirtualMemory`] heaps over one page source `P`
/// ([`DevicePages`](crate::leaf::DevicePages) on a GPU, [`Simulated`](crate::leaf::Simulated)
/// anywhere), one for each stream and one for each thread: a request goes to its stream's heap,
/// waiting for it where another thread holds it, unless more than four threads meet there: then to
/// the calling thread's own (every request on that stream, once they meet there often: see below);
/// a free goes to the heap the block came from. So the threads of one program that take turns on a
/// stream (PyTorch's forward on the main thread, its backward on the autograd thread), or a few
/// that allocate on it at once, share one heap and its pages, and a crowd of threads on one stream
/// soon stops waiting for each other. Each heap reserves its own virtual ranges and maps physical
/// pages only under live blocks; the pages freed blocks leave stay mapped for the next blocks,
/// within the peak of the heap's live pages and a slack (a 64th of that peak,
/// [`PagedHeapsConfig::peak_slack`]): a block that needs new pages beyond it takes the place of
/// free pages whose freeing work is done, unmapping them first, which is checked by events queried
/// at most every 32 calls and every 50 µs (where too few pages have settled, the request waits for
/// events an earlier call recorded, 200 ms at most, without the heap's lock). So the physical
/// memory follows the peak of live memory, not that peak plus the holes freed blocks leave. Across
/// heaps: when a heap maps pages while all heaps together hold more than the peak of their live
/// pages (as seen each time a heap maps pages) and its slack, the other heaps give up as many free
/// pages as they hold beyond what each needed lately (the peak of its live pages over the last 100
/// to 200 ms, and its slack), those whose freeing work is done at once and the rest as it
/// completes. So a heap whose threads moved on (to heaps of their own, other streams, or gone) does
/// not keep its pages, while heaps whose peaks come at different moments keep theirs: moving pages
/// between them at every peak would cost a swap each time, tens of microseconds a page. Memory
/// running short or [`release`](Self::release) gives back every free page.
///
/// Each heap keeps its own peak, and pages go from one heap to another only by the bound across
/// heaps, so what matters is that blocks do not keep moving between heaps. An allocation that finds
/// its stream's heap held by another thread waits for it, unless a fifth thread found it held
/// within the last 100 ms (threads counted by their slots, so that a thread that takes the place of
/// one gone is not one more): then it goes to the calling thread's heap, and a stream heap found
/// held so 16 times within 100 ms is left to the threads' heaps from then on (until a new stream
/// takes its slot). Up to four threads on one stream share its heap however their work
/// interleaves: had each gone to its own heap whenever it found another in the stream's, their
/// blocks would spread over the heaps as their timing shifts, each heap's pages rising to its own
/// peak. Over [`Simulated`](crate::leaf::Simulated), a replay of the two threads of PyTorch's GPT
/// training mapped 1.06 to 2.15 times what they held at once that way, 1.004 to 1.013 sharing;
/// four threads replaying transformer_train's two twice over, 1.07 to 1.91 where only two shared,
/// 1.01 to 1.05 with four (at 175–373 ns/op against 160–460). A crowd on one stream, which
/// would wait on one lock, settles in heaps of its own within its first few hundred allocations
/// instead, and stays there: were they to come back to the stream's heap
/// now and then, what each heap holds would keep shifting, and each heap's pages would keep rising
/// to new peaks, towards the sum of the heaps' peaks rather than the peak of their sum, or, under
/// the bound across heaps, swap pages between heaps at every shift. The pages they used in the
/// stream's heap before stay in use: where a thread's heap would map pages while all heaps
/// together map the peak of their live pages and its slack, the block goes in the free mapped
/// pages of a stream heap left so, on its stream, instead ([`VmUsage::borrowed`] counts them);
/// what no heap uses goes by the bound across heaps. Threads that take turns on a
/// stream (PyTorch's forward and backward threads, which never met on their stream's heap in the
/// GPT training of [`guide::performance`](crate::guide::performance)) keep sharing its heap and its
/// pages through a chance meeting. [`VmUsage::busy`] counts the allocations that found their
/// stream's heap held. Threads that allocate at once are faster on streams of their own.
///
/// There are 16 stream heaps, one for each of the first 16 streams allocated on (a cudarc
/// stream's heap goes to a new stream once it is dropped; later streams share them by a hash of
/// their id), and a heap for each of the first 64 live threads, made at first use; later threads
/// share one more. A thread remembers the heap of the last stream it allocated on, so only its
/// first allocation on a stream takes the lock of that table. A heap outlives its
/// thread: the next thread to take the slot takes the heap as it is.
///
/// # Cost
///
/// An allocation is a [`VirtualMemory`] allocation in its stream's heap (a try-lock; where it is
/// held, a count of the meeting on a line the stream's threads share, and the wait for the other
/// thread's call, which may map pages; a call that waits for events where it would map beyond the
/// peak bound lets the lock go meanwhile) or the calling thread's: tens of nanoseconds when its
/// pages are mapped; mapping a 2 MiB page costs `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`, tens
/// of microseconds, and then the bound across heaps: two counters read for each heap, and a
/// try-lock of each heap asked for pages, whose unmapping costs `cuMemUnmap` + `cuMemRelease` a
/// page. Once a stream heap is left, a block that needs pages is first looked for without mapping,
/// and, over the bound, in the left heaps (each a lock): a search or two more, on the way to
/// mapping. A free costs the lock of the calling thread's heap and, where that heap does not hold
/// the block, its stream's heap's; a block of neither, a read lock of the table of ranges and its
/// heap's lock.
///
/// # Memory pressure
///
/// When a heap cannot map a page, it gives back its own free pages and tries again; then every
/// other heap gives back its free pages (waiting for the work that freed them) and the request
/// is tried once more before it fails. [`release`](Self::release) gives every free page back.
///
/// # Streams
///
/// As [`VirtualMemory`], in each heap: a block freed on stream `S` is reused at once on `S`, and
/// by another stream only after `order_after`.
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::leaf::{PagedHeaps, PagedHeapsConfig};
///
/// let sim = Simulated::new(256 << 20);
/// let heaps = PagedHeaps::new(&sim, PagedHeapsConfig::default());
/// std::thread::scope(|s| {
///     for _ in 0..4 {
///         s.spawn(|| {
///             let p = heaps.allocate(3 << 20, 256, StreamRef::DEFAULT).unwrap();
///             // SAFETY: `p` came from `heaps` with this size and alignment.
///             unsafe { heaps.deallocate(p, 3 << 20, 256, StreamRef::DEFAULT) };
///         });
///     }
/// });
/// assert_eq!(heaps.usage().allocated, 0);
/// heaps.release();
/// assert_eq!(sim.mapped(), 0); // every page went back
/// ```
pub struct PagedHeaps<P: PhysicalPages + Clone> {
    pages: P,
    config: PagedHeapsConfig,
    /// One per thread slot ([`shard::SLOTS`]), the shared one, then [`STREAM_HEAPS`] by stream;
    /// made at first use, each on cache lines of its own.
    heaps: Box<[shard::Line<OnceLock<VirtualMemory<P>>>]>,
    /// Every heap's reserved ranges, `(base, size, slot)` sorted by base, for frees from other
    /// threads; a range missing (reserved since the last look) is found by asking each heap.
    routes: RwLock<Vec<(usize, usize, usize)>>,
    /// Which stream heap each stream allocates from first.
    streams: Mutex<StreamSlots>,
    /// Each stream heap's meetings, on lines of their own (written only when one is held).
    meetings: Box<[shard::Line<Meetings>]>,
    /// How many stream heaps are left to the threads' heaps: those whose pages others may
    /// [`borrow`](Self::borrow).
    left_heaps: AtomicUsize,
    /// The origin of [`Meetings::since`].
    epoch: Instant,
    /// This instance's number ([`INSTANCES`]).
    instance: usize,
    /// The heaps' one pace: their swaps count together, since the driver serializes them.
    pace: Arc<Pace>,
    /// Allocations that found their stream's heap held ([`VmUsage::busy`]), on a line of its
    /// own: counted only then, so threads that share no stream never write it.
    pub(super) busy: shard::Line<AtomicU64>,
    /// Allocations placed in another heap's mapped pages ([`VmUsage::borrowed`]), on a line of
    /// its own: counted only then.
    borrowed: shard::Line<AtomicU64>,
    /// The most bytes of pages under live blocks of all heaps together, as seen each time a
    /// heap mapped pages (when what is live outgrows what is mapped), on a line of its own.
    live_peak: shard::Line<AtomicUsize>,
}

impl<P: PhysicalPages + Clone> std::fmt::Debug for PagedHeaps<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagedHeaps")
            .field("config", &self.config)
            .field("heaps", &self.heaps())
            .field("usage", &self.usage())
            .finish()
    }
}

impl<P: PhysicalPages + Clone> PagedHeaps<P> {
    /// Heaps over `pages`, made as threads first allocate.
    pub fn new(pages: P, config: PagedHeapsConfig) -> Self {
        PagedHeaps {
            pages,
            config,
            heaps: (0..by_stream(STREAM_HEAPS))
                .map(|_| shard::Line(OnceLock::new()))
                .collect(),
            routes: RwLock::new(Vec::new()),
            streams: Mutex::new(StreamSlots::default()),
            meetings: (0..STREAM_HEAPS)
                .map(|_| shard::Line(Meetings::default()))
                .collect(),
            left_heaps: AtomicUsize::new(0),
            epoch: Instant::now(),
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
            pace: Arc::new(Pace::new()),
            busy: shard::Line(AtomicU64::new(0)),
            borrowed: shard::Line(AtomicU64::new(0)),
            live_peak: shard::Line(AtomicUsize::new(0)),
        }
    }

    /// The index of `stream`'s heap: remembered per thread, so that only a thread's first
    /// allocation on a stream takes the slots' lock.
    #[inline]
    pub(super) fn stream_heap(&self, stream: StreamRef) -> usize {
        let id = stream.id();
        let (instance, known, heap) = HINT.with(|h| h.stream.get());
        if instance == self.instance && known == id {
            return heap;
        }
        self.find_stream_heap(stream, id)
    }

    /// [`stream_heap`](Self::stream_heap) for a stream this thread did not allocate on last.
    #[cold]
    fn find_stream_heap(&self, stream: StreamRef, id: StreamId) -> usize {
        let slots = &mut *self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        let (i, new) = slots.of(stream);
        if new {
            // A new stream starts with its heap open to it, whatever the last one met.
            let m = &self.meetings[i];
            if m.left.swap(false, Ordering::Relaxed) {
                self.left_heaps.fetch_sub(1, Ordering::Relaxed);
            }
            m.restart(self.since_epoch());
        }
        let heap = by_stream(i);
        HINT.with(|h| h.stream.set((self.instance, id, heap)));
        heap
    }

    /// Counts a meeting on stream heap `heap` (found held by another thread), and says whether
    /// the heap is crowded: more than [`SHARERS`] threads found it held in the current window.
    /// A crowded heap is left to the threads' own once it met [`MEETINGS_TO_LEAVE`] in one
    /// window.
    #[cold]
    fn met(&self, heap: usize) -> bool {
        self.busy.fetch_add(1, Ordering::Relaxed);
        let m = &self.meetings[heap - by_stream(0)];
        let count = m.count_one(self.since_epoch());
        // By slot, not by token: a thread that takes the slot of one gone is not one more.
        let token = shard::slot() as u64 + 1;
        let known = |t: &AtomicU64| t.load(Ordering::Relaxed) == token;
        let added = |t: &AtomicU64| {
            t.compare_exchange(0, token, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        };
        // Racing the start of a window, a token may be lost: a crowd seen a meeting later, no
        // harm.
        if !m.threads.iter().any(known) && !m.threads.iter().any(added) {
            m.crowded.store(true, Ordering::Relaxed);
        }
        let crowded = m.crowded.load(Ordering::Relaxed);
        if crowded && count >= MEETINGS_TO_LEAVE && !m.left.swap(true, Ordering::Relaxed) {
            self.left_heaps.fetch_add(1, Ordering::Relaxed);
        }
        crowded
    }

    /// Nanoseconds since the instance's `epoch`.
    fn since_epoch(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Makes stream `stream`'s heap crowded, as if [`SHARERS`] threads other than any real one
    /// had found it held in the current window (started now if over).
    #[cfg(test)]
    pub(super) fn crowd(&self, stream: StreamRef) {
        let m = &self.meetings[self.stream_heap(stream) - by_stream(0)];
        m.window_at(self.since_epoch());
        for (i, t) in m.threads.iter().enumerate() {
            t.store(u64::MAX - i as u64, Ordering::Relaxed);
        }
    }

    /// Whether stream heap `heap` is left to the threads' own heaps.
    #[inline]
    pub(super) fn left(&self, heap: usize) -> bool {
        self.meetings[heap - by_stream(0)]
            .left
            .load(Ordering::Relaxed)
    }

    /// The page source.
    pub fn pages(&self) -> &P {
        &self.pages
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &PagedHeapsConfig {
        &self.config
    }

    /// Heaps made so far.
    pub fn heaps(&self) -> usize {
        self.heaps.iter().filter(|h| h.get().is_some()).count()
    }

    /// What all heaps hold together, each read at its own instant (`peak_mapped` is the sum of
    /// the heaps' peaks: at least the peak of the sum; `slack_doublings` their one pace's;
    /// `busy` the allocations that found their stream's heap held).
    pub fn usage(&self) -> VmUsage {
        let mut total = VmUsage::default();
        for heap in self.heaps.iter().filter_map(|h| h.get()) {
            let u = heap.usage();
            total.mapped += u.mapped;
            total.peak_mapped += u.peak_mapped;
            total.cached += u.cached;
            total.allocated += u.allocated;
            total.reserved += u.reserved;
            total.free_blocks += u.free_blocks;
            total.maps += u.maps;
            total.unmaps += u.unmaps;
            total.waited += u.waited;
            total.page_table_bytes += u.page_table_bytes;
        }
        total.slack_doublings = self.pace.doublings();
        total.busy = self.busy.load(Ordering::Relaxed);
        total.borrowed = self.borrowed.load(Ordering::Relaxed);
        total
    }

    /// Unmaps every free page of every heap (after waiting for the work that freed them), and
    /// gives back each heap's empty ranges but one ([`VirtualMemory::release`]); returns the
    /// physical bytes given back.
    pub fn release(&self) -> usize {
        self.heaps
            .iter()
            .filter_map(|h| h.get())
            .map(VirtualMemory::release)
            .sum()
    }

    /// Heap `slot` (a thread's, or a stream's), made on first use.
    #[inline]
    pub(super) fn heap(&self, slot: usize) -> Result<&VirtualMemory<P>> {
        match self.heaps[slot].get() {
            Some(heap) => Ok(heap),
            None => self.make_heap(slot),
        }
    }

    /// Heap `slot`, made now unless another thread made it first.
    #[cold]
    fn make_heap(&self, slot: usize) -> Result<&VirtualMemory<P>> {
        let config = VirtualMemoryConfig {
            cache: self.config.cache,
            peak_slack: self.config.peak_slack,
            ..VirtualMemoryConfig::default()
        };
        let made = VirtualMemory::with_pace(self.pages.clone(), config, Arc::clone(&self.pace))?;
        // Threads may race to make a shared or a stream heap: the loser's heap, unused, gives its
        // range back as it drops.
        let _ = self.heaps[slot].set(made);
        self.heaps[slot]
            .get()
            .ok_or_else(|| AllocError::out_of_memory(0, 0, NAME))
    }

    /// After heap `grown` mapped pages: where all heaps together map more than the peak of
    /// their live pages and its slack, the other heaps give up cached pages they did not need
    /// lately ([`VirtualMemory::give_up`]), as many as that excess, so that the pages follow
    /// the peak of what all threads hold rather than the sum of each heap's peak. Pages whose
    /// freeing work is not done yet go as it completes, in later calls; a heap held by another
    /// thread is passed over.
    #[cold]
    fn bound_all(&self, grown: usize) {
        if self.config.peak_slack == usize::MAX {
            return;
        }
        let (mapped, live) = self.totals();
        let peak = self.live_peak.fetch_max(live, Ordering::Relaxed).max(live);
        let mut over = mapped
            .saturating_sub(self.bound(peak))
            .div_ceil(self.pages.page_size());
        let heaps = self
            .heaps
            .iter()
            .enumerate()
            .filter_map(|(i, h)| Some((i, h.get()?)));
        for (i, heap) in heaps {
            if over == 0 {
                break;
            }
            let cached = heap.shown().2;
            if i == grown || cached == 0 {
                continue;
            }
            // What a heap keeps (it needed it lately, or holds its lock) falls to the next.
            over -= heap.give_up(over.min(cached));
        }
    }

    /// What all heaps map together, and the bytes of pages under their live blocks, each heap
    /// as its last call left it.
    fn totals(&self) -> (usize, usize) {
        self.heaps
            .iter()
            .filter_map(|h| h.get())
            .fold((0usize, 0usize), |(m, l), h| {
                let (mapped, live, _) = h.shown();
                (m.saturating_add(mapped), l.saturating_add(live))
            })
    }

    /// The most bytes all heaps may map together, given a peak of `peak` bytes of pages under
    /// their live blocks: that peak and its slack, as each heap's bound.
    fn bound(&self, peak: usize) -> usize {
        let slack = self
            .pace
            .slack(self.config.peak_slack, peak, self.pages.page_size());
        peak.saturating_add(slack)
    }

    /// An allocation in heap `slot`, the lock taken as `lock` says: in its mapped pages where
    /// they hold the block; else, where mapping pages for it would take all heaps together
    /// beyond the peak of their live pages and its slack, in the mapped pages of another heap
    /// ([`borrow`](Self::borrow)); else in heap `slot`, mapping pages, and then the bound across
    /// heaps. Notes the heap that served it for the next free.
    #[inline]
    fn place_in(
        &self,
        slot: usize,
        heap: &VirtualMemory<P>,
        size: usize,
        align: usize,
        stream: StreamRef,
        lock: Lock,
    ) -> Attempt {
        let served = |done: Attempt| {
            if matches!(done, Attempt::Done(Ok(_))) {
                HINT.with(|h| h.served.set(slot));
            }
            done
        };
        // Only while some heap's pages may be borrowed is room for a block without mapping
        // looked for first: otherwise the one search maps what the block needs.
        if self.config.peak_slack != usize::MAX && self.left_heaps.load(Ordering::Relaxed) > 0 {
            match heap.allocate_with(size, align, stream, lock, Room::Mapped) {
                Attempt::NoRoom => {}
                done => return served(done),
            }
            if let Some(p) = self.borrow(size, align, stream) {
                return Attempt::Done(Ok(p));
            }
        }
        let before = heap.shown().0;
        let done = heap.allocate_with(size, align, stream, lock, Room::Any);
        if heap.shown().0 > before {
            self.bound_all(slot);
        }
        served(done)
    }

    /// A block placed in the mapped pages of a stream heap left to the threads' heaps (never
    /// the heap asked first, which is not left), from the free ranges of `stream` there (never
    /// ordering `stream` after another), where mapping pages for it would take all heaps
    /// together beyond the peak of their live pages and its slack. The pages such a heap mapped
    /// while its threads took turns on it are then used by the heaps they moved to, not kept
    /// beside new ones, and no page moves. The block is that heap's, and its free goes there.
    /// Only left heaps lend: blocks lent by heaps in use would scatter each thread's blocks over
    /// the heaps, each page shared by more of them, and cost a lock of another heap at every
    /// lent allocation and its free.
    #[cold]
    fn borrow(&self, size: usize, align: usize, stream: StreamRef) -> Option<NonNull<u8>> {
        let (mapped, live) = self.totals();
        let peak = self.live_peak.load(Ordering::Relaxed).max(live);
        if mapped.saturating_add(size) <= self.bound(peak) {
            return None;
        }
        // Heaps held by other threads are asked again, waiting for their locks: a wait for
        // another thread's call is far shorter than mapping a page.
        let mut held = 0u32;
        for lock in [Lock::Try, Lock::Wait] {
            for i in by_stream(0)..by_stream(STREAM_HEAPS) {
                let Some(heap) = self.heaps[i]
                    .get()
                    .filter(|h| self.left(i) && h.shown().0 > 0)
                else {
                    continue;
                };
                if lock == Lock::Wait && held & (1 << (i - by_stream(0))) == 0 {
                    continue;
                }
                match heap.allocate_with(size, align, stream, lock, Room::Borrowed) {
                    Attempt::Done(Ok(p)) => {
                        HINT.with(|h| h.served.set(i));
                        self.borrowed.fetch_add(1, Ordering::Relaxed);
                        return Some(p);
                    }
                    Attempt::Held => held |= 1 << (i - by_stream(0)),
                    _ => {}
                }
            }
        }
        None
    }

    /// Frees `addr` on `stream` in heap `slot` if that heap exists and its ranges hold it; says
    /// whether they do.
    #[inline]
    fn free_in(&self, slot: usize, addr: usize, stream: StreamRef) -> bool {
        let heap = self.heaps.get(slot).and_then(|h| h.get());
        heap.is_some_and(|heap| heap.free_if_owned(addr, stream))
    }

    /// Frees `addr` in the heap whose ranges hold it, by the table of ranges, made again where
    /// it names none or a heap that no longer holds the range (ranges come and go: a heap's
    /// `release` gives back its free extra ranges); an address of no heap is ignored.
    fn free_by_routes(&self, addr: usize, stream: StreamRef) {
        let find = |routes: &[(usize, usize, usize)]| {
            let i = routes.partition_point(|r| r.0 <= addr).checked_sub(1)?;
            let (base, size, slot) = routes[i];
            (addr - base < size).then_some(slot)
        };
        let known = find(&self.routes.read().unwrap_or_else(PoisonError::into_inner));
        if known.is_some_and(|slot| self.free_in(slot, addr, stream)) {
            return;
        }
        let mut routes: Vec<(usize, usize, usize)> = Vec::new();
        for (slot, heap) in self.heaps.iter().enumerate() {
            if let Some(heap) = heap.get() {
                routes.extend(heap.ranges().into_iter().map(|(b, s)| (b, s, slot)));
            }
        }
        routes.sort_unstable();
        let slot = find(&routes);
        *self.routes.write().unwrap_or_else(PoisonError::into_inner) = routes;
        if let Some(slot) = slot {
            self.free_in(slot, addr, stream);
        }
    }
}

impl PagedHeaps<crate::leaf::DevicePages> {
    /// The stack to start with on `ctx`'s device: heaps over its pages at the device's
    /// granularity, with the default configuration.
    ///
    /// ```no_run
    /// use mrstack::prelude::*;
    ///
    /// # fn main() -> Result<(), AllocError> {
    /// let ctx = mrstack::cuda_context(0)?;
    /// let mr = PagedHeaps::for_context(&ctx)?;
    /// let v = DeviceVec::from_slice(&[1u32, 2, 3], &mr, &ctx.default_stream())?;
    /// assert_eq!(v.to_vec()?, [1, 2, 3]);
    /// # Ok(()) }
    /// ```
    pub fn for_context(ctx: &std::sync::Arc<cudarc::driver::CudaContext>) -> Result<Self> {
        Ok(Self::new(
            crate::leaf::DevicePages::new(ctx)?,
            PagedHeapsConfig::default(),
        ))
    }

    /// [`for_context`](Self::for_context) on device `ordinal`'s primary context.
    pub fn on_device(ordinal: usize) -> Result<Self> {
        Self::for_context(&crate::cuda_context(ordinal)?)
    }
}

// SAFETY: every block is a block of one heap, a `VirtualMemory` over a clone of `P` (clones of a
// page source map into the same device and keep its promises), so the properties are
// `VirtualMemory`'s; a free goes to the heap whose reserved ranges hold the address (ranges of
// different heaps are disjoint reservations), which frees only a block it handed out. Each heap's
// `synchronize` and `order_after` are its page source's alone, so calling them once on `P`'s
// original is calling them on every heap.
unsafe impl<P: PhysicalPages + Clone> MemoryResource for PagedHeaps<P> {
    page_leaf!();

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(p) = check_request::<Self>(size, align, NAME)? {
            return Ok(p);
        }
        // The stream's heap, unless threads meet there: then this thread's own.
        let by_stream = self.stream_heap(stream);
        if !self.left(by_stream) {
            // A stream heap that cannot be made (no address space for its range) leaves the
            // request to this thread's heap.
            if let Ok(heap) = self.heap(by_stream) {
                let mut tried = self.place_in(by_stream, heap, size, align, stream, Lock::Try);
                // A few threads that meet here wait for each other, so that their blocks share
                // one heap's pages; a crowd goes to its threads' heaps.
                if matches!(tried, Attempt::Held) && !self.met(by_stream) {
                    tried = self.place_in(by_stream, heap, size, align, stream, Lock::Wait);
                }
                match tried {
                    Attempt::Held | Attempt::NoRoom => {}
                    Attempt::Done(Err(e)) if e.is_out_of_memory() => {}
                    Attempt::Done(done) => return done,
                }
            }
        }
        let slot = shard::slot();
        let heap = self.heap(slot)?;
        let oom = || AllocError::out_of_memory(size, align, NAME);
        match self.place_in(slot, heap, size, align, stream, Lock::Wait) {
            // A request the device could never hold fails whatever the heaps give back.
            Attempt::Done(Err(e)) if e.is_out_of_memory() && !heap.never_fits(size, align) => {
                // Other heaps' free pages, given back, may make room (the heap gave back its
                // own already).
                let freed: usize = self
                    .heaps
                    .iter()
                    .enumerate()
                    .filter(|&(s, _)| s != slot)
                    .filter_map(|(_, h)| h.get())
                    .map(VirtualMemory::release)
                    .sum();
                if freed == 0 {
                    return Err(e);
                }
                self.place_in(slot, heap, size, align, stream, Lock::Wait)
                    .done_or(oom)
            }
            other => other.done_or(oom),
        }
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, _align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        let addr = ptr.as_ptr() as usize;
        // The heap that served this thread's last allocation first, then the stream's and the
        // thread's own, each looked up only if the one before does not hold the block: one of
        // them holds nearly every block, and each try is one lock. Then
        // the heap whose ranges hold it; an address of no heap is ignored, as each heap ignores
        // one it never handed out.
        let owns = |slot: usize| self.free_in(slot, addr, stream);
        let last = HINT.with(|h| h.served.get());
        if owns(last) {
            return;
        }
        let by_stream = self.stream_heap(stream);
        if by_stream != last && owns(by_stream) {
            return;
        }
        let own = shard::slot();
        if own != last && own != by_stream && owns(own) {
            return;
        }
        self.free_by_routes(addr, stream);
    }

    /// `paged(device=0, …)` (or `paged(simulated=…, …)`), leaving out what the defaults give.
    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (c, d) = (&self.config, PagedHeapsConfig::default());
        super::describe_page_leaf(
            f,
            "paged",
            &self.pages,
            &[
                ("cache", c.cache, d.cache),
                ("peak_slack", c.peak_slack, d.peak_slack),
            ],
        )
    }
}

static_assertions::assert_impl_all!(
    PagedHeaps<crate::leaf::DevicePages>: Send,
    Sync,
    crate::property::Accessible<crate::property::DeviceAccessible>
);
static_assertions::assert_not_impl_any!(
    PagedHeaps<crate::leaf::DevicePages>: crate::property::Accessible<crate::property::HostAccessible>
);
