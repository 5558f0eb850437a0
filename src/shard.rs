//! Per-thread shards: a small index for each live thread, and counters that a thread updates
//! with no lock-prefixed instruction, reserving from a shared total only in chunks.
//!
//! Why: on the hosts mrstack runs on, each lock-prefixed atomic costs ~10 ns, and one shared
//! counter's cache line bouncing between 8 cores costs far more. `Statistics` and `Limiting`
//! would pay that on every call. Here each thread writes only its own shard (plain loads and
//! stores, which compile to `mov`), and touches the shared total only when its running count
//! leaves the reservation it holds — a chunk at a time.
//!
//! The shared total `reserved` is the sum of every shard's reservation: at least what each shard
//! has live, at most `2 × chunk` more. So `my live + (reserved - my reservation)` is an upper
//! bound on everything live, exact when no other thread holds a reservation — one thread at a
//! time, or threads that have exited (a thread gives its slack back when it exits).
//!
//! A shard's own counts are not bounded by what is live: a thread that allocates what another
//! frees counts up without end, the other down. So they are kept modulo 2^64 (wrapping), and
//! only their differences are compared: a shard's reservation minus its live count is its slack,
//! small and exact, and the shards' sum, `reserved`, is the true total. The counts themselves are
//! never compared: once wrapped, they would let a limit be passed (and overflow in debug builds).

use std::cell::{Cell, RefCell, UnsafeCell};
use std::marker::PhantomData;
use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
use std::sync::{Arc, Weak};

/// A value on cache lines of its own: side by side, two threads' heaps would share a line (the
/// mutex word, the counters each call updates) and every call would move it between cores.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct Line<T>(pub(crate) T);

impl<T> std::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Live threads that get a shard of their own; threads beyond share one, with atomic updates.
pub(crate) const SLOTS: usize = 64;

/// The token of a thread with no slot of its own (more than [`SLOTS`] threads alive, or a thread
/// whose thread-locals are being destroyed): its slot is `SLOTS`, the shared one.
const OVERFLOW: u64 = SLOTS as u64;
/// Not claimed yet.
const UNCLAIMED: u64 = u64::MAX;

/// Which slots are taken, one bit each.
static TAKEN: AtomicU64 = AtomicU64::new(0);
/// Claims so far: each claim's token carries a new generation, so that a shard knows whether its
/// slot's current owner has registered its exit with the shard's owner.
static CLAIMS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// `slot | generation << 8`, or [`UNCLAIMED`] / [`OVERFLOW`]. No destructor, so it can be
    /// read at any time, even while the thread's other thread-locals are destroyed.
    static TOKEN: Cell<u64> = const { Cell::new(UNCLAIMED) };
    /// Gives the slot back, and each shard set's slack, when the thread exits.
    static EXIT: Exit = const { Exit { hooks: RefCell::new(Vec::new()) } };
}

/// What a thread does when it exits: each shard set it used flushes its slot, then the slot goes.
struct Exit {
    hooks: RefCell<Vec<Weak<dyn Flush>>>,
}

impl Drop for Exit {
    fn drop(&mut self) {
        let token = TOKEN.with(Cell::get);
        let Some(slot) = own_slot(token) else { return };
        // No shard may be written for this slot from now on: the slot is shared from here.
        TOKEN.with(|t| t.set(OVERFLOW));
        for hook in self.hooks.get_mut().drain(..) {
            if let Some(set) = hook.upgrade() {
                set.flush(slot);
            }
        }
        // Release: the next owner of the slot sees every write this thread made to its shards.
        TAKEN.fetch_and(!(1u64 << slot), Release);
    }
}

/// A shard set that gives back what a thread's slot holds when the thread exits.
pub(crate) trait Flush: Send + Sync {
    fn flush(&self, slot: usize);
}

fn own_slot(token: u64) -> Option<usize> {
    (token != UNCLAIMED && token != OVERFLOW).then_some((token & 0xff) as usize)
}

