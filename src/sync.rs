//! [`Lock`]: the mutex of the allocators' shared state. One waiter spins, the others sleep, and
//! an unlock wakes a sleeper only when no waiter spins.
//!
//! The sections these locks guard last tens of nanoseconds, and a thread that unlocks one asks
//! for it again within nanoseconds. `std`'s `Mutex` parks every waiter in the kernel after a
//! short spin, and from then on every unlock makes a wake-up system call, whose woken thread
//! mostly finds the lock taken again and parks once more. Eight threads sharing one `Tlsf` on
//! the lent H100's host ran at 1,059–1,074 ns per operation in aggregate, with 380,000 context
//! switches and twice as much system time as user time in 1.2 s (61–79 ns/op on one thread).
//! Letting every waiter spin instead cut that to about 200 ns, but made sixteen threads 2–3x
//! slower where each had a stream of its own: fifteen spinners pull at the lock's cache line and
//! take the cores.
//!
//! Here at most one waiter, the *spinner*, spins: it reads the lock with backoff (pauses
//! doubling up to [`MAX_PAUSES`]) and takes it when it sees it free. The other waiters sleep on
//! a condition variable. An unlock clears the locked bit and, only where sleepers wait and no
//! spinner does, wakes one sleeper, which becomes the spinner. So a busy lock costs one wake-up
//! per hand-over to a new holder, not one per unlock, and the holder keeps the lock and its
//! state's cache lines for as long as it asks again before the spinner looks. A spinner that
//! has spun [`SPIN_FOR`] without getting the lock (a holder preempted, an upstream call inside)
//! goes to sleep like the others.
//!
//! Poison is not kept: every user's state is whole between its updates (each says why where it
//! builds its lock), so a panic inside leaves nothing half done.

use std::cell::UnsafeCell;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering::*};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The most `spin_loop` hints between two looks at the lock.
const MAX_PAUSES: u32 = 64;
/// How long the spinner spins before it sleeps.
const SPIN_FOR: Duration = Duration::from_micros(50);
/// The longest a sleeper sleeps before it looks again without being woken: a bound on any wait
/// a missed wake-up could cause (none should be possible; see [`Lock::sleep`]).
const NAP: Duration = Duration::from_millis(1);

/// Set while a guard is out.
const LOCKED: u32 = 1;
/// Set while a waiter spins for the lock.
const SPINNER: u32 = 2;

/// A mutex whose waiters take turns spinning (see the module's doc).
pub(crate) struct Lock<T: ?Sized> {
    state: AtomicU32,
    /// Waiters asleep, or about to be.
    sleepers: AtomicU32,
    /// Where sleepers sleep; it guards nothing but the wait itself.
    room: Mutex<()>,
    wake: Condvar,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out `&mut T` to one thread at a time (the `LOCKED` bit, set by a
// compare-and-swap that only one thread can win, is cleared only by the guard that won it), so
// sharing a `Lock<T>` between threads moves `T` between them and needs no more than `T: Send`,
// as `std::sync::Mutex` does.
unsafe impl<T: ?Sized + Send> Sync for Lock<T> {}

/// The access a [`Lock`] gives until it is dropped.
pub(crate) struct Guard<'a, T: ?Sized> {
    lock: &'a Lock<T>,
    /// What the guard gives: `&mut T`. Shared between threads it hands out `&T` to each, so it
    /// is `Sync` only where `T` is.
    _access: PhantomData<&'a mut T>,
}

impl<T> Lock<T> {
    pub(crate) const fn new(value: T) -> Self {
        Lock {
            state: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            room: Mutex::new(()),
            wake: Condvar::new(),
            value: UnsafeCell::new(value),
        }
    }
}

impl<T: Default> Default for Lock<T> {
    fn default() -> Self {
        Lock::new(T::default())
    }
}

impl<T: ?Sized> Lock<T> {
    /// Locks: at once where it is free; otherwise spinning (one waiter at a time) or sleeping.
    #[inline]
    pub(crate) fn lock(&self) -> Guard<'_, T> {
        if self
            .state
            .compare_exchange_weak(0, LOCKED, Acquire, Relaxed)
            .is_err()
        {
            self.contended();
        }
        Guard {
            lock: self,
            _access: PhantomData,
        }
    }

