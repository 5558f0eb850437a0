//! `Statistics<U>`: counts of bytes and allocations — current, peak and total — with nested scopes.

use crate::config::{ConfigError, FromItem, ItemSpec};
use crate::resource::{check_request, forward_upstream, Layer, MemoryResource, Result};
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::StreamRef;
use crate::units::Bytes;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
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

/// Lock-free counters for one quantity, as two running sums: everything allocated (`total`) and
/// everything freed (`freed`); `current` is their difference. An allocation then costs one atomic
/// add (and a `fetch_max` only when it sets a new peak), a deallocation one: four per
/// allocate/deallocate pair for bytes and counts together, where keeping `current` as its own
/// atomic would take six.
///
/// The price: with calls on several threads at once, the `current` an allocation computes for the
/// peak may miss an allocation or include a deallocation made at the same instant on another
/// thread, so the peak can read low by what those racing calls moved. Calls that do not overlap
/// are counted exactly.
/// Counts modulo 2^64: what is live (`total - freed`) is less than 2^64 bytes (live blocks are
/// disjoint ranges of a 64-bit address space), so the wrapping difference is exact whatever the
/// totals; no sum can overflow, whatever sizes a `Simulated` stack hands out.
#[derive(Debug, Default)]
struct AtomicCounter {
    total: AtomicU64,
    freed: AtomicU64,
    peak: AtomicU64,
}

impl AtomicCounter {
    #[inline]
    fn add(&self, n: u64) {
        let total = self.total.fetch_add(n, AcqRel).wrapping_add(n);
        let now = total.wrapping_sub(self.freed.load(Acquire));
        // A racing thread's free may be seen before its allocation is: the difference is then
        // "negative" (wrapped above 2^63), and is no peak. So a peak reads low under races, never
        // high; and live byte counts above 2^63 (only `Simulated` can hand those out) are not
        // recorded as peaks.
        if (now as i64) > 0 && now > self.peak.load(Relaxed) {
            self.peak.fetch_max(now, Relaxed);
        }
    }

    #[inline]
    fn sub(&self, n: u64) {
        // Release: a reader that sees this free also sees the allocation it frees (which happened
        // before it), so `total - freed` never counts a free without its allocation.
        self.freed.fetch_add(n, Release);
    }

    fn get(&self) -> Counter {
        let freed = self.freed.load(Acquire);
        let total = self.total.load(Acquire);
        Counter {
            current: i128::from(total.wrapping_sub(freed)),
            peak: i128::from(self.peak.load(Relaxed)),
            total: i128::from(total),
        }
    }

    fn reset_peak(&self) {
        let c = self.get();
        self.peak.store(c.current as u64, Relaxed);
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
/// Two atomic additions per allocation, two per deallocation (no lock) while no scope is open, plus
/// a `fetch_max` for a counter that reaches a new peak and one relaxed load of the "scope open"
/// flag; with [`push_scope`](Self::push_scope) open, one extra mutex per call. Counts are exact for
/// calls that do not overlap; when calls race on several threads, a peak may read low by what the
/// racing calls moved, never high. Memory: three 64-bit atomics per counter and the scope stack.
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
    bytes: AtomicCounter,
    allocations: AtomicCounter,
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
            bytes: AtomicCounter::default(),
            allocations: AtomicCounter::default(),
            scoped: AtomicBool::new(false),
            scopes: Mutex::new(Vec::new()),
        }
    }
}

impl<U> Statistics<U> {
    /// The counters over the adaptor's whole life (peaks since the last [`reset_peak`](Self::reset_peak)).
    pub fn stats(&self) -> Stats {
        Stats {
            bytes: self.bytes.get(),
            allocations: self.allocations.get(),
        }
    }

    /// The byte counters: `stats().bytes`.
    pub fn bytes(&self) -> Counter {
        self.bytes.get()
    }

    /// The allocation counters: `stats().allocations`.
    pub fn allocations(&self) -> Counter {
        self.allocations.get()
    }

    /// Sets both peaks to the current values, so that the next peak is measured from now
    /// (PyTorch's `reset_peak_memory_stats`). Open scopes keep their own peaks.
    pub fn reset_peak(&self) {
        self.bytes.reset_peak();
        self.allocations.reset_peak();
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
        self.bytes.add(size as u64);
        self.allocations.add(1);
        if self.scoped.load(Relaxed) {
            if let Some(top) = self.lock_scopes().last_mut() {
                top.allocated(size as i128);
            }
        }
    }

    #[inline]
    fn count_deallocation(&self, size: usize) {
        self.bytes.sub(size as u64);
        self.allocations.sub(1);
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

    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        ItemWriter::over(f, &self.upstream, "statistics").finish()
    }

    fn upstream_layer(&self) -> Option<&dyn crate::stack::AnyLayer>
    where
        Self: 'static,
    {
        Some(&self.upstream)
    }
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

impl FromItem for StatisticsConfig {
    /// `statistics` (no fields).
    fn from_item(item: &ItemSpec) -> Result<Self, ConfigError> {
        item.check_fields(&[])?;
        Ok(StatisticsConfig {})
    }
}

static_assertions::assert_impl_all!(Statistics<crate::System>: Send, Sync, crate::Accessible<crate::HostAccessible>);
static_assertions::assert_impl_all!(
    Statistics<crate::Managed>: Send,
    Sync,
    crate::Accessible<(crate::HostAccessible, crate::DeviceAccessible)>,
    crate::Accessible<crate::Migratable>
);
static_assertions::assert_not_impl_any!(Statistics<crate::Cuda>: crate::Accessible<crate::HostAccessible>);
static_assertions::assert_eq_size!(StatisticsConfig, ());