/// This thread's token: its slot in the low 8 bits (`SLOTS` for the shared one) and the claim's
/// generation above. Claims the lowest free slot on first use.
#[inline]
pub(crate) fn token() -> u64 {
    let t = TOKEN.with(Cell::get);
    if t != UNCLAIMED {
        return t;
    }
    claim()
}

/// This thread's slot: below [`SLOTS`] its own, `SLOTS` the shared one.
#[inline]
pub(crate) fn slot() -> usize {
    slot_of(token())
}

/// The slot of a token: below [`SLOTS`] a thread's own, `SLOTS` the shared one.
#[inline]
pub(crate) fn slot_of(token: u64) -> usize {
    (token & 0xff) as usize
}

#[cold]
fn claim() -> u64 {
    // The exit hook must exist before the slot is taken, or the slot would never come back.
    if EXIT.try_with(|_| ()).is_err() {
        return OVERFLOW;
    }
    let mut taken = TAKEN.load(Relaxed);
    let token = loop {
        let free = !taken;
        if free == 0 {
            break OVERFLOW;
        }
        let slot = free.trailing_zeros() as u64;
        // Acquire: this thread sees what the slot's last owner wrote to its shards.
        match TAKEN.compare_exchange_weak(taken, taken | 1 << slot, Acquire, Relaxed) {
            Ok(_) => break slot | (CLAIMS.fetch_add(1, Relaxed) + 1) << 8,
            Err(now) => taken = now,
        }
    };
    TOKEN.with(|t| t.set(token));
    token
}

/// Registers `set` to be flushed when this thread exits. Returns false when this thread's
/// thread-locals are gone (it then has no slot of its own either).
pub(crate) fn on_exit(set: Weak<dyn Flush>) -> bool {
    EXIT.try_with(|e| {
        // Taken already: this call came from inside the push below, through a global allocator
        // built on a sharded adaptor. Its thread uses the shared slot for this set instead.
        let Ok(mut hooks) = e.hooks.try_borrow_mut() else {
            return false;
        };
        // Sets dropped since go, so that a thread using many short-lived sets holds few.
        if hooks.len() >= 8 && hooks.len().is_power_of_two() {
            hooks.retain(|h| h.strong_count() > 0);
        }
        hooks.push(set);
        true
    })
    .unwrap_or(false)
}

/// One quantity's part of a shard, written only by the slot's owner (or with atomic
/// read-modify-writes in the shared slot).
#[derive(Debug, Default)]
struct Part {
    /// Allocated minus freed through this slot (negative where it freed what others allocated).
    live: AtomicI64,
    /// What this slot holds of `reserved`: always at least `live`, at most `live + 2 × chunk`.
    reservation: AtomicI64,
    total: AtomicU64,
    freed: AtomicU64,
}

/// One slot's parts, on a cache line of its own (two on CPUs that fetch lines in pairs).
#[derive(Debug)]
#[repr(align(128))]
struct Shard<const N: usize> {
    parts: [Part; N],
    /// The token of the owner that registered its exit with this set.
    hooked: AtomicU64,
}

impl<const N: usize> Default for Shard<N> {
    fn default() -> Self {
        Shard {
            parts: std::array::from_fn(|_| Part::default()),
            hooked: AtomicU64::new(UNCLAIMED),
        }
    }
}

/// The shared part of one quantity.
#[derive(Debug)]
struct Global {
    /// The sum of every slot's reservation, plus what the shared slot has live.
    reserved: AtomicI64,
    /// The largest bound on what was live seen by an allocation.
    peak: AtomicI64,
    chunk: i64,
    /// The most `reserved` may reach (`i64::MAX`: no limit).
    limit: i64,
    /// Set when a reservation was refused: threads then reserve only what they need and give
    /// all their slack back at each subtraction, until `reserved` falls to half the limit.
    tight: AtomicBool,
}