    /// The value, through `&mut self` (no guard can be out).
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }

    /// Sets `LOCKED` if it is clear, keeping the other bits; true if this call set it.
    #[inline]
    fn try_take(&self) -> bool {
        let mut s = self.state.load(Relaxed);
        while s & LOCKED == 0 {
            match self
                .state
                .compare_exchange_weak(s, s | LOCKED, Acquire, Relaxed)
            {
                Ok(_) => return true,
                Err(now) => s = now,
            }
        }
        false
    }

    #[cold]
    #[inline(never)]
    fn contended(&self) {
        loop {
            if self.try_take() {
                return;
            }
            // Become the spinner if there is none.
            let s = self.state.load(Relaxed);
            if s & SPINNER == 0
                && self
                    .state
                    .compare_exchange(s, s | SPINNER, Relaxed, Relaxed)
                    .is_ok()
            {
                if self.spin() {
                    return;
                }
                continue;
            }
            self.sleep();
        }
    }

    /// Spins as the spinner until it takes the lock (true) or gives up (false); either way the
    /// `SPINNER` bit is cleared (in the same step as the taking, so that no unlock in between
    /// wakes a sleeper for nothing).
    fn spin(&self) -> bool {
        let mut pauses = 1;
        let mut since: Option<Instant> = None;
        loop {
            let s = self.state.load(Relaxed);
            if s & LOCKED == 0 {
                // Takes the lock and gives up the spinner's place at once.
                if self
                    .state
                    .compare_exchange_weak(s, (s | LOCKED) & !SPINNER, Acquire, Relaxed)
                    .is_ok()
                {
                    return true;
                }
                continue;
            }
            for _ in 0..pauses {
                std::hint::spin_loop();
            }
            if pauses < MAX_PAUSES {
                pauses *= 2;
                continue;
            }
            // The clock only once the backoff is at its longest: a short wait never reads it.
            let start = *since.get_or_insert_with(Instant::now);
            if start.elapsed() >= SPIN_FOR {
                self.state.fetch_and(!SPINNER, SeqCst);
                // A sleeper may wait for a spinner that no longer is: let one take its place.
                self.wake_one();
                return false;
            }
        }
    }

    /// Sleeps until an unlock wakes this thread (or [`NAP`] passes), unless the lock is free or
    /// has no spinner by the time this thread has counted itself a sleeper.
    fn sleep(&self) {
        // SeqCst with `unlock`'s clearing of `LOCKED` then load of `sleepers`: either the unlock
        // sees this sleeper (and wakes one, under `room`, after this thread waits or re-checks),
        // or this thread's check below sees the lock free.
        self.sleepers.fetch_add(1, SeqCst);
        let room = self.room.lock().unwrap_or_else(PoisonError::into_inner);
        let s = self.state.load(SeqCst);
        if s & LOCKED != 0 && s & SPINNER != 0 {
            // Woken, timed out or spurious: the caller's loop looks again either way.
            drop(
                self.wake
                    .wait_timeout(room, NAP)
                    .unwrap_or_else(PoisonError::into_inner),
            );
        } else {
            drop(room);
        }
        self.sleepers.fetch_sub(1, SeqCst);
    }

    /// Wakes one sleeper, if any.
    #[inline]
    fn wake_one(&self) {
        if self.sleepers.load(SeqCst) > 0 {
            self.notify();
        }
    }

    #[cold]
    #[inline(never)]
    fn notify(&self) {
        // Under `room`: a sleeper that has checked the state is waiting by now.
        let _room = self.room.lock().unwrap_or_else(PoisonError::into_inner);
        self.wake.notify_one();
    }

    #[inline]
    fn unlock(&self) {
        // The guard's `LOCKED` is set, so subtracting it clears it alone (one `lock xadd`,
        // where a `fetch_and` that returns the old bits is a compare-and-swap loop).
        let s = self.state.fetch_sub(LOCKED, SeqCst);
        if s & SPINNER == 0 {
            self.wake_one();
        }
    }
}

impl<T: ?Sized> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        self.lock.unlock();
    }
}

impl<T: ?Sized> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard's lock holds `LOCKED` for it (see `Lock`'s `Sync`): no other
        // reference to the value exists while the guard does.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T: ?Sized> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Lock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never waits: a held lock shows as such.
        if !self.try_take() {
            return f.write_str("Lock { <locked> }");
        }
        let guard = Guard {
            lock: self,
            _access: PhantomData,
        };
        f.debug_struct("Lock").field("value", &&*guard).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_that_contend_lose_no_update() {
        let lock = Arc::new(Lock::new(0u64));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..50_000 {
                        *lock.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), 400_000);
    }

    #[test]
    fn waiters_past_the_spin_sleep_and_all_get_the_lock_when_it_is_let_go() {
        let lock = Arc::new(Lock::new(Vec::new()));
        let held = lock.lock();
        let waiters: Vec<_> = (0..4)
            .map(|i| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || lock.lock().push(i))
            })
            .collect();
        // Long past the spinner's patience and several naps: all of them have slept.
        std::thread::sleep(SPIN_FOR * 20 + NAP * 3);
        let mut held = held;
        held.push(99);
        drop(held);
        for w in waiters {
            w.join().unwrap();
        }
        let mut got = lock.lock().clone();
        assert_eq!(got[0], 99);
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2, 3, 99]);
        assert_eq!(lock.state.load(SeqCst), 0, "free, no spinner");
        assert_eq!(lock.sleepers.load(SeqCst), 0);
    }

    #[test]
    fn a_lock_let_go_by_a_panic_is_free_again() {
        let lock = Arc::new(Lock::new(5));
        let other = Arc::clone(&lock);
        let _ = std::thread::spawn(move || {
            let _g = other.lock();
            panic!("let go by a panic");
        })
        .join();
        assert_eq!(lock.state.load(SeqCst), 0);
        assert_eq!(*lock.lock(), 5);
    }

    #[test]
    fn debug_shows_the_value_or_that_it_is_locked() {
        let lock = Lock::new(7);
        assert_eq!(format!("{lock:?}"), "Lock { value: 7 }");
        let g = lock.lock();
        assert_eq!(format!("{lock:?}"), "Lock { <locked> }");
        drop(g);
    }
}
