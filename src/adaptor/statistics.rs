//! `Statistics<U>`: counts of bytes and allocations — current, peak and total — with nested scopes.

use crate::resource::{check_request, forward_upstream, Layer, MemoryResource, Result};
use crate::shard::{Reading, Sharded};
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::StreamRef;
use crate::units::Bytes;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

/// One quantity (bytes or allocations): now, the most at once, and the sum of all allocations.
///
/// Signed, as RMM's: a [scope](Statistics::push_scope) that frees memory allocated before it opened
/// sees its `current` go below zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Counter {
    /// Allocated now (allocations minus deallocations).
    pub current: i128,
    /// The largest `current` seen (since creation, the scope's start, or the last `reset_peak`).
    pub peak: i128,
    /// The sum of every allocation, whatever was freed since (modulo 2^64 for the whole-life
    /// counters: 16 EiB of allocations before it wraps).
    pub total: i128,
}

impl Counter {
    fn add(&mut self, n: i128) {
        self.current += n;
        self.peak = self.peak.max(self.current);
        self.total += n;
    }

    fn sub(&mut self, n: i128) {
        self.current -= n;
    }

    /// Folds a finished inner scope into this one, as RMM's `add_counters_from_tracked_sub_block`.
    fn absorb(&mut self, inner: Counter) {
        self.peak = self.peak.max(self.current + inner.peak);
        self.current += inner.current;
        self.total += inner.total;
    }
}

/// The byte and allocation counters of a [`Statistics`] adaptor or of one of its scopes.
///
/// Its `Display` is one line for logs:
///
/// ```
/// use mrstack::prelude::*;
///
/// let mr = resource_stack![Simulated::new(1 << 30), Statistics];
/// let a = mr.allocate(1 << 20, 256, StreamRef::DEFAULT).unwrap();
/// let b = mr.allocate(512, 256, StreamRef::DEFAULT).unwrap();
/// // SAFETY: a came from mr with this size and alignment.
/// unsafe { mr.deallocate(a, 1 << 20, 256, StreamRef::DEFAULT) };
/// assert_eq!(
///     mr.stats().to_string(),
///     "bytes 512 B (peak 1.00 MiB, total 1.00 MiB), allocations 1 (peak 2, total 2)"
/// );
/// # unsafe { mr.deallocate(b, 512, 256, StreamRef::DEFAULT) };
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Stats {
    /// Bytes requested.
    pub bytes: Counter,
    /// Allocations (zero-size requests are not counted: they take no memory).
    pub allocations: Counter,
}

/// A byte count as [`Bytes`] shows it, with a sign: a scope's `current` goes below zero when it
/// frees memory allocated before it opened.
struct SignedBytes(i128);

impl fmt::Display for SignedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let bytes = Bytes(u64::try_from(self.0.unsigned_abs()).unwrap_or(u64::MAX));
        f.pad(&format!("{sign}{bytes}"))
    }
}

impl fmt::Display for Stats {
    /// `bytes 1.46 KiB (peak 2.93 KiB, total 4.39 KiB), allocations 2 (peak 4, total 6)`: bytes in
    /// powers of 1024, as [`Bytes`] shows them. The two peaks are each counter's own, perhaps
    /// reached at different times.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (b, a) = (&self.bytes, &self.allocations);
        write!(
            f,
            "bytes {} (peak {}, total {}), allocations {} (peak {}, total {})",
            SignedBytes(b.current),
            SignedBytes(b.peak),
            SignedBytes(b.total),
            a.current,
            a.peak,
            a.total
        )
    }
}

impl Stats {
    fn allocated(&mut self, size: i128) {
        self.bytes.add(size);
        self.allocations.add(1);
    }

    fn freed(&mut self, size: i128) {
        self.bytes.sub(size);
        self.allocations.sub(1);
    }
}

/// How far a thread reserves ahead of what it has live, for bytes and for allocations: each
/// thread touches the shared totals once per chunk of growth, and with several threads a peak
/// can read high by at most twice this per other thread.
const CHUNKS: [i64; 2] = [1 << 20, 16];

fn counter(r: Reading) -> Counter {
    Counter {
        current: i128::from(r.current),
        peak: i128::from(r.peak),
        total: i128::from(r.total),
    }
}