impl Global {
    /// Adds `n` to `reserved` unless that passes the limit; returns whether it did. With no
    /// limit, counts wrap (modulo 2^64 like the totals) rather than refuse.
    fn reserve(&self, n: i64) -> bool {
        self.reserved
            .fetch_update(AcqRel, Acquire, |r| {
                if self.limit == i64::MAX {
                    Some(r.wrapping_add(n))
                } else {
                    r.checked_add(n).filter(|&v| v <= self.limit)
                }
            })
            .is_ok()
    }
}

#[derive(Debug)]
struct Inner<const N: usize> {
    /// In the `Arc`'s own allocation: one pointer from the adaptor to a thread's shard.
    shards: [Shard<N>; SLOTS + 1],
    globals: [Global; N],
}

impl<const N: usize> Flush for Inner<N> {
    fn flush(&self, slot: usize) {
        for (part, global) in self.shards[slot].parts.iter().zip(&self.globals) {
            let live = part.live.load(Relaxed);
            let slack = part.reservation.load(Relaxed).wrapping_sub(live);
            if slack != 0 {
                global.reserved.fetch_sub(slack, AcqRel);
                part.reservation.store(live, Relaxed);
            }
        }
    }
}

/// One quantity, read: live now, the peak, the sum of all additions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reading {
    /// Modulo 2^64, as the totals: what is live is less than 2^64 (live blocks are disjoint
    /// ranges of a 64-bit address space), so the wrapping difference is exact.
    pub(crate) current: u64,
    pub(crate) peak: i64,
    pub(crate) total: u64,
}

/// `N` counted quantities (bytes, allocations, …), sharded by thread. See the module docs.
#[derive(Debug)]
pub(crate) struct Sharded<const N: usize> {
    inner: Arc<Inner<N>>,
}

/// A [`Sharded::add`] that would pass a quantity's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OverLimit;

impl<const N: usize> Sharded<N> {
    /// Quantities with these chunks (how much a thread reserves beyond what it needs) and limits
    /// (`i64::MAX`: none).
    pub(crate) fn new(chunks: [i64; N], limits: [i64; N]) -> Self {
        Sharded {
            inner: Arc::new(Inner {
                shards: std::array::from_fn(|_| Shard::default()),
                globals: std::array::from_fn(|q| Global {
                    reserved: AtomicI64::new(0),
                    peak: AtomicI64::new(0),
                    chunk: chunks[q].max(0),
                    limit: limits[q],
                    tight: AtomicBool::new(false),
                }),
            }),
        }
    }

    /// This thread's shard, registering its exit with this set first.
    #[inline]
    fn shard(&self) -> (usize, &Shard<N>) {
        let token = token();
        let slot = slot_of(token);
        let shard = &self.inner.shards[slot];
        if slot < SLOTS && shard.hooked.load(Relaxed) != token {
            return self.hook(token, slot);
        }
        (slot, shard)
    }

    #[cold]
    fn hook(&self, token: u64, slot: usize) -> (usize, &Shard<N>) {
        let inner: Arc<dyn Flush> = self.inner.clone();
        if on_exit(Arc::downgrade(&inner)) {
            self.inner.shards[slot].hooked.store(token, Relaxed);
            (slot, &self.inner.shards[slot])
        } else {
            (SLOTS, &self.inner.shards[SLOTS])
        }
    }