/// Counts bytes and allocations going through to `U`.
///
/// It counts what passes through — bytes and allocations, current, peak and total — as RMM's
/// `statistics_resource_adaptor` and PyTorch's `memory_stats` do: [`stats`](Self::stats) over the
/// adaptor's whole life, [`reset_peak`](Self::reset_peak) to measure the next peak from now, and
/// nested scopes ([`push_scope`](Self::push_scope) / [`pop_scope`](Self::pop_scope), RMM's
/// `push_counters` / `pop_counters`) with counters of their own. It counts requested sizes, not
/// what the upstream rounds them to.
///
/// # Cost
///
/// No lock-prefixed instruction per call while no scope is open: each thread counts in a shard of
/// its own (plain loads and stores on its own cache line; the first 64 live threads get one,
/// later ones share an atomic shard), and touches the shared totals only when its count grows a
/// chunk (1 MiB, 16 allocations) beyond what it reserved, or shrinks two chunks below, and a
/// `fetch_max` when an allocation sets a new peak. With [`push_scope`](Self::push_scope) open,
/// one extra mutex per call. Memory: 8.3 KiB of shards.
///
/// # Exactness
///
/// `current` and `total` are exact once the calls in flight are done: reading sums the shards.
/// A peak is checked at each allocation as the thread's own live count plus what every other
/// thread holds reserved, which is at least what those threads have live: so the peak is exact
/// while one thread at a time uses the adaptor (threads that have exited hold nothing reserved;
/// see [`std::thread::JoinHandle::join`]: a scoped thread's end can be seen before its
/// thread-locals are gone), and with several threads it can read high by at most two chunks
/// (2 MiB, 32 allocations) per other thread that holds a reservation, never low for calls that
/// do not overlap. A scope's counters are exact (they are kept under its mutex).
///
/// # Streams
///
/// The stream of each call goes to the upstream unchanged, and the counters ignore it;
/// `synchronize` and `order_after` are forwarded to the upstream. It keeps no stream alive.
///
/// # Upstream
///
/// Requires nothing of its upstream and keeps its properties and alignment; every call goes
/// through (the counting happens after a successful `allocate` and before `deallocate`).
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
///
/// let sim = Simulated::new(1 << 30);
/// let mr = resource_stack![&sim, Statistics];
/// let a = mr.allocate(1000, 256, StreamRef::DEFAULT).unwrap();
/// let b = mr.allocate(500, 256, StreamRef::DEFAULT).unwrap();
/// // SAFETY: a came from mr with this size and alignment.
/// unsafe { mr.deallocate(a, 1000, 256, StreamRef::DEFAULT) };
/// let s = mr.stats();
/// assert_eq!((s.bytes.current, s.bytes.peak, s.bytes.total), (500, 1500, 1500));
/// assert_eq!((s.allocations.current, s.allocations.peak, s.allocations.total), (1, 2, 2));
/// # unsafe { mr.deallocate(b, 500, 256, StreamRef::DEFAULT) };
/// ```
#[derive(Debug)]
pub struct Statistics<U> {
    upstream: U,
    /// Bytes (quantity 0) and allocations (quantity 1).
    counters: Sharded<2>,
    /// True while `scopes` is not empty: the hot path reads only this flag when no scope is open.
    scoped: AtomicBool,
    scopes: Mutex<Vec<Stats>>,
}

impl<U: MemoryResource> Statistics<U> {
    const NAME: &'static str = "Statistics";

    /// Counts what goes to `upstream`.
    pub fn new(upstream: U) -> Self {
        Statistics {
            upstream,
            counters: Sharded::new(CHUNKS, [i64::MAX; 2]),
            scoped: AtomicBool::new(false),
            scopes: Mutex::new(Vec::new()),
        }
    }
}

impl<U> Statistics<U> {
    /// The counters over the adaptor's whole life (peaks since the last [`reset_peak`](Self::reset_peak)).
    pub fn stats(&self) -> Stats {
        Stats {
            bytes: self.bytes(),
            allocations: self.allocations(),
        }
    }

    /// The byte counters: `stats().bytes`.
    pub fn bytes(&self) -> Counter {
        counter(self.counters.read(0))
    }