    /// Adds `amounts`, tracking the peaks when `peaks`; fails (adding nothing) when a quantity
    /// would pass its limit.
    #[inline]
    pub(crate) fn add(&self, amounts: [u64; N], peaks: bool) -> Result<(), OverLimit> {
        let (slot, shard) = self.shard();
        if slot == SLOTS {
            return self.add_shared(shard, amounts, peaks);
        }
        // Reservations first, so that a limit refuses before anything is counted.
        let mut lives = [0i64; N];
        for q in 0..N {
            let part = &shard.parts[q];
            lives[q] = part.live.load(Relaxed).wrapping_add(amounts[q] as i64);
            // Differences only: the counts themselves wrap (module docs).
            let short = lives[q].wrapping_sub(part.reservation.load(Relaxed));
            if short > 0 {
                // On a refusal, reservations already made for this call's earlier quantities
                // stay as slack, which the next free trims.
                self.reserve(q, part, short)?;
            }
        }
        for q in 0..N {
            let part = &shard.parts[q];
            // Only this thread writes its shard: a load and a store, no lock prefix.
            part.live.store(lives[q], Relaxed);
            part.total
                .store(part.total.load(Relaxed).wrapping_add(amounts[q]), Relaxed);
            if peaks {
                let global = &self.inner.globals[q];
                let others = global
                    .reserved
                    .load(Acquire)
                    .wrapping_sub(part.reservation.load(Relaxed));
                let bound = lives[q].wrapping_add(others);
                if bound > global.peak.load(Relaxed) {
                    global.peak.fetch_max(bound, Relaxed);
                }
            }
        }
        Ok(())
    }

    /// Takes `need` more of quantity `q`'s shared total for `part`, and a chunk beyond when the
    /// limit allows.
    #[cold]
    fn reserve(&self, q: usize, part: &Part, need: i64) -> Result<(), OverLimit> {
        let global = &self.inner.globals[q];
        let mut got = None;
        let ahead = if global.tight.load(Relaxed) {
            0
        } else {
            global.chunk
        };
        for want in [need.saturating_add(ahead), need] {
            if global.reserve(want) {
                got = Some(want);
                break;
            }
        }
        let Some(want) = got else {
            global.tight.store(true, Relaxed);
            return Err(OverLimit);
        };
        part.reservation
            .store(part.reservation.load(Relaxed).wrapping_add(want), Relaxed);
        Ok(())
    }

    #[cold]
    fn add_shared(
        &self,
        shard: &Shard<N>,
        amounts: [u64; N],
        peaks: bool,
    ) -> Result<(), OverLimit> {
        for q in 0..N {
            let global = &self.inner.globals[q];
            let n = amounts[q] as i64;
            if !global.reserve(n) {
                for (g, &a) in self.inner.globals.iter().zip(&amounts).take(q) {
                    g.reserved.fetch_sub(a as i64, AcqRel);
                }
                return Err(OverLimit);
            }
        }
        for ((part, global), &n) in shard.parts.iter().zip(&self.inner.globals).zip(&amounts) {
            part.live.fetch_add(n as i64, Relaxed);
            part.total.fetch_add(n, Relaxed);
            if peaks {
                // The shared slot's live is in `reserved` itself: the bound is `reserved`.
                let bound = global.reserved.load(Acquire);
                global.peak.fetch_max(bound, Relaxed);
            }
        }
        Ok(())
    }

    /// Subtracts `amounts`.
    #[inline]
    pub(crate) fn sub(&self, amounts: [u64; N]) {
        let (slot, shard) = self.shard();
        for ((part, global), &amount) in shard.parts.iter().zip(&self.inner.globals).zip(&amounts) {
            let n = amount as i64;
            if slot == SLOTS {
                part.live.fetch_sub(n, Relaxed);
                part.freed.fetch_add(amount, Relaxed);
                global.reserved.fetch_sub(n, AcqRel);
                continue;
            }
            let live = part.live.load(Relaxed).wrapping_sub(n);
            part.live.store(live, Relaxed);
            part.freed
                .store(part.freed.load(Relaxed).wrapping_add(amount), Relaxed);
            let reservation = part.reservation.load(Relaxed);
            let keep = if global.tight.load(Relaxed) {
                0
            } else {
                global.chunk
            };
            let slack = reservation.wrapping_sub(live);
            if slack > keep.saturating_mul(2) {
                // Keep one chunk of slack (none near the limit); give the rest back for other
                // threads.
                let give = slack - keep;
                let left = global.reserved.fetch_sub(give, AcqRel).wrapping_sub(give);
                part.reservation
                    .store(reservation.wrapping_sub(give), Relaxed);
                if keep == 0 && left <= global.limit / 2 {
                    global.tight.store(false, Relaxed);
                }
            }
        }
    }

    /// Quantity `q` now: exact when no call is in flight on another thread.
    pub(crate) fn read(&self, q: usize) -> Reading {
        let (mut freed, mut total) = (0u64, 0u64);
        for shard in self.inner.shards.iter() {
            let part = &shard.parts[q];
            // A slot that freed what another allocated can be read before that other: the sum
            // may be off while calls are in flight, and is exact once they are done.
            freed = freed.wrapping_add(part.freed.load(Acquire));
            total = total.wrapping_add(part.total.load(Acquire));
        }
        let current = total.wrapping_sub(freed);
        // Live counts above 2^63 (only `Simulated` hands those out) are no peak.
        let peak = self.inner.globals[q].peak.load(Relaxed);
        Reading {
            current,
            peak: i64::try_from(current).map_or(peak, |c| peak.max(c)),
            total,
        }
    }

    /// Sets quantity `q`'s peak to what is live now.
    pub(crate) fn reset_peak(&self, q: usize) {
        let current = i64::try_from(self.read(q).current).unwrap_or(0);
        self.inner.globals[q].peak.store(current, Relaxed);
    }

    /// What the other threads hold beyond what they have live, for quantity `q`, as seen from
    /// this thread.
    #[cfg(test)]
    pub(crate) fn slack_elsewhere(&self, q: usize) -> i64 {
        let (slot, _) = self.shard();
        let mut slack = 0;
        for (i, shard) in self.inner.shards.iter().enumerate() {
            if i != slot && i != SLOTS {
                let p = &shard.parts[q];
                slack += p
                    .reservation
                    .load(Relaxed)
                    .wrapping_sub(p.live.load(Relaxed));
            }
        }
        slack
    }
}

/// A lock for data that one thread uses almost always alone (a thread slot's cache or buffer):
/// taking it is one compare-and-swap and releasing it a plain store, where std's `Mutex`
/// releases with a second locked instruction (to look for sleepers). A thread that finds it
/// taken spins briefly, then yields: it is held for a few pushes and pops at a time.
pub(crate) struct SlotLock<T> {
    taken: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a `SlotGuard` (or `&mut self`), and `taken` lets one
// guard exist at a time, handing the value from thread to thread with Acquire/Release: what a
// `Mutex<T>` promises, so the same bound.
unsafe impl<T: Send> Sync for SlotLock<T> {}

impl<T: Default> Default for SlotLock<T> {
    fn default() -> Self {
        SlotLock {
            taken: AtomicBool::new(false),
            value: UnsafeCell::new(T::default()),
        }
    }
}

impl<T> std::fmt::Debug for SlotLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotLock").finish_non_exhaustive()
    }
}

impl<T> SlotLock<T> {
    #[inline]
    pub(crate) fn lock(&self) -> SlotGuard<'_, T> {
        if self
            .taken
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            self.wait();
        }
        SlotGuard(self, PhantomData)
    }

    /// Takes the lock if it is free.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<SlotGuard<'_, T>> {
        self.taken
            .compare_exchange(false, true, Acquire, Relaxed)
            .is_ok()
            .then(|| SlotGuard(self, PhantomData))
    }

    #[cold]
    fn wait(&self) {
        let mut looks = 0u32;
        loop {
            while self.taken.load(Relaxed) {
                looks += 1;
                if looks < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if self
                .taken
                .compare_exchange_weak(false, true, Acquire, Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn into_inner(self) -> T {
        self.value.into_inner()
    }
}

/// The one way to the value of a taken [`SlotLock`]; releases it when dropped (a panic while it
/// is held releases it too: the callers' updates cannot stop halfway). It is `Send` and `Sync`
/// as `&mut T` is (the marker): shared, it lends `&T`, so it is `Sync` only for `T: Sync`.
pub(crate) struct SlotGuard<'a, T>(&'a SlotLock<T>, PhantomData<&'a mut T>);

impl<T> std::ops::Deref for SlotGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard is the only one (the lock is taken until it drops).
        unsafe { &*self.0.value.get() }
    }
}

impl<T> std::ops::DerefMut for SlotGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as above, and `&mut self` makes this the only reference through it.
        unsafe { &mut *self.0.value.get() }
    }
}