    /// The allocation counters: `stats().allocations`.
    pub fn allocations(&self) -> Counter {
        counter(self.counters.read(1))
    }

    /// Sets both peaks to the current values, so that the next peak is measured from now
    /// (PyTorch's `reset_peak_memory_stats`). Open scopes keep their own peaks.
    pub fn reset_peak(&self) {
        self.counters.reset_peak(0);
        self.counters.reset_peak(1);
    }

    /// Opens a nested scope with counters at zero: from now until the matching
    /// [`pop_scope`](Self::pop_scope), every call is counted in it as well (RMM's `push_counters`).
    /// Scopes nest; while any is open each call takes a mutex.
    pub fn push_scope(&self) {
        let mut scopes = self.lock_scopes();
        scopes.push(Stats::default());
        self.scoped.store(true, Relaxed);
    }

    /// Closes the innermost scope and returns its counters, which are folded into the enclosing
    /// scope (its peak becomes at least its current plus the inner peak), as RMM's `pop_counters`.
    /// `None` when no scope is open.
    pub fn pop_scope(&self) -> Option<Stats> {
        let mut scopes = self.lock_scopes();
        let inner = scopes.pop()?;
        match scopes.last_mut() {
            Some(outer) => {
                outer.bytes.absorb(inner.bytes);
                outer.allocations.absorb(inner.allocations);
            }
            None => self.scoped.store(false, Relaxed),
        }
        Some(inner)
    }

    /// The counters of the innermost open scope, `None` when no scope is open.
    pub fn scope_stats(&self) -> Option<Stats> {
        self.lock_scopes().last().copied()
    }

    /// The number of open scopes.
    pub fn scope_depth(&self) -> usize {
        self.lock_scopes().len()
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// Unwraps the adaptor.
    pub fn into_inner(self) -> U {
        self.upstream
    }

    fn lock_scopes(&self) -> std::sync::MutexGuard<'_, Vec<Stats>> {
        // Every update under the lock is a few additions that cannot panic halfway: a poisoned
        // lock still holds consistent counters.
        self.scopes.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[inline]
    fn count_allocation(&self, size: usize) {
        // No limit: the shards cannot refuse.
        let _ = self.counters.add([size as u64, 1], true);
        if self.scoped.load(Relaxed) {
            if let Some(top) = self.lock_scopes().last_mut() {
                top.allocated(size as i128);
            }
        }
    }

    #[inline]
    fn count_deallocation(&self, size: usize) {
        self.counters.sub([size as u64, 1]);
        if self.scoped.load(Relaxed) {
            if let Some(top) = self.lock_scopes().last_mut() {
                top.freed(size as i128);
            }
        }
    }
}

// SAFETY: every allocation is the upstream's, returned unchanged; the counters do not touch memory.
unsafe impl<U: MemoryResource> MemoryResource for Statistics<U> {
    forward_upstream!(U, upstream);

    #[inline]
    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(empty) = check_request::<Self>(size, align, Self::NAME)? {
            return Ok(empty);
        }
        let ptr = self.upstream.allocate(size, align, stream)?;
        self.count_allocation(size);
        Ok(ptr)
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        self.count_deallocation(size);
        // SAFETY: forwarded from the caller.
        unsafe { self.upstream.deallocate(ptr, size, align, stream) }
    }

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        ItemWriter::over(f, &self.upstream, "statistics").finish()
    }

    forward_upstream!(layer over upstream);
}

has_upstream!(impl<U> for Statistics<U>);

/// `resource_stack!` configuration of [`Statistics`]: `Statistics` (no fields).
#[derive(Debug, Clone, Copy, Default)]
pub struct StatisticsConfig {}

impl<U: MemoryResource> Layer<U> for StatisticsConfig {
    type Resource = Statistics<U>;
    fn layer(self, upstream: U) -> Statistics<U> {
        Statistics::new(upstream)
    }
}

crate::property::assert_keeps_properties!(Statistics);
static_assertions::assert_impl_all!(
    Statistics<crate::leaf::Managed>: Send,
    Sync,
    crate::property::Accessible<(crate::property::HostAccessible, crate::property::DeviceAccessible)>,
    crate::property::Accessible<crate::property::Migratable>
);
static_assertions::assert_eq_size!(StatisticsConfig, ());