impl<T> Drop for SlotGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.0.taken.store(false, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_lock_lets_one_thread_in_at_a_time() {
        let lock = SlotLock::<u64>::default();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        let mut g = lock.lock();
                        // A read and a write apart: lost updates would show.
                        let v = *g;
                        std::hint::black_box(&mut *g);
                        *g = v + 1;
                    }
                });
            }
        });
        assert_eq!(lock.into_inner(), 80_000);
    }

    #[test]
    fn one_thread_is_exact() {
        let s = Sharded::<2>::new([1 << 20, 64], [i64::MAX; 2]);
        s.add([1000, 1], true).unwrap();
        s.add([500, 1], true).unwrap();
        s.sub([1000, 1]);
        let r = s.read(0);
        assert_eq!((r.current, r.peak, r.total), (500, 1500, 1500));
        let r = s.read(1);
        assert_eq!((r.current, r.peak, r.total), (1, 2, 2));
        s.reset_peak(0);
        assert_eq!(s.read(0).peak, 500);
        s.sub([500, 1]);
        assert_eq!(s.read(0).current, 0);
    }

    #[test]
    fn a_thread_that_exits_gives_its_slack_back() {
        let s = Arc::new(Sharded::<1>::new([1 << 20], [i64::MAX]));
        // `join` returns after the thread's thread-locals are gone (a scoped thread's end can be
        // seen before).
        let there = s.clone();
        std::thread::spawn(move || there.add([4096], true).unwrap())
            .join()
            .unwrap();
        // The other thread's block is still live; its chunk of slack is not.
        s.add([100], true).unwrap();
        let r = s.read(0);
        assert_eq!((r.current, r.peak), (4196, 4196));
        // Freed here, allocated there: exact again.
        s.sub([4096]);
        s.sub([100]);
        assert_eq!(s.read(0).current, 0);
        s.add([10], true).unwrap();
        assert_eq!(s.read(0).peak, 4196);
    }

    #[test]
    fn a_limit_is_never_passed_and_refuses_exactly_alone() {
        let s = Sharded::<1>::new([4096], [1 << 20]);
        s.add([768 << 10], false).unwrap();
        assert_eq!(s.add([512 << 10], false), Err(OverLimit));
        s.add([256 << 10], false).unwrap();
        assert_eq!(s.add([1], false), Err(OverLimit));
        s.sub([768 << 10]);
        s.add([768 << 10], false).unwrap();
    }

    #[test]
    fn many_threads_sum_exactly_once_done() {
        let s = Arc::new(Sharded::<2>::new([1 << 16, 64], [i64::MAX; 2]));
        // More threads than slots: some share the atomic slot.
        let handles: Vec<_> = (0..(SLOTS + 8))
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..200u64 {
                        s.add([i * 7 + t as u64, 1], true).unwrap();
                        if i % 3 == 0 {
                            s.sub([i * 7 + t as u64, 1]);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let expect: u64 = (0..(SLOTS + 8) as u64)
            .map(|t| {
                (0..200u64)
                    .filter(|i| i % 3 != 0)
                    .map(|i| i * 7 + t)
                    .sum::<u64>()
            })
            .sum();
        let r = s.read(0);
        assert_eq!(r.current, expect);
        assert!(r.peak as u64 >= expect);
        assert_eq!(s.read(1).current, (SLOTS as u64 + 8) * 133);
        // Every thread has exited: no slack is held anywhere.
        assert_eq!(s.slack_elsewhere(0), 0);
    }
}
